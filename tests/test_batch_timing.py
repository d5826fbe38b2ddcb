"""A batch of configs on the measuring child: each compiled and verified, then the verified ones
timed back to back, so that only the batch's first timing pays the sustained-state warm-up
(issue 33); failures are reported at once, a sticky one ends the batch, and the parent measures
what a dead or hung child left on a fresh one."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.fakes import faulty
from tuner.backends import TimingOptions
from tuner.backends import child as child_mod
from tuner.backends.process import ProcessBackend
from tuner.config import KernelConfig
from tuner.measurement import Measurement, Outcome

GOOD = [KernelConfig(MODE=faulty.GOOD, SLOW=s) for s in (1, 2, 3)]
WRONG = KernelConfig(MODE=faulty.WRONG, SLOW=1)
STICKY = KernelConfig(MODE=faulty.STICKY, SLOW=1)
COMPILE_ERROR = KernelConfig(MODE=faulty.COMPILE_ERROR, SLOW=1)


class Monitor:
    """NVML's view, set by the test: each timing leaves the power of ``after`` (in turn; the
    last one stays), a 700 W limit, no throttle bits."""

    def __init__(self) -> None:
        self.after = [300.0]
        self.power_w = 300.0

    def sample(self) -> dict[str, Any]:
        return {"sm_mhz": 1980.0, "mem_mhz": 2619.0, "power_w": self.power_w,
                "temp_c": 40.0, "throttle": 0}

    def power_limit_w(self) -> float:
        return 700.0


@pytest.fixture
def gpu_child(monkeypatch: pytest.MonkeyPatch) -> tuple[child_mod.ChildState, Monitor,
                                                         list[tuple[float, float]]]:
    """A child's state on a "GPU" (no GPU here: the kernel's tensors stay on the CPU, nothing
    is synchronised, NVML is a ``Monitor``, and ``tuner.gpu_timer.bench`` is faked to take
    1 ms, record each call's warm-up and rep, and leave the monitor's next power), on the
    faulty kernel, whose GPU path compiles with its ``compile``."""
    import tuner.gpu_timer

    calls: list[tuple[float, float]] = []
    monitor = Monitor()

    def bench(method: str, fn: Any, warmup: float = 25.0, rep: float = 100.0,
              quantiles: Any = None) -> list[float]:
        fn()
        calls.append((warmup, rep))
        monitor.power_w = monitor.after[min(len(calls), len(monitor.after)) - 1]
        return [1.0, 1.0, 1.0]

    monkeypatch.setattr(tuner.gpu_timer, "bench", bench)
    monkeypatch.setattr(child_mod.ChildState, "device", property(lambda self: "cpu"))
    monkeypatch.setattr(child_mod.ChildState, "sync", lambda self: None)
    state = child_mod.ChildState("cuda")
    state.monitor = monitor  # type: ignore[assignment]
    state.kernel, state.shape, state.dtype = faulty.KERNEL, {"N": 64}, "float32"
    state.last_busy = time.monotonic() - 0.5  # the previous batch's timing: long ago
    return state, monitor, calls


TIMING = TimingOptions(warmup_ms=10, settle_warmup_ms=100, rep_ms=40, quick_rep_ms=0)


def _run(state: child_mod.ChildState, configs: list[KernelConfig]) -> list[tuple[Any, ...]]:
    sent: list[tuple[Any, ...]] = []
    child_mod.measure_many(state, configs, TIMING, sent.append)
    return sent


def _steps(sent: list[tuple[Any, ...]]) -> list[tuple[str, int]]:
    return [(m[0], m[1]) for m in sent]


def test_a_batch_is_verified_first_then_timed_back_to_back_with_one_long_warm_up(gpu_child):
    state, _monitor, calls = gpu_child  # the power stays quiet: 300 of 700 W
    configs = [GOOD[0], WRONG, GOOD[1], GOOD[2]]
    sent = _run(state, configs)
    assert _steps(sent) == [
        ("compiled", 0), ("verified", 0), ("compiled", 1), ("result", 1),
        ("compiled", 2), ("verified", 2), ("compiled", 3), ("verified", 3),
        ("result", 0), ("result", 2), ("result", 3)]
    results = {m[1]: m[2] for m in sent if m[0] == "result"}
    assert results[1].outcome is Outcome.WRONG_RESULT and results[1].p50_ms is None
    timed = [results[i] for i in (0, 2, 3)]
    assert all(m.ok and m.extra["measured"] == "trial" for m in timed)
    # the first timing after a gap warms the GPU up to its sustained state; the next ones
    # follow it within settle_gap_s, with the power limiter idle, and keep the short warm-up
    assert calls == [(100, 40), (10, 40), (10, 40)]
    assert [m.extra["warmup_ms"] for m in timed] == [100, 10, 10]
    assert [m.extra["warmups"] for m in timed] == [
        {"long": 1, "short": 0, "redone": 0}, {"long": 0, "short": 1, "redone": 0},
        {"long": 0, "short": 1, "redone": 0}]
    # each was verified (its max error measured) and its own compile step recorded; the
    # inputs, made once for the batch, counted on its first config
    assert all(m.max_error == 0.0 and m.extra["compile_step_s"] >= 0 for m in timed)
    assert timed[0].extra["inputs_s"] >= 0 and timed[1].extra["inputs_s"] == 0


def test_back_to_back_under_the_power_limiter_every_trial_warms_up(gpu_child):
    """A config right after another of less power starts at the clock that one left: with a
    10 ms warm-up 8192^3 ran 0.922x its sustained time after a 2048^3 GEMM
    (bench/results/gap_probe_h100.md). So a batch's trial keeps the short warm-up only while
    the power after the previous timing was quiet."""
    state, monitor, calls = gpu_child
    monitor.after = [650.0]  # every timing leaves the power over 60% of the limit
    sent = _run(state, GOOD)
    assert calls == [(100, 40)] * 3
    assert [m[2].extra["warmups"] for m in sent if m[0] == "result"] == [
        {"long": 1, "short": 0, "redone": 0}] * 3


def test_a_short_warm_up_that_finds_the_limiter_engaged_is_taken_again(gpu_child):
    state, monitor, calls = gpu_child
    # the first config leaves the power quiet; the second, timed back to back with 10 ms,
    # draws more: it is timed again after 100 ms, and the third warms up too
    monitor.after = [300.0, 650.0, 650.0, 650.0]
    sent = _run(state, GOOD)
    assert calls == [(100, 40), (10, 40), (100, 40), (100, 40)]
    timed = [m[2] for m in sent if m[0] == "result"]
    assert [m.extra["warmup_ms"] for m in timed] == [100, 100, 100]
    assert [m.extra["warmups"] for m in timed] == [
        {"long": 1, "short": 0, "redone": 0}, {"long": 0, "short": 1, "redone": 1},
        {"long": 1, "short": 0, "redone": 0}]


def test_a_retimings_rounds_keep_the_short_warm_up_back_to_back(gpu_child):
    """Its finalists are near-equal configs of one problem, timed in turn: not guarded (entry
    by entry here; interleaved, a round is one pass: tests/test_start_and_pacing.py)."""
    state, monitor, calls = gpu_child
    monitor.after = [650.0]
    child_mod.retime(state, GOOD[:2], 3, TimingOptions(
        warmup_ms=10, settle_warmup_ms=100, retime_rep_ms=20, retime_min_rounds=0),
        interleave=False)
    assert calls == [(100, 20)] + [(10, 20)] * 5


def test_timed_one_at_a_time_each_trial_pays_the_long_warm_up(gpu_child):
    """What the batch saves: configs sent one by one, a gap between them (the parent's and the
    next config's load and verification), every timing warms up for 100 ms."""
    state, _monitor, calls = gpu_child
    for config in GOOD:
        state.last_busy = time.monotonic() - 0.05  # a trial's gap: over settle_gap_s
        assert _steps(_run(state, [config]))[-1] == ("result", 0)
    assert calls == [(100, 40)] * 3


def test_a_compile_error_is_reported_at_once_and_a_sticky_error_ends_the_batch(gpu_child):
    state, _monitor, calls = gpu_child
    sent = _run(state, [COMPILE_ERROR, GOOD[0], STICKY, GOOD[1]])
    assert _steps(sent) == [("result", 0), ("compiled", 1), ("verified", 1),
                            ("compiled", 2), ("result", 2)]
    assert sent[0][2].outcome is Outcome.COMPILE_ERROR and sent[0][3] is False
    assert sent[-1][2].outcome is Outcome.CRASH and sent[-1][3] is True  # sticky
    assert calls == []  # nothing was timed on a context a sticky error left unusable


# -- the parent: a real child process on the interpreter ------------------------------------

FAST = TimingOptions(compile_timeout_s=60, run_timeout_s=60, start_timeout_s=120)


def _batches(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Each batch a backend sends its child, as config keys (a spy on the child's pipe)."""
    from tuner.backends.process import ChildProcess

    seen: list[list[str]] = []
    spied = ChildProcess.send

    def send(child: ChildProcess, message: tuple[Any, ...]) -> None:
        if message[0] == "measure":
            seen.append([c.key() for c in message[1]])
        spied(child, message)

    monkeypatch.setattr(ChildProcess, "send", send)
    return seen


@pytest.mark.timeout(300)
def test_the_parent_measures_what_a_dead_childs_batch_left_on_a_fresh_child(monkeypatch):
    seen = _batches(monkeypatch)
    backend = ProcessBackend("interpret", faulty.KERNEL.ref, {"N": 64}, "float32",
                             timing=FAST, compile_workers=0)
    exits = KernelConfig(MODE=faulty.EXIT, SLOW=1)
    got: list[Measurement] = []
    try:
        backend._measure_batch([GOOD[0], exits, GOOD[1], STICKY, GOOD[2]], got.append)
    finally:
        backend.close()
    by = {m.config: m for m in got}
    assert len(got) == 5 and by[GOOD[0]].ok and by[GOOD[1]].ok and by[GOOD[2]].ok
    assert by[exits].outcome is Outcome.CRASH and "exit code 3" in (by[exits].error or "")
    assert by[STICKY].outcome is Outcome.CRASH and "illegal memory access" in (
        by[STICKY].error or "")
    # the first child died verifying the second config (the first, verified, was not timed
    # yet); a fresh one took the rest and was replaced after the sticky error, which it met
    # verifying; the configs it had verified but not timed went to a third child
    keys = [[c.key() for c in batch] for batch in (
        [GOOD[0], exits, GOOD[1], STICKY, GOOD[2]], [GOOD[0], GOOD[1], STICKY, GOOD[2]],
        [GOOD[0], GOOD[1], GOOD[2]])]
    assert seen == keys
    assert len(set(backend.child_pids)) == 3
    assert backend.restarts == 2 and backend.consecutive_deaths == 0


@pytest.mark.timeout(300)
def test_a_config_that_hangs_its_timing_is_a_timeout_and_the_rest_are_measured(monkeypatch):
    backend = ProcessBackend("interpret", faulty.KERNEL.ref, {"N": 64}, "float32",
                             timing=TimingOptions(compile_timeout_s=60, run_timeout_s=3,
                                                  start_timeout_s=120), compile_workers=0)
    hangs = KernelConfig(MODE=faulty.HANG, SLOW=1)
    got: list[Measurement] = []
    try:
        backend._measure_batch([GOOD[0], hangs, GOOD[1]], got.append)
    finally:
        backend.close()
    by = {m.config: m for m in got}
    assert by[hangs].outcome is Outcome.TIMEOUT and "run timed out" in (by[hangs].error or "")
    assert by[GOOD[0]].ok and by[GOOD[1]].ok and len(got) == 3


@pytest.mark.timeout(300)
def test_the_parents_own_work_on_a_result_is_not_counted_as_the_childs_measuring():
    """``measuring`` is the parent's wait for the child; what the result's callback takes
    (storing the trial, timed as its own phase by the worker) is not counted again there,
    so that the phases of a task never overlap. The child's own seconds timing the trials
    are counted beside (``timing_child``)."""
    from tuner.phases import PhaseClock

    backend = ProcessBackend("interpret", faulty.KERNEL.ref, {"N": 64}, "float32",
                             timing=FAST, compile_workers=0)
    backend.clock = clock = PhaseClock()

    def store(_m: Measurement) -> None:
        with clock.timed("storing"):
            time.sleep(0.3)

    try:
        t0 = time.perf_counter()
        with clock.timed("search"):
            backend._measure_batch(list(GOOD[:3]), store)
        wall = time.perf_counter() - t0
    finally:
        backend.close()
    s = clock.seconds
    assert s["storing"] >= 0.9
    assert s["search"] >= 0  # nothing taken out of the loop twice
    assert sum(s[p] for p in ("compile_child", "verifying", "measuring", "storing",
                              "search")) <= wall + 0.01
    assert 0 < s["timing_child"]


# -- time ahead: the GPU child's idle wait for a batch's compiles ---------------------------

@pytest.mark.timeout(300)
@pytest.mark.parametrize("ahead", [True, False])
def test_while_a_batch_waits_for_a_compile_the_child_times_configs_compiled_ahead(
        monkeypatch, ahead):
    """With ``time_ahead``, configs compiled ahead are timed while the batch's own config
    compiles (2 s here), and a later batch that asks for them takes those results without
    the child; without it, the child idles and times them when asked."""
    from dataclasses import replace

    seen = _batches(monkeypatch)
    warm = KernelConfig(MODE=faulty.GOOD, SLOW=1)
    early = [KernelConfig(MODE=faulty.GOOD, SLOW=2), KernelConfig(MODE=faulty.WRONG, SLOW=1)]
    slow = KernelConfig(MODE=faulty.GOOD, SLOW=3)  # its compile takes 2 s
    backend = ProcessBackend("interpret", faulty.SLOW_COMPILE.ref, {"N": 64}, "float32",
                             timing=replace(FAST, time_ahead=ahead), compile_workers=2)
    try:
        assert backend.measure([warm])[0].ok  # the pool's processes are up
        backend.compile_now(early)
        time.sleep(3.0)  # compiled (1 s and at once), not measured
        [m_slow] = backend.measure([slow])
        after_slow = list(seen)
        got = backend.measure(early)
    finally:
        backend.close()
    assert m_slow.ok and not m_slow.extra.get("timed_ahead")
    keys = [[c.key()] for c in early]
    if ahead:  # timed while the slow compile ran, in the order their compiles finished
        assert after_slow[1:] == [keys[1], keys[0], [slow.key()]]
        assert seen == after_slow  # the later batch took the results: nothing sent
        assert all(m.extra.get("timed_ahead") and m.extra["measured"] == "trial" for m in got)
    else:
        assert after_slow[1:] == [[slow.key()]]
        assert seen[len(after_slow):] == [[c.key() for c in early]]  # one batch, when asked
        assert not any(m.extra.get("timed_ahead") for m in got)
    good, wrong = got
    assert good.ok and good.compile_s is not None and good.compile_s >= 0.9  # the pool's
    assert wrong.outcome is Outcome.WRONG_RESULT


@pytest.mark.timeout(300)
def test_a_compile_wait_while_a_config_is_queued_is_told_apart():
    """One pool process: the batch's second config waits in the queue while the first
    compiles (1 s), so part of the GPU child's wait is counted as queued
    (``compile_wait_queued``); with a process for each, none is."""
    from tuner.phases import PhaseClock

    def waits(workers: int) -> dict[str, float]:
        backend = ProcessBackend("interpret", faulty.SLOW_COMPILE.ref, {"N": 64}, "float32",
                                 timing=FAST, compile_workers=workers)
        try:
            assert backend.measure([KernelConfig(MODE=faulty.GOOD, SLOW=1)])[0].ok
            backend.clock = clock = PhaseClock()
            got = backend.measure([KernelConfig(MODE=faulty.GOOD, SLOW=2),
                                   KernelConfig(MODE=faulty.WRONG, SLOW=2)])
        finally:
            backend.close()
        assert got[0].ok and got[1].outcome is Outcome.WRONG_RESULT, got
        return clock.seconds

    one, two = waits(1), waits(2)
    assert one["compile_wait"] >= 1.5 and one.get("compile_wait_queued", 0.0) >= 0.7
    assert one["compile_wait_queued"] <= one["compile_wait"]
    assert two["compile_wait"] >= 0.8 and two.get("compile_wait_queued", 0.0) < 0.3


@pytest.mark.timeout(300)
def test_measure_ready_hands_back_what_it_timed_while_a_slow_compile_runs_on():
    """``measure_ready``: the config whose compile finished is timed and handed back while
    the slow one (2 s) still compiles; a later call takes the slow one from that same compile
    instead of starting another; ``measure`` waits for every config."""
    backend = ProcessBackend("interpret", faulty.SLOW_COMPILE.ref, {"N": 64}, "float32",
                             timing=FAST, compile_workers=2)
    quick = KernelConfig(MODE=faulty.GOOD, SLOW=2)  # its compile takes 1 s
    slow = KernelConfig(MODE=faulty.GOOD, SLOW=3)  # 2 s
    try:
        assert backend.measure([KernelConfig(MODE=faulty.GOOD, SLOW=1)])[0].ok  # pool up
        t0 = time.perf_counter()
        first = backend.measure_ready([slow, quick])
        handed_back = time.perf_counter() - t0
        second = backend.measure_ready([slow])
        both = time.perf_counter() - t0
        every = backend.measure([KernelConfig(MODE=faulty.WRONG, SLOW=1),
                                 KernelConfig(MODE=faulty.WRONG, SLOW=2)])
    finally:
        backend.close()
    assert [m.config for m in first] == [quick] and first[0].ok
    assert handed_back < 1.9  # before the slow compile finished
    assert [m.config for m in second] == [slow] and second[0].ok
    assert second[0].compile_s is not None and second[0].compile_s >= 1.9  # the pool's
    # its one compile (2 s) ran on while the quick one was timed: the second call waited
    # for what was left of it, not for a compile of its own
    assert both - handed_back < 1.7, (handed_back, both)
    assert [m.outcome for m in every] == [Outcome.WRONG_RESULT] * 2
