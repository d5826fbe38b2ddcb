"""The measurement pipeline's isolation, through the real child process and compile pool."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fakes.faulty import (
    COMPILE_ERROR,
    COMPILE_HANG,
    EXIT,
    GOOD,
    HANG,
    KERNEL,
    NAN,
    STICKY,
    WRONG,
)
from tests.support_processes import alive
from tuner.backends import TimingOptions
from tuner.backends.process import ProcessBackend
from tuner.config import KernelConfig
from tuner.measurement import Outcome
from tuner.search import SearchOptions, run_search

SHAPE = {"N": 1000}
FAST = TimingOptions(compile_timeout_s=3, run_timeout_s=3, start_timeout_s=60,
                     max_consecutive_deaths=10)


def cfg(mode: int, slow: int = 1) -> KernelConfig:
    return KernelConfig(MODE=mode, SLOW=slow)


def spawned_children() -> list[int]:
    """Live processes started by this one through multiprocessing's spawn (resource tracker
    excluded)."""
    me, found = os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        state = stat.rsplit(")", 1)[1].split()[0]
        if ppid == me and state != "Z" and "spawn_main" in cmdline:
            found.append(int(entry.name))
    return found


def pids_of(b: ProcessBackend) -> list[int]:
    """Every process the backend started: GPU children (restarts included) and compile pool."""
    return list(b.child_pids) + (list(b._pool.pids) if b._pool is not None else [])


@pytest.fixture
def backend():
    # The interpreter has nothing to compile ahead; the pool is enabled here so that its
    # timeouts and error paths run for real.
    b = ProcessBackend("interpret", KERNEL.ref, SHAPE, "float32", timing=FAST,
                       compile_workers=2)
    yield b
    pids = pids_of(b)
    b.close()
    assert [p for p in pids if alive(p)] == [], "a process the backend started is alive"
    assert spawned_children() == [], "a child process was left behind"


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("mode", "outcome", "restarts"), [
    (EXIT, Outcome.CRASH, 1),
    (HANG, Outcome.TIMEOUT, 1),
    (STICKY, Outcome.CRASH, 1),
    (WRONG, Outcome.WRONG_RESULT, 0),
    (NAN, Outcome.WRONG_RESULT, 0),
    (COMPILE_HANG, Outcome.TIMEOUT, 0),
    (COMPILE_ERROR, Outcome.COMPILE_ERROR, 0),
])
def test_each_fault_is_classified_and_the_next_config_still_runs(backend, mode, outcome,
                                                                 restarts):
    bad, good = backend.measure([cfg(mode), cfg(GOOD)])
    assert bad.outcome is outcome, bad.error
    assert backend.restarts == restarts
    assert good.outcome is Outcome.OK and good.p50_ms and good.p50_ms > 0
    assert backend.healthy


def test_every_trial_is_marked_as_a_trial_whoever_made_it(backend):
    # OK in the child, a failure the child classified, a crash and a compile timeout the
    # parent recorded
    results = backend.measure([cfg(GOOD), cfg(WRONG), cfg(EXIT), cfg(COMPILE_HANG)])
    assert [m.extra.get("measured") for m in results] == ["trial"] * 4
    assert "gpu" not in results[0].extra  # the interpreter records no GPU state


def test_wrong_and_nan_results_say_what_was_wrong(backend):
    wrong, nan = backend.measure([cfg(WRONG), cfg(NAN)])
    assert "off the reference" in (wrong.error or "")
    assert "NaN/Inf" in (nan.error or "")


def test_a_compile_timeout_kills_only_that_compile(backend):
    results = backend.measure([cfg(COMPILE_HANG), cfg(GOOD, 1), cfg(GOOD, 2)])
    assert [m.outcome for m in results] == [Outcome.TIMEOUT, Outcome.OK, Outcome.OK]
    assert "compile timed out" in (results[0].error or "")
    assert backend._pool is not None and backend._pool.kills == 1


@pytest.mark.timeout(300)
def test_a_search_over_faulty_configs_finishes_with_a_verified_best(backend):
    result = run_search(KERNEL, SHAPE, "float32", backend,
                        SearchOptions(trials=24, seed=0, strategy="exhaustive", batch_size=4))
    assert result.best is not None and result.best.config["MODE"] == GOOD
    outcomes = {m.config["MODE"]: m.outcome for m in result.trials}
    assert outcomes[EXIT] is Outcome.CRASH and outcomes[HANG] is Outcome.TIMEOUT
    assert outcomes[COMPILE_HANG] is Outcome.TIMEOUT
    assert len(result.trials) == 24


def test_repeated_deaths_mark_the_device_unhealthy():
    timing = TimingOptions(compile_timeout_s=3, run_timeout_s=3, start_timeout_s=60,
                           max_consecutive_deaths=2)
    b = ProcessBackend("interpret", KERNEL.ref, SHAPE, "float32", timing=timing,
                       compile_workers=0)
    try:
        from tuner.errors import WorkerDied

        b.measure([cfg(EXIT)])
        with pytest.raises(WorkerDied):
            b.measure([cfg(EXIT, 2)])
        assert not b.healthy
    finally:
        b.close()
    assert spawned_children() == []


def test_a_hang_kills_the_child_with_its_process_group(backend):
    first = backend._child.process.pid
    (bad,) = backend.measure([cfg(HANG)])
    assert bad.outcome is Outcome.TIMEOUT and "run timed out" in (bad.error or "")
    assert not alive(first) and backend._child.process.pid != first


def test_duplicates_in_a_batch_are_measured_once(backend):
    a, b, c = backend.measure([cfg(GOOD), cfg(GOOD), cfg(GOOD, 2)])
    assert a is b and a.ok and c.ok


def test_preferred_batch_follows_the_pool(backend):
    assert backend.preferred_batch == 2


def test_calibrate_answers_on_the_interpreter(backend):
    assert backend.calibrate() == {"copy_gbps": None, "copy_gbps_spread": None,
                                   "matmul_tflops": None, "matmul_tflops_spread": None,
                                   "runs": 0}


def test_retime_interleaves_and_survives(backend):
    ok = backend.measure([cfg(GOOD, 1), cfg(GOOD, 3)])
    retimed = backend.retime([m.config for m in ok], rounds=3)
    assert [m.config for m in retimed] == [m.config for m in ok]
    assert all(m.ok and m.p20_ms <= m.p50_ms <= m.p80_ms for m in retimed)
    assert all(m.extra["measured"] == "retimed" and m.extra["rounds"] == 3 for m in retimed)
    # the fake kernel has no baseline hook: asking for one adds nothing
    assert [m.config for m in backend.retime([ok[0].config], 2, baseline=True)] == [ok[0].config]
    # a config that hangs while re-timed: the child is replaced and the caller keeps its timings
    assert backend.retime([cfg(HANG)], rounds=1) == []
    assert backend.measure([cfg(GOOD, 2)])[0].ok


@pytest.mark.timeout(300)
def test_search_with_the_backends_preferred_batch(backend):
    """batch_size None: the loop asks preferred_batch configs ahead (the pool size)."""
    result = run_search(KERNEL, SHAPE, "float32", backend,
                        SearchOptions(trials=12, seed=1, strategy="exhaustive"))
    assert result.best is not None and result.best.config["MODE"] == GOOD
    assert len({m.config for m in result.trials}) == len(result.trials) == 12


def test_measure_reports_each_result_as_it_is_taken(backend):
    seen = []
    results = backend.measure([cfg(COMPILE_ERROR), cfg(GOOD), cfg(GOOD)], on_result=seen.append)
    assert len(seen) == 2 and {m.config for m in seen} == {cfg(COMPILE_ERROR), cfg(GOOD)}
    assert results[1] is results[2] and results[1] in seen and results[0] in seen


def test_a_callback_that_raises_stops_the_batch_and_the_backend_still_works(backend):
    class Stop(Exception):
        pass

    seen = []

    def stop(m):
        seen.append(m)
        raise Stop

    with pytest.raises(Stop):
        backend.measure([cfg(GOOD, 1), cfg(GOOD, 2), cfg(GOOD, 3)], on_result=stop)
    assert len(seen) == 1
    assert backend.measure([cfg(GOOD, 2)])[0].ok


def test_a_config_only_the_compile_pool_fails_to_build_is_measured_by_the_child():
    """A pool crash may come from the pool's own inputs (stand-ins, a problem made on the
    CPU): the child compiles and measures the config itself. Compile errors stay final."""
    from tests.fakes.faulty import POOL_ONLY

    b = ProcessBackend("interpret", POOL_ONLY.ref, SHAPE, "float32", timing=FAST,
                       compile_workers=1)
    try:
        good, broken = b.measure([KernelConfig(MODE=GOOD, SLOW=1),
                                  KernelConfig(MODE=COMPILE_ERROR, SLOW=1)])
    finally:
        b.close()
    assert good.ok, good.error
    assert broken.outcome is Outcome.COMPILE_ERROR
