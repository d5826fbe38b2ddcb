"""The measuring child process: verifies a batch of configs, then times them in turn.

It runs in a process of its own (spawned, in its own process group) so that a config that
crashes, hangs or leaves a sticky CUDA error kills only this process. Being in a group of its
own, it would not die with its parent's group: ``die_with_parent`` makes it (and the compile
pool's processes) exit as soon as the process that started it is gone, freeing the GPU. The
parent talks to it over a Pipe; every message is a tuple whose first item names it:

parent -> child: ("setup", kernel_ref, shape, dtype, seed)
                 | ("measure", [config, ...], timing[, best_ms])
                 | ("retime", configs, rounds, timing[, baseline]) | ("selftest",)
                 | ("calibrate"[, runs[, timing]])
child -> parent: ("ready", fingerprint, {step: monotonic time}) | ("ok",)
                 | ("compiled", i, seconds) | ("verified", i) | ("result", i, measurement, sticky)
                 | ("results", [measurement]) | ("error", text)
                 | ("calibration", {...})

Every timing follows the protocol of ``tuner/gpu_state.py`` (settled sustained state) and
carries the GPU's state (``extra["gpu"]``) on a GPU, and is taken with its options' timing method
(``tuner/timing.py``: ``eager-flushed``, ``cuda-graph``, ``eager-hot``), which it names
(``extra["timing"]``).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import math
import os
import signal
import statistics
import sys
import threading
import time
import traceback
from collections.abc import Callable
from functools import partial
from itertools import cycle
from typing import Any

from tuner.backends.base import TimingOptions
from tuner.backends.compiler_output import captured_stdout, pass_on
from tuner.config import KernelConfig
from tuner.gpu_state import (
    GpuMonitor,
    GpuSample,
    cool_down,
    merge_samples,
    monitor_for_torch_device,
    settle,
)
from tuner.launching import output_tensor
from tuner.measurement import Measurement, Outcome
from tuner.timing import (
    CUDA_GRAPH,
    DEFAULT_TIMING,
    EAGER_FLUSHED,
    EAGER_HOT,
    interpreter_refusal,
)

#: CUDA errors after which the context is unusable: the child must be replaced.
STICKY_CUDA_ERRORS = (
    "illegal memory access", "an illegal instruction", "misaligned address",
    "unspecified launch failure", "device-side assert", "cudaErrorIllegalAddress",
    "CUDA_ERROR_ILLEGAL_ADDRESS", "CUDA_ERROR_LAUNCH_FAILED", "CUDA_ERROR_MISALIGNED_ADDRESS",
    "operation not permitted when stream is capturing", "CUDA error: unknown error",
)


#: NVML's throttle-reason bits that mean the power limiter holds the clock
#: (``tuner.gpu_state.THROTTLE_REASONS``: sw_power_cap, hw_power_brake_slowdown)
POWER_CAP_REASONS = 0x4 | 0x80


def is_sticky(text: str) -> bool:
    return any(marker.lower() in text.lower() for marker in STICKY_CUDA_ERRORS)


#: exception types, for ``isinstance``
ErrorTypes = tuple[type[BaseException], ...]


@functools.cache
def triton_error_types() -> tuple[ErrorTypes, ErrorTypes]:
    """Triton's own exception types: those meaning the config asks for more than the hardware
    has (``OutOfResources``), and those meaning it does not compile (``CompilationError``, with
    its ``CompileTimeAssertionFailure`` and ``UnsupportedLanguageConstruct``, and
    ``PTXASError``). ``triton.runtime.errors`` and ``triton.compiler.errors`` hold them in
    Triton 3.6 (the GPU machine's) and 3.9 alike. Without Triton, none (nothing raises them)."""
    try:
        from triton.compiler.errors import CompilationError
        from triton.runtime.errors import OutOfResources, PTXASError
    except ImportError:
        return (), ()
    return (OutOfResources,), (CompilationError, PTXASError)


def classify_exception(exc: BaseException) -> Outcome:
    """What a config's failure was: by Triton's own exception types; by its text only where a
    failure reaches us without a type of its own (each such check says which)."""
    from tuner.errors import InvalidConfig

    if isinstance(exc, InvalidConfig):  # the kernel's own pruning (prune_configs_by)
        return Outcome.PRUNED
    out_of_resources, compile_errors = triton_error_types()
    text = f"{type(exc).__name__}: {exc}"
    # the text: an OutOfResources whose message was re-raised inside another exception (by a
    # kernel's own launch code) has lost its type
    if isinstance(exc, out_of_resources) or "out of resource" in text.lower():
        return Outcome.OUT_OF_RESOURCES
    # no type at all: CUDA's errors reach Python as RuntimeError (torch's, Triton's launcher's)
    # whose text names the error (STICKY_CUDA_ERRORS)
    if is_sticky(text):
        return Outcome.CRASH
    # the text: a ptxas failure whose message was re-raised inside another exception (a
    # kernel's launch code, the interpreter's InterpreterError) has lost its PTXASError
    if isinstance(exc, compile_errors) or "PTXAS" in text.upper():
        return Outcome.COMPILE_ERROR
    return Outcome.CRASH


class ChildState:
    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.kernel: Any = None
        self.shape: dict[str, int] = {}
        self.dtype = ""
        self.seed = 0
        self.counter = 0
        #: NVML's view of this child's GPU (opened on first use; cuda only)
        self.monitor: GpuMonitor | None = None
        #: whether the GPU was brought to its sustained state for this task, and when it last
        #: finished timing (monotonic seconds): an idle GPU is settled again
        self.settled = False
        self.last_busy = 0.0
        #: the last full timing's warm-up (ms) and the GPU's idle time before it (s; None
        #: before the first), recorded with each trial
        self.warmup_ms: float | None = None
        self.idle_s: float | None = None
        #: the GPU's power after this task's last full timing was under the quiet share of
        #: its limit, with no power-cap throttle (``TimingOptions.memory_bound``)
        self.quiet = False
        self._power_limit_w: float | None = None
        #: full timings by warm-up since the parent last took the counts
        #: (``tuner.phases.COUNTS``: long, short, redone)
        self.warmups: dict[str, int] = dict.fromkeys(("long", "short", "redone"), 0)

    def take_warmups(self) -> dict[str, int]:
        """The warm-up counts since the last call, and zero them."""
        taken, self.warmups = self.warmups, dict.fromkeys(self.warmups, 0)
        return taken

    def power_pressed(self, timing: TimingOptions) -> bool:
        """Whether the GPU's power now is over ``quiet_power_frac`` of its limit or capped
        (throttled for power); True where NVML cannot say (be safe: warm up)."""
        sample = self.gpu_sample()
        if sample is None or sample.get("power_w") is None:
            return True
        if self._power_limit_w is None and self.monitor is not None:
            self._power_limit_w = self.monitor.power_limit_w()
        if not self._power_limit_w:
            return True
        throttle = int(sample.get("throttle") or 0)
        return (float(sample["power_w"] or 0.0) >= timing.quiet_power_frac * self._power_limit_w
                or bool(throttle & POWER_CAP_REASONS))

    @property
    def device(self) -> str:
        return "cuda" if self.kind == "cuda" else "cpu"

    def gpu_sample(self) -> GpuSample | None:
        """The GPU's state now; None on the interpreter (no GPU state at all)."""
        if self.kind != "cuda":
            return None
        if self.monitor is None:
            self.monitor = monitor_for_torch_device(0)
        return self.monitor.sample()

    def sync(self) -> None:
        if self.kind == "cuda":
            import torch

            torch.cuda.synchronize()


def _output_names(inputs: dict[str, Any]) -> tuple[str, ...]:
    """The inputs the kernel writes: ``"out"``, or the names listed under ``"_outputs"``."""
    return tuple(inputs.get("_outputs") or ("out",))


def _verify(state: ChildState, config: KernelConfig, inputs: dict[str, Any]) -> str | None:
    """Poison the outputs, run once, compare with the reference. None when right, else why."""
    names = _output_names(inputs)
    for name in names:
        output_tensor(inputs[name]).fill_(float("nan"))
    state.kernel.launch(config, inputs)
    state.sync()
    from tuner.errors import WrongOutput

    try:
        refs = state.kernel.reference(inputs)
    except WrongOutput as exc:  # what the outputs are checked against cannot be trusted
        return str(exc)
    refs = refs if isinstance(refs, tuple | list) else (refs,)
    if len(refs) != len(names):
        return f"the reference gave {len(refs)} output(s); the kernel writes {len(names)}"
    worst = 0.0
    for name, ref in zip(names, refs, strict=True):
        label = "" if len(names) == 1 else f"output {name}: "
        wrong = _compare(state, output_tensor(inputs[name]), ref, label)
        if isinstance(wrong, str):
            return wrong
        worst = max(worst, wrong)
    inputs["_max_error"] = worst
    return None


def _compare(state: ChildState, got: Any, ref: Any, label: str) -> str | float:
    """Why ``got`` is not ``ref`` under the kernel's tolerance and declared output check
    (``tuner/verification.py``: errors against the reference's scale, per row for row-wise
    kernels, no bias, declared invariants), else the largest absolute error."""
    from tuner.kernel import output_check_of
    from tuner.verification import compare

    return compare(got, ref, state.kernel.tolerance(state.dtype), state.dtype,
                   output_check_of(state.kernel), label)


def _time(state: ChildState, config: KernelConfig, inputs: dict[str, Any],
          timing: TimingOptions, best_ms: float | None = None
          ) -> tuple[float, float, float, bool]:
    """p20/p50/p80 in ms, and whether only the quick timing was done (adaptive timing). A
    trial's timing is ``guarded``: back to back in its batch, it keeps the short warm-up
    only while the power limiter is not engaged (``_full_warmup_ms``)."""
    return _time_fn(state, lambda: state.kernel.launch(config, inputs), timing, best_ms,
                    guarded=True)


def timing_method(timing: TimingOptions) -> str:
    """The timing method ``timing`` asks for (``tuner/timing.py``; an empty one: the
    default)."""
    return timing.method or DEFAULT_TIMING


def _time_fn(state: ChildState, fn: Callable[[], Any], timing: TimingOptions,
             best_ms: float | None = None, guarded: bool = False
             ) -> tuple[float, float, float, bool]:
    """``_time`` of any callable (a config's launch, the kernel's baseline). ``guarded`` (a
    trial's timing): the GPU's power is read after the timing, and a timing taken with the
    short warm-up that finds the limiter engaged is taken again with the long one."""
    method = timing_method(timing)
    if state.kind == "cuda":
        from tuner.gpu_timer import bench

        # eager-flushed (the default): do_bench flushes L2 (writes a 256 MB buffer) before
        # every timed run, so timings are cold-cache even for problems that fit in L2;
        # rotating input buffers is not needed. It also lets the host get ahead before each
        # run (tuner/gpu_timer.py), so that a config of several small launches is timed on the
        # GPU, not on the Python host. eager-hot: the same without the flush; cuda-graph:
        # launches captured in a CUDA graph, replayed (tuner/timing.py).
        quick_rep = timing.quick_rep_ms
        if quick_rep > 0 and best_ms is not None and quick_rep < timing.rep_ms:
            q = bench(method, fn, warmup=max(quick_rep / 5, 0.5), rep=quick_rep)
            if float(q[1]) > timing.quick_factor * best_ms:
                return float(q[0]), float(q[1]), float(q[2]), True
        idle_s = time.monotonic() - state.last_busy if state.last_busy else None
        back_to_back = idle_s is not None and idle_s < timing.settle_gap_s
        state.idle_s, state.warmup_ms = idle_s, _full_warmup_ms(timing, idle_s, state.quiet,
                                                                guarded)
        q = bench(method, fn, warmup=state.warmup_ms, rep=timing.rep_ms)
        long = state.warmup_ms >= timing.settle_warmup_ms
        state.warmups["long" if long else "short"] += 1
        # a memory-bound problem's timing after a gap, and every trial's: the power decides
        # the next one's warm-up, and one taken without it at high power is taken again with
        # it (a re-timing's rounds, back to back: nothing to check)
        if timing.settles and (guarded or (timing.memory_bound and not back_to_back)):
            pressed = state.power_pressed(timing)
            if pressed and not long:
                state.warmup_ms = timing.settle_warmup_ms
                q = bench(method, fn, warmup=state.warmup_ms, rep=timing.rep_ms)
                state.warmups["redone"] += 1
            state.quiet = not pressed
        return float(q[0]), float(q[1]), float(q[2]), False
    # The interpreter's wall time says nothing about a GPU; it is recorded only so that the
    # whole pipeline runs. Results from it are stored under the interpreter's own device key,
    # as timed with the eager method asked for; it cannot replay CUDA graphs.
    refusal = interpreter_refusal(method)
    if refusal is not None:
        raise RuntimeError(refusal)
    samples = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e3)
    samples.sort()
    return samples[0], samples[1], samples[2], False


def _compile(state: ChildState, config: KernelConfig, inputs: dict[str, Any]) -> None:
    """The kernel's optional ``compile`` hook, on a GPU (without one, or on the interpreter,
    the first launch compiles)."""
    from tuner.kernel import compile_hook

    compile_fn = compile_hook(state.kernel)
    if compile_fn is not None and state.kind == "cuda":
        compile_fn(config, inputs)


def settle_due(state: ChildState, timing: TimingOptions, now: float | None = None) -> bool:
    """Whether the GPU must be brought to its sustained state before the next timing: on a
    GPU, with settling on, before the task's first timing and after ``resettle_idle_s`` idle."""
    if state.kind != "cuda" or not _settles(timing):
        return False
    idle_s = timing.resettle_idle_s
    now = time.monotonic() if now is None else now
    return not state.settled or (idle_s > 0 and now - state.last_busy > idle_s)


def _settles(timing: TimingOptions) -> bool:
    """Whether ``timing`` asks for the long settle (the settled protocol with
    ``settle_max_ms`` > 0)."""
    return timing.settles and timing.settle_max_ms > 0


def _full_warmup_ms(timing: TimingOptions, idle_s: float | None = None,
                    quiet: bool = False, guarded: bool = False) -> float:
    """do_bench's warm-up for a full timing: the settled protocol's sustained-state warm-up,
    unless the GPU finished a timing under ``settle_gap_s`` ago (``idle_s``): back-to-back
    timings (a re-timing's rounds) keep it at the sustained clock; or unless the problem is
    memory-bound and the power stayed quiet after the previous full timing (``quiet``:
    ``TimingOptions.memory_bound``).

    ``guarded`` (the trials of a batch, back to back): the short warm-up only while the power
    stayed quiet after the previous timing. Back to back is not enough there: the previous
    config may have drawn less power than this one, and right after a lighter load (a 2048^3
    GEMM at 1980 MHz, under the limiter) 8192^3's timing with a 10 ms warm-up ran 0.922x of
    its sustained time, with 100 ms 1.015x (``bench/results/gap_probe_h100.md``, gap 0); a
    timing whose power then shows the limiter engaged is taken again with the long warm-up
    (``_time_fn``). The finalists of a re-timing are near-equal configs: not guarded."""
    warmup = timing.warmup_ms
    if not timing.settles:
        return warmup
    if idle_s is not None and idle_s < timing.settle_gap_s:
        return warmup if quiet or not guarded else max(warmup, timing.settle_warmup_ms)
    if timing.memory_bound and quiet:
        return warmup
    return max(warmup, timing.settle_warmup_ms)


def _cool(state: ChildState, timing: TimingOptions) -> dict[str, Any] | None:
    """With the ``cool`` protocol on a GPU, idle until the power is far from the cap
    (``tuner/gpu_state.cool_down``); what was done, else None."""
    if state.kind != "cuda" or timing.protocol != "cool":
        return None
    if state.monitor is None:
        state.monitor = monitor_for_torch_device(0)
    return cool_down(state.monitor, timing)


def _settle(state: ChildState, load: Callable[[], Any],
            timing: TimingOptions) -> dict[str, Any]:
    """Run ``load`` until the GPU's clock settles (tuner/gpu_state.py); what was done."""
    if state.monitor is None:
        state.monitor = monitor_for_torch_device(0)
    done = settle(load, state.sync, state.monitor, timing)
    state.settled, state.last_busy = True, time.monotonic()
    return done


def _timed_extra(state: ChildState, before: GpuSample | None,
                 settled: dict[str, Any] | None,
                 cooled: dict[str, Any] | None = None) -> dict[str, Any]:
    """The GPU state after (and before) a timing, and the settling that preceded it."""
    after = state.gpu_sample()
    state.last_busy = time.monotonic()
    extra: dict[str, Any] = {}
    if after is not None:
        extra["gpu"] = after
    if before is not None:
        extra["gpu_before"] = before
    if settled is not None:
        extra["settle"] = settled
    if cooled is not None:
        extra["cool"] = cooled
    return extra


@dataclasses.dataclass
class _Verified:
    """A config of a batch that compiled and verified, waiting for its timing."""

    index: int
    config: KernelConfig
    compile_s: float
    step: dict[str, Any]


def measure_many(state: ChildState, configs: list[KernelConfig], timing: TimingOptions,
                 send: Callable[[tuple[Any, ...]], None],
                 best_ms: float | None = None) -> None:
    """Compile and verify every config of a batch on one set of inputs, then time the verified
    ones back to back. Sends, for config ``i`` of ``configs``: ``("compiled", i, seconds)``
    once its binary is loaded (or compiled), ``("verified", i)`` once it passed verification,
    and ``("result", i, measurement, sticky)`` with its outcome: a failure at once, a timing
    once taken. A sticky CUDA error ends the batch there (the configs without a result were
    not measured: the parent measures them on a fresh child).

    One after the other: a timing that starts under ``settle_gap_s`` after the previous one
    keeps the short warm-up only while the power after that one was quiet (``guarded``,
    ``_full_warmup_ms``: right after a lighter config a power-capped winner timed 4-14%
    fast), so where the power limiter is idle only the batch's first timing pays the
    sustained-state warm-up; timed one at a time, each config's inputs, load and verification
    left the GPU idle long enough to regain its boost clock, and every trial paid it."""
    state.counter += 1
    t0 = time.perf_counter()
    try:
        inputs = state.kernel.make_inputs(state.shape, state.dtype, state.device,
                                          state.seed + state.counter)
    except Exception as exc:  # noqa: BLE001 - every failure becomes an outcome
        for i, config in enumerate(configs):
            send(("result", i, _failure(config, exc), False))
        return
    inputs_s = time.perf_counter() - t0
    verified: list[_Verified] = []
    for i, config in enumerate(configs):
        with captured_stdout() as printed:
            failure, sticky, ready = _compile_and_verify(state, i, config, inputs, send)
        pass_on(printed.getvalue(), failure is not None, config.key())
        if failure is not None:
            send(("result", i, failure, sticky))
            if sticky:
                return
            continue
        assert ready is not None
        # the batch's inputs were made once: the first config's step counts them
        ready.step["inputs_s"] = round(inputs_s if not verified else 0.0, 4)
        ready.step["max_error"] = inputs.get("_max_error")
        verified.append(ready)
    for ready in verified:
        with captured_stdout() as printed:
            m, sticky = _timed(state, ready, inputs, timing, best_ms)
        pass_on(printed.getvalue(), not m.ok, ready.config.key())
        send(("result", ready.index, m, sticky))
        if sticky:
            return
        if m.ok and not m.extra.get("quick") and m.p50_ms and (
                best_ms is None or m.p50_ms < best_ms):
            best_ms = m.p50_ms


def _compile_and_verify(state: ChildState, index: int, config: KernelConfig,
                        inputs: dict[str, Any], send: Callable[[tuple[Any, ...]], None]
                        ) -> tuple[Measurement | None, bool, _Verified | None]:
    """Compile (or load) and verify one config of a batch: its failure and whether it was
    sticky, else what its timing needs."""
    t0, cpu0 = time.perf_counter(), time.process_time()
    try:
        _compile(state, config, inputs)
    except Exception as exc:  # noqa: BLE001 - every failure becomes an outcome
        return _failure(config, exc), False, None
    compile_s = time.perf_counter() - t0
    compile_cpu_s = time.process_time() - cpu0  # a compile's passes run here; a load is I/O
    send(("compiled", index, compile_s))
    try:
        wrong = _verify(state, config, inputs)
    except Exception as exc:  # noqa: BLE001
        m = _failure(config, exc, compile_s)
        return m, is_sticky(m.error or ""), None
    if wrong:
        return Measurement(config, Outcome.WRONG_RESULT, error=wrong,
                           compile_s=compile_s), False, None
    send(("verified", index))
    return None, False, _Verified(index, config, compile_s, {
        "compile_step_s": round(compile_s, 4),  # the child's own: the binary's load
        "compile_cpu_s": round(compile_cpu_s, 4)})


def _timed(state: ChildState, ready: _Verified, inputs: dict[str, Any], timing: TimingOptions,
           best_ms: float | None) -> tuple[Measurement, bool]:
    """Time a verified config (the GPU settled first when due, ``settle_due``, with it as the
    load): its measurement and whether it failed with a sticky error."""
    config, compile_s = ready.config, ready.compile_s
    try:
        settled = None
        if settle_due(state, timing):
            settled = _settle(state, lambda: state.kernel.launch(config, inputs), timing)
        cooled = _cool(state, timing)
        t0 = time.perf_counter()
        before = state.gpu_sample()
        p20, p50, p80, quick = _time(state, config, inputs, timing, best_ms)
        extra = _timed_extra(state, before, settled, cooled)
        extra["time_s"] = round(time.perf_counter() - t0, 4)  # the GPU's state read too
    except Exception as exc:  # noqa: BLE001
        m = _failure(config, exc, compile_s)
        return m, is_sticky(m.error or "")
    if not all(math.isfinite(v) and v > 0 for v in (p20, p50, p80)):
        return Measurement(config, Outcome.CRASH, error=f"timer returned {p20, p50, p80}",
                           compile_s=compile_s), False
    step = dict(ready.step)
    max_error = step.pop("max_error", None)
    extra["measured"] = "trial"
    extra["timing"] = timing_method(timing)
    extra.update(step)
    extra["warmups"] = state.take_warmups()
    if quick:
        extra["quick"] = True
    elif state.warmup_ms is not None:  # the warm-up it had, after how long idle
        extra["warmup_ms"] = state.warmup_ms
        if state.idle_s is not None:
            extra["idle_s"] = round(state.idle_s, 4)
    return Measurement(config, Outcome.OK, p20_ms=p20, p50_ms=p50, p80_ms=p80,
                       compile_s=compile_s, max_error=max_error, extra=extra), False


def _failure(config: KernelConfig, exc: BaseException, compile_s: float | None = None
             ) -> Measurement:
    text = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    return Measurement(config, classify_exception(exc), error=text[-4000:], compile_s=compile_s)


#: what a re-timed baseline is called in ``extra["baseline"]``
BASELINE_LABEL = "torch"


def _baseline_fn(state: ChildState, inputs: dict[str, Any],
                 timing: TimingOptions) -> Callable[[], Any] | None:
    """The kernel's ``baseline(inputs)`` hook as a callable, if it has one that runs here (it
    is tried once, and with ``cuda-graph`` timing captured once: a baseline that fails is left
    out rather than failing the re-timing)."""
    from tuner.kernel import baseline_hook

    hook = baseline_hook(state.kernel)
    if hook is None:
        return None
    try:
        hook(inputs)
        state.sync()
        if state.kind == "cuda" and timing_method(timing) == CUDA_GRAPH:
            from tuner.gpu_timer import capture_graph

            capture_graph(lambda: hook(inputs), 1).reset()  # one it cannot capture: left out
    except Exception as exc:  # noqa: BLE001 - no baseline, the finalists are still re-timed
        if is_sticky(str(exc)):
            raise
        return None
    return lambda: hook(inputs)


#: medians closer than this (relative) are a tie: more rounds would only pick between
#: configs whose difference does not matter (``separated``)
RETIME_TIE = 0.005


def separated(timings: list[list[float]], tie: float = RETIME_TIE,
              paired: bool = False) -> bool:
    """Whether more rounds could not change which entry wins by more than ``tie``: the entry
    of the lowest median was timed faster in every round than each other entry in any round
    (``paired``, the rounds interleaved run by run so that a drift moves every entry of a
    round alike: faster than each other entry in the same round), or their medians are within
    ``tie`` of each other (each list: one entry's timings so far, round by round); True for
    one entry."""
    if len(timings) <= 1:
        return True
    medians = [statistics.median(t) for t in timings]
    lead = min(range(len(timings)), key=medians.__getitem__)
    slowest_lead = max(timings[lead])

    def ahead(t: list[float]) -> bool:
        if paired:
            return all(a < b for a, b in zip(timings[lead], t, strict=True))
        return slowest_lead < min(t)

    return all(ahead(t) or medians[i] <= medians[lead] * (1 + tie)
               for i, t in enumerate(timings) if i != lead)


def interleaves(state: ChildState, timing: TimingOptions) -> bool:
    """Whether a re-timing's rounds time their entries interleaved run by run
    (``gpu_timer.do_bench_interleaved``): asked for (``TimingOptions.retime_interleaved``),
    on a GPU, with an eager method and without the ``cool`` protocol's idle before each
    timing (a graph replay, or a cool-down per entry, is timed entry by entry)."""
    return (timing.retime_interleaved and state.kind == "cuda"
            and timing_method(timing) in (EAGER_FLUSHED, EAGER_HOT)
            and timing.protocol != "cool")


def _round(state: ChildState, fns: list[Callable[[], Any]], timing: TimingOptions) -> list[float]:
    """One interleaved round of a re-timing: each callable's median, in order (its warm-up as
    ``_time_fn``'s: the sustained-state one unless the GPU was busy a moment ago)."""
    from tuner.gpu_timer import do_bench_interleaved

    idle_s = time.monotonic() - state.last_busy if state.last_busy else None
    state.idle_s, state.warmup_ms = idle_s, _full_warmup_ms(timing, idle_s, state.quiet)
    state.warmups["long" if state.warmup_ms >= timing.settle_warmup_ms else "short"] += 1
    out = do_bench_interleaved(fns, warmup=state.warmup_ms, rep=timing.rep_ms,
                               flush=timing_method(timing) == EAGER_FLUSHED)
    return [q[1] for q in out]


def retime(state: ChildState, configs: list[KernelConfig], rounds: int,
           timing: TimingOptions, baseline: bool = False,
           interleave: bool | None = None) -> list[Measurement]:
    """Interleave: every round times every config once (and then the kernel's baseline, with
    ``baseline``), so drift hits all of them alike. The GPU is settled first, with all of them
    in turn as the load. One measurement per config, in order, then the baseline's
    (``KernelConfig({})``, ``extra["baseline"]``) when asked for and the kernel has one.
    ``rounds`` is the most: after ``timing.retime_min_rounds`` the rounds stop once the
    fastest config is ``separated`` from the other configs (``extra["rounds"]`` says how many
    ran). Each round's timing runs ``timing.retime_rep_ms`` (else ``rep_ms``) per entry; asked
    to (``interleaves``), a round times its entries interleaved run by run, so the clock's
    drift over a round hits every entry alike and ``separated`` compares them round by round
    (``interleave``: force it on or off, as ``bench/retime_pairing_probe.py`` does)."""
    if timing.retime_rep_ms > 0:
        timing = dataclasses.replace(timing, rep_ms=timing.retime_rep_ms)
    inputs = state.kernel.make_inputs(state.shape, state.dtype, state.device, state.seed)
    entries: list[tuple[KernelConfig, Callable[[], Any], dict[str, Any]]] = [
        (c, partial(state.kernel.launch, c, inputs), {}) for c in configs]
    base = _baseline_fn(state, inputs, timing) if baseline else None
    if base is not None:
        entries.append((KernelConfig({}), base, {"baseline": BASELINE_LABEL}))
    settled = None
    if state.kind == "cuda" and _settles(timing):
        turn = cycle([fn for _, fn, _ in entries])
        settled = _settle(state, lambda: next(turn)(), timing)
    medians: list[list[float]] = [[] for _ in entries]
    gpu: list[list[GpuSample]] = [[] for _ in entries]
    cooled: list[float] = []
    paired = interleaves(state, timing) if interleave is None else interleave
    for done_rounds in range(1, rounds + 1):
        if paired:
            values = _round(state, [fn for _, fn, _ in entries], timing)
            state.last_busy = time.monotonic()
            sample = state.gpu_sample()
            for i, value in enumerate(values):
                medians[i].append(value)
                if sample is not None:
                    gpu[i].append(sample)
        else:
            for i, (_config, fn, _extra) in enumerate(entries):
                done = _cool(state, timing)
                if done is not None:
                    cooled.append(done["ms"])
                medians[i].append(_time_fn(state, fn, timing)[1])
                state.last_busy = time.monotonic()
                sample = state.gpu_sample()
                if sample is not None:
                    gpu[i].append(sample)
        if done_rounds >= max(1, timing.retime_min_rounds) and timing.retime_min_rounds and (
                separated(medians[:len(configs)], paired=paired)):
            break
    state.last_busy = time.monotonic()
    out: list[Measurement] = []
    warmups = state.take_warmups()
    for (config, _fn, extra), values, samples in zip(entries, medians, gpu, strict=True):
        extra = {**extra, "measured": "retimed", "rounds": len(values),
                 "timing": timing_method(timing)}
        if paired:
            extra["interleaved"] = True
        if not out:  # the re-timing's warm-ups, counted once
            extra["warmups"] = warmups
        if samples:
            extra["gpu"] = merge_samples(samples)
        if settled is not None:
            extra["settle"] = settled
        if cooled:
            extra["cool"] = {"ms": sum(cooled), "waits": len(cooled)}
        p20, p50, p80 = _quantiles(values)
        out.append(Measurement(config, Outcome.OK, p20_ms=p20, p50_ms=p50, p80_ms=p80,
                               extra=extra))
    return out


def _quantiles(values: list[float]) -> tuple[float, float, float]:
    """p20, p50 and p80 of per-round medians."""
    values = sorted(values)
    if len(values) == 1:
        return values[0], values[0], values[0]
    q = statistics.quantiles(values, n=5, method="inclusive")
    return q[0], statistics.median(values), q[-1]


def selftest(state: ChildState) -> None:
    """A small known-good computation: fails loudly if the device is unusable."""
    import torch

    x = torch.arange(1024, device=state.device, dtype=torch.float32)
    y = (x + 1).sum().item()
    if y != 1024 * 1025 / 2:
        raise RuntimeError(f"self-test computed {y}, expected {1024 * 1025 / 2}")


#: calibration runs: each ceiling is the median of this many, with its spread
CALIBRATION_RUNS = 3
#: the vendor GEMMs (M, N, K) the matmul ceiling is the best median of, in each 16-bit dtype
CALIBRATION_GEMMS = ((8192, 8192, 8192), (8192, 8192, 16384))
#: do_bench's measuring time per calibration run (ms): a 1 GiB copy or an 8192^3 GEMM runs
#: 0.5-2 ms, so each run's median is over 25-100 launches
CALIBRATION_REP_MS = 50.0
CALIBRATION_DTYPES = ("bfloat16", "float16")


def median_spread(samples: list[float]) -> tuple[float, float]:
    """The median of repeated runs and their spread, (max - min) / median."""
    if not samples:
        raise ValueError("no samples")
    mid = statistics.median(samples)
    return mid, (max(samples) - min(samples)) / mid if mid else 0.0


def best_median(samples: dict[Any, list[float]]) -> tuple[float, float]:
    """The highest median among several candidates' runs (the fastest vendor GEMM), with the
    spread of that candidate's runs."""
    return max(median_spread(runs) for runs in samples.values() if runs)


def calibrate(state: ChildState, runs: int = CALIBRATION_RUNS,
              timing: TimingOptions | None = None) -> dict[str, float | None]:
    """The device's copy bandwidth (GB/s, read + write) and matmul ceiling (TFLOP/s): each the
    median of ``runs`` runs with its spread ((max - min) / median), taken in the settled
    sustained state. The ceiling is the best median of torch.matmul (cuBLAS) over a few large
    bf16 and fp16 GEMMs, so a kernel is never measured against less than the vendor reaches."""
    if state.kind != "cuda":
        return {"copy_gbps": None, "copy_gbps_spread": None, "matmul_tflops": None,
                "matmul_tflops_spread": None, "runs": 0}
    import torch
    import triton.testing

    runs = max(1, int(runs))
    gemms: dict[Any, Callable[[], Any]] = {}
    for dtype in CALIBRATION_DTYPES:
        for m, n, k in CALIBRATION_GEMMS:
            a = torch.randn(m, k, device="cuda", dtype=getattr(torch, dtype))
            b = torch.randn(k, n, device="cuda", dtype=getattr(torch, dtype))
            gemms[(dtype, m, n, k)] = partial(torch.matmul, a, b)
    first = next(iter(gemms.values()))
    timing = timing if timing is not None else TimingOptions()
    if _settles(timing):
        _settle(state, first, timing)
    warm = max(25.0, _full_warmup_ms(timing))
    size = 1 << 30
    src = torch.empty(size, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    copy = []
    for _ in range(runs):
        _cool(state, timing)
        ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=warm,
                                      rep=CALIBRATION_REP_MS)
        copy.append(2 * size / (ms * 1e-3) / 1e9)
    tflops: dict[Any, list[float]] = {key: [] for key in gemms}
    for _ in range(runs):  # interleaved: drift hits every GEMM alike
        for (dtype, m, n, k), fn in gemms.items():
            _cool(state, timing)
            ms = triton.testing.do_bench(fn, warmup=warm, rep=CALIBRATION_REP_MS)
            tflops[(dtype, m, n, k)].append(2 * m * n * k / (ms * 1e-3) / 1e12)
    state.last_busy = time.monotonic()
    copy_gbps, copy_spread = median_spread(copy)
    peak, peak_spread = best_median(tflops)
    return {"copy_gbps": copy_gbps, "copy_gbps_spread": copy_spread, "matmul_tflops": peak,
            "matmul_tflops_spread": peak_spread, "runs": runs}


#: prctl(2) option: the signal this process gets when its parent dies
PR_SET_PDEATHSIG = 1
#: how often (seconds) the watch thread checks that the parent is still there
PARENT_WATCH_S = 0.5


def die_with_parent(parent_pid: int | None) -> None:
    """Exit, with the process group this process leads, once ``parent_pid`` is gone.

    On Linux the kernel sends SIGKILL at once (``prctl(PR_SET_PDEATHSIG)``). It fires when
    the *thread* that spawned this process exits, not the process: spawn children from a
    thread that lives as long as they do (the main thread, or the compile pool's supervisor,
    which outlives the processes it replaces). A watch thread that exits when ``os.getppid()``
    changes is the portable backstop (and takes the group, with any compiler started, along).
    """
    expected = parent_pid if parent_pid is not None else os.getppid()
    if sys.platform.startswith("linux"):
        _set_pdeathsig()
    if os.getppid() != expected:  # the parent died before the signal was armed
        _exit_with_group()
    threading.Thread(target=_watch_parent, args=(expected,), daemon=True,
                     name="tuner-parent-watch").start()


def _set_pdeathsig() -> None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: the watch thread alone
        pass


def _watch_parent(expected: int) -> None:
    while os.getppid() == expected:
        time.sleep(PARENT_WATCH_S)  # a poll: there is no event for "my parent died"
    _exit_with_group()


def _exit_with_group() -> None:
    try:
        if os.getpgrp() == os.getpid():  # we lead our group: the compilers we started go too
            os.killpg(0, signal.SIGKILL)
    except OSError:
        pass
    os._exit(1)


def stacks_on_sigusr1() -> None:
    """``kill -USR1 PID`` prints every thread's Python stack to stderr: how an operator sees
    where a stalled worker, measuring child or compile process is (none is stopped by it)."""
    import faulthandler
    import io

    try:
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    except (io.UnsupportedOperation, ValueError, AttributeError):
        pass  # stderr is no file (captured in a test, embedded): no stacks to print there


def child_main(conn: Any, kind: str, device_index: int, parent_pid: int | None = None) -> None:
    """Entry point of the spawned child. Its "ready" reply carries when (``time.monotonic``,
    one clock for every process of the machine) it entered here, had imported torch and had
    started its device, so that the parent can say where a slow start went."""
    entered = time.monotonic()
    os.setpgrp()  # so that the parent can kill us together with any compiler we started
    die_with_parent(parent_pid)
    stacks_on_sigusr1()
    state = ChildState(kind)
    try:
        from tuner.device import detect_cuda, interpreter_fingerprint, visible_device_for

        if kind == "interpret":
            os.environ["TRITON_INTERPRET"] = "1"
        elif kind == "cuda":  # the worker's device (its index among the visible ones): cuda:0
            os.environ["CUDA_VISIBLE_DEVICES"] = visible_device_for(device_index)
        import torch  # noqa: F401 - imported here to be timed apart from the device's start

        imported = time.monotonic()
        fp = detect_cuda(0) if kind == "cuda" else interpreter_fingerprint()
        conn.send(("ready", fp, {"entered": entered, "torch": imported,
                                 "device": time.monotonic()}))
    except Exception as exc:  # noqa: BLE001
        conn.send(("error", f"device start failed: {type(exc).__name__}: {exc}"))
        return
    _serve(conn, state)


def _serve(conn: Any, state: ChildState) -> None:
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):  # the parent went away
            return
        op = msg[0]
        try:
            if op not in ("setup", "exit") and state.kind == "cuda":
                # nothing is timed while the output check compiles (``_warm_output_check``)
                from tuner.verification_fused import wait_warm

                wait_warm()
            if op == "setup":
                _setup(state, *msg[1:])
                conn.send(("ok",))
            elif op == "measure":
                measure_many(state, list(msg[1]), msg[2], conn.send,
                             msg[3] if len(msg) > 3 else None)
            elif op == "retime":
                baseline = bool(msg[4]) if len(msg) > 4 else False
                conn.send(("results", retime(state, msg[1], msg[2], msg[3], baseline)))
            elif op == "selftest":
                selftest(state)
                conn.send(("ok",))
            elif op == "calibrate":
                conn.send(("calibration", calibrate(state, *msg[1:3])))
            elif op == "exit":
                return
        except Exception as exc:  # noqa: BLE001
            conn.send(("error", f"{type(exc).__name__}: {exc}"))


def _setup(state: ChildState, kernel_ref: str, shape: dict[str, int], dtype: str,
           seed: int) -> None:
    from tuner.kernel import load_ref

    state.kernel = load_ref(kernel_ref)
    state.shape, state.dtype, state.seed, state.counter = dict(shape), dtype, seed, 0
    state.settled = False  # a new task: settled again with its own load
    state.quiet = False  # and its first full timing warms up, whatever the last task drew
    if state.kind == "cuda":
        _check_inputs_fit(state)
        _warm_output_check(state.dtype)


def _warm_output_check(dtype: str) -> None:
    """Start compiling the fused output check for this task's outputs (``dtype`` against an
    fp32 reference, as the built-in kernels' references are): ``verification_fused``."""
    from tuner import dtypes
    from tuner.verification_fused import warm_async

    if dtype in dtypes.ELEMENT_BYTES:
        warm_async(dtypes.torch_dtype(dtype))


#: the share of the GPU's memory one task may allocate (``TUNER_GPU_MEMORY_FRACTION``)
DEFAULT_GPU_MEMORY_FRACTION = 0.9


class InputsTooLarge(RuntimeError):
    """The problem's inputs do not fit in the GPU memory a task may use."""


def _check_inputs_fit(state: ChildState) -> None:
    """Bound what this task may allocate on the GPU, and fail the setup with a clear error
    when the problem's inputs cannot fit (rather than OOM on every config)."""
    import torch

    fraction = float(os.environ.get("TUNER_GPU_MEMORY_FRACTION", DEFAULT_GPU_MEMORY_FRACTION))
    torch.cuda.set_per_process_memory_fraction(fraction)
    free, total = torch.cuda.mem_get_info()
    limit = min(free, fraction * total)
    need = state.kernel.bytes(state.shape, state.dtype)
    what = f"the inputs of {state.kernel.name} {state.shape} {state.dtype}"
    if need > limit:
        raise InputsTooLarge(f"{what} need {need / 2**30:.1f} GiB; this task may use "
                             f"{limit / 2**30:.1f} GiB of the GPU's {total / 2**30:.1f} GiB")
    try:
        inputs = state.kernel.make_inputs(state.shape, state.dtype, state.device, state.seed)
    except torch.OutOfMemoryError:
        raise InputsTooLarge(f"{what} do not fit in the {limit / 2**30:.1f} GiB of GPU memory "
                             "this task may use") from None
    del inputs
    torch.cuda.empty_cache()
