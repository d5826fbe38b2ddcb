"""matmul ALIGN=1 on the GPU: unaligned operands staged into aligned rows, then every variant
(TMA included, where the copy engine really needs 16-byte rows, and bf16, which the CPU
interpreter computes wrongly).

In a child process (this process never initialises CUDA): on shapes with K, N or both
unaligned, each variant with ALIGN=1 must match the fp32 reference within matmul's tolerance and
write nothing past the output's columns. Then the product's pipeline measures and verifies the
unaligned target's staged TMA tile like any other config."""

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

shapes = [(777, 1234, 4321), (1500, 3001, 999), (300, 1001, 64), (1, 17, 3)]
tiles = {"tiled": (128, 128, 32, 4, 4), "persistent": (128, 128, 64, 8, 3),
         "tma_persistent": (128, 128, 64, 4, 4), "split_k": (64, 128, 64, 4, 4),
         "stream_k": (64, 64, 64, 4, 3)}
space = KERNEL.space()
sms = torch.cuda.get_device_properties(0).multi_processor_count
cases = 0
for dtype in ("bfloat16", "float16", "float32"):
    for m, n, k in shapes:
        for name, (bm, bn, bk, warps, stages) in tiles.items():
            if m == 1:
                bm, bn, bk = 16, 32, 32
            config = KernelConfig(VARIANT=mm.VARIANTS.index(name),
                                  SPLIT_K=2 if name == "split_k" else 1, BLOCK_M=bm,
                                  BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=warps,
                                  num_stages=stages, ALIGN=1)
            ctx = ProblemContext({"M": m, "N": n, "K": k}, dtype, sm_count=sms)
            if space.violation(config, ctx):
                continue
            cases += 1
            inputs = KERNEL.make_inputs({"M": m, "N": n, "K": k}, dtype, "cuda", seed=warps)
            wide = torch.full((m, n + 64), 7.0, device="cuda", dtype=inputs["out"].dtype)
            out = wide[:, :n]  # columns n.. of each row belong to no output
            out.fill_(float("nan"))
            mm.matmul(inputs["a"], inputs["b"], out, config)
            torch.cuda.synchronize()
            check = compare(out, KERNEL.reference(inputs), KERNEL.tolerance(dtype), dtype,
                            output_check_of(KERNEL))
            assert isinstance(check, float), (m, n, k, dtype, name, check)
            assert bool(torch.all(wide[:, n:] == 7.0)), "a store went past N"
            print(f"ok {m}x{n}x{k} {dtype} {name}")
print(f"cases {cases}")
"""


def test_every_variant_staged_is_right_on_unaligned_shapes(cuda_machine: list[Gpu]):
    out = run_check(CHECK)
    # every case its constraints allow (32 on an H200: tma_persistent for 16-bit inputs, the
    # persistent variants where the tiles fill the SMs), each right
    cases = int(out.split("cases ")[-1].split()[0])
    assert cases >= 28 and out.count("ok ") == cases, out
    assert out.count("tma_persistent") >= 6, out


def test_the_pipeline_verifies_and_times_a_staged_tma_tile(cuda_machine: list[Gpu]):
    config = KernelConfig(VARIANT=TMA_PERSISTENT, SPLIT_K=1, BLOCK_M=128, BLOCK_N=128,
                          BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=4, ALIGN=1)
    m = measure_one(MATMUL.ref, {"M": 777, "N": 1234, "K": 4321}, "float16", config)
    assert m.ok, m
    assert m.ms is not None and m.ms > 0
