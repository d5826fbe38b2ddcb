"""The Backend contract every measurement backend implements."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from tuner.config import KernelConfig
from tuner.device import DeviceFingerprint
from tuner.measurement import Measurement
from tuner.space import SearchSpace

#: the timing protocols (``tuner/gpu_state.py`` describes and compares them)
TIMING_PROTOCOLS = ("settled", "cool", "none")
#: the environment variable choosing the protocol of every ``TimingOptions()``
PROTOCOL_ENV = "TUNER_TIMING_PROTOCOL"


#: the environment variable that turns ``TimingOptions.time_ahead`` on ("1")
TIME_AHEAD_ENV = "TUNER_TIME_AHEAD"
RETIME_INTERLEAVED_ENV = "TUNER_RETIME_INTERLEAVED"


def default_protocol() -> str:
    """The protocol named by ``TUNER_TIMING_PROTOCOL`` (ValueError for an unknown one), else
    ``settled``."""
    name = os.environ.get(PROTOCOL_ENV, "").strip() or "settled"
    if name not in TIMING_PROTOCOLS:
        raise ValueError(f"{PROTOCOL_ENV}={name!r} is not a timing protocol; "
                         f"choose one of {', '.join(TIMING_PROTOCOLS)}")
    return name


#: called with each measurement as soon as it is taken, before the rest of its batch is
MeasuredCallback = Callable[[Measurement], None]


@dataclass(frozen=True)
class TimingOptions:
    """How configs are timed and how long each may take."""

    warmup_ms: float = 10.0
    rep_ms: float = 40.0
    #: adaptive timing: once a config has been fully timed, each later one is first timed
    #: quickly (do_bench with this rep, warm-up a fifth of it); one whose quick median is over
    #: ``quick_factor`` x the best full median so far keeps that quick timing (it cannot win,
    #: and its p20/p80 still show its noise); the others are then timed in full. 0: off.
    quick_rep_ms: float = 5.0
    quick_factor: float = 2.0
    #: seconds one config may spend compiling before it is recorded as a timeout
    compile_timeout_s: float = 120.0
    #: seconds one config may spend verifying and timing before it is recorded as a timeout
    run_timeout_s: float = 60.0
    #: seconds a fresh child may take to start (import torch, initialise CUDA)
    start_timeout_s: float = 180.0
    #: deaths in a row (no config ran in between) after which the device is reported
    #: unhealthy; each death is followed by a self-test, so these are bad configs in a row
    max_consecutive_deaths: int = 8
    #: the timing protocol (``tuner/gpu_state.py`` says why; ``bench/results/
    #: timing_stability_h200.md`` and ``warmup_probe_h200.md`` measure it):
    #: ``settled`` (the default): every full timing (a trial, each re-timing round, the
    #: baseline, the calibration) is preceded by ``settle_warmup_ms`` of the timed work itself,
    #: long enough for the power limiter to bring the clock to its sustained level, so no
    #: timing starts at a boost clock regained while the GPU idled between timings;
    #: ``cool`` (before every timing the GPU idles until its power reading is at most
    #: ``cool_power_frac`` of its enforced limit, at most ``cool_max_ms``); ``none`` (every
    #: timing in whatever state the GPU is in, warm-up ``warmup_ms``).
    protocol: str = field(default_factory=default_protocol)
    #: 50 ms (100 before the sixteenth session): on an H100, two runs of
    #: ``bench/warmup_floor_probe.py`` (``bench/results/tuning_time_33i/``) timed compute-bound
    #: configs after another config and a 5 ms or 100 ms gap, as a search meets them: 50 ms read
    #: as close to a 400 ms warm-up as 100 ms did on all four problems (within their 4-15%
    #: spread), 10 ms read 7-12% fast on the GEMMs (the boost clock); each pressed trial
    #: pays it
    settle_warmup_ms: float = 50.0
    #: the problem is memory-bound on this device (its roofline's floor is the copy
    #: bandwidth; the worker sets it per task): its full timings skip the sustained-state
    #: warm-up while the GPU's power, read after the task's previous full timing, stayed under
    #: ``quiet_power_frac`` of its limit without a power-cap throttle (the limiter is not
    #: engaged, so the clock is where a warm-up would leave it); a timing that then finds the
    #: power over it or capped is taken again with the warm-up, and so are those after it.
    #: ``bench/results/gap_probe_h100.md``: a compute-bound GEMM's clock is back at boost 30 ms
    #: after a sustained load, so compute-bound problems keep the warm-up on every timing
    memory_bound: bool = False
    quiet_power_frac: float = 0.6
    #: a re-timing's rounds stop after this many once the fastest config's timings are all
    #: under every other config's, or the others' medians are within 0.5% of its own (more
    #: rounds could only pick between configs whose difference does not matter:
    #: ``tuner.backends.child.separated``); ``rounds`` is the most (0: every round)
    retime_min_rounds: int = 3
    #: do_bench's ``rep`` for each re-timing round (0: ``rep_ms``): the rounds' median is the
    #: re-timing's number, so each round needs fewer runs than a trial's single timing; half
    #: of ``rep_ms`` halves a phase that took 0.6-2.0 s of every task on an H100 (issue 33)
    retime_rep_ms: float = 20.0
    #: a full timing that starts under this long after the previous one finished (the rounds
    #: of a re-timing, back to back) keeps the usual ``warmup_ms``: the GPU had no time to
    #: regain its boost clock
    settle_gap_s: float = 0.02
    #: while a batch waits for its compiles and the GPU child is idle, time configs compiled
    #: ahead for later batches (``ProcessBackend``): a later ``measure`` of one takes that
    #: result. Off unless ``TUNER_TIME_AHEAD=1``: on an H100 it cut the shapes' compile wait
    #: by about what it added to their measuring (most configs timed ahead were never asked
    #: for), so the walls did not move (``bench/results/tuning_time_33e_h100/``)
    time_ahead: bool = field(default_factory=lambda: os.environ.get(TIME_AHEAD_ENV) == "1")
    #: a re-timing's rounds time their configs interleaved run by run
    #: (``gpu_timer.do_bench_interleaved``; eager methods on a GPU) instead of one config's
    #: 20 ms after another's. Off unless ``TUNER_RETIME_INTERLEAVED=1``: on an H200
    #: (``bench/results/retime_pairing_h200/``, two runs) it cut the spread of the finalists'
    #: ratios on 6-9 of 14 problems (1500x3001x999: 1.2-1.8% -> 0.2-0.3%) but widened it on two
    #: short ones (0.1-0.3% -> 1.6-2.5%), and on power-capped 8192^3 it ranked two configs the
    #: other way round (interleaved, they share one clock; alone, each runs at its own
    #: sustained clock, as its trial and a user's repeated launches do)
    retime_interleaved: bool = field(
        default_factory=lambda: os.environ.get(RETIME_INTERLEAVED_ENV) == "1")
    cool_power_frac: float = 0.5
    cool_max_ms: float = 3000.0
    #: with ``settled``, also a long settle before the task's first timing, every re-timing,
    #: the calibration and after ``resettle_idle_s`` idle: the load runs until the SM clock
    #: fell less than ``settle_drop_mhz`` over the last ``settle_window_ms`` (at most
    #: ``settle_max_ms``). Off (0) by default: on the H200 it gave the same numbers as the
    #: per-timing warm-up alone (1.6375 ms after 1 s of load against 1.6373 ms after 250 ms)
    #: and costs seconds per task.
    settle_max_ms: float = 0.0
    settle_window_ms: float = 1000.0
    settle_drop_mhz: float = 15.0
    resettle_idle_s: float = 3.0
    #: the timing method (``tuner/timing.py``): ``eager-flushed``, ``cuda-graph`` or
    #: ``eager-hot``; a worker sets each task's own (``ProcessBackend.use_timing``)
    method: str = "eager-flushed"

    @property
    def settles(self) -> bool:
        """Whether every full timing gets the sustained-state warm-up."""
        return self.protocol == "settled"

    @property
    def cools(self) -> bool:
        return self.protocol == "cool" and self.cool_max_ms > 0


class Backend(Protocol):
    """Measures configs of one (kernel, shape, dtype) problem on one device.

    ``measure`` never raises for a bad config: every failure is returned as a Measurement with
    its Outcome. It raises ``WorkerDied`` only when the device itself cannot be used any more.
    It passes each measurement to ``on_result`` the moment it is taken (once per distinct
    config), so that a caller can store it before the rest of the batch runs: a batch that ends
    in a dead device or process loses none of its finished measurements. An exception raised by
    ``on_result`` stops the batch and propagates. Not thread-safe: one search loop drives one
    backend.

    Everything else a backend may have is optional, each member a protocol of its own below
    (``BatchesAhead``, ``CompilesAhead``, ``Interruptible``, ``Retargetable``, ``Calibrates``,
    ``TimesWithMethods``), found with ``isinstance``; ``tests/backend_conformance.py`` checks
    which ones each real backend has.
    """

    fingerprint: DeviceFingerprint

    @property
    def healthy(self) -> bool: ...

    def restrict(self, space: SearchSpace) -> SearchSpace:
        """The part of ``space`` this backend can answer (a replay table's configs)."""
        ...

    def measure(self, configs: Sequence[KernelConfig],
                on_result: MeasuredCallback | None = None) -> list[Measurement]:
        """One measurement per config, in the order of ``configs``."""
        ...

    def retime(self, configs: Sequence[KernelConfig], rounds: int,
               baseline: bool = False) -> list[Measurement]:
        """Time ``configs`` again, interleaved round-robin (every round times each once), for a
        fair final comparison: one measurement per config, in order, each with
        ``extra["measured"] == "retimed"``. With ``baseline``, the kernel's ``baseline`` (the
        vendor library doing the same work: torch) is timed in the same rounds and one more
        measurement is appended for it (``config=KernelConfig({})``, ``extra["baseline"] ==
        "torch"``), if the backend can time one. [] when re-timing failed."""
        ...

    def close(self) -> None: ...


# -- optional members: a backend may have each of these or not ------------------------------
# Each is a protocol of its own, checked with isinstance (runtime_checkable: the member is
# present, and not None where it is a method); ``ProcessBackend`` has them all,
# ``ReplayBackend`` only ``TimesWithMethods``, a test's fake any of them.

@runtime_checkable
class BatchesAhead(Protocol):
    """A backend that wants configs asked ahead of measuring: ``preferred_batch`` of them
    (the process backend: its compile pool's size). Without it, one."""

    @property
    def preferred_batch(self) -> int: ...


@runtime_checkable
class CompilesAhead(Protocol):
    """A backend that compiles configs ahead of their batch (the process backend's compile
    pool): ``prefetch`` hands it those the search expects to ask next, most likely first."""

    def prefetch(self, configs: Sequence[KernelConfig]) -> None: ...


@runtime_checkable
class CompilesNow(Protocol):
    """A backend whose compile pool can start on configs at once (``compile_now``): a search
    hands it its warm start while it builds its strategy, before its first batch."""

    def compile_now(self, configs: Sequence[KernelConfig]) -> None: ...


def compile_now(backend: object, configs: Sequence[KernelConfig]) -> None:
    """Start compiling ``configs`` on ``backend``'s pool now (``CompilesNow``); nothing for a
    backend without one."""
    if isinstance(backend, CompilesNow) and configs:
        backend.compile_now(configs)


@runtime_checkable
class MeasuresAsReady(Protocol):
    """A backend whose configs become ready to time at different moments (the process
    backend: as their compiles finish): ``measure_ready`` measures those that are ready and
    hands the results back once the GPU would wait for the others (at least one result,
    unless it failed), which stay in flight: a later ``measure`` or ``measure_ready`` that
    names them again takes them as they finish. A search asks more configs meanwhile instead
    of idling the GPU behind one slow compile (issue 33: a matmul config of 4.3 s held a
    batch of four 3.9 s on an H200, with 13 others compiled and waiting)."""

    def measure_ready(self, configs: Sequence[KernelConfig],
                      on_result: MeasuredCallback | None = None) -> list[Measurement]: ...


def measure_ready(backend: Backend, configs: Sequence[KernelConfig],
                  on_result: MeasuredCallback | None = None) -> list[Measurement]:
    """The measurements of the configs of ``configs`` that ``backend`` could time without
    waiting for the others (``MeasuresAsReady``), in the order of ``configs``; all of them
    for a backend without the notion (``measure``)."""
    if isinstance(backend, MeasuresAsReady):
        return backend.measure_ready(configs, on_result)
    return backend.measure(configs, on_result)


@runtime_checkable
class Interruptible(Protocol):
    """A backend that asks ``interrupt`` (when set) while a measurement is in flight and stops
    it (``MeasuringStopped``) when it answers True."""

    interrupt: Callable[[], bool] | None


@runtime_checkable
class Retargetable(Protocol):
    """A backend that can measure another problem with what it has started (its child and
    compile pool): a sweep's next shape, a worker's next task."""

    def targets(self, kernel_ref: str, shape: dict[str, int], dtype: str, seed: int) -> bool:
        """Whether it is set up for exactly this problem."""
        ...

    def retarget(self, shape: dict[str, int], *, kernel_ref: str | None = None,
                 dtype: str | None = None, seed: int | None = None) -> None:
        """Measure this problem from now on."""
        ...


@runtime_checkable
class Calibrates(Protocol):
    """A backend that measures its device's ceilings (copy bandwidth, matmul TFLOP/s)."""

    def calibrate(self, runs: int | None = None) -> dict[str, float | None]: ...


@runtime_checkable
class TimesWithMethods(Protocol):
    """A backend that times with a chosen timing method (``tuner/timing.py``)."""

    def use_timing(self, method: str) -> str: ...


@runtime_checkable
class PacesWarmups(Protocol):
    """A backend told whether its problem is memory-bound (``TimingOptions.memory_bound``)."""

    def use_bound(self, memory_bound: bool) -> None: ...


def use_bound(backend: object, memory_bound: bool) -> None:
    """Tell ``backend`` whether the next problem is memory-bound (``PacesWarmups``); nothing
    for a backend without the notion."""
    if isinstance(backend, PacesWarmups):
        backend.use_bound(memory_bound)


def preferred_batch(backend: object) -> int:
    """How many configs ``backend`` wants asked ahead (``BatchesAhead``), else 1."""
    return int(backend.preferred_batch) if isinstance(backend, BatchesAhead) else 1


def use_timing(backend: object, method: str) -> str:
    """Have ``backend`` time with ``method`` (``tuner/timing.py``) from now on; the method it
    will actually time with (a replay table's own). A backend that cannot time with it raises
    InvalidRequest (the interpreter and ``cuda-graph``); one without the notion (a test's
    fake) times ``eager-flushed``."""
    from tuner.timing import DEFAULT_TIMING

    if isinstance(backend, TimesWithMethods):
        return str(backend.use_timing(method))
    return DEFAULT_TIMING
