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


# -- compiling from host tensors (tuner.host_compile): no CUDA context in the pool -----------

#: a problem of each built-in kernel family, with what its host code decides by the device:
#: the persistent variants' SM count, tensor descriptors (TMA) on sm_90, the fast activation's
#: PTX, softmax's cross-program SYNC, unaligned rows staged (ALIGN)
HOST_PROBLEMS = [
    ("matmul", {"M": 4096, "N": 4096, "K": 4096}, "bfloat16"),
    ("matmul", {"M": 1500, "N": 3001, "K": 999}, "float16"),
    ("matmul_epilogue_gelu", {"M": 1024, "N": 1024, "K": 1024}, "bfloat16"),
    ("moe_gemm_variants", {"M": 64, "N": 1024, "K": 512, "E": 8, "TOPK": 2}, "bfloat16"),
    ("softmax", {"M": 4096, "N": 8192}, "float16"),
    ("add_layernorm", {"M": 1024, "N": 4096}, "bfloat16"),
    ("flash_attention_causal", {"B": 1, "H": 2, "S": 256, "D": 64}, "float16"),
    ("vector_add", {"N": 1 << 20}, "float32"),
    ("conv2d_nhwc", {"N": 2, "C": 16, "H": 16, "W": 16, "K": 16, "R": 3, "S": 3, "STRIDE": 1,
                     "PAD1": 2, "DIL": 1}, "float16"),
]
#: the parameters whose values change what the host code decides by the device
VARIED = ("VARIANT", "SYNC", "SPLIT", "TMA", "PROGRAMS_PER_SM", "SUBTILE", "ALIGN", "SPLIT_K")


def _varied_configs(kernel, shape, dtype, most: int = 8) -> list[KernelConfig]:
    """The default config, then for each value of each ``VARIED`` parameter the first feasible
    config that has it."""
    from tuner.space import ProblemContext

    feasible = kernel.space().feasible(ProblemContext(dict(shape), dtype))
    picks = [kernel.default_config(shape, dtype)]
    for name in VARIED:
        seen = {c.get(name) for c in picks}
        for c in feasible:
            if name in c and c[name] not in seen:
                picks.append(c)
                seen.add(c[name])
    return list(dict.fromkeys(picks))[:most]


@pytest.mark.parametrize("name,shape,dtype", HOST_PROBLEMS,
                         ids=[f"{p[0]}-{'x'.join(map(str, p[1].values()))}"
                              for p in HOST_PROBLEMS])
def test_the_pool_compiles_from_host_tensors_the_binaries_the_child_loads(
        cuda_machine: list[Gpu], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        name: str, shape: dict[str, int], dtype: str):
    """Each built-in kernel compiles from host tensors in the pool (``compiles_on_host``):
    for every kind of config its host code decides by the device, the child's compile step is
    a cache load (the same binary and key as its own launch), and no pool process holds a CUDA
    context (nvidia-smi lists the child, never them)."""
    from search_spaces import get_kernel
    from tests.gpu.smi import compute_pids
    from tuner.host_compile import compiles_on_host

    kernel = get_kernel(name)
    assert compiles_on_host(kernel)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    configs = _varied_configs(kernel, shape, dtype)
    backend = ProcessBackend("cuda", kernel.ref, shape, dtype, compile_workers=4,
                             timing=TimingOptions(warmup_ms=2, rep_ms=5, quick_rep_ms=0,
                                                  protocol="none", compile_timeout_s=120,
                                                  run_timeout_s=30))
    try:
        [warm] = backend.measure([configs[0]])  # the child's one-time costs
        measured = backend.measure(configs[1:])
        holding = compute_pids()
        pool_pids = set(backend._pool.pids) if backend._pool is not None else set()
        child_pid = backend.child_pids[-1]
    finally:
        backend.close()
    assert pool_pids and not pool_pids & holding, (pool_pids, holding)
    assert child_pid in holding
    ok = [m for m in measured if m.ok]
    assert warm.ok and len(ok) >= len(measured) // 2, [(m.config.key(), m.error) for m in measured]
    for m in ok:
        child_s = m.extra.get("compile_step_s")
        assert child_s is not None and child_s < CACHE_LOAD_S, (
            f"{m.config.key()}: the child took {child_s:.2f} s to compile: the pool's binary "
            "from host tensors was not the one the child's launch needed")


def test_the_pool_builds_the_launcher_of_what_it_compiles(
        cuda_machine: list[Gpu], tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Triton 3.6 builds a C launcher per kernel signature at a binary's first launch (~200 ms
    of the child's on a cold cache, ``bench/results/trial_cost_cold_h100/``); the pool builds
    it beside the binary (``tuner.host_compile.build_launchers``), before anything launched."""
    import inspect
    import time

    from triton.backends.nvidia import driver as nvidia_driver

    from search_spaces import get_kernel
    from tuner.backends.compile_pool import CompilePool

    cache = tmp_path / "triton-cache"
    monkeypatch.setenv("TRITON_CACHE_DIR", str(cache))
    kernel = get_kernel("vector_add")
    shape = {"N": 1 << 20}
    pool = CompilePool("cuda", kernel.ref, shape, "float32", size=1, timeout_s=120)
    try:
        pool.submit([kernel.default_config(shape, "float32")])
        done: list = []
        deadline = time.monotonic() + 120
        while not done and time.monotonic() < deadline:
            done = pool.poll(1.0)
    finally:
        pool.close()
    assert done and done[0].failure is None, done
    builds_c = "compile_module_from_src" in inspect.getsource(nvidia_driver.CudaLauncher)
    launchers = list(cache.rglob("__triton_launcher*"))
    assert bool(launchers) == builds_c, (builds_c, launchers)
