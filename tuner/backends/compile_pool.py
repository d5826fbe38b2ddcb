"""Compile ahead: a pool of spawned processes that compile candidates into Triton's disk cache
while the GPU child times earlier ones.

Each pool process loads the kernel by reference, builds one set of inputs that compiles the
specialisation the GPU child will launch (``tuner.kernel.compile_shape_for``: the kernel's
``compile_shape``, a small problem with the same dtypes, alignments and divisibilities; else the
problem itself when its inputs are small; else none, and the GPU child compiles), and calls
``kernel.compile(config, inputs)``. The GPU child then finds the binary in the cache. For a
GPU worker, a kernel that compiles from host tensors (``tuner.host_compile``: the built-in ones)
gets its inputs in host memory, so that the pool's processes start no CUDA context (15 of them
starting one took 2-2.5 s of a worker's start on an H100, and each holds its memory).
A compile that outlives its timeout has its process (and the compiler processes it started:
each pool process leads its own process group) killed and replaced; the config is recorded as a
``timeout``. Compile errors and OutOfResources are returned as outcomes and never reach the GPU.

A supervisor thread in the parent hands out work, collects finished compiles and enforces the
timeouts, so the pool keeps compiling while the parent waits on the GPU child. Pool processes run
at a lower CPU priority (nice) than the GPU child, which must never wait for a core.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import queue
import signal
import threading
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

#: how much lower than the GPU child the compile processes run (os.nice increment)
POOL_NICENESS = 5


def default_pool_size(workers_on_host: int = 1) -> int:
    """The usable CPU cores shared among the GPU workers of this machine, less one per worker
    for its GPU child and itself (at least one). Compiling is CPU-bound: two workers with a
    process per core each would share the cores anyway, each paying to start twice as many
    processes (measured on 2 H200s: ``bench/results/multi_gpu_h200x2.md``)."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, cores // max(1, workers_on_host) - 1)


def compile_device(kind: str, kernel: Any) -> str:
    """Where a pool process makes ``kernel``'s compile inputs: in host memory on the
    interpreter, and for a GPU worker where the kernel compiles from host tensors
    (``tuner.host_compile``); on the GPU otherwise (its process then starts a CUDA context)."""
    from tuner.host_compile import compiles_on_host

    return "cuda" if kind == "cuda" and not compiles_on_host(kernel) else "cpu"


def _pool_main(conn: Connection, kind: str, kernel_ref: str, shape: dict[str, int],
               dtype: str, device_index: int, parent_pid: int | None = None,
               hold: bool = False) -> None:
    os.setpgrp()  # the parent kills a timed-out compile together with the compilers it started
    from tuner.backends.child import die_with_parent, stacks_on_sigusr1
    from tuner.backends.compiler_output import captured_stdout, pass_on

    stacks_on_sigusr1()

    die_with_parent(parent_pid)  # never outlive the worker (a group of our own would)
    try:
        os.nice(POOL_NICENESS)
    except OSError:
        pass
    from tuner.backends.child import classify_exception
    from tuner.device import visible_device_for
    from tuner.host_compile import HOST_COMPILE_ENV
    from tuner.kernel import compile_hook, compile_inputs_for, load_ref

    try:
        if kind == "interpret":
            os.environ["TRITON_INTERPRET"] = "1"
        else:  # the worker's device (its index among the visible ones) as cuda:0
            os.environ["CUDA_VISIBLE_DEVICES"] = visible_device_for(device_index)
            # a kernel that compiles from host tensors gets them: no CUDA context here
            os.environ[HOST_COMPILE_ENV] = "1"
        kernel = load_ref(kernel_ref)
        if kind != "interpret":  # a compile needs no CUDA context: never start one for it
            from tuner.host_compile import build_launchers, quiet_driver

            quiet_driver()
            build_launchers()  # and the child's first launch of a binary builds nothing
        if hold:  # imported; the device only once the parent says (``CompilePool.release``)
            go = conn.recv()
            if go is None:
                return
            _op, ref, shape, dtype = go
            if ref != kernel_ref:
                kernel, kernel_ref = load_ref(ref), ref

        def load(shape: dict[str, int]) -> tuple[Any, dict[str, Any]]:
            compile_fn = compile_hook(kernel)  # without it, the GPU child compiles
            if compile_fn is None:
                return None, {}
            inputs = compile_inputs_for(kernel, shape, dtype, compile_device(kind, kernel))
            return (compile_fn, inputs) if inputs is not None else (None, {})

        compile_fn, inputs = load(shape)
    except Exception as exc:  # noqa: BLE001
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready",))
    failed: str | None = None  # why the inputs of a retargeted shape could not be made
    while True:
        try:
            config = conn.recv()
        except (EOFError, OSError):
            return
        if config is None:
            return
        if isinstance(config, tuple):  # ("shape", ref, shape, dtype): compile another problem
            _op, ref, shape, dtype = config
            try:
                if ref != kernel_ref:  # another task's kernel (a worker's pool outlives tasks)
                    kernel, kernel_ref = load_ref(ref), ref
                compile_fn, inputs, failed = *load(shape), None
            except Exception as exc:  # noqa: BLE001 - every later compile reports it
                compile_fn, inputs, failed = None, {}, f"{type(exc).__name__}: {exc}"
            continue
        t0 = time.perf_counter()
        reply: tuple[str, KernelConfig, float, str | None, str | None]
        with captured_stdout() as printed:
            try:
                if failed is not None:
                    raise RuntimeError(f"the compile inputs of this shape failed: {failed}")
                if compile_fn is not None:
                    compile_fn(config, inputs)
                reply = ("ok", config, time.perf_counter() - t0, None, None)
            except Exception as exc:  # noqa: BLE001 - a failed compile is an outcome
                text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
                reply = ("failed", config, time.perf_counter() - t0,
                         classify_exception(exc).value, text[-4000:])
        pass_on(printed.getvalue(), reply[0] == "failed", config.key())
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
    #: the pool's shape generation this process compiles for, and that of its compile now
    generation: int = 0
    config_generation: int = 0
    #: it said "ready" (loaded the kernel, made its inputs): only then is it given work
    ready: bool = False
    #: it failed to start after supervision began: never given work (nor started again)
    failed: bool = False


@dataclass(frozen=True)
class Compiled:
    config: KernelConfig
    #: the compile's seconds; negative: taken from an earlier problem of the same
    #: specialisation (``ProcessBackend``), no compile of its own
    seconds: float
    failure: Measurement | None  # None: in the cache, ready to time


class CompilePool:
    """``submit`` configs; ``poll`` returns them as their compiles finish (in that order).
    Compiles start in queue order: a batch submitted ``first`` before configs compiled ahead
    (``ProcessBackend.prefetch``), each in the order given (the strategy's ranking)."""

    def __init__(self, kind: str, kernel_ref: str, shape: dict[str, int], dtype: str,
                 size: int, timeout_s: float, device_index: int = 0,
                 start_timeout_s: float = 180.0, wait_ready: bool = True,
                 hold: bool = False) -> None:
        self._args = (kind, kernel_ref, shape, dtype, device_index)
        #: ``hold``: the processes import (the kernel's module, torch, Triton) and then wait
        #: for ``release`` before they make their inputs (on the GPU for a kernel that does not
        #: compile from host tensors: a CUDA start), so that a GPU child started beside them
        #: starts its device first
        self._held = hold
        self.timeout_s, self.start_timeout_s = timeout_s, start_timeout_s
        self._started = time.monotonic()
        #: seconds from the start to the last process ready (or failed); None before
        self.all_ready_s: float | None = None
        self._ctx = mp.get_context("spawn")
        self._slots = [self._spawn() for _ in range(max(1, size))]
        self._queue: deque[KernelConfig] = deque()
        self._done: queue.Queue[Compiled] = queue.Queue()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        #: bumped by ``retarget``: compiles of an older generation are dropped
        self._generation = 0
        self._thread: threading.Thread | None = None
        self.kills = 0
        #: pids of every pool process ever started (tests check that none is left behind)
        self.pids: list[int] = [s.process.pid for s in self._slots]
        if wait_ready:
            self.wait_ready()

    @property
    def size(self) -> int:
        return len(self._slots)

    def wait_ready(self, at_least: int | None = None) -> None:
        """Wait for ``at_least`` pool processes (None: every one) to load the kernel, then
        start supervising: the others are given work as each says it is ready (a worker's
        start need not wait for the slowest of its pool's processes). ``all_ready_s``: seconds
        from the pool's start to its last process ready (or failed)."""
        if self._thread is not None:
            return
        if self._held:
            raise RuntimeError("a held compile pool is released before it is waited for")
        wanted = len(self._slots) if at_least is None else max(0, min(at_least,
                                                                    len(self._slots)))
        try:
            while sum(s.ready for s in self._slots) < wanted:
                pending = [s for s in self._slots if not s.ready]
                ready = wait([s.conn for s in pending], timeout=self.start_timeout_s)
                if not ready:
                    raise RuntimeError("a compile process did not start in time")
                for slot in pending:
                    if slot.conn in ready:
                        self._await_ready(slot)
        except Exception:
            self._closed = True
            for slot in self._slots:
                _kill(slot.process)
                slot.conn.close()
            raise
        self._note_all_ready()
        self._thread = threading.Thread(target=self._supervise, name="tuner-compile-pool",
                                        daemon=True)
        self._thread.start()

    @property
    def broken(self) -> bool:
        """Every process failed to start: nothing will ever be compiled here (the backend's
        child compiles instead)."""
        return all(s.failed for s in self._slots)

    def _note_all_ready(self) -> None:
        if self.all_ready_s is None and all(s.ready or s.failed for s in self._slots):
            self.all_ready_s = time.monotonic() - self._started
            # a worker's start is done once its pool is warm too (bench/tuning_time.py reads
            # this line's time)
            log.info("compile pool warm: %d of %d processes ready %.2f s after it started",
                     sum(s.ready for s in self._slots), len(self._slots), self.all_ready_s)

    def _collect_starting(self) -> None:
        """Processes still starting that said ready (or failed) since last looked. One that
        failed is not started again: what failed it (the kernel's import, its inputs) would
        fail the next one too."""
        for slot in self._slots:
            if slot.ready or slot.failed or not slot.conn.poll(0):
                continue
            try:
                self._await_ready(slot)
            except RuntimeError as exc:
                log.error("a compile process failed to start (%s); the GPU child compiles "
                          "what it would have", exc)
                slot.failed = True
                _kill(slot.process)
        self._note_all_ready()

    def release(self) -> None:
        """Let held processes (``hold``) make their inputs (starting the device where they
        are on the GPU), for the problem the pool compiles for now."""
        with self._lock:
            if not self._held:
                return
            self._held = False
            for slot in self._slots:
                try:
                    slot.conn.send(("shape", self._args[1], self._args[2], self._args[3]))
                except (BrokenPipeError, OSError):
                    pass  # found dead when it should say ready
                slot.generation = self._generation

    def _spawn(self) -> _Slot:
        parent, child = self._ctx.Pipe()
        process = self._ctx.Process(target=_pool_main,
                                    args=(child, *self._args, os.getpid(), self._held),
                                    daemon=True, name="tuner-compile")
        process.start()
        child.close()
        return _Slot(process, parent)

    def _await_ready(self, slot: _Slot) -> None:
        try:
            if not slot.conn.poll(self.start_timeout_s):
                raise RuntimeError("a compile process did not start in time")
            reply = slot.conn.recv()
        except (EOFError, OSError):
            raise RuntimeError("a compile process died while starting") from None
        if reply[0] != "ready":
            raise RuntimeError(f"a compile process failed to start: {reply[1]}")
        slot.ready = True

    def submit(self, configs: Iterable[KernelConfig], first: bool = False) -> None:
        """Queue compiles, in order; ``first``: ahead of everything queued (a batch the GPU
        waits for, before configs compiled ahead), taking back any of them queued already.
        A config being compiled now for this problem is not queued again (one being
        compiled for the problem before a ``retarget`` is: its result will be dropped)."""
        with self._lock:
            busy = {s.config for s in self._slots
                    if s.config is not None and s.config_generation == self._generation}
            fresh = [c for c in dict.fromkeys(configs) if c not in busy]
            if first:
                moved = set(fresh)
                self._queue = deque(c for c in self._queue if c not in moved)
                self._queue.extendleft(reversed(fresh))
            else:
                self._queue.extend(fresh)
        self._wake.set()

    def retarget(self, shape: dict[str, int], dtype: str, kernel_ref: str | None = None) -> None:
        """Compile for another problem from now on (another shape of the same kernel, or with
        ``kernel_ref`` another kernel: a worker's pool serves task after task): the queue and
        every finished compile not yet polled are dropped, compiles running now are dropped
        when they finish, and each process loads the kernel and makes its inputs for the new
        problem before its next compile (processes started later, for it)."""
        with self._lock:
            self._generation += 1
            ref = kernel_ref if kernel_ref is not None else self._args[1]
            self._args = (self._args[0], ref, dict(shape), dtype, self._args[4])
            self._queue.clear()
            while True:
                try:
                    self._done.get_nowait()
                except queue.Empty:
                    break

    def queued(self) -> list[KernelConfig]:
        """Configs waiting for a compile process, next first."""
        with self._lock:
            return list(self._queue)

    def poll(self, timeout_s: float) -> list[Compiled]:
        """Finished compiles (waiting at most ``timeout_s`` for the first one)."""
        out: list[Compiled] = []
        try:
            out.append(self._done.get(timeout=timeout_s) if timeout_s > 0
                       else self._done.get_nowait())
        except queue.Empty:
            return out
        while True:
            try:
                out.append(self._done.get_nowait())
            except queue.Empty:
                return out

    # -- the supervisor thread ---------------------------------------------------------------

    def _supervise(self) -> None:
        while not self._closed:
            try:
                self._step()
            except Exception:  # noqa: BLE001 - never let the pool stop silently
                log.exception("compile pool supervisor")
                time.sleep(0.1)

    def _step(self) -> None:
        if self.all_ready_s is None:
            self._collect_starting()
        self._dispatch()
        busy = [s for s in self._slots if s.config is not None]
        if not busy:
            self._wake.wait(0.5)
            self._wake.clear()
            return
        now = time.monotonic()
        nearest = min(s.started + self.timeout_s for s in busy) - now
        ready = wait([s.conn for s in busy], timeout=max(0.0, min(nearest, 0.1)))
        for slot in busy:
            if slot.conn in ready:
                current = slot.config_generation == self._generation
                compiled = self._harvest(slot)
                if current:
                    self._done.put(compiled)
        for current, compiled in self._expire_overdue():
            if current:
                self._done.put(compiled)

    def _dispatch(self) -> None:
        with self._lock:
            for slot in self._slots:
                if slot.ready and slot.config is None and self._queue:
                    slot.config, slot.started = self._queue.popleft(), time.monotonic()
                    slot.config_generation = self._generation
                    log.debug("pool: compiling %s (%d queued behind it)", slot.config.key(),
                              len(self._queue))
                    try:
                        if slot.generation != self._generation:  # retargeted since
                            slot.conn.send(("shape", self._args[1], self._args[2],
                                            self._args[3]))
                            slot.generation = self._generation
                        slot.conn.send(slot.config)
                    except (BrokenPipeError, OSError):
                        pass  # found dead when harvested

    def _harvest(self, slot: _Slot) -> Compiled:
        config = slot.config
        assert config is not None
        try:
            status, _cfg, seconds, outcome, error = slot.conn.recv()
        except (EOFError, OSError):
            self._replace(slot)
            return Compiled(config, 0.0, Measurement.failure(
                config, Outcome.CRASH, "the compile process died while compiling"))
        slot.config = None
        log.debug("pool: %s %s in %.2f s of the process, %.2f s after its dispatch", status,
                  config.key(), seconds, time.monotonic() - slot.started)
        if status == "ok":
            return Compiled(config, seconds, None)
        return Compiled(config, seconds, Measurement(config, Outcome(outcome), error=error,
                                                     compile_s=seconds))

    def _expire_overdue(self) -> list[tuple[bool, Compiled]]:
        """Compiles over their timeout, killed: (of the current generation?, outcome)."""
        now, out = time.monotonic(), []
        for slot in self._slots:
            if slot.config is not None and now - slot.started > self.timeout_s:
                config = slot.config
                log.warning("compile of %s exceeded %.0f s; killing it", config.key(),
                            self.timeout_s)
                current = slot.config_generation == self._generation
                self._replace(slot)
                out.append((current, Compiled(config, self.timeout_s, Measurement(
                    config, Outcome.TIMEOUT, error=f"compile timed out after "
                    f"{self.timeout_s:.0f} s", compile_s=self.timeout_s))))
        return out

    def _replace(self, slot: _Slot) -> None:
        _kill(slot.process)
        slot.conn.close()
        slot.config = None
        self.kills += 1
        if self._closed:
            return
        generation = self._generation  # the shape its arguments are for
        fresh = self._spawn()
        self.pids.append(fresh.process.pid)
        slot.process, slot.conn, slot.generation = fresh.process, fresh.conn, generation
        slot.ready = False
        try:
            self._await_ready(slot)
        except RuntimeError as exc:  # try again on the next death; the others keep going
            log.error("could not replace a compile process: %s", exc)

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
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
