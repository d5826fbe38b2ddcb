"""The timing-stability benchmark's arithmetic (its GPU parts run on the H200 only)."""

from __future__ import annotations

import pytest

from bench.timing_stability import parse_config, spread, sweep_table, target_config, verdicts


def test_spread_is_range_over_median():
    assert spread([1.0, 1.1, 0.9]) == pytest.approx(0.2)
    assert spread([2.0]) == 0.0


def test_a_choice_is_beyond_the_band_only_past_the_larger_of_2_percent_and_its_noise():
    times = {"a": 1.00, "b": 1.015, "c": 1.05}
    band, rows = verdicts(["a", "b", "c", "a"], times, {"a": 0.01, "b": 0.012, "c": 0.03})
    assert band == pytest.approx(0.03)
    assert [(k, beyond) for k, _, beyond in rows] == [
        ("a", False), ("b", False), ("c", True), ("a", False)]
    band, rows = verdicts(["c"], times, {"c": 0.06})
    assert band == pytest.approx(0.06) and rows[0][2] is False


def test_the_target_config_is_a_complete_config_of_the_matmul_space():
    from search_spaces import get_kernel

    config = target_config()
    assert get_kernel("matmul").space().contains(config)
    assert {k: config[k] for k in parse_config("BLOCK_M=128,BLOCK_N=256")} == {
        "BLOCK_M": 128, "BLOCK_N": 256}


def test_the_sweep_table_has_one_row_per_protocol_with_its_spread():
    rows = [{"ms": ms, "ok": True, "sm_mhz": 1980.0, "power_w": 300.0, "temp_c": 50.0,
             "cool_ms": 5.0, "settle_ms": None} for ms in (1.0, 1.02, 0.99)]
    lines = sweep_table([{"protocol": "cool", "rows": rows, "wall_s": 3.0}])
    assert len(lines) == 3 and lines[2].startswith("| cool | 3 | 1.0000 | 3.0% |")
