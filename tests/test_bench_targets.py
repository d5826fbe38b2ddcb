"""bench/targets.py's arithmetic and its problem list (the GPU runs happen on the H200)."""

from __future__ import annotations

import pytest

from bench.targets import PROBLEMS, Problem, achieved, parse_shape, score, variant_bests
from search_spaces import get_kernel


def test_every_problem_names_a_registered_kernel_its_dims_and_dtype():
    for p in PROBLEMS:
        kernel = get_kernel(p.kernel)
        shape = parse_shape(p.shape)
        assert set(shape) == {d.name for d in kernel.dims}, p
        assert p.dtype in kernel.dtypes, p
        assert all(d.lo <= shape[d.name] <= d.hi for d in kernel.dims), p


def test_the_ratio_is_torch_time_over_tuned_time_and_bandwidth_is_over_the_copy():
    p = Problem("matmul", "M=1,N=1,K=1", "float16", "x_torch", 0.95, 13)
    assert score(p, 0.2, 0.19, None, None) == (pytest.approx(0.95), True)
    assert score(p, 0.2, 0.18, None, None)[1] is False
    assert score(p, None, 0.18, None, None) == (None, None)
    bw = Problem("vector_add", "N=1", "float16", "bandwidth", 0.9, 14)
    assert score(bw, 1.0, None, 3.9, 4.27) == (pytest.approx(3.9 / 4.27), True)


def test_achieved_rates_and_variant_bests():
    p = PROBLEMS[0]
    tflops, tbs = achieved(p, 1.0, 2e12, 4e9)
    assert tflops == pytest.approx(2000.0) and tbs == pytest.approx(4.0)
    assert achieved(p, None, 1.0, 1.0) == (None, None)
    trials = [{"config": {"VARIANT": 0}, "outcome": "ok", "ms": 2.0},
              {"config": {"VARIANT": 0}, "outcome": "ok", "ms": 1.5},
              {"config": {"VARIANT": 1}, "outcome": "wrong_result", "ms": 0.1},
              {"config": {"VARIANT": 1}, "outcome": "ok", "ms": 1.7},
              {"config": {"BLOCK": 4}, "outcome": "ok", "ms": 0.5}]
    assert variant_bests(trials) == {"0": 1.5, "1": 1.7}
