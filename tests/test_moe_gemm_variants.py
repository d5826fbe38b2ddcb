"""moe_gemm's EVEN_K loop, its algorithm variants (the moe_gemm_variants plugin kernel: tiled,
persistent, tma_persistent) under Triton's CPU interpreter on odd shapes, their constraints, and
the prior (matmul's cost model on the padded grouped problem) against what the H200 measured."""

from __future__ import annotations

import math

import pytest
import torch

from search_spaces import get_kernel
from search_spaces import moe_gemm as moe
from search_spaces.moe_gemm import (
    PERSISTENT,
    TILED,
    TMA_PERSISTENT,
    VARIANTS,
    VARIANTS_KERNEL,
    add_routing,
    estimate_s,
    expected_row_blocks,
)
from tuner.config import KernelConfig
from tuner.kernel import output_check_of
from tuner.search import known_good_first
from tuner.space import ProblemContext
from tuner.verification import compare

KERNEL = get_kernel("moe_gemm")
H200_SMEM = 232_448
MIXTRAL = {"N": 14336, "K": 4096, "E": 8, "TOPK": 2}
#: what vLLM's fused_moe_kernel takes as **config (an unknown key makes its launch fail)
VLLM_KEYS = {"BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps",
             "num_stages"}


def config(variant: int, bm: int = 16, bn: int = 32, bk: int = 32, group: int = 8,
           warps: int = 4, stages: int = 2) -> KernelConfig:
    return KernelConfig(VARIANT=variant, BLOCK_SIZE_M=bm, BLOCK_SIZE_N=bn, BLOCK_SIZE_K=bk,
                        GROUP_SIZE_M=group, num_warps=warps, num_stages=stages)


def gathered_product(inputs: dict) -> torch.Tensor:
    """out[m, k] = a[m] @ w[topk_ids[m, k]].T by gathering each slot's weights (no sorting)."""
    w = inputs["w"].float()[inputs["_topk_ids"].long()]
    return torch.einsum("mk,mtnk->mtn", inputs["a"].float(), w)


def run_and_check(kernel, cfg: KernelConfig, inputs: dict, dtype: str = "float16") -> None:
    inputs["out"].fill_(float("nan"))  # every element must be written
    kernel.launch(cfg, inputs)
    out = inputs["out"].float()
    assert not out.isnan().any(), "an output element was not written"
    result = compare(out, gathered_product(inputs), kernel.tolerance(dtype), dtype,
                     output_check_of(kernel))
    assert isinstance(result, float), result


# Odd shapes: routed rows (M * TOPK) a multiple of no block, N a multiple of no tile width, K
# a multiple of BLOCK_SIZE_K (EVEN_K) or not; TOPK 1 and 2. K is a multiple of 8 where the
# TMA variant runs (16-byte weight rows).
SHAPES = [
    {"M": 19, "N": 37, "K": 64, "E": 3, "TOPK": 2},   # EVEN_K for BLOCK_SIZE_K 32 and 64
    {"M": 13, "N": 40, "K": 72, "E": 5, "TOPK": 1},   # K = 72: a partial last K step
    {"M": 1, "N": 33, "K": 40, "E": 4, "TOPK": 2},    # one token, two experts
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s.values())))
@pytest.mark.parametrize("bk", [32, 64])
@pytest.mark.parametrize("variant", range(len(VARIANTS)), ids=lambda v: VARIANTS[v])
def test_every_variant_matches_the_gathered_product_on_odd_shapes(variant, bk, shape):
    inputs = VARIANTS_KERNEL.make_inputs(shape, "float16", "cpu", seed=3)
    run_and_check(VARIANTS_KERNEL, config(variant, bk=bk), inputs)


@pytest.mark.parametrize("variant", range(len(VARIANTS)), ids=lambda v: VARIANTS[v])
@pytest.mark.parametrize("topk", [1, 2])
def test_every_variant_leaves_an_expert_without_tokens_out_and_gets_the_rest(variant, topk):
    shape = {"M": 21, "N": 24, "K": 48, "E": 4, "TOPK": topk}
    inputs = VARIANTS_KERNEL.make_inputs(shape, "float16", "cpu", seed=5)
    gen = torch.Generator().manual_seed(0)
    pick = torch.tensor([0, 2, 3])  # expert 1 gets no token
    topk_ids = pick[torch.stack([torch.randperm(3, generator=gen)[:topk] for _ in range(21)])]
    topk_ids = topk_ids.to(torch.int32)
    inputs["_topk_ids"] = topk_ids
    add_routing(inputs, topk_ids, 4)
    assert 1 not in inputs["_expert_ids_16"].tolist()
    # 21 * TOPK rows over three experts: some expert's rows end inside a 16-row block
    assert inputs["_sorted_ids_16"].numel() > 21 * topk
    run_and_check(VARIANTS_KERNEL, config(variant, bn=64, bk=32, group=1), inputs)


def test_the_persistent_programs_walk_several_tiles_each():
    shape = {"M": 30, "N": 70, "K": 32, "E": 2, "TOPK": 2}
    inputs = VARIANTS_KERNEL.make_inputs(shape, "float16", "cpu", seed=7)
    cfg = config(PERSISTENT)
    kernel, grid, _, kwargs = moe._launch(inputs, cfg)
    tiles = inputs["_sorted_ids_16"].numel() // 16 * 3
    assert kernel is moe._moe_gemm_persistent_kernel
    assert grid == (kwargs["NUM_SMS"],) and tiles > 2 * kwargs["NUM_SMS"]
    run_and_check(VARIANTS_KERNEL, cfg, inputs)


def test_tma_weights_past_the_last_expert_read_as_zeros_and_past_n_are_not_stored():
    # N = 20 is no multiple of the 32-wide tile: each weight tile reads into the next expert's
    # rows, and the last expert's past the end of w (the descriptor zero-fills those).
    shape = {"M": 9, "N": 20, "K": 24, "E": 2, "TOPK": 2}
    inputs = VARIANTS_KERNEL.make_inputs(shape, "float16", "cpu", seed=8)
    assert sorted(set(inputs["_expert_ids_16"].tolist())) == [0, 1]
    run_and_check(VARIANTS_KERNEL, config(TMA_PERSISTENT), inputs)


@pytest.mark.parametrize(("K", "bk", "even"), [(64, 32, True), (64, 64, True), (72, 32, False),
                                               (40, 64, False)])
def test_even_k_is_decided_at_launch_and_kept_by_the_compile_shape(K, bk, even):
    shape = {"M": 5, "N": 16, "K": K, "E": 2, "TOPK": 2}
    inputs = KERNEL.make_inputs(shape, "float16", "cpu", seed=0)
    cfg = KernelConfig(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=bk, GROUP_SIZE_M=1,
                       num_warps=4, num_stages=2)
    kernel, _, _, kwargs = moe._launch(inputs, cfg)
    assert kernel is moe._moe_gemm_kernel and kwargs["EVEN_K"] is even
    big = {**shape, "K": K + 4096}  # the compile shape of a large K must specialise alike
    small = KERNEL.compile_shape(big, "float16")
    assert (small["K"] % bk == 0) is even


def test_moe_gemm_keeps_vllms_parameters_and_the_variants_kernel_adds_only_variant():
    assert set(KERNEL.space().names) == VLLM_KEYS  # what tuner export --format vllm writes
    assert moe.variant_of(KERNEL.default_config({"M": 64, **MIXTRAL}, "bfloat16")) == TILED
    assert set(VARIANTS_KERNEL.space().names) == VLLM_KEYS | {"VARIANT"}
    ctx = ProblemContext({"M": 4096, **MIXTRAL}, "bfloat16", smem_limit=H200_SMEM)
    for kernel in (KERNEL, VARIANTS_KERNEL):
        shape = dict(ctx.shape)
        configs = [*kernel.known_good_configs(shape, "bfloat16"),
                   kernel.default_config(shape, "bfloat16")]
        assert all(kernel.space().contains(c) for c in configs), kernel.name
        assert all(kernel.space().violation(c, ctx) is None for c in configs), kernel.name
    variants = {c["VARIANT"] for c in VARIANTS_KERNEL.known_good_configs(dict(ctx.shape),
                                                                         "bfloat16")}
    assert variants == {TILED, PERSISTENT, TMA_PERSISTENT}
    decode = {"M": 2, **MIXTRAL}
    assert {c["VARIANT"] for c in VARIANTS_KERNEL.known_good_configs(decode, "bfloat16")} == {
        TILED}


def test_the_variant_constraints_prune_repeats_and_what_cannot_run():
    space = VARIANTS_KERNEL.space()
    big = ProblemContext({"M": 4096, **MIXTRAL}, "bfloat16", smem_limit=H200_SMEM)
    tma = config(TMA_PERSISTENT, 128, 256, 64, 16, 8, 3)
    assert space.violation(tma, big) is None
    assert space.violation(config(PERSISTENT, 128, 256, 64, 16, 8, 3), big) is None
    # one token to two experts: at most 2 row blocks x 56 column blocks fit on 132 SMs
    decode = ProblemContext({"M": 1, **MIXTRAL}, "bfloat16", smem_limit=H200_SMEM)
    reason = space.violation(config(PERSISTENT, 16, 256, 64, 1, 4, 3), decode)
    assert reason is not None and "persistent is the tiled kernel" in reason
    assert space.violation(config(TMA_PERSISTENT, 16, 256, 64, 1, 4, 3), decode) is None
    for ctx, words in ((ProblemContext(big.shape, "float32", smem_limit=H200_SMEM), "16-bit"),
                       (ProblemContext({**big.shape, "K": 4100}, "bfloat16",
                                       smem_limit=H200_SMEM), "16-byte"),
                       (ProblemContext(big.shape, "bfloat16", capability=80), "9.0")):
        reason = space.violation(tma, ctx)
        assert reason is not None and words in reason, (reason, words)
    # the persistent loops keep the pipeline's buffers through the store: 128x256x64 with 4
    # stages fits (192 KB + 32 KB); 64x256x64 with 5 stages fits the tiled kernel (200 KB) but
    # not a persistent loop (232 KB)
    assert space.violation(config(PERSISTENT, 128, 256, 64, 16, 8, 4), big) is None
    reason = space.violation(config(PERSISTENT, 64, 256, 64, 16, 8, 5), big)
    assert reason is not None and "shared memory" in reason
    assert space.violation(config(TILED, 64, 256, 64, 16, 8, 5), big) is None


# -- the prior -------------------------------------------------------------------------------

#: moe_gemm bf16, 4096 tokens of Mixtral's 8 experts top-2 on the H200 (the issue-13 run,
#: bench/results/targets_13_h200.json): (BLOCK_SIZE_M, N, K, GROUP_SIZE_M, warps, stages), ms
H200_4096 = [
    ((128, 256, 64, 16, 8, 4), 1.855), ((128, 256, 64, 64, 8, 3), 1.875),
    ((128, 256, 64, 8, 8, 4), 1.913), ((128, 256, 64, 1, 8, 4), 1.988),
    ((128, 256, 64, 1, 8, 3), 2.023), ((128, 256, 32, 16, 8, 5), 2.078),
    ((128, 128, 64, 16, 8, 4), 2.308), ((64, 256, 64, 32, 8, 3), 2.407),
    ((128, 256, 64, 32, 8, 2), 2.517), ((64, 128, 64, 16, 4, 3), 2.562),
    ((64, 128, 32, 32, 8, 3), 2.658), ((64, 128, 32, 8, 4, 3), 3.551),
    ((32, 128, 64, 16, 4, 4), 4.093), ((32, 128, 128, 8, 4, 5), 6.483),
    ((32, 256, 256, 8, 8, 5), 10.279), ((64, 32, 32, 1, 4, 2), 10.672),
    ((16, 128, 64, 1, 4, 4), 13.637),
]
_NAMES = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps",
          "num_stages")


def _ranks(values: list[float]) -> list[int]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0] * len(values)
    for rank, i in enumerate(order):
        ranks[i] = rank
    return ranks


def test_the_prior_ranks_the_h200s_measurements_and_puts_their_best_first():
    ctx = ProblemContext({"M": 4096, **MIXTRAL}, "bfloat16", smem_limit=H200_SMEM)
    configs = [KernelConfig(dict(zip(_NAMES, c, strict=True))) for c, _ in H200_4096]
    prior = [KERNEL.prior(c, ctx) for c in configs]
    measured = [ms for _, ms in H200_4096]
    n = len(prior)
    rp, rm = _ranks(prior), _ranks(measured)
    spearman = 1 - 6 * sum((a - b) ** 2 for a, b in zip(rp, rm, strict=True)) / (n * (n * n - 1))
    assert spearman > 0.85, spearman
    assert min(range(n), key=prior.__getitem__) == 0  # the measured best
    # and over the whole feasible space the prior's best is that same tile
    best = min(KERNEL.space().feasible(ctx), key=lambda c: estimate_s(c, ctx))
    assert (best["BLOCK_SIZE_M"], best["BLOCK_SIZE_N"], best["BLOCK_SIZE_K"]) == (128, 256, 64)
    # GROUP_SIZE_M=1 re-reads each expert's weights for every few row blocks (measured 7%
    # slower at 4 stages): the prior says slower too
    assert prior[3] > prior[0]


def test_the_prior_sees_the_weights_bytes_at_decode_sizes_and_picks_small_row_blocks():
    for m, want in ((1, 16), (8, 16), (4096, 128)):
        ctx = ProblemContext({"M": m, **MIXTRAL}, "bfloat16", smem_limit=H200_SMEM)
        best = min(KERNEL.space().feasible(ctx), key=lambda c: estimate_s(c, ctx))
        assert best["BLOCK_SIZE_M"] == want, (m, dict(best))
        assert known_good_first(KERNEL, dict(ctx.shape), "bfloat16", ctx=ctx)[0][
            "BLOCK_SIZE_M"] == want
    # one token reads two experts' weights (2 x 117 MB): at least their time at 4.8 TB/s
    one = ProblemContext({"M": 1, **MIXTRAL}, "bfloat16", smem_limit=H200_SMEM)
    t = min(estimate_s(c, one) for c in KERNEL.space().feasible(one))
    assert t >= 2 * 14336 * 4096 * 2 / 4.8e12
    assert expected_row_blocks(one.shape, 16) == (2.0, 1.0)


def test_expected_row_blocks_follow_the_routing_make_inputs_draws():
    shape = {"M": 300, "N": 8, "K": 8, "E": 8, "TOPK": 2}
    inputs = KERNEL.make_inputs(shape, "float32", "cpu", seed=0)
    for bm in (16, 64):
        active, blocks = expected_row_blocks(shape, bm)
        real = inputs[f"_expert_ids_{bm}"].numel()
        assert math.isclose(active * blocks, real, rel_tol=0.15), (bm, active * blocks, real)


def test_the_variants_kernel_is_a_built_in_beside_moe_gemm():
    from search_spaces import registry

    assert get_kernel("moe_gemm_variants") is VARIANTS_KERNEL
    assert get_kernel("moe_gemm") is KERNEL  # vLLM's parameters alone: no VARIANT
    assert "VARIANT" not in {p.name for p in KERNEL.space().params}
    assert {"moe_gemm", "moe_gemm_variants"} <= set(registry.kernel_names())
