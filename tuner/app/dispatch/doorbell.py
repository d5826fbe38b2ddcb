"""The embedded dispatcher's doorbell: an idle worker on this machine wakes when a job is queued.

Without it an idle worker finds a queued task at its next look at the queue
(``TUNER_WORKER_POLL_SECONDS``, 0.2 s: 0.1-0.2 s of every job's wall on an H100,
``bench/results/tuning_time_33h/``). Each serving worker binds a Unix datagram socket in the
data folder's ``doorbell/`` (``<worker id>.sock``); the API rings every socket there once it
committed a job's tasks. A ring carries nothing: the worker looks at the queue at once, and
its claim is the same guarded UPDATE as ever. So the doorbell only makes pick-up prompt; a
worker on another machine, or one whose socket could not be made (a path over the 107
bytes a socket's name allows, a system without Unix sockets), keeps polling, and a ring
that reaches nobody changes nothing.
"""

from __future__ import annotations

import logging
import os
import select
import socket
import threading
import time
from pathlib import Path

log = logging.getLogger(__name__)

#: the longest path a Unix socket may be bound to (``sun_path`` less its terminating NUL)
MAX_SOCKET_PATH = 107
#: seconds between two looks at ``stopping`` while a worker waits at its doorbell
STOP_LOOK_S = 0.25


def doorbell_dir(data_dir: Path) -> Path:
    """The folder of a data folder's doorbells."""
    return data_dir / "doorbell"


class Doorbell:
    """A worker's doorbell: ``wait`` returns when rung or after ``timeout_s``, whichever is
    first. Where the socket cannot be made, ``wait`` only waits (on ``stopping``)."""

    def __init__(self, folder: Path, name: str, stopping: threading.Event) -> None:
        self.stopping = stopping
        self.path = folder / f"{name}.sock"
        self.sock: socket.socket | None = None
        if len(os.fsencode(self.path)) > MAX_SOCKET_PATH or not hasattr(socket, "AF_UNIX"):
            log.info("no doorbell at %s (the path is too long for a socket): this worker "
                     "finds queued tasks by polling", self.path)
            return
        try:
            folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            self.path.unlink(missing_ok=True)  # a socket left by a worker of that id
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            sock.bind(os.fspath(self.path))
            sock.setblocking(False)
            self.sock = sock
        except OSError as exc:
            log.info("no doorbell at %s (%s): this worker finds queued tasks by polling",
                     self.path, exc)

    def wait(self, timeout_s: float) -> None:
        """Until rung, ``stopping`` is set (seen within ``STOP_LOOK_S``) or ``timeout_s``."""
        if self.sock is None:
            self.stopping.wait(timeout_s)
            return
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or self.stopping.is_set():
                return
            if select.select([self.sock], [], [], min(left, STOP_LOOK_S))[0]:
                break
        try:
            while self.sock.recv(16):  # every ring since the last look: one look answers all
                pass
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as exc:  # noqa: BLE001 - the worker polls on
            log.debug("the doorbell at %s: %s", self.path, exc)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
            self.path.unlink(missing_ok=True)


def ring(folder: Path) -> int:
    """Ring every doorbell in ``folder``; how many answered. A socket nobody listens on any
    more (its worker died) is removed. Never raises: a worker's poll catches up."""
    rung = 0
    try:
        paths = [p for p in folder.iterdir() if p.suffix == ".sock"]
    except OSError:
        return 0
    try:
        sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    except (OSError, AttributeError):
        return 0
    with sender:
        sender.setblocking(False)
        for path in paths:
            try:
                sender.sendto(b"\x01", os.fspath(path))
                rung += 1
            except ConnectionRefusedError:  # bound by nobody: its worker is gone
                path.unlink(missing_ok=True)
            except OSError:  # a full queue (rung already, not looked yet), or gone: fine
                pass
    return rung
