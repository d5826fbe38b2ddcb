"""Helpers of the tests that start real processes: the environment of a ``python -m tuner.app.cli``
child on the Triton CPU interpreter, a free local port, polling until a condition holds,
``tuner serve`` as a user starts it, and whether a pid is still alive."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]


def interpreter_env(**extra: str) -> dict[str, str]:
    """This process's environment for a child that imports this checkout and runs kernels on
    the Triton CPU interpreter (``extra``: more variables)."""
    return {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT), **extra}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(condition: Callable[[], Any], proc: subprocess.Popen[Any] | None,
             timeout: float = 180) -> Any:
    """Poll ``condition`` until it is true, and return its value; fails when ``proc`` (where
    given) exits first, or after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert proc is None or proc.poll() is None, "the process exited early"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


def wait_ready(base: str, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """Wait until the service at ``base`` answers ``/readyz``; fails if ``proc`` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "tuner serve exited early"
        try:
            if httpx.get(f"{base}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise AssertionError("the service did not become ready")


@dataclass(frozen=True)
class Served:
    """A running ``tuner serve``: its process, base URL and database URL."""

    proc: subprocess.Popen[bytes]
    base: str
    db: str


@contextmanager
def serving(data: Path) -> Iterator[Served]:
    """``tuner serve --backend interpret`` in ``data`` (its SQLite file and ``serve.log``
    there), in a session of its own, once it is ready; stopped with SIGTERM on leaving
    (``proc.returncode`` then says how it exited)."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = interpreter_env(TUNER_DATA_DIR=str(data), TUNER_DATABASE_URL="")
    with open(data / "serve.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tuner.app.cli", "serve", "--port",
                                 str(port), "--backend", "interpret"], cwd=data, env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_ready(base, proc)
            yield Served(proc, base, f"sqlite:///{data / 'tuner.db'}")
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=90)


def alive(pid: int) -> bool:
    """Whether ``pid`` is a live process (a zombie is not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
