"""matmul_epilogue on the GPU: the paths the CPU interpreter cannot run. Its tma_persistent
build stores C (and loads the residual) by tensor descriptors, which the copy engine clips at
the edges, and 16-bit outputs take GELU's and SiLU's tanh from the GPU's approximation
(``tanh.approx.f32`` by inline PTX: ``FAST_ACT``), which the interpreter never executes.

In a child process: gelu, silu with a residual and the residual alone, in both 16-bit dtypes
and fp32, on whole tiles and on a shape whose last tiles lie partly past M and N, each
persistent build the space offers (tma_persistent for 16-bit inputs only) must match the fp32
reference within the kernel's tolerance and write nothing past the output's columns;
FAST_ACT must be what the 16-bit outputs got and not fp32's. fp32 passes the bias check
because its operands are rounded to TF32 to nearest (``round_tf32``): truncated, as Hopper's
TF32 wgmma would, gelu came out 3.67x over the bias bound (bench/NOTES.md). Then the
product's pipeline measures and verifies the gelu target's config like any other."""

from __future__ import annotations

import pytest

from search_spaces.matmul import TMA_PERSISTENT
from search_spaces.matmul_epilogue import GELU
from tests.gpu.child import measure_one, run_check
from tests.gpu.smi import Gpu
from tuner.config import KernelConfig

pytestmark = pytest.mark.gpu

CHECK = r"""
import torch
from search_spaces import matmul_epilogue as me
from search_spaces.matmul import PERSISTENT, TMA_PERSISTENT
from tuner.config import KernelConfig
from tuner.kernel import output_check_of
from tuner.verification import compare

shapes = [(512, 512, 256), (300, 264, 200)]
for name in ("matmul_epilogue_gelu", "matmul_epilogue_silu_residual",
             "matmul_epilogue_none_residual"):
    kernel = me.KERNELS[name]
    for dtype in ("bfloat16", "float16", "float32"):
        for m, n, k in shapes:
            for variant, bm, bn, warps, stages in ((TMA_PERSISTENT, 128, 128, 8, 3),
                                                   (TMA_PERSISTENT, 64, 64, 4, 3),
                                                   (PERSISTENT, 64, 128, 4, 3)):
                if dtype == "float32" and variant == TMA_PERSISTENT:
                    continue  # the space offers tma_persistent for 16-bit inputs only
                config = KernelConfig(VARIANT=variant, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=32,
                                      GROUP_M=8, num_warps=warps, num_stages=stages)
                inputs = kernel.make_inputs({"M": m, "N": n, "K": k}, dtype, "cuda", seed=m)
                wide = torch.full((m, n + 64), 7.0, device="cuda", dtype=inputs["out"].dtype)
                inputs["out"] = out = wide[:, :n]  # columns n.. of each row belong to no output
                out.fill_(float("nan"))
                kernel.launch(config, inputs)
                torch.cuda.synchronize()
                check = compare(out, kernel.reference(inputs), kernel.tolerance(dtype), dtype,
                                output_check_of(kernel))
                assert isinstance(check, float), (name, m, n, k, dtype, variant, check)
                assert bool(torch.all(wide[:, n:] == 7.0)), "a store went past N"
        assert me.fast_activation(inputs["out"]) == (dtype != "float32"), dtype
        print(f"ok {name} {dtype}")
"""


def test_the_epilogues_are_right_at_every_edge_on_the_gpu(cuda_machine: list[Gpu]):
    out = run_check(CHECK, timeout_s=600)
    assert out.count("ok ") == 3 * 3, out


def test_the_pipeline_verifies_and_times_the_gelu_targets_config(cuda_machine: list[Gpu]):
    config = KernelConfig(VARIANT=TMA_PERSISTENT, BLOCK_M=128, BLOCK_N=256, BLOCK_K=64,
                          GROUP_M=8, num_warps=8, num_stages=3)
    m = measure_one(GELU.ref, {"M": 4096, "N": 4096, "K": 4096}, "bfloat16", config)
    assert m.ok, m
    assert m.ms is not None and m.ms > 0
