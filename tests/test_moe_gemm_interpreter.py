"""The mixture-of-experts grouped GEMM under Triton's CPU interpreter: odd shapes (one token, M
not a multiple of BLOCK_SIZE_M, TOPK=2, more slots than experts), an expert with no tokens,
the vLLM-style alignment, the per-expert torch baseline and the space's constraints."""

from __future__ import annotations

import pytest
import torch

from search_spaces import get_kernel
from search_spaces.moe_gemm import BLOCK_SIZES_M, add_routing, align_block_size
from tuner.config import KernelConfig
from tuner.kernel import output_check_of
from tuner.space import ProblemContext
from tuner.verification import compare

KERNEL = get_kernel("moe_gemm")
CONFIGS = [
    KernelConfig(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=32, GROUP_SIZE_M=1,
                 num_warps=4, num_stages=2),
    KernelConfig(BLOCK_SIZE_M=32, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64, GROUP_SIZE_M=8,
                 num_warps=4, num_stages=3),
]
SHAPES = [
    {"M": 1, "N": 5, "K": 3, "E": 4, "TOPK": 1},     # one token, one expert used
    {"M": 1, "N": 33, "K": 40, "E": 4, "TOPK": 2},   # one token, two experts
    {"M": 19, "N": 37, "K": 65, "E": 3, "TOPK": 2},  # M * TOPK not a multiple of any block
    {"M": 3, "N": 7, "K": 9, "E": 2, "TOPK": 4},     # more slots than experts: repeats
]


def gathered_product(inputs: dict) -> torch.Tensor:
    """out[m, k] = a[m] @ w[topk_ids[m, k]].T, by gathering each slot's weights (no sorting,
    no per-expert loop: independent of the kernel's and the reference's ways)."""
    w = inputs["w"].float()[inputs["_topk_ids"].long()]  # [M, TOPK, N, K]
    return torch.einsum("mk,mtnk->mtn", inputs["a"].float(), w)


def check(inputs: dict, dtype: str) -> None:
    out = inputs["out"].float()
    assert not out.isnan().any(), "an output element was not written"
    result = compare(out, gathered_product(inputs), KERNEL.tolerance(dtype), dtype,
                     output_check_of(KERNEL))
    assert isinstance(result, float), result


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s.values())))
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.key())
def test_moe_gemm_matches_the_gathered_product_on_odd_shapes(shape, dtype, config):
    inputs = KERNEL.make_inputs(shape, dtype, "cpu", seed=1)
    inputs["out"].fill_(float("nan"))  # every element must be written
    KERNEL.launch(config, inputs)
    check(inputs, dtype)


def test_an_expert_with_no_tokens_gets_no_tile_and_the_others_are_right():
    shape = {"M": 5, "N": 9, "K": 17, "E": 4, "TOPK": 2}
    inputs = KERNEL.make_inputs(shape, "float16", "cpu", seed=2)
    topk_ids = torch.tensor([[0, 2], [3, 0], [2, 3], [0, 3], [3, 2]], dtype=torch.int32)
    inputs["_topk_ids"] = topk_ids  # expert 1 gets nothing
    add_routing(inputs, topk_ids, 4)
    assert 1 not in inputs["_expert_ids_16"].tolist()
    assert inputs["_expert_rows"][1].numel() == 0
    inputs["out"].fill_(float("nan"))
    KERNEL.launch(CONFIGS[0], inputs)
    check(inputs, "float16")
    reference = KERNEL.reference(inputs)
    assert torch.allclose(reference, gathered_product(inputs), atol=1e-5)


@pytest.mark.parametrize("block_size_m", BLOCK_SIZES_M)
def test_alignment_sorts_by_expert_and_pads_each_expert_to_the_block(block_size_m):
    topk_ids = torch.tensor([[2, 0], [2, 3], [0, 2], [2, 3], [3, 0], [2, 0]], dtype=torch.int32)
    sorted_ids, expert_ids = align_block_size(topk_ids, 5, block_size_m)
    sentinel = topk_ids.numel()
    flat = topk_ids.flatten()
    assert sorted_ids.numel() == expert_ids.numel() * block_size_m
    blocks = sorted_ids.view(-1, block_size_m)
    for expert, block in zip(expert_ids.tolist(), blocks, strict=True):
        real = block[block != sentinel]
        assert real.numel() > 0 and bool((flat[real.long()] == expert).all())
    real = sorted_ids[sorted_ids != sentinel]
    assert sorted(real.tolist()) == list(range(sentinel))  # every (token, slot) exactly once
    assert expert_ids.tolist() == sorted(expert_ids.tolist())
    assert set(expert_ids.tolist()) == {0, 2, 3}  # experts 1 and 4 have no tokens: no block


def test_the_baseline_loop_of_per_expert_matmuls_matches_the_reference():
    shape = {"M": 6, "N": 10, "K": 12, "E": 3, "TOPK": 2}
    inputs = KERNEL.make_inputs(shape, "float32", "cpu", seed=4)
    inputs["out"].fill_(float("nan"))
    result = KERNEL.baseline(inputs)
    assert torch.allclose(result, gathered_product(inputs), atol=1e-5)


def test_space_refuses_tiles_no_problem_needs_and_keeps_vllms_defaults():
    decode = {"M": 2, "N": 4096, "K": 4096, "E": 8, "TOPK": 2}
    ctx = ProblemContext(decode, "bfloat16")
    space = KERNEL.space()
    tall = KernelConfig(BLOCK_SIZE_M=64, BLOCK_SIZE_N=64, BLOCK_SIZE_K=64, GROUP_SIZE_M=1,
                        num_warps=4, num_stages=3)
    reason = space.violation(tall, ctx)
    assert reason is not None and "BLOCK_SIZE_M=64" in reason and "M * TOPK=4" in reason
    default = KERNEL.default_config(decode, "bfloat16")
    assert default["BLOCK_SIZE_M"] == 16  # vLLM's decode default: M <= E
    assert space.violation(default, ctx) is None
    big = KernelConfig(BLOCK_SIZE_M=128, BLOCK_SIZE_N=256, BLOCK_SIZE_K=128, GROUP_SIZE_M=8,
                       num_warps=8, num_stages=4)
    reason = space.violation(big, ProblemContext({**decode, "M": 4096}, "bfloat16"))
    assert reason is not None and "shared memory" in reason
