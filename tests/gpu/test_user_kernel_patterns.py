"""Users' kernels (tests/user_kernels.py) on the GPU: every pattern verified and tuned by the
real measuring child (a TMA kernel's pre_hook on the compiled path, heuristics, reset_to_zero,
restore_value, prune_configs_by, config-dependent inputs, dimensions beyond the key), NaN
refused without a reference, and a kernel declaring 512 MiB compiled ahead by the pool from
stand-ins (the child then loads the binary)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests import user_kernels as uk
from tests.gpu.smi import Gpu
from tuner.backends import TimingOptions
from tuner.backends.process import ProcessBackend
from tuner.config import KernelConfig
from tuner.search import SearchOptions, run_search

pytestmark = pytest.mark.gpu

TIMING = TimingOptions(warmup_ms=2, rep_ms=10, compile_timeout_s=90, run_timeout_s=30)
CASES = {
    "PADDED": {"T": 1000, "D": 96},
    "TMA": {"M": 256, "N": 512},
    "SQUARE": {"N": 4096},
    "IN_PLACE": {"N": 5000},
    "NEGATE": {"N": 20},
    "ROWS": {"B": 4, "H": 8, "S": 1000},
    "LISTED": {"N": 100000},
    "BY_CALL": {"N": 100000},
}


def _search(kernel: Any, shape: dict[str, int], trials: int, **backend_kw: Any) -> Any:
    backend = ProcessBackend("cuda", kernel.ref, shape, "float32", timing=TIMING,
                             **backend_kw)
    try:
        return run_search(kernel, shape, "float32", backend, SearchOptions(
            trials=trials, retime_rounds=2, listed=kernel.listed_configs(shape, "float32")))
    finally:
        backend.close()


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_pattern_is_verified_and_tuned_on_the_gpu(cuda_machine: list[Gpu], name: str):
    kernel = getattr(uk, name)
    result = _search(kernel, CASES[name], trials=len(kernel.configs) + 3)
    failed = [(m.config.key(), m.outcome.value, m.error) for m in result.trials
              if not m.ok and m.outcome.value != "pruned"]
    assert failed == []
    assert result.best is not None and result.best.ok
    assert set(kernel.listed_configs(CASES[name], "float32")) <= {m.config for m in
                                                                   result.trials}


def test_a_tma_config_beyond_the_list_compiles_with_the_shared_pre_hook(
        cuda_machine: list[Gpu]):
    beyond = KernelConfig(BLOCK_M=64, BLOCK_N=64, num_warps=4, num_stages=3)
    backend = ProcessBackend("cuda", uk.TMA.ref, CASES["TMA"], "float32", timing=TIMING)
    try:
        [m] = backend.measure([beyond])
    finally:
        backend.close()
    assert m.ok, m.error


def test_without_a_reference_nan_rows_are_refused_on_the_gpu(cuda_machine: list[Gpu]):
    backend = ProcessBackend("cuda", uk.NAN_ROWS.ref, {"R": 4, "N": 16}, "float32",
                             timing=TIMING)
    try:
        measured = backend.measure(uk.NAN_ROWS.configs)
    finally:
        backend.close()
    assert [m.outcome.value for m in measured] == ["wrong_result"] * len(measured)
    assert all("NaN" in (m.error or "") for m in measured)


def test_a_kernel_declaring_huge_traffic_is_compiled_ahead_from_stand_ins(
        cuda_machine: list[Gpu], tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    cache = tmp_path / "triton-cache"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    shape = {"N": 1 << 20}
    backend = ProcessBackend("cuda", uk.HUGE.ref, shape, "float32", timing=TIMING,
                             compile_workers=2)
    try:
        [warm] = backend.measure([uk.HUGE.configs[0]])  # the child's one-time costs
        assert warm.ok, warm.error
        measured = backend.measure(uk.HUGE.configs[1:4])
    finally:
        backend.close()
    assert all(m.ok for m in measured), [m.error for m in measured]
    # compiled by the pool: the child's compile step found each binary in the cache
    child_compile_s = {m.config.key(): m.extra.get("compile_step_s") for m in measured}
    assert all((s or 0) < 0.5 for s in child_compile_s.values()), child_compile_s
