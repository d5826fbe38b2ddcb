"""The compile pool on the GPU: its processes compile each config on a small problem
(``compile_shape``: 4096 -> 256 in every dimension) into Triton's disk cache, and the GPU child
finds the same binary there: its own compile step for a pre-compiled config is a cache load."""

from __future__ import annotations

from pathlib import Path

import pytest

from search_spaces.matmul import KERNEL as MATMUL
from tests.gpu.smi import Gpu
from tuner.backends import TimingOptions
from tuner.backends.process import ProcessBackend
from tuner.config import KernelConfig
from tuner.kernel import compile_shape_for

pytestmark = pytest.mark.gpu

SHAPE = {"M": 4096, "N": 4096, "K": 4096}
#: the first config a child times pays its one-time costs (Triton's launcher, the first load)
WARM = KernelConfig(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8, num_warps=4, num_stages=3)
CONFIGS = [
    KernelConfig(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_M=8, num_warps=8, num_stages=3),
    KernelConfig(BLOCK_M=128, BLOCK_N=64, BLOCK_K=32, GROUP_M=8, num_warps=4, num_stages=4),
    KernelConfig(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, GROUP_M=1, num_warps=4, num_stages=3),
]
#: a cache load (inputs made, the binary found) takes milliseconds; compiling, seconds
CACHE_LOAD_S = 0.5


def test_the_pool_compiles_small_and_the_child_loads_the_binary(
        cuda_machine: list[Gpu], tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    small = compile_shape_for(MATMUL, SHAPE, "float16")
    assert small == {"M": 256, "N": 256, "K": 256}
    cache = tmp_path / "triton-cache"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))  # empty: nothing compiled before
    backend = ProcessBackend("cuda", MATMUL.ref, SHAPE, "float16", compile_workers=3,
                             timing=TimingOptions(warmup_ms=2, rep_ms=10,
                                                  compile_timeout_s=90, run_timeout_s=30))
    try:
        assert backend.preferred_batch == 3
        [warm] = backend.measure([WARM])
        assert warm.ok, warm
        measured = backend.measure(CONFIGS)
    finally:
        backend.close()
    assert any(cache.rglob("*.cubin")), "nothing was compiled into the test's cache"
    for m in measured:
        assert m.ok, m
        # the pool's compile, and the child's own compile step (its load from the cache)
        pool_s, child_s = m.compile_s, m.extra.get("compile_step_s")
        assert pool_s is not None and child_s is not None
        assert child_s < CACHE_LOAD_S, (
            f"{m.config.key()}: the child took {child_s:.2f} s to compile (the pool "
            f"{pool_s:.2f} s): the pool's binary was not the one the child needed")
        assert child_s < pool_s, (m.config.key(), child_s, pool_s)
