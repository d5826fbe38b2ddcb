"""tuner.phases: a task's phases never overlap, whatever nests inside what."""

from __future__ import annotations

import time

import pytest

from tuner.phases import PhaseClock, unaccounted


def test_a_block_is_charged_its_own_time_less_the_phases_inside_it():
    clock = PhaseClock()
    t0 = time.perf_counter()
    with clock.timed("search"):
        time.sleep(0.02)
        with clock.timed("storing"):
            time.sleep(0.03)
        clock.add("measuring", 0.5)  # reported by the backend: inside the loop's wall time
        clock.add("compile_ahead_cpu", 7.0)  # other processes' work: not wall time here
        clock.add("queued", 3.0)  # before the claim: not inside anything
    wall = time.perf_counter() - t0
    got = clock.to_dict()
    assert got["storing"] == pytest.approx(0.03, abs=0.02)
    assert got["search"] == pytest.approx(wall - got["storing"] - 0.5, abs=0.005)
    assert got["compile_ahead_cpu"] == 7.0 and got["queued"] == 3.0
    assert list(got) == ["queued", "measuring", "storing", "search", "compile_ahead_cpu"]


def test_unaccounted_is_total_less_the_phases_after_the_claim():
    phases = {"queued": 5.0, "setup": 1.0, "measuring": 2.0, "search": 0.5, "total": 4.0}
    assert unaccounted(phases) == pytest.approx(0.5)
    assert unaccounted({"setup": 1.0}) == 0.0


def test_an_unknown_phase_is_refused():
    with pytest.raises(ValueError, match="unknown phase 'compiling'"):
        PhaseClock().add("compiling", 1.0)
