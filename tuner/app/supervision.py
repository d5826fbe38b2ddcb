"""What keeps ``tuner serve``'s processes in step with it: none outlives it, its address is
checked before anything starts, and what it knows of its workers reaches the API processes.

- **Dying with serve**: the API processes (uvicorn workers) and the worker processes ``serve``
  started are signalled by the kernel the moment it dies, however it dies (``kill -9``
  included): ``prctl(PR_SET_PDEATHSIG)`` on Linux; elsewhere, and as a backstop, a thread that
  polls ``os.getppid()``. An API process exits at once (it holds the listening socket and no
  state: ``exit_with_serve``); a worker gets one SIGTERM (it stops as on Ctrl-C, its task
  re-queued) and is killed with its process group ``ORPHAN_GRACE_S`` later if still there
  (``stop_with_serve``). ``SERVE_PID_ENV`` names ``serve`` to its API processes; workers are
  told by ``--parent-pid``. PR_SET_PDEATHSIG fires when the *thread* that started the process
  exits: ``serve`` starts them from threads that live as long as it does.
- **The address**: ``check_address`` binds it once before anything starts: a port in use is
  one line naming the port and, where ``/proc`` shows it, the process listening on it.
- **Worker state**: ``serve``'s pool restarts a worker that exits, forever, after a back-off
  (``restart_delay``), and writes each worker's state (running or restarting, its restarts
  and last exit) to a JSON file that ``STATE_ENV`` names, for ``/healthz`` (``read_state``).

Importing this module imports nothing of the engine or the API.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from tuner.errors import CannotListen

log = logging.getLogger(__name__)

#: the environment variable through which ``serve`` tells its API processes its pid
SERVE_PID_ENV = "TUNER_SERVE_PID"
#: the environment variable naming the file of ``serve``'s worker states
STATE_ENV = "TUNER_SERVE_STATE"
#: prctl(2) option: the signal this process gets when its parent dies
PR_SET_PDEATHSIG = 1
#: seconds between two looks at the parent's pid (there is no event for "my parent died")
PARENT_WATCH_S = 0.5
#: seconds a worker whose ``serve`` died has to stop on its own before it is killed
ORPHAN_GRACE_S = 30.0


# -- dying with serve ---------------------------------------------------------------------------

def set_parent_death_signal(sig: int) -> bool:
    """Ask the kernel for ``sig`` when this process's parent dies (Linux only); whether it
    was armed."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def serve_pid() -> int | None:
    """The pid of the ``tuner serve`` that started this API process (``SERVE_PID_ENV``), or
    None: not started by ``serve``, or ``serve`` itself (a single API process runs in it)."""
    text = os.environ.get(SERVE_PID_ENV, "")
    pid = int(text) if text.isdigit() else None
    return pid if pid != os.getpid() else None


def exit_with_serve() -> None:
    """In an API process ``serve`` started: exit the moment ``serve`` is gone (SIGKILL from
    the kernel; the watch thread where there is no prctl). Nothing where ``serve`` did not
    start this process."""
    parent = serve_pid()
    if parent is None:
        return
    set_parent_death_signal(signal.SIGKILL)
    if os.getppid() != parent:  # gone before the signal was armed
        os._exit(1)
    _start_watch(parent, lambda: os._exit(1))


def stop_with_serve(parent_pid: int, grace_s: float = ORPHAN_GRACE_S) -> None:
    """In a worker ``serve`` started (call it from the main thread): one SIGTERM the moment
    ``parent_pid`` is gone (the worker stops as on Ctrl-C, re-queueing its task), and SIGKILL
    of its process group (its measuring processes too) ``grace_s`` later if it is still there.

    The kernel's signal is SIGHUP, caught here, not SIGTERM itself: it comes again each time
    the worker passes to another of the dying process's threads (a second SIGTERM would make
    the worker exit at once, its task left to its lease), and when a thread of a live
    ``serve`` ends; the watch thread sends the one SIGTERM, once the parent is really gone."""
    woken = threading.Event()
    signal.signal(signal.SIGHUP, lambda _signum, _frame: woken.set())
    set_parent_death_signal(signal.SIGHUP)

    def watch() -> None:
        while os.getppid() == parent_pid:
            woken.wait(PARENT_WATCH_S)
            woken.clear()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        log.warning("the serving process %d is gone and this worker did not stop within "
                    "%.0f s; killing it", parent_pid, grace_s)
        _exit_with_group()

    threading.Thread(target=watch, daemon=True, name="serve-watch").start()


def _start_watch(parent_pid: int, gone: Any) -> None:
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(PARENT_WATCH_S)
        gone()

    threading.Thread(target=watch, daemon=True, name="serve-watch").start()


def _exit_with_group() -> None:
    with contextlib.suppress(OSError):
        if os.getpgrp() == os.getpid():  # a group leader: its measuring processes go too
            os.killpg(0, signal.SIGKILL)
    os._exit(1)


# -- the address --------------------------------------------------------------------------------

def check_address(host: str, port: int) -> None:
    """CannotListen, in one line, unless ``host:port`` can be listened on now (bound as
    uvicorn binds it, and closed again): a port in use names the process listening on it
    where ``/proc`` shows it."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise CannotListen(f"port {port} is already in use{holder_text(port)}; stop "
                                   "that process or pass another --port") from None
            reason = exc.strerror or str(exc)
            raise CannotListen(f"cannot listen on {host}:{port}: {reason} (--host, --port)"
                               ) from None


def holder_text(port: int) -> str:
    """`` by pid 123 (python -m tuner.app.cli serve ...)`` for the process listening on TCP
    ``port`` (the first of several sharing the socket: the one whose parent is not among
    them), or ``""`` where none can be seen (another user's, or no ``/proc``)."""
    pids = port_holders(port)
    if not pids:
        return ""
    first = next((p for p in pids if _parent_of(p) not in pids), pids[0])
    others = len(pids) - 1
    more = f" and {others} other process{'es' if others > 1 else ''}" if others else ""
    return f" by pid {first} ({_command_of(first)}){more}"


def port_holders(port: int) -> list[int]:
    """Pids of the processes with a socket listening on TCP ``port``, from ``/proc`` (Linux;
    only processes this user may inspect); empty elsewhere."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            listening = len(fields) > 9 and fields[3] == "0A"
            if listening and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    pids = []
    for entry in Path("/proc").iterdir() if inodes else ():
        if entry.name.isdigit() and _holds(entry, inodes):
            pids.append(int(entry.name))
    return sorted(pids)


def _holds(proc: Path, sockets: set[str]) -> bool:
    try:
        fds = list((proc / "fd").iterdir())
    except OSError:  # another user's process, or gone
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(fd) in sockets:
                return True
    return False


def _parent_of(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _command_of(pid: int, limit: int = 100) -> str:
    try:
        words = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
    except OSError:
        return "command unknown"
    text = " ".join(w.decode(errors="replace") for w in words) or "command unknown"
    return text if len(text) <= limit else text[:limit - 3] + "..."


# -- worker state -------------------------------------------------------------------------------

def restart_delay(quick_failures: int, first_s: float, max_s: float) -> float:
    """Seconds before a worker is restarted: none after it ran a while (``quick_failures``
    0), else ``first_s`` doubling with each exit in a row right after starting, capped at
    ``max_s``."""
    if quick_failures <= 0:
        return 0.0
    return float(min(max_s, first_s * 2.0 ** min(quick_failures - 1, 60)))


def exit_reason(returncode: int, ran_s: float) -> str:
    """``exited with status 3 after 0.4 s`` / ``killed by SIGKILL after 12.0 s``."""
    if returncode < 0:
        try:
            what = f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            what = f"killed by signal {-returncode}"
    else:
        what = f"exited with status {returncode}"
    return f"{what} after {ran_s:.1f} s"


def write_state(path: Path, state: dict[str, Any]) -> None:
    """Replace the state file in one rename: a reader never sees half of it."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(state))
    os.replace(tmp, path)


def remove_stale_states(folder: Path) -> None:
    """Remove the state files in ``folder`` (``tuner-serve-<pid>-*.json``) of a ``serve``
    that is gone (killed: one that stops removes its own)."""
    for path in folder.glob("tuner-serve-*-*.json"):
        pid = path.name.split("-")[2]
        if pid.isdigit() and not _running(int(pid)):
            with contextlib.suppress(OSError):
                path.unlink()


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's
        return True
    return True


def read_state() -> dict[str, Any] | None:
    """The worker states ``serve`` last wrote (``STATE_ENV``), or None: not under ``serve``,
    or the file is gone or unreadable."""
    path = os.environ.get(STATE_ENV)
    if not path:
        return None
    try:
        state = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return state if isinstance(state, dict) else None
