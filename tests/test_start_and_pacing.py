"""Issue 33: where a worker's start goes (the child's steps), a fingerprint that does not make
the worker import torch, a re-timing that stops once its ranking is settled, and memory-bound
problems timed without the sustained-state warm-up while the power stays quiet. CPU only:
NVML and the GPU timer cannot exist here, so they alone are faked (a monitor's sample and
``tuner.gpu_timer.bench``)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest

from tuner.backends import TimingOptions
from tuner.backends import child as child_mod
from tuner.backends.base import use_bound
from tuner.backends.process import ChildProcess, ProcessBackend, start_steps
from tuner.config import KernelConfig

FAST = TimingOptions(compile_timeout_s=30, run_timeout_s=30, start_timeout_s=60)


# -- the child's start, step by step --------------------------------------------------------

def test_start_steps_are_the_gaps_between_the_spawn_the_child_s_marks_and_the_reply():
    marks = {"entered": 10.25, "torch": 13.5, "device": 14.0}
    assert start_steps(10.0, marks, 14.5) == {"python": 0.25, "torch": 3.25, "device": 0.5,
                                              "reply": 0.5}
    assert start_steps(10.0, {"entered": 10.25}, 14.5) == {}  # an older child: no steps


@pytest.mark.timeout(120)
def test_a_child_s_fingerprint_carries_plain_strings_and_its_start_has_steps():
    """torch.__version__ is a TorchVersion: a fingerprint carrying one made the worker import
    torch to read the child's reply (3.7 s of a start on an H100)."""
    child = ChildProcess("interpret", 0, 60)
    try:
        fp = child.fingerprint
        assert type(fp.torch_version) is str and type(fp.triton_version) is str
        assert set(child.start_steps) == {"python", "torch", "device", "reply"}
        assert all(v >= 0 for v in child.start_steps.values())
    finally:
        child.close()


@pytest.mark.timeout(120)
def test_a_backend_s_start_seconds_name_the_child_s_steps_and_its_setup():
    backend = ProcessBackend("interpret", "search_spaces.vector_add:KERNEL", {"N": 256},
                             "float32", timing=FAST)
    try:
        steps = backend.start_seconds
        assert {"child", "child_python", "child_torch", "child_device", "child_reply",
                "child_setup"} <= set(steps)
        assert steps["child"] >= steps["child_setup"] > 0
        # the bound travels with the timing options of the next measurements
        assert not backend.timing.memory_bound
        use_bound(backend, True)
        assert backend.timing.memory_bound
        use_bound(backend, False)
        assert not backend.timing.memory_bound
    finally:
        backend.close()


def test_the_worker_warms_its_imports_of_torch_and_the_built_in_kernels():
    import threading

    from search_spaces.registry import BUILTINS
    from tuner.app.service import warm_imports

    done = threading.Event()
    warm_imports(done)
    modules = {ref.split(":")[0] for ref in BUILTINS.values()}
    assert {"torch", "triton", *modules} <= set(sys.modules) and done.is_set()


def test_the_worker_s_imports_begin_once_the_store_answers_beside_the_child_s_start(
        tmp_path, monkeypatch):
    """``_start_first`` starts the task imports once the store answered (not after the
    worker is ready: the first task of an H100 run waited 3.8 s for them); a database URL
    that can never work starts none and raises."""
    import threading

    from tuner.app import service
    from tuner.settings import Settings

    calls: list[str] = []
    monkeypatch.setattr(service, "warm_imports",
                        lambda done: (calls.append(threading.current_thread().name),
                                      done.set()))
    warmed = threading.Event()
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'w.db'}", worker_keep_seconds=0)
    early, steps = service._start_first(settings, "interpret", 0, None, warmed=warmed)
    assert early is None and "factory" in steps
    assert warmed.wait(10) and calls == ["warm-imports"]

    from tuner.errors import DatabaseUrlError

    unreachable = threading.Event()
    bad = Settings(database_url="nosuchdialect://somewhere/db", worker_keep_seconds=0)
    with pytest.raises(DatabaseUrlError):
        service._start_first(bad, "interpret", 0, None, warmed=unreachable)
    assert not unreachable.wait(0.5) and calls == ["warm-imports"]


def test_a_task_waits_for_its_worker_s_imports_before_it_runs(tmp_path):
    """A task claimed while the worker still imports (``Worker.warmed`` clear) starts once
    the imports are done, not beside them."""
    import threading

    from db.engine import init_db
    from tuner.app.worker import Worker

    factory = init_db(f"sqlite:///{tmp_path / 't.db'}")
    worker = Worker(factory, backend_kind="interpret", device_key="interpret:cpu")
    worker.warmed.clear()
    started: list[float] = []
    import tuner.app.worker as worker_mod

    real = worker_mod.execute_task
    try:
        def execute(*args: Any, **kwargs: Any) -> Any:
            started.append(time.monotonic())
            return SimpleNamespace(status="succeeded", error=None)

        worker_mod.execute_task = execute  # type: ignore[assignment]
        t0 = time.monotonic()
        threading.Timer(0.3, worker.warmed.set).start()
        worker.run_claimed(12345)
    finally:
        worker_mod.execute_task = real
    assert started and started[0] - t0 >= 0.25


# -- re-timing stops once the fastest is separated ---------------------------------------------

def test_separated_needs_every_timing_of_the_fastest_under_every_other_timing():
    assert child_mod.separated([[1.0, 1.1, 1.05], [1.2, 1.3, 1.25], [2.0, 2.1, 2.0]])
    assert not child_mod.separated([[1.0, 1.1, 1.05], [1.08, 1.3, 1.25]])  # 1.1 > 1.08
    # overlapping, but the medians 0.3% apart: a tie, more rounds would not matter
    assert child_mod.separated([[1.0, 1.02, 1.01], [1.0, 1.013, 1.02]])
    assert not child_mod.separated([[1.0, 1.02, 1.01], [1.0, 1.013, 1.02]], tie=0.001)
    assert child_mod.separated([[3.0, 3.0]])
    # the lead is the lowest median, wherever it is listed
    assert child_mod.separated([[2.0, 2.0, 2.0], [1.0, 1.0, 1.0]])


class Paced:
    """A kernel whose configs take ``2 X`` ms a launch; with ``flip``, every other round
    config 1 takes 4 ms and config 2 2.6 ms (a ranking that never settles, and never ties)."""

    def __init__(self, flip: bool = False) -> None:
        self.flip = flip
        self.launches: dict[int, int] = {}

    def make_inputs(self, shape: Mapping[str, int], dtype: str, device: str,
                    seed: int) -> dict[str, Any]:
        return {}

    def launch(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        x = int(config["X"])
        n = self.launches[x] = self.launches.get(x, 0) + 1
        ms = 2.0 * x
        if self.flip and (n - 1) // 3 % 2:  # the CPU timer launches 3 times a round
            ms = {1: 4.0, 2: 2.6}[x]  # the lead swaps, and the medians stay 10%+ apart
        time.sleep(ms / 1e3)


def _retime(kernel: Paced, rounds: int, timing: TimingOptions) -> list[Any]:
    state = child_mod.ChildState("interpret")
    state.kernel = kernel
    return child_mod.retime(state, [KernelConfig(X=1), KernelConfig(X=2)], rounds, timing)


def test_retiming_stops_after_its_minimum_once_the_fastest_is_separated():
    out = _retime(Paced(), 5, FAST)
    assert [m.extra["rounds"] for m in out] == [3, 3]
    assert out[0].p50_ms < out[1].p50_ms


def test_retiming_runs_every_round_while_the_ranking_is_not_settled_or_when_asked():
    out = _retime(Paced(flip=True), 5, FAST)
    assert [m.extra["rounds"] for m in out] == [5, 5]
    every = TimingOptions(compile_timeout_s=30, run_timeout_s=30, retime_min_rounds=0)
    assert [m.extra["rounds"] for m in _retime(Paced(), 4, every)] == [4, 4]


def _fake_gpu_timer(monkeypatch: pytest.MonkeyPatch) -> list[tuple[float, float]]:
    """``tuner.gpu_timer.bench`` faked (no GPU here): every timing takes 1 ms; the returned
    list gets each call's (warm-up, rep)."""
    import tuner.gpu_timer

    calls: list[tuple[float, float]] = []

    def bench(method: str, fn: Any, warmup: float = 25.0, rep: float = 100.0,
              quantiles: Any = None) -> list[float]:
        calls.append((warmup, rep))
        return [1.0, 1.0, 1.0]

    monkeypatch.setattr(tuner.gpu_timer, "bench", bench)
    return calls


def test_a_retiming_round_runs_retime_rep_ms_and_a_trial_rep_ms(monkeypatch):
    calls = _fake_gpu_timer(monkeypatch)
    monkeypatch.setattr(child_mod.ChildState, "gpu_sample", lambda self: None)
    state = child_mod.ChildState("cuda")
    state.kernel = Paced()
    timing = TimingOptions(rep_ms=40, retime_rep_ms=20, quick_rep_ms=0, settle_max_ms=0)
    child_mod._time_fn(state, lambda: None, timing)
    assert [rep for _, rep in calls] == [40]
    calls.clear()
    out = child_mod.retime(state, [KernelConfig(X=1), KernelConfig(X=2)], 3, timing,
                           interleave=False)
    assert [rep for _, rep in calls] == [20] * 6 and [m.extra["rounds"] for m in out] == [3, 3]
    calls.clear()
    child_mod.retime(state, [KernelConfig(X=1)], 3, replace(timing, retime_rep_ms=0),
                     interleave=False)
    assert [rep for _, rep in calls] == [40] * 3  # 0: the trials' rep_ms


# -- re-timing interleaved run by run (tuner.gpu_timer.do_bench_interleaved) -------------------

def test_paired_rounds_separate_a_lead_that_a_common_drift_hides_from_unpaired_ones():
    # the clock drifts 10% a round: the lead is 2% faster in every round, yet its slowest
    # round is slower than the other's fastest
    drifting = [[1.0, 1.1, 1.2], [1.02, 1.122, 1.224]]
    assert not child_mod.separated(drifting)
    assert child_mod.separated(drifting, paired=True)
    # one round where the other won: not separated, paired or not
    assert not child_mod.separated([[1.0, 1.1, 1.2], [1.02, 1.09, 1.224]], paired=True)
    # a tie is a tie either way
    assert child_mod.separated([[1.0, 1.1, 1.2], [1.0, 1.102, 1.19]], paired=True)


ON = TimingOptions(retime_interleaved=True, settle_max_ms=0)


def test_a_gpu_re_timing_interleaves_when_asked_with_an_eager_method_and_not_otherwise(
        monkeypatch):
    gpu, cpu = child_mod.ChildState("cuda"), child_mod.ChildState("cpu")
    assert child_mod.interleaves(gpu, ON)  # eager-flushed, settled
    assert child_mod.interleaves(gpu, replace(ON, method="eager-hot"))
    assert not child_mod.interleaves(gpu, replace(ON, method="cuda-graph"))
    assert not child_mod.interleaves(gpu, replace(ON, protocol="cool"))
    assert not child_mod.interleaves(cpu, ON)
    # off by default (bench/results/retime_pairing_h200/), on with the environment variable
    monkeypatch.delenv("TUNER_RETIME_INTERLEAVED", raising=False)
    assert not child_mod.interleaves(gpu, TimingOptions())
    monkeypatch.setenv("TUNER_RETIME_INTERLEAVED", "1")
    assert child_mod.interleaves(gpu, TimingOptions())


def _fake_interleaved(monkeypatch: pytest.MonkeyPatch, drift: float,
                      ms: Mapping[int, float]) -> list[tuple[int, float, float, bool]]:
    """``tuner.gpu_timer``'s two timers faked (no GPU here): config X's launch takes
    ``ms[X]``, every timing call ``drift`` slower than the one before (a clock sinking under
    the power limiter), one interleaved pass counting as one; each call's (callables timed,
    warm-up, rep, flush) is recorded. The callables are ``Paced`` launches: their config is
    read from the partial's arguments."""
    import tuner.gpu_timer

    calls: list[tuple[int, float, float, bool]] = []

    def scale() -> float:
        return (1 + drift) ** len(calls)

    def x_of(fn: Any) -> int:
        return int(fn.args[0]["X"])

    def interleaved(fns: Any, warmup: float = 25.0, rep: float = 100.0, quantiles: Any = None,
                    flush: bool = True) -> list[list[float]]:
        f = scale()
        calls.append((len(fns), warmup, rep, flush))
        return [[ms[x_of(fn)] * f] * 3 for fn in fns]

    def bench(method: str, fn: Any, warmup: float = 25.0, rep: float = 100.0,
              quantiles: Any = None) -> list[float]:
        f = scale()
        calls.append((1, warmup, rep, method != "eager-hot"))
        return [ms[x_of(fn)] * f] * 3

    monkeypatch.setattr(tuner.gpu_timer, "do_bench_interleaved", interleaved)
    monkeypatch.setattr(tuner.gpu_timer, "bench", bench)
    monkeypatch.setattr(child_mod.ChildState, "gpu_sample", lambda self: None)
    return calls


def test_an_interleaved_re_timing_times_every_config_in_one_pass_a_round(monkeypatch):
    calls = _fake_interleaved(monkeypatch, 0.0, {1: 1.0, 2: 1.5, 3: 1.2})
    state = child_mod.ChildState("cuda")
    state.kernel = Paced()
    timing = replace(ON, rep_ms=40, retime_rep_ms=20, warmup_ms=10, settle_warmup_ms=50)
    configs = [KernelConfig(X=1), KernelConfig(X=2), KernelConfig(X=3)]
    out = child_mod.retime(state, configs, 5, timing)
    # three rounds (then separated), each one pass over the three configs at retime_rep_ms;
    # the first after the GPU idled with the sustained-state warm-up, the others back to back
    assert calls == [(3, 50, 20, True), (3, 10, 20, True), (3, 10, 20, True)]
    assert [m.config for m in out] == configs and [m.p50_ms for m in out] == [1.0, 1.5, 1.2]
    assert all(m.extra["interleaved"] and m.extra["rounds"] == 3 for m in out)
    assert out[0].extra["warmups"] == {"long": 1, "short": 2, "redone": 0}
    calls.clear()
    child_mod.retime(state, configs, 3, replace(timing, method="eager-hot"))
    assert [flush for *_, flush in calls] == [False] * 3


def test_under_a_drifting_clock_interleaved_rounds_stop_where_entry_by_entry_ones_go_on(
        monkeypatch):
    # config 1 is 2% faster; every timing call runs 3% slower than the one before
    calls = _fake_interleaved(monkeypatch, 0.03, {1: 1.0, 2: 1.02})
    state = child_mod.ChildState("cuda")
    state.kernel = Paced()
    timing = ON
    configs = [KernelConfig(X=1), KernelConfig(X=2)]
    paired = child_mod.retime(state, configs, 5, timing)
    assert [m.extra["rounds"] for m in paired] == [3, 3] and len(calls) == 3
    assert paired[0].p50_ms < paired[1].p50_ms
    calls.clear()
    # entry by entry the drift over the rounds (6% a round) hides the 2% gap: every round runs
    unpaired = child_mod.retime(state, configs, 5, timing, interleave=False)
    assert [m.extra["rounds"] for m in unpaired] == [5, 5] and len(calls) == 10
    assert "interleaved" not in unpaired[0].extra


def test_under_a_rising_clock_entry_by_entry_rounds_rank_the_configs_the_wrong_way(
        monkeypatch):
    # the clock climbs (an idle GPU regaining its boost): each timing 3% faster than the one
    # before, more than config 1's 2% lead over config 2, which is timed after it every round
    calls = _fake_interleaved(monkeypatch, -0.03, {1: 1.0, 2: 1.02})
    state = child_mod.ChildState("cuda")
    state.kernel = Paced()
    configs = [KernelConfig(X=1), KernelConfig(X=2)]
    paired = child_mod.retime(state, configs, 5, ON)
    assert paired[0].p50_ms < paired[1].p50_ms
    calls.clear()
    unpaired = child_mod.retime(state, configs, 5, ON, interleave=False)
    assert unpaired[0].p50_ms > unpaired[1].p50_ms


# -- memory-bound problems: the warm-up only where the power limiter may hold the clock ---------

def test_the_warm_up_is_skipped_only_for_a_memory_bound_problem_with_quiet_power():
    compute = TimingOptions(warmup_ms=10, settle_warmup_ms=100)
    memory = TimingOptions(warmup_ms=10, settle_warmup_ms=100, memory_bound=True)
    assert child_mod._full_warmup_ms(memory, idle_s=0.2, quiet=True) == 10
    assert child_mod._full_warmup_ms(memory, idle_s=0.2, quiet=False) == 100
    assert child_mod._full_warmup_ms(compute, idle_s=0.2, quiet=True) == 100


class FakeMonitor:
    """NVML's view, set by the test: power (W), throttle bits, a 700 W limit."""

    def __init__(self) -> None:
        self.power_w: float | None = 300.0
        self.throttle = 0

    def sample(self) -> dict[str, Any]:
        return {"sm_mhz": 1980.0, "mem_mhz": 2619.0, "power_w": self.power_w,
                "temp_c": 40.0, "throttle": self.throttle}

    def power_limit_w(self) -> float:
        return 700.0


def test_power_pressure_is_the_power_over_its_share_of_the_limit_or_a_power_cap():
    state = child_mod.ChildState("cuda")
    state.monitor = FakeMonitor()  # type: ignore[assignment]
    timing = TimingOptions(memory_bound=True, quiet_power_frac=0.6)
    assert not state.power_pressed(timing)  # 300 W of 700
    state.monitor.power_w = 450.0  # type: ignore[union-attr]
    assert state.power_pressed(timing)  # over 420 W
    state.monitor.power_w, state.monitor.throttle = 200.0, 0x4  # type: ignore[union-attr]
    assert state.power_pressed(timing)  # sw_power_cap
    state.monitor.power_w, state.monitor.throttle = None, 0  # type: ignore[union-attr]
    assert state.power_pressed(timing)  # NVML cannot say: warm up


def test_a_memory_bound_task_warms_up_first_then_only_after_the_power_rose(monkeypatch):
    calls = _fake_gpu_timer(monkeypatch)

    def warmups() -> list[float]:  # of the timings so far
        return [w for w, _ in calls]

    state = child_mod.ChildState("cuda")
    monitor = FakeMonitor()
    state.monitor = monitor  # type: ignore[assignment]
    timing = TimingOptions(warmup_ms=10, settle_warmup_ms=100, memory_bound=True,
                           quick_rep_ms=0)

    def timed() -> None:
        state.last_busy = time.monotonic() - 0.2  # a trial's gap: over settle_gap_s
        child_mod._time_fn(state, lambda: None, timing)

    timed()  # the task's first: warmed up; the power after it is quiet
    timed()  # so no warm-up
    assert warmups() == [100, 10] and state.quiet
    monitor.power_w = 650.0
    timed()  # this one met high power: taken again after the warm-up
    assert warmups()[2:] == [10, 100] and not state.quiet and state.warmup_ms == 100
    monitor.power_w = 250.0
    timed()  # the power was high after the last one: warmed up, then quiet again
    timed()
    assert warmups()[4:] == [100, 10]
    assert state.take_warmups() == {"long": 2, "short": 3, "redone": 1}
    # back to back (a re-timing's rounds) the clock is sustained already: a short warm-up,
    # and high power takes nothing again
    monitor.power_w = 650.0
    for _ in range(3):
        state.last_busy = time.monotonic()
        child_mod._time_fn(state, lambda: None, timing)
    assert warmups()[-3:] == [10, 10, 10] and state.take_warmups() == {
        "long": 0, "short": 3, "redone": 0}
    # a compute-bound problem's every timing is warmed up, whatever the power
    calls.clear()
    state.quiet = True
    compute = TimingOptions(warmup_ms=10, settle_warmup_ms=100, quick_rep_ms=0)
    state.last_busy = time.monotonic() - 0.2
    child_mod._time_fn(state, lambda: None, compute)
    assert warmups() == [100]


def test_a_new_task_starts_without_the_last_task_s_quiet_power(monkeypatch):
    state = child_mod.ChildState("interpret")
    state.quiet = True
    monkeypatch.setattr("tuner.kernel.load_ref", lambda ref: SimpleNamespace())
    child_mod._setup(state, "x:KERNEL", {"N": 1}, "float32", 0)
    assert not state.quiet


def test_a_child_whose_spawned_hook_fails_is_killed_not_left_behind():
    """The backend starts its compile pool in ``spawned_hook``, once the child is spawned; if
    that raises, the child (not yet waited for) is killed and the error goes on."""
    spawned: list[int] = []

    class PoolFailed(Exception):
        pass

    def hook() -> None:
        import multiprocessing

        spawned.extend(p.pid for p in multiprocessing.active_children()
                       if p.name == "tuner-interpret-child" and p.pid is not None)
        raise PoolFailed("no compile pool")

    with pytest.raises(PoolFailed):
        ChildProcess("interpret", 0, start_timeout_s=60, spawned_hook=hook)
    assert spawned
    for pid in spawned:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
