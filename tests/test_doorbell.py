"""The embedded dispatcher's doorbell (``tuner.app.dispatch.doorbell``): real Unix sockets."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from tuner.app.dispatch.doorbell import MAX_SOCKET_PATH, Doorbell, ring


def _waited(bell: Doorbell, timeout_s: float, ring_after_s: float | None = None) -> float:
    """Seconds ``bell.wait(timeout_s)`` took, its doorbell rung after ``ring_after_s``."""
    took: list[float] = []

    def wait() -> None:
        t0 = time.monotonic()
        bell.wait(timeout_s)
        took.append(time.monotonic() - t0)

    thread = threading.Thread(target=wait)
    thread.start()
    if ring_after_s is not None:
        time.sleep(ring_after_s)
        assert ring(bell.path.parent) == 1
    thread.join(timeout_s + 5)
    return took[0]


def test_a_rung_doorbell_wakes_its_worker_at_once_and_an_unrung_one_waits(tmp_path: Path):
    stopping = threading.Event()
    bell = Doorbell(tmp_path / "doorbell", "worker-1", stopping)
    try:
        assert bell.sock is not None and bell.path.exists()
        assert _waited(bell, 10.0, ring_after_s=0.3) < 1.0
        assert 0.4 <= _waited(bell, 0.5) < 2.0  # nothing rang: the whole wait
        for _ in range(3):  # rung thrice while busy: one look answers all
            ring(bell.path.parent)
        assert _waited(bell, 5.0) < 0.5
        assert 0.4 <= _waited(bell, 0.5) < 2.0
        stopping.set()  # a stopping worker stops waiting
        assert _waited(bell, 10.0) < 0.5
    finally:
        bell.close()
    assert not bell.path.exists()


def test_a_ring_removes_the_doorbell_of_a_worker_that_is_gone(tmp_path: Path):
    folder = tmp_path / "doorbell"
    alive = Doorbell(folder, "alive", threading.Event())
    gone = Doorbell(folder, "gone", threading.Event())
    assert gone.sock is not None
    gone.sock.close()  # died without closing: its socket file is left
    try:
        assert ring(folder) == 1
        assert not gone.path.exists() and alive.path.exists()
    finally:
        alive.close()
    assert ring(tmp_path / "nowhere") == 0


def test_a_doorbell_whose_path_is_too_long_leaves_the_worker_polling(tmp_path: Path):
    folder = tmp_path / ("x" * MAX_SOCKET_PATH)
    stopping = threading.Event()
    bell = Doorbell(folder, "worker-1", stopping)
    assert bell.sock is None
    assert 0.25 <= _waited(bell, 0.3) < 2.0
    stopping.set()
    assert _waited(bell, 10.0) < 0.5
    bell.close()
