"""softmax's one-launch split rows (``SYNC`` = 1) on the GPU, where its programs really wait
for each other at the row counters (the CPU interpreter runs the two launches instead).

In a child process (this process never initialises CUDA): on shapes with one-block and
several-block chunks, aligned and unaligned rows, each SYNC config launched on fresh random
inputs several times in a row must match torch.softmax and the two-launch config, leave every
row counter at 0 (the next launch on the stream would otherwise pass its wait before the
partials are written), and give the same bits on 20 launches of one input. Then the product's
pipeline measures and verifies a SYNC config like any other."""

from __future__ import annotations

import pytest

from search_spaces.softmax import KERNEL as SOFTMAX
from tests.gpu.child import measure_one, run_check
from tests.gpu.smi import Gpu
from tuner.config import KernelConfig

pytestmark = pytest.mark.gpu

CHECK = r"""
import torch
from search_spaces.softmax import KERNEL, _ARRIVE, split_chunk
from tuner.config import KernelConfig
from tuner.space import ProblemContext

cases = [  # (M, N, dtype, SPLIT, BLOCK_N, warps, stages)
    (16, 131072, "float16", 8, 16384, 16, 1),   # one block a chunk, held across the wait
    (16, 131072, "float16", 4, 8192, 8, 3),     # several blocks a chunk, read again
    (7, 50257, "bfloat16", 16, 4096, 8, 1),     # unaligned rows, one block a chunk
    (1, 100003, "float32", 64, 2048, 4, 1),     # one row on 64 programs
]
space = KERNEL.space()
sms = torch.cuda.get_device_properties(0).multi_processor_count
for m, n, dtype, split, block, warps, stages in cases:
    looped = block < split_chunk(n, split)
    config = KernelConfig(BLOCK_N=block, ROWS=1, SPLIT=split, PROGRAMS_PER_SM=0,
                          EVICT=int(looped), SYNC=1, num_warps=warps, num_stages=stages)
    ctx = ProblemContext({"M": m, "N": n}, dtype, sm_count=sms)
    assert space.violation(config, ctx) is None, (config, space.violation(config, ctx))
    two = KernelConfig({**config, "SYNC": 0, "EVICT": 1})
    tol = KERNEL.tolerance(dtype)
    for seed in range(3):
        inputs = KERNEL.make_inputs({"M": m, "N": n}, dtype, "cuda", seed)
        inputs["out"].fill_(float("nan"))
        KERNEL.launch(config, inputs)
        got = inputs["out"].clone()
        KERNEL.launch(two, inputs)
        torch.cuda.synchronize()
        for counters in _ARRIVE.values():
            assert int(counters.abs().sum()) == 0, "a row counter was left set"
        ref = KERNEL.reference(inputs)
        torch.testing.assert_close(got.float(), ref, atol=tol.atol, rtol=tol.rtol)
        torch.testing.assert_close(got.float(), inputs["out"].float(), atol=tol.atol,
                                   rtol=tol.rtol)
    first = got
    for _ in range(20):
        KERNEL.launch(config, inputs)
        assert torch.equal(inputs["out"], first), "SYNC gave different bits on a repeat"
    print(f"ok {m}x{n} {dtype} SPLIT={split} BLOCK_N={block}: 3 inputs, 20 repeats")
"""


def test_one_launch_split_rows_are_right_repeatable_and_reset_their_counters(
        cuda_machine: list[Gpu]):
    out = run_check(CHECK)
    assert out.count("ok ") == 4, out


def test_the_pipeline_verifies_and_times_a_one_launch_config(cuda_machine: list[Gpu]):
    shape = {"M": 16, "N": 131072}
    sync = KernelConfig(BLOCK_N=16384, ROWS=1, SPLIT=8, PROGRAMS_PER_SM=0, EVICT=0, SYNC=1,
                        num_warps=16, num_stages=1)
    m = measure_one(SOFTMAX.ref, shape, "float16", sync)
    assert m.ok, m
    assert m.ms is not None and m.ms > 0
