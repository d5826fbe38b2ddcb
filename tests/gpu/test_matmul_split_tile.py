"""matmul tma_persistent's split tiles (BLOCK_N 192 = 128 + 64) on the GPU, where the copy
engine really zero-fills and clips at the edges (the CPU interpreter emulates descriptors).

In a child process (this process never initialises CUDA): on a 3072^3 problem (whole tiles) and
on shapes whose last tile's second block lies partly or wholly past N, each split config (8 and
4 warps) must match the fp32 reference within matmul's tolerance and write nothing past the
output's columns. Then the product's pipeline measures and verifies one like any other config."""

from __future__ import annotations

import pytest

from search_spaces.matmul import KERNEL as MATMUL
from search_spaces.matmul import TMA_PERSISTENT
from tests.gpu.child import measure_one, run_check
from tests.gpu.smi import Gpu
from tuner.config import KernelConfig

pytestmark = pytest.mark.gpu

CHECK = r"""
import torch
from search_spaces import matmul as mm
from search_spaces.matmul import KERNEL
from tuner.config import KernelConfig
from tuner.kernel import output_check_of
from tuner.space import ProblemContext
from tuner.verification import compare

shapes = [(3072, 3072, 3072), (1000, 200, 520), (136, 136, 64), (200, 456, 4104)]
space = KERNEL.space()
sms = torch.cuda.get_device_properties(0).multi_processor_count
for dtype in ("bfloat16", "float16"):
    for m, n, k in shapes:
        for warps in (8, 4):
            config = KernelConfig(VARIANT=mm.TMA_PERSISTENT, SPLIT_K=1, BLOCK_M=128,
                                  BLOCK_N=192, BLOCK_K=64, GROUP_M=8, num_warps=warps,
                                  num_stages=4)
            ctx = ProblemContext({"M": m, "N": n, "K": k}, dtype, sm_count=sms)
            assert space.violation(config, ctx) is None, space.violation(config, ctx)
            inputs = KERNEL.make_inputs({"M": m, "N": n, "K": k}, dtype, "cuda", seed=warps)
            wide = torch.full((m, n + 64), 7.0, device="cuda", dtype=inputs["out"].dtype)
            out = wide[:, :n]  # columns n.. of each row belong to no output
            out.fill_(float("nan"))
            mm.matmul(inputs["a"], inputs["b"], out, config)
            torch.cuda.synchronize()
            check = compare(out, KERNEL.reference(inputs), KERNEL.tolerance(dtype), dtype,
                            output_check_of(KERNEL))
            assert isinstance(check, float), (m, n, k, dtype, warps, check)
            assert bool(torch.all(wide[:, n:] == 7.0)), "a store went past N"
            print(f"ok {m}x{n}x{k} {dtype} {warps} warps")
"""


def test_split_tiles_are_right_at_every_edge(cuda_machine: list[Gpu]):
    out = run_check(CHECK)
    assert out.count("ok ") == 16, out


def test_the_pipeline_verifies_and_times_a_split_tile(cuda_machine: list[Gpu]):
    config = KernelConfig(VARIANT=TMA_PERSISTENT, SPLIT_K=1, BLOCK_M=128, BLOCK_N=192,
                          BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=4)
    m = measure_one(MATMUL.ref, {"M": 3072, "N": 3072, "K": 3072}, "bfloat16", config)
    assert m.ok, m
    assert m.ms is not None and m.ms > 0
