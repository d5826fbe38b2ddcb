"""The parent side of a measuring child: timeouts, crash recovery, health.

The parent never initialises CUDA. It sends the child a batch of configs (those whose binaries
are ready: the child verifies each, then times them one after the other) and waits for each
step with a deadline: a config's compile (or load) gets ``compile_timeout_s``, its
verification and its timing ``run_timeout_s`` each.
A child that dies, hangs or reports a sticky CUDA error is killed with its whole process group
(the compiler subprocesses it started included), a fresh one is started and checked with a small
known-good computation, and the config is recorded as ``crash`` or ``timeout``. The run phase's
deadline also allows for the child settling the GPU first (``TimingOptions.settle_max_ms``,
tuner/gpu_state.py).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import signal
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from tuner.backends.base import MeasuredCallback, TimingOptions
from tuner.backends.child import CALIBRATION_RUNS, child_main, is_sticky
from tuner.backends.compile_pool import Compiled, CompilePool, default_pool_size
from tuner.config import KernelConfig
from tuner.device import DeviceFingerprint
from tuner.errors import InvalidRequest, MeasuringStopped, WorkerDied
from tuner.kernel import compile_shape_for, load_ref, optional_hook
from tuner.measurement import Measurement, Outcome
from tuner.phases import PhaseClock
from tuner.space import SearchSpace
from tuner.timing import check_timing, interpreter_refusal

log = logging.getLogger(__name__)


class _Timeout(Exception):
    pass


class _Died(Exception):
    pass


class _Interrupted(Exception):
    pass


class ChildProcess:
    """One spawned child and its pipe. ``call`` waits for a reply with a deadline."""

    def __init__(self, kind: str, device_index: int, start_timeout_s: float,
                 spawned_hook: Callable[[], None] | None = None) -> None:
        """``spawned_hook``: called once the process is spawned, before its start is waited
        for (the backend starts its compile pool there)."""
        ctx = mp.get_context("spawn")
        spawned = time.monotonic()
        self.conn, child_conn = ctx.Pipe()
        self.process = ctx.Process(target=child_main,
                                   args=(child_conn, kind, device_index, os.getpid()),
                                   daemon=True, name=f"tuner-{kind}-child")
        self.process.start()
        child_conn.close()
        try:
            if spawned_hook is not None:
                try:
                    spawned_hook()
                except BaseException:  # the child must not outlive a start that failed
                    self.kill()
                    raise
            reply = self.receive(start_timeout_s)
        except (_Timeout, _Died) as exc:
            self.kill()
            raise WorkerDied(f"the {kind} child did not start: {exc}") from None
        if reply[0] != "ready":
            self.kill()
            raise WorkerDied(f"the {kind} child did not start: {reply[1]}")
        self.fingerprint: DeviceFingerprint = reply[1]
        #: seconds its setup on its first problem took (``ProcessBackend._start``)
        self.setup_s = 0.0
        #: seconds the start took, by step: the child's Python start and imports up to its
        #: entry point (``python``), torch's import (``torch``), the device's start
        #: (``device``), and the reply's way back (``reply``)
        self.start_steps: dict[str, float] = start_steps(spawned, reply[2] if len(reply) > 2
                                                         else {}, time.monotonic())

    def receive(self, timeout_s: float,
                interrupt: Callable[[], bool] | None = None) -> tuple[Any, ...]:
        """The child's next reply, waited for ``timeout_s`` at most; ``interrupt`` is asked
        every 0.5 s meanwhile (True: ``_Interrupted``, the reply left unread)."""
        deadline = time.monotonic() + timeout_s
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Timeout(f"no answer within {timeout_s:.0f} s")
            try:
                if self.conn.poll(min(left, 0.5)):
                    return self.conn.recv()  # type: ignore[no-any-return]
            except (EOFError, OSError):
                raise _Died(self._death_note()) from None
            if not self.process.is_alive() and not self.conn.poll(0):
                raise _Died(self._death_note())
            if interrupt is not None and interrupt():
                raise _Interrupted

    def send(self, message: tuple[Any, ...]) -> None:
        try:
            self.conn.send(message)
        except (BrokenPipeError, OSError):
            raise _Died(self._death_note()) from None

    def _death_note(self) -> str:
        self.process.join(timeout=1)
        code = self.process.exitcode
        if code is not None and code < 0:
            return f"the child was killed by signal {signal.Signals(-code).name}"
        return f"the child exited abruptly (exit code {code})"

    def kill(self) -> None:
        pid = self.process.pid
        if pid is not None and self.process.is_alive():
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self.process.kill()
        self.process.join(timeout=10)
        self.conn.close()

    def close(self) -> None:
        try:
            self.conn.send(("exit",))
            self.process.join(timeout=5)
        except (BrokenPipeError, OSError):
            pass
        self.kill()


#: the child's compile step for a config the pool compiled takes milliseconds (a load from
#: Triton's cache, its inputs made); over this it compiled again, which is logged: matmul
#: 1500x3001x999 spent 10-12 s so in 16 trials on an H100 (bench/NOTES.md, issue 33)
SLOW_CHILD_COMPILE_S = 0.25


def start_steps(spawned: float, marks: dict[str, float], answered: float) -> dict[str, float]:
    """The seconds between the spawn, the child's marks (``child_main``: ``entered``,
    ``torch``, ``device``; ``time.monotonic`` is one clock for every process) and the reply;
    {} without marks."""
    names = ("entered", "torch", "device")
    if not all(isinstance(marks.get(n), float) for n in names):
        return {}
    times = [spawned, *(marks[n] for n in names), answered]
    labels = ("python", "torch", "device", "reply")
    return {label: max(0.0, b - a)
            for label, a, b in zip(labels, times[:-1], times[1:], strict=True)}


#: what a compile-pool failure settles for good: the compiler refused the config or ran out of
#: time. Anything else (a crash) may come from the pool's own inputs (stand-ins, a problem made
#: on another device), so the GPU child compiles and measures that config itself: a config the
#: pool could not build (liger's fused MoE: routing kernels launched on the pool's CPU-made
#: inputs) is not a config that cannot run.
DECISIVE_COMPILE_FAILURES = (Outcome.COMPILE_ERROR, Outcome.OUT_OF_RESOURCES, Outcome.TIMEOUT)

#: the phase (``tuner.phases``) the parent's wait counts in, by the stage of the config the
#: child works on: its inputs and binary, its verification, its timing
_STAGE_PHASE = {"compile": "compile_child", "verify": "verifying", "time": "measuring"}


def specialisation_key(kernel_ref: str, shape: dict[str, int], dtype: str
                       ) -> tuple[str, str, tuple[tuple[str, int], ...]]:
    """What decides the binaries a problem's configs compile to: the kernel, the dtype and
    the kernel's ``compile_shape`` (a small problem that specialises like this one: the same
    constexprs, divisibilities and alignments; ``tuner.kernel.compile_shape_for``). Two problems
    with the same key compile every config to the same binary, so a config compiled for one
    is in Triton's cache for the other (a sweep's token counts 256 and up, for moe_gemm). A
    kernel without a ``compile_shape`` (or one that fails to load here) is keyed by its shape
    itself: nothing is shared."""
    try:
        kernel = load_ref(kernel_ref)
        # a user's kernel compiles on stand-ins of its own (compile_inputs): nothing shared
        small = (None if optional_hook(kernel, "compile_inputs") is not None
                 else compile_shape_for(kernel, shape, dtype))
    except Exception:  # noqa: BLE001 - only a missed saving: the problem itself is the key
        small = None
    if small is None:
        small = {"<shape>": 0, **shape}
    return kernel_ref, dtype, tuple(sorted(small.items()))


def _decisive(failure: Measurement | None) -> bool:
    return failure is not None and failure.outcome in DECISIVE_COMPILE_FAILURES


class ProcessBackend:
    """The ``cuda`` and ``interpret`` backends: a child process measures, the parent supervises."""

    def __init__(self, kind: str, kernel_ref: str, shape: dict[str, int], dtype: str,
                 seed: int = 0, device_index: int = 0,
                 timing: TimingOptions | None = None,
                 compile_workers: int | None = None) -> None:
        self.kind = kind
        self.kernel_ref, self.shape, self.dtype, self.seed = kernel_ref, shape, dtype, seed
        self.device_index = device_index
        self.timing = timing or TimingOptions()
        #: asked every 0.5 s while a measurement or re-timing is in flight (a worker sets its
        #: task's stop check): True kills the child mid-work and raises MeasuringStopped; the
        #: backend is then unhealthy (``stopped``) and is closed, not reused
        self.interrupt: Callable[[], bool] | None = None
        self.stopped = False
        self.consecutive_deaths = 0
        self.restarts = 0
        #: fastest fully timed p50 so far: configs far slower get only a quick timing
        self.best_ms: float | None = None
        #: pids of every GPU child started (restarts included)
        self.child_pids: list[int] = []
        #: where the time goes (``tuner.phases``): a worker hands each task's clock here
        self.clock: PhaseClock | None = None
        #: compiles the pool finished, per specialisation (``specialisation_key``), for as
        #: long as the backend lives: a later problem of the same specialisation (a sweep's
        #: next shape, a worker's next task) takes them instead of compiling again
        self._compiled_for: dict[Any, dict[KernelConfig, Compiled]] = {}
        self._known_problem: Any = None
        self._known_now: dict[KernelConfig, Compiled] = {}
        #: compiles finished ahead of their batch (``prefetch``), and those still queued
        self._compiled: dict[KernelConfig, Compiled] = {}
        #: configs compiled ahead and timed while a batch waited for its compiles
        #: (``TimingOptions.time_ahead``), with their compiles: a later batch takes them
        self._timed_ahead: dict[KernelConfig, tuple[Measurement, Compiled]] = {}
        self._ahead: set[KernelConfig] = set()
        self._pending: list[KernelConfig] = []  # to compile ahead behind the next batch
        if compile_workers is None:  # the interpreter has nothing to compile ahead
            compile_workers = default_pool_size() if kind == "cuda" else 0
        # The pool's processes start beside the child but make their inputs only once the
        # child has started (``hold``): a kernel whose compile inputs are on the GPU (a user's;
        # the built-in ones compile from host tensors, ``tuner.host_compile``, and start no
        # CUDA context) would start the device there, and 15 CUDA starts would queue the
        # child's (measured on an H100, the child of a 15-process pool started beside it was
        # ready with the pool's processes, after 5-12 s), while their imports (torch, Triton,
        # the kernel: 2.1 s byte-compiled, niced) need not wait. Then they are given work as
        # each is ready, while the backend is already in use.
        self._pool: CompilePool | None = None
        t0 = time.monotonic()

        def start_pool() -> None:  # once the child is spawned
            self._pool = CompilePool(kind, kernel_ref, shape, dtype, compile_workers or 0,
                                     self.timing.compile_timeout_s, device_index,
                                     self.timing.start_timeout_s, wait_ready=False, hold=True)

        try:
            self._child = self._start(start_pool if compile_workers else None)
            #: seconds the start took: the child (its imports, CUDA, its setup), and its steps
            #: (``ChildProcess.start_steps``, then the setup on its first problem)
            self.start_seconds = {"child": time.monotonic() - t0, **{
                f"child_{k}": v for k, v in self._child.start_steps.items()},
                "child_setup": self._child.setup_s}
            if self._pool is not None:
                self._pool.release()
                self._pool.wait_ready(at_least=0)
        except BaseException:
            if self._pool is not None:
                self._pool.close()
            if hasattr(self, "_child"):
                self._child.kill()
            raise
        self.fingerprint: DeviceFingerprint = self._child.fingerprint

    @property
    def preferred_batch(self) -> int:
        """Configs worth asking ahead: enough to keep the compile pool busy (the search
        loop's default batch_size)."""
        return self._pool.size if self._pool is not None else 1

    @property
    def healthy(self) -> bool:
        return (self.consecutive_deaths < self.timing.max_consecutive_deaths
                and not self.stopped)

    def _stop_in_flight(self, doing: str) -> MeasuringStopped:
        """``interrupt`` said stop: the child's work in flight is abandoned with the child (its
        process group), which leaves the GPU at once; the compile pool is closed with the
        backend."""
        log.info("stopping the %s child while %s: the task must stop", self.kind, doing)
        self._child.kill()
        self.stopped = True
        return MeasuringStopped(f"stopped while {doing}")

    @property
    def _settle_s(self) -> float:
        """The longest the child may spend settling (or cooling) the GPU before a timing (cuda
        only)."""
        if self.kind != "cuda":
            return 0.0
        return max(self.timing.settle_max_ms if self.timing.settles else 0.0,
                   self.timing.settle_warmup_ms if self.timing.settles else 0.0,
                   self.timing.cool_max_ms if self.timing.cools else 0.0) / 1e3

    def _start(self, spawned_hook: Callable[[], None] | None = None) -> ChildProcess:
        child = ChildProcess(self.kind, self.device_index, self.timing.start_timeout_s,
                             spawned_hook)
        if child.process.pid is not None:
            self.child_pids.append(child.process.pid)
        try:
            t0 = time.monotonic()
            child.send(("setup", self.kernel_ref, self.shape, self.dtype, self.seed))
            reply = child.receive(self.timing.start_timeout_s)
            child.setup_s = time.monotonic() - t0
        except (_Timeout, _Died) as exc:
            child.kill()
            raise WorkerDied(f"the {self.kind} child failed its setup: {exc}") from None
        if reply[0] != "ok":
            child.kill()
            raise WorkerDied(f"the {self.kind} child failed its setup: {reply[1]}")
        return child

    def _restart(self, why: str) -> None:
        log.warning("restarting the %s child: %s", self.kind, why)
        self._child.kill()
        self.restarts += 1
        if not self.healthy:
            raise WorkerDied(f"the {self.kind} device died {self.consecutive_deaths} times in a "
                             f"row; last: {why}")
        self._child = self._start()
        try:
            self._child.send(("selftest",))
            reply = self._child.receive(self.timing.run_timeout_s)
        except (_Timeout, _Died) as exc:
            reply = ("error", str(exc))
        if reply[0] != "ok":
            self._child.kill()
            self.consecutive_deaths = self.timing.max_consecutive_deaths
            raise WorkerDied(f"the restarted {self.kind} child failed its self-test: {reply[1]}")

    def restrict(self, space: SearchSpace) -> SearchSpace:
        return space

    @property
    def timing_method(self) -> str:
        """The timing method of every timing from now on (``tuner/timing.py``)."""
        return self.timing.method

    def use_timing(self, method: str) -> str:
        """Time with ``method`` from now on (a worker's next task may ask for another) and
        return it. When it changes, the quick timing's bar (``best_ms``) is dropped: times of
        two methods do not compare. InvalidRequest (naming ``timing``) for an unknown method,
        and for ``cuda-graph`` on the interpreter, which cannot replay CUDA graphs."""
        check_timing(method)
        refusal = interpreter_refusal(method) if self.kind != "cuda" else None
        if refusal is not None:
            raise InvalidRequest(f"{refusal}; run it on a GPU worker", field="timing")
        if method != self.timing.method:
            self.timing = replace(self.timing, method=method)
            self.best_ms = None
        return method

    def use_bound(self, memory_bound: bool) -> None:
        """Time the next problem as memory-bound or not (``TimingOptions.memory_bound``)."""
        if memory_bound != self.timing.memory_bound:
            self.timing = replace(self.timing, memory_bound=memory_bound)

    def targets(self, kernel_ref: str, shape: dict[str, int], dtype: str, seed: int) -> bool:
        """Whether this backend is set up for exactly this problem."""
        return (self.kernel_ref, self.shape, self.dtype, self.seed) == (
            kernel_ref, dict(shape), dtype, seed)

    def retarget(self, shape: dict[str, int], *, kernel_ref: str | None = None,
                 dtype: str | None = None, seed: int | None = None) -> None:
        """Measure another problem from now on (another shape of the kernel: a sweep; or
        another kernel, dtype and seed: a worker's next task), with this GPU child and compile
        pool, so that their start (~7 s of CUDA and imports on the H200) is paid once: the
        child sets the new problem up, the pool drops what it compiled for the old one. A
        child that fails the setup is replaced (``WorkerDied`` when a fresh one fails it too,
        e.g. inputs too large)."""
        self.shape = dict(shape)
        self.kernel_ref = kernel_ref or self.kernel_ref
        self.dtype = dtype or self.dtype
        self.seed = self.seed if seed is None else seed
        self.best_ms = None
        self._compiled.clear()
        self._timed_ahead.clear()
        self._ahead.clear()
        self._pending = []
        if self._pool is not None:
            self._pool.retarget(self.shape, self.dtype, self.kernel_ref)
        try:
            self._child.send(("setup", self.kernel_ref, self.shape, self.dtype, self.seed))
            reply = self._child.receive(self.timing.start_timeout_s)
        except (_Timeout, _Died) as exc:
            reply = ("error", str(exc))
        if reply[0] != "ok":
            log.warning("the %s child failed to set up %s: %s", self.kind, self.shape, reply[1])
            self._child.kill()
            self._child = self._start()

    def prefetch(self, configs: Sequence[KernelConfig]) -> None:
        """Compile these ahead, in order, behind the next batch (the pool takes them when the
        next ``measure`` has queued its own configs, so that they never delay it): configs
        the search expects to ask next, most likely first. Their binaries land in Triton's
        cache; a later ``measure`` of one takes its finished compile (or its compile error)
        from here instead of waiting for it. Without a compile pool: nothing."""
        if self._pool is not None:
            self._pending = list(configs)

    def compile_now(self, configs: Sequence[KernelConfig]) -> None:
        """Queue these on the compile pool at once (not behind a batch, as ``prefetch``): the
        first batch's configs, while the search builds its strategy and no batch runs. A
        config compiled already, queued or known from an earlier problem of this
        specialisation is not queued again."""
        if self._pool is not None:
            self._queue_ahead(configs)

    def _submit_ahead(self) -> None:
        pending, self._pending = self._pending, []
        self._queue_ahead(pending)

    def _queue_ahead(self, configs: Sequence[KernelConfig]) -> None:
        """Queue on the pool, behind any batch, the configs not compiled, queued or known
        already (``compile_now``, ``prefetch``'s ``_submit_ahead``)."""
        assert self._pool is not None
        fresh = [c for c in dict.fromkeys(configs) if c not in self._compiled
                 and c not in self._ahead and c not in self._known]
        self._ahead.update(fresh)
        self._pool.submit(fresh)

    def _stash(self, compiled: Compiled) -> None:
        """A compile no batch waits for (compiled ahead, or left from an abandoned batch)."""
        self._ahead.discard(compiled.config)
        self._compiled[compiled.config] = compiled
        self._remember(compiled)

    @property
    def _known(self) -> dict[KernelConfig, Compiled]:
        """The compiles kept for this problem's specialisation (``specialisation_key``),
        found when first needed: finding it loads the kernel here, which the start of the
        child and the pool must not wait for."""
        problem = (self.kernel_ref, self.dtype, tuple(sorted(self.shape.items())))
        if problem != self._known_problem:
            self._known_now = self._compiled_for.setdefault(
                specialisation_key(self.kernel_ref, self.shape, self.dtype), {})
            self._known_problem = problem
        return self._known_now

    def _remember(self, compiled: Compiled) -> None:
        """A compile the pool finished for this problem: counted (``compile_ahead_cpu``,
        ``compiled_ahead``), and kept for later problems of its specialisation when it settles
        the config (in the cache, or refused by the compiler; not a crash of the pool)."""
        if self.clock is not None:
            self.clock.add("compile_ahead_cpu", compiled.seconds)
            self.clock.add("compiled_ahead", 1)
        if compiled.failure is None or _decisive(compiled.failure):
            self._known[compiled.config] = compiled

    def _take_known(self, config: KernelConfig) -> Compiled | None:
        """The compile an earlier problem of this specialisation finished for ``config``,
        counted as ``reused_compiles``; None if there is none."""
        compiled = self._known.get(config)
        if compiled is not None and self.clock is not None:
            self.clock.add("reused_compiles", 1)
        return compiled

    def measure(self, configs: Sequence[KernelConfig],
                on_result: MeasuredCallback | None = None) -> list[Measurement]:
        """Measure a batch; with a compile pool, the GPU times each config as soon as its
        compile finished while the pool compiles the rest (the batch ahead of configs
        compiled ahead; configs compiled ahead already are timed first). Each result goes to
        ``on_result`` as soon as it is known."""
        return self._measure(configs, on_result, every=True)

    def measure_ready(self, configs: Sequence[KernelConfig],
                      on_result: MeasuredCallback | None = None) -> list[Measurement]:
        """As ``measure``, but back as soon as the child would wait for a compile and at
        least one config was measured (``MeasuresAsReady``): the results so far, in the order
        of ``configs``; the others compile on and are taken by the next call that names
        them (from the compiles kept, or as they finish). Without a compile pool: all."""
        return self._measure(configs, on_result, every=False)

    def _measure(self, configs: Sequence[KernelConfig], on_result: MeasuredCallback | None,
                 every: bool) -> list[Measurement]:
        unique = list(dict.fromkeys(configs))
        results: dict[KernelConfig, Measurement] = {}

        def done(m: Measurement) -> None:
            if m.extra.get("measured") != "trial":  # failures made here, and older children
                m = replace(m, extra={**m.extra, "measured": "trial"})
            results[m.config] = m
            if on_result is not None:
                on_result(m)

        if self._pool is None or self._pool.broken:
            for config in unique:
                self._measure_batch([config], done)
            return [results[c] for c in configs]
        for compiled in self._pool.poll(0.0):
            self._stash(compiled)
        wanted = set(unique)
        for config in unique:  # timed ahead while an earlier batch waited: taken as it is
            if config in self._timed_ahead:
                m, compiled = self._timed_ahead.pop(config)
                wanted.discard(config)
                done(replace(m, compile_s=compiled.seconds) if compiled.seconds >= 0 else m)
        ready: deque[Compiled] = deque()
        for config in unique:  # compiled ahead (or for an earlier problem): timed first
            if config not in wanted:
                continue
            if config in self._compiled:
                compiled = self._compiled.pop(config)
            else:
                known = self._take_known(config)
                if known is None:
                    continue
                compiled = replace(known, seconds=-1.0)  # no compile of its own (below)
            if _decisive(compiled.failure):
                wanted.discard(config)
                done(compiled.failure)  # type: ignore[arg-type]
            else:
                ready.append(compiled)
        to_compile = [c for c in unique if c in wanted and c not in {r.config for r in ready}]
        log.debug("measure: %d configs, %d timed ahead, %d compiled, %d to compile (%d of "
                  "them queued or compiling ahead already)", len(unique),
                  len(unique) - len(wanted), len(ready), len(to_compile),
                  sum(c in self._ahead for c in to_compile))
        self._pool.submit(to_compile, first=True)
        self._submit_ahead()
        began = time.perf_counter()
        while len(results) < len(unique):
            if not ready and self.interrupt is not None and self.interrupt():
                raise self._stop_in_flight("waiting for compiles")
            # measure_ready: something measured and nothing ready: a last look, then back
            handing_back = not every and bool(results)
            spare = None if ready or handing_back else self._spare(wanted)
            # a wait while one of the batch's configs is still queued (no pool process free
            # for it) is told apart from one where all are compiling (``tuner.phases``)
            queued = not ready and self.clock is not None and not wanted.isdisjoint(
                self._pool.queued())
            waited = time.perf_counter()
            # while queued, looked at again often: the dispatch takes a queued config soon
            finished = self._pool.poll(0.0 if ready or spare is not None or handing_back
                                       else 0.05 if queued else 0.5)
            if not ready and self.clock is not None:  # the GPU child idle, waiting
                idle = time.perf_counter() - waited
                self.clock.add("compile_wait", idle)
                if queued:
                    self.clock.add("compile_wait_queued", idle)
            for compiled in finished:
                self._ahead.discard(compiled.config)
                if compiled.config not in wanted or compiled.config in results or any(
                        r.config == compiled.config for r in ready):
                    self._stash(compiled)  # compiled ahead, or left from an abandoned batch
                    continue
                self._remember(compiled)
                if _decisive(compiled.failure):
                    wanted.discard(compiled.config)
                    done(compiled.failure)  # type: ignore[arg-type]
                else:
                    ready.append(compiled)
            if ready:  # every config compiled by now: one batch of the child's
                batch = {c.config: c for c in ready}
                log.debug("measure: a batch of %d at %.2f s, %d left to compile", len(batch),
                          time.perf_counter() - began, len(wanted) - len(batch))
                ready.clear()
                wanted.difference_update(batch)

                def pooled(m: Measurement, batch: dict[KernelConfig, Compiled] = batch) -> None:
                    compiled = batch[m.config]
                    step = m.extra.get("compile_step_s")
                    if isinstance(step, float) and step > SLOW_CHILD_COMPILE_S:
                        log.info("the child took %.2f s (%.2f s of its CPU: a compile) to load "
                                 "%s, which the pool had compiled (%.2f s)", step,
                                 m.extra.get("compile_cpu_s") or 0.0, m.config.key(),
                                 compiled.seconds)
                    # a config compiled ahead: the pool's compile time; one compiled for an
                    # earlier problem: the child's own (its load from the cache)
                    done(replace(m, compile_s=compiled.seconds) if compiled.seconds >= 0
                         else m)

                self._measure_batch(list(batch), pooled)
            elif handing_back:
                break
            elif spare is not None and spare.config in self._compiled:
                self._time_ahead(spare)
        log.debug("measure: %d of %d done in %.2f s", len(results), len(unique),
                  time.perf_counter() - began)
        return [results[c] for c in configs if c in results]

    def _spare(self, wanted: set[KernelConfig]) -> Compiled | None:
        """With ``time_ahead``, a config compiled ahead (the search asked for it to be: the
        warm start, the model's next picks), the first whose compile finished, not in this
        batch and not timed yet; None without one."""
        if not self.timing.time_ahead:
            return None
        for config, compiled in self._compiled.items():
            if config not in wanted and compiled.failure is None:
                return compiled
        return None

    def _time_ahead(self, compiled: Compiled) -> None:
        """Time a config compiled ahead while the batch waits for its own compiles (the GPU
        child would idle): its result waits for the ``measure`` that asks for it."""
        self._compiled.pop(compiled.config)

        def keep(m: Measurement) -> None:
            m = replace(m, extra={**m.extra, "measured": "trial", "timed_ahead": True})
            self._timed_ahead[m.config] = (m, compiled)

        self._measure_batch([compiled.config], keep)

    def _measure_batch(self, configs: list[KernelConfig],
                       done: Callable[[Measurement], None]) -> None:
        """Measure ``configs`` as batches of the child's (``measure_many``: each compiled and
        verified, then the verified ones timed one after the other), each result to ``done`` as it
        comes; a config that kills or hangs the child is recorded as such, and the configs of
        its batch left unmeasured go to the fresh child. A ``done`` that raises stops the
        measuring once the child finished its batch (its results are read and dropped, so
        that the next batch does not read them): the error is raised then."""
        raised: list[Exception] = []

        def report(m: Measurement) -> None:  # a callback that raises: the batch is drained
            if not raised:
                try:
                    done(m)
                except Exception as exc:  # noqa: BLE001 - raised once the child is idle
                    raised.append(exc)

        left = configs
        while left and not raised:
            left = self._child_batch(left, report)
        if raised:
            raise raised[0]

    def _child_batch(self, configs: list[KernelConfig],
                     done: Callable[[Measurement], None]) -> list[KernelConfig]:
        """One batch on the child; the configs it left without a result (it died, hung or
        reported a sticky error, and was restarted)."""
        stage = ["compile"] * len(configs)  # -> "verify" -> "time" -> "done", per config
        compile_s: list[float | None] = [None] * len(configs)
        t0 = time.perf_counter()

        def current() -> int:  # the config the child works on: its batch's order, then timing
            for want in (("compile", "verify"), ("time",)):
                for i, st in enumerate(stage):
                    if st in want:
                        return i
            raise AssertionError("no config left in the batch")

        def failed(outcome: Outcome, why: str) -> list[KernelConfig]:
            i = current()
            phase = "compile" if stage[i] == "compile" else "run"
            timed_out = outcome is Outcome.TIMEOUT
            error = f"{phase} timed out: {why}" if timed_out else why
            stage[i] = "done"
            self.consecutive_deaths += 1
            left = [c for c, st in zip(configs, stage, strict=True) if st != "done"]
            self._restart(f"{configs[i].key()} {'hung' if timed_out else 'killed the child'}: "
                          f"{why}")
            done(Measurement(configs[i], outcome, error=error[:4000], compile_s=compile_s[i]))
            return left

        try:
            self._child.send(("measure", configs, self.timing, self.best_ms))
            while any(st != "done" for st in stage):
                i = current()
                timeout = (self.timing.compile_timeout_s if stage[i] == "compile" else
                           self.timing.run_timeout_s + (self._settle_s if stage[i] == "time"
                                                        else 0.0))
                try:
                    reply = self._child.receive(timeout, self.interrupt)
                finally:
                    now = time.perf_counter()
                    self._clock_add(_STAGE_PHASE[stage[i]], now - t0)
                    t0 = now
                if reply[0] == "compiled":
                    stage[reply[1]], compile_s[reply[1]] = "verify", reply[2]
                elif reply[0] == "verified":
                    stage[reply[1]] = "time"
                elif reply[0] == "result":
                    _, j, measurement, sticky = reply
                    stage[j] = "done"
                    self._count_warmups(measurement)
                    if sticky:  # the context is unusable from now on
                        self.consecutive_deaths += 1
                        left = [c for c, st in zip(configs, stage, strict=True) if st != "done"]
                        self._restart(f"{configs[j].key()} left a sticky CUDA error")
                        done(measurement)
                        return left
                    self.consecutive_deaths = 0
                    if measurement.ok and not measurement.extra.get("quick") and (
                            measurement.p50_ms and (self.best_ms is None
                                                    or measurement.p50_ms < self.best_ms)):
                        self.best_ms = measurement.p50_ms
                    self._clock_add("timing_child", float(measurement.extra.get("time_s", 0.0)))
                    done(measurement)
                    # what ``done`` took (storing the trial: its own phase) is not the child's
                    t0 = time.perf_counter()
                else:  # the child's own machinery failed; be safe: a fresh child
                    return failed(Outcome.CRASH, str(reply[1]))
        except _Interrupted:
            raise self._stop_in_flight(f"measuring {configs[current()].key()}") from None
        except _Timeout as exc:
            return failed(Outcome.TIMEOUT, str(exc))
        except _Died as exc:
            return failed(Outcome.CRASH, str(exc))
        return []

    def retime(self, configs: Sequence[KernelConfig], rounds: int,
               baseline: bool = False) -> list[Measurement]:
        """Re-time configs that already ran, interleaved in the child, and with ``baseline``
        the kernel's baseline beside them (appended last, when the kernel has one); [] (the
        caller keeps its first timings) if that fails, after replacing the child."""
        if not configs:
            return []
        entries = len(configs) + (1 if baseline else 0)
        limit = self.timing.run_timeout_s * entries * max(1, rounds) / 4
        t0 = time.perf_counter()
        try:
            self._child.send(("retime", list(configs), rounds, self.timing, baseline))
            reply = self._child.receive(max(limit, self.timing.run_timeout_s) + self._settle_s,
                                        self.interrupt)
        except _Interrupted:
            raise self._stop_in_flight("re-timing the finalists") from None
        except (_Timeout, _Died) as exc:
            reply = ("error", str(exc))
        finally:
            self._clock_add("retiming", time.perf_counter() - t0)
        if reply[0] != "results":
            log.warning("re-timing the finalists failed: %s", reply[1])
            self._restart(f"re-timing failed: {reply[1]}")
            return []
        results = list(reply[1])
        if results:
            self._count_warmups(results[0])
        return results

    def calibrate(self, runs: int | None = None) -> dict[str, float | None]:
        """The device's copy bandwidth (GB/s) and matmul ceiling (TFLOP/s), each the median
        of ``runs`` runs (the child's default: 5) with its spread (``copy_gbps_spread``,
        ``matmul_tflops_spread``: (max - min) / median) and ``runs``; None where the kind
        cannot tell (the interpreter), {} where calibrating failed."""
        try:
            self._child.send(("calibrate", runs or CALIBRATION_RUNS, self.timing))
            reply = self._child.receive(max(600.0, self.timing.run_timeout_s) + self._settle_s)
        except (_Timeout, _Died) as exc:
            self._restart(f"calibration failed: {exc}")
            return {}
        if reply[0] != "calibration":
            log.warning("calibration failed: %s", reply[1])
            if is_sticky(str(reply[1])):
                self._restart(f"calibration failed: {reply[1]}")
            return {}
        return dict(reply[1])

    def _count_warmups(self, measurement: Measurement) -> None:
        """The child's warm-ups behind ``measurement`` (``extra["warmups"]``), on the task's
        clock (``tuner.phases.COUNTS``)."""
        counts = measurement.extra.get("warmups")
        if self.clock is not None and isinstance(counts, dict):
            for name in ("long", "short", "redone"):
                if counts.get(name):
                    self.clock.add(f"warmups_{name}", counts[name])

    def _clock_add(self, phase: str, seconds: float) -> None:
        if self.clock is not None:
            self.clock.add(phase, seconds)

    def close(self) -> None:
        try:
            if self._pool is not None:
                self._pool.close()
        finally:
            self._child.close()
