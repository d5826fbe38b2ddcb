"""Compile ahead: a pool of spawned processes that compile candidates into Triton's disk cache
while the GPU child times earlier ones.

Each pool process loads the kernel by reference, builds one set of inputs with the problem's
shapes and strides (so the compiled specialisation is exactly the one the GPU child will launch),
and calls ``kernel.compile(config, inputs)``. The GPU child then finds the binary in the cache.
A compile that outlives its timeout has its process (and the compiler processes it started)
killed and replaced; the config is recorded as a ``timeout``. Compile errors and
OutOfResources are returned as outcomes and never reach the GPU.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import time
import traceback
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from tuner.config import KernelConfig
from tuner.measurement import Measurement, Outcome

log = logging.getLogger(__name__)


def _pool_main(conn: Connection, kind: str, kernel_ref: str, shape: dict[str, int],
               dtype: str, device_index: int) -> None:
    os.setpgrp()
    if kind == "interpret":
        os.environ["TRITON_INTERPRET"] = "1"
    else:
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", str(device_index))
    from tuner.backends.child import classify_exception
    from tuner.kernel import load_ref

    kernel = load_ref(kernel_ref)
    compile_fn = getattr(kernel, "compile", None)  # without it, the GPU child compiles
    inputs = kernel.make_inputs(shape, dtype, "cuda" if kind == "cuda" else "cpu", 0)
    conn.send(("ready",))
    while True:
        try:
            config = conn.recv()
        except (EOFError, OSError):
            return
        if config is None:
            return
        t0 = time.perf_counter()
        try:
            if compile_fn is not None:
                compile_fn(config, inputs)
            reply = ("ok", config, time.perf_counter() - t0, None, None)
        except Exception as exc:  # noqa: BLE001 - a failed compile is an outcome
            text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            reply = ("failed", config, time.perf_counter() - t0,
                     classify_exception(exc).value, text[-4000:])
        try:
            conn.send(reply)
        except OSError:  # the parent closed the pool while we compiled
            return


@dataclass
class _Slot:
    process: Any
    conn: Connection
    config: KernelConfig | None = None
    started: float = 0.0


@dataclass(frozen=True)
class Compiled:
    config: KernelConfig
    seconds: float
    failure: Measurement | None  # None: in the cache, ready to time


class CompilePool:
    def __init__(self, kind: str, kernel_ref: str, shape: dict[str, int], dtype: str,
                 size: int, timeout_s: float, device_index: int = 0,
                 start_timeout_s: float = 180.0) -> None:
        self._args = (kind, kernel_ref, shape, dtype, device_index)
        self.timeout_s, self.start_timeout_s = timeout_s, start_timeout_s
        self._ctx = mp.get_context("spawn")
        self._slots = [self._spawn() for _ in range(max(1, size))]
        for slot in self._slots:
            self._await_ready(slot)
        self._queue: deque[KernelConfig] = deque()
        self.kills = 0

    @property
    def size(self) -> int:
        return len(self._slots)

    def _spawn(self) -> _Slot:
        parent, child = self._ctx.Pipe()
        process = self._ctx.Process(target=_pool_main, args=(child, *self._args), daemon=True,
                                    name="tuner-compile")
        process.start()
        child.close()
        return _Slot(process, parent)

    def _await_ready(self, slot: _Slot) -> None:
        if not slot.conn.poll(self.start_timeout_s):
            raise RuntimeError("a compile process did not start in time")
        slot.conn.recv()

    def submit(self, configs: Iterable[KernelConfig]) -> None:
        self._queue.extend(configs)
        self._dispatch()

    @property
    def busy(self) -> bool:
        return bool(self._queue) or any(s.config is not None for s in self._slots)

    def _dispatch(self) -> None:
        for slot in self._slots:
            if slot.config is None and self._queue:
                slot.config, slot.started = self._queue.popleft(), time.monotonic()
                slot.conn.send(slot.config)

    def poll(self, timeout_s: float) -> list[Compiled]:
        """Finished compiles (waiting at most ``timeout_s`` for the first one)."""
        busy = [s for s in self._slots if s.config is not None]
        if not busy:
            return []
        ready = wait([s.conn for s in busy], timeout=timeout_s)
        done = [self._harvest(s) for s in busy if s.conn in ready]
        done += self._expire_overdue()
        self._dispatch()
        return [d for d in done if d is not None]

    def _harvest(self, slot: _Slot) -> Compiled | None:
        config = slot.config
        assert config is not None
        try:
            status, _cfg, seconds, outcome, error = slot.conn.recv()
        except (EOFError, OSError):
            self._replace(slot)
            return Compiled(config, 0.0, Measurement.failure(
                config, Outcome.CRASH, "the compile process died while compiling"))
        slot.config = None
        if status == "ok":
            return Compiled(config, seconds, None)
        return Compiled(config, seconds, Measurement(config, Outcome(outcome), error=error,
                                                     compile_s=seconds))

    def _expire_overdue(self) -> list[Compiled]:
        now, out = time.monotonic(), []
        for slot in self._slots:
            if slot.config is not None and now - slot.started > self.timeout_s:
                config = slot.config
                log.warning("compile of %s exceeded %.0f s; killing it", config.key(),
                            self.timeout_s)
                self._replace(slot)
                out.append(Compiled(config, self.timeout_s, Measurement(
                    config, Outcome.TIMEOUT, error=f"compile timed out after "
                    f"{self.timeout_s:.0f} s", compile_s=self.timeout_s)))
        return out

    def _replace(self, slot: _Slot) -> None:
        _kill(slot.process)
        slot.conn.close()
        fresh = self._spawn()
        self._await_ready(fresh)
        slot.process, slot.conn, slot.config = fresh.process, fresh.conn, None
        self.kills += 1

    def close(self) -> None:
        for slot in self._slots:
            try:
                slot.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        deadline = time.monotonic() + 5
        for slot in self._slots:
            slot.process.join(timeout=max(0.0, deadline - time.monotonic()))
            _kill(slot.process)
            slot.conn.close()


def _kill(process: Any) -> None:
    if process.is_alive():
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            process.kill()
    process.join(timeout=10)
