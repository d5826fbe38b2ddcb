"""Timing on the GPU through the real pipeline (compile pool, measuring child, verification,
do_bench with the L2 flushed) on a real matmul: the quick timing for a config far slower than
the best, the full one otherwise; the GPU state recorded with each timing; the calibration."""

from __future__ import annotations

import importlib
import math
from collections.abc import Iterator
from dataclasses import dataclass, replace

import pytest

from search_spaces.matmul import KERNEL as MATMUL
from tests.gpu.smi import Gpu, state_line
from tests.gpu.specs import spec_of
from tuner.backends import TimingOptions
from tuner.backends.process import ProcessBackend
from tuner.config import KernelConfig
from tuner.measurement import Measurement

pytestmark = pytest.mark.gpu

SHAPE = {"M": 4096, "N": 4096, "K": 4096}
FLOPS = MATMUL.flops(SHAPE)
#: the Triton tutorial's config for large fp16 GEMMs on Hopper
FAST = KernelConfig(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3)
#: the smallest tiles of the space on one of 2 warps: many times slower than FAST
SLOW = KernelConfig(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=1, num_warps=2, num_stages=2)
TIMING = TimingOptions(warmup_ms=5, rep_ms=20, compile_timeout_s=90, run_timeout_s=30)


@dataclass
class Timed:
    backend: ProcessBackend
    first: Measurement  # FAST, nothing timed before: the full timing
    slow: Measurement  # SLOW once FAST is known
    again: Measurement  # FAST again, in the same batch as SLOW


@pytest.fixture(scope="module")
def timed(_gpu_env: list[Gpu]) -> Iterator[Timed]:
    backend = ProcessBackend("cuda", MATMUL.ref, SHAPE, "float16", timing=TIMING,
                             compile_workers=2)
    try:
        [first] = backend.measure([FAST])
        slow, again = backend.measure([SLOW, FAST])
        yield Timed(backend, first, slow, again)
    finally:
        backend.close()


def sane(m: Measurement) -> None:
    assert m.ok, f"{m.config.key()}: {m.outcome.value}: {m.error}"
    assert m.p20_ms is not None and m.p50_ms is not None and m.p80_ms is not None
    assert 0 < m.p20_ms <= m.p50_ms <= m.p80_ms, (m.p20_ms, m.p50_ms, m.p80_ms)
    assert m.p80_ms < 10 * m.p20_ms  # one timing, not a hiccup
    # verified against the reference first (its tolerance is the verifier's business)
    assert m.max_error is not None and 0 <= m.max_error < 0.1, m.max_error
    assert m.compile_s is not None and m.compile_s > 0


def test_a_config_far_slower_than_the_best_gets_only_the_quick_timing(timed: Timed):
    for m in (timed.first, timed.slow, timed.again):
        sane(m)
    best = timed.first.p50_ms
    assert best is not None and timed.slow.p50_ms is not None
    # a real 4096^3 fp16 GEMM: well above 20 TFLOP/s, below any GPU's dense peak
    tflops = FLOPS / (best * 1e-3) / 1e12
    assert 20 < tflops < 2500, f"FAST at {tflops:.0f} TFLOP/s ({state_line()})"
    assert not timed.first.extra.get("quick")  # nothing to compare with yet: full timing
    assert timed.slow.p50_ms > TIMING.quick_factor * best
    assert timed.slow.extra.get("quick") is True
    # near the best: the quick look is followed by the full timing
    assert not timed.again.extra.get("quick")
    assert timed.again.p50_ms is not None and 0.5 < timed.again.p50_ms / best < 2.0
    # only full timings set the bar
    assert timed.backend.best_ms == min(best, timed.again.p50_ms)


def test_each_gpu_timing_records_the_gpu_state(timed: Timed):
    # part of the issue (tuner/gpu_state.py): a missing module is a failure, not a skip
    importlib.import_module("tuner.gpu_state")
    for m in (timed.first, timed.slow, timed.again):
        state = m.extra.get("gpu")
        assert isinstance(state, dict), f"{m.config.key()}: no extra['gpu'] in {m.extra}"
        assert {"sm_mhz", "mem_mhz", "power_w", "temp_c"} <= set(state), state
        values = {k: state[k] for k in ("sm_mhz", "mem_mhz", "power_w", "temp_c")}
        assert all(isinstance(v, int | float) and math.isfinite(v) for v in values.values()), (
            f"NVML gave no reading: {state}")
        assert 100 <= values["sm_mhz"] <= 3500, state  # H200: 1980 MHz at most
        assert 200 <= values["mem_mhz"] <= 20000, state  # HBM3e on the H200: 3201 MHz
        assert 20 <= values["power_w"] <= 1500, state
        assert 10 <= values["temp_c"] <= 105, state
        throttle = state.get("throttle")
        assert throttle is None or isinstance(throttle, int | str | list | dict), state


def test_calibration_reads_plausible_bandwidth_and_matmul_peak(timed: Timed):
    cal = timed.backend.calibrate()
    assert cal, "calibration failed (the log says why)"
    copy, tflops = cal.get("copy_gbps"), cal.get("matmul_tflops")
    assert isinstance(copy, float) and isinstance(tflops, float), cal
    spec = spec_of(timed.backend.fingerprint.name)
    if spec is not None:
        # a measurement reads below the datasheet, never above it (5% for the clock's boost)
        assert 0.4 * spec.hbm_gbps < copy <= 1.05 * spec.hbm_gbps, (cal, state_line())
        assert 0.4 * spec.bf16_tflops < tflops <= 1.05 * spec.bf16_tflops, (cal, state_line())
    else:
        assert 50 < copy < 20000 and 5 < tflops < 5000, cal
    # the repeated runs' spread ((max - min) / median), where calibrate reports it
    for key in ("copy_gbps_spread", "matmul_tflops_spread"):
        if key in cal or "runs" in cal:
            spread = cal[key]
            assert isinstance(spread, float) and 0 <= spread < 0.3, (key, cal)
    if "runs" in cal:
        runs = cal["runs"]
        assert (runs >= 2) if isinstance(runs, int) else len(runs) >= 2, cal


def test_a_re_timing_interleaves_its_configs_and_agrees_with_their_own_timings(timed: Timed):
    """``gpu_timer.do_bench_interleaved`` through the child: FAST and SLOW re-timed in one
    pass per round, each near its own full timing (SLOW's own is only the quick look); off
    by default, asked for here (``TimingOptions.retime_interleaved``)."""
    timed.backend.timing = replace(TIMING, retime_interleaved=True)
    try:
        fast, slow = timed.backend.retime([FAST, SLOW], 3)
    finally:
        timed.backend.timing = TIMING
    for m in (fast, slow):
        assert m.ok and m.extra.get("measured") == "retimed", m
        assert m.extra.get("interleaved") is True and m.extra.get("rounds") == 3, m.extra
        assert m.p20_ms is not None and m.p50_ms is not None and m.p80_ms is not None
        assert 0 < m.p20_ms <= m.p50_ms <= m.p80_ms
    assert timed.first.p50_ms is not None and fast.p50_ms is not None
    assert slow.p50_ms is not None and timed.slow.p50_ms is not None
    assert 0.8 < fast.p50_ms / timed.first.p50_ms < 1.25, (fast, timed.first, state_line())
    assert 0.7 < slow.p50_ms / timed.slow.p50_ms < 1.4, (slow, timed.slow, state_line())
    assert slow.p50_ms > 2 * fast.p50_ms
