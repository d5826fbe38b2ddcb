"""The corpus of real library kernels (``tests/corpus/``): each one, adapted through
``tuner.Kernel``, computes what its torch reference computes with the library's first config,
passes the conformance suite (``tuner.testing``), and is tuned end to end on the CPU
interpreter through the engine (a short search in a measuring child process that imports it by
``kernel.ref``). A kernel a defect of this project blocks is named in its module's
docstring, with the defect; none is now."""

from __future__ import annotations

from typing import Any

import pytest

import tuner.testing
from tests.corpus import fla_kernels, liger_kernels
from tuner.backends import TimingOptions
from tuner.backends.child import ChildState, _verify
from tuner.backends.factory import open_backend
from tuner.kernel import load_ref
from tuner.search import SearchOptions, run_search

MODULES = (fla_kernels, liger_kernels)
KERNELS: dict[str, Any] = {n: k for m in MODULES for n, k in m.KERNELS.items()}
SHAPES: dict[str, dict[str, int]] = {n: s for m in MODULES for n, s in m.SHAPES.items()}
#: the interpreter computes fp32 right (bf16 tl.dot wrongly)
DTYPE = "float32"
#: a search of a few trials: the library's first configs, each verified and timed
TRIALS = 3
FAST = TimingOptions(warmup_ms=1.0, rep_ms=5.0, quick_rep_ms=0.0, compile_timeout_s=60,
                     run_timeout_s=60, start_timeout_s=120)


@pytest.fixture(params=sorted(KERNELS))
def name(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def verify_default(kernel: Any, shape: dict[str, int]) -> str | None:
    """Why the default config's outputs differ from the reference (None: they match), as the
    measuring child checks them."""
    state = ChildState("interpret")
    state.kernel, state.shape, state.dtype = kernel, shape, DTYPE
    inputs = kernel.make_inputs(shape, DTYPE, "cpu", 3)
    return _verify(state, kernel.default_config(shape, DTYPE), inputs)


def test_every_corpus_kernel_has_a_shape_a_gpu_shape_and_a_ref_that_imports_it():
    for module in MODULES:
        names = set(module.KERNELS)
        assert names <= set(module.SHAPES) and names <= set(module.GPU_SHAPES)
        for kernel in module.KERNELS.values():
            assert load_ref(kernel.ref) is kernel
    assert len(KERNELS) >= 8


def test_the_default_config_matches_the_reference(name):
    assert verify_default(KERNELS[name], SHAPES[name]) is None


def test_passes_the_conformance_suite(name):
    """``tuner.testing``: members, version, configs, seeded inputs that name their own problem,
    the reference, a zeroing launch and wrong outputs refused, rounding noise accepted. On the
    corpus's own shapes: the suite's default of 7 per dimension is no rotary head (odd) and no
    TMA row (strides must be 16-byte aligned)."""
    tuner.testing.check_kernel(KERNELS[name], shape=SHAPES[name], dtype=DTYPE)


@pytest.mark.timeout(300)
def test_a_short_search_on_the_interpreter_finds_a_verified_best(name):
    kernel, shape = KERNELS[name], SHAPES[name]
    listed = kernel.listed_configs(shape, DTYPE)
    backend = open_backend("interpret", kernel, shape, DTYPE, timing=FAST, compile_workers=0)
    try:
        result = run_search(kernel, shape, DTYPE, backend,
                            SearchOptions(trials=TRIALS, warm_start=listed[:TRIALS],
                                          retime_rounds=1))
    finally:
        backend.close()
    assert [m.config for m in result.trials] == listed[:TRIALS]
    assert result.best is not None and result.best.ok, result.counts
    assert result.best.max_error is not None  # verified against the reference
