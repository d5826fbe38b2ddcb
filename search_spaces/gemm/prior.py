"""A cheap analytic prior for tiled GEMM-like configs: which configs to measure first.

It is matmul's own prior (``MatmulKernel.prior`` returns :func:`estimate`; conv2d and moe_gemm
rank with it on the GEMM they compute, flash attention reads its hardware constants); the
strategies never call it: they rank configs with whatever prior the kernel gives them. Its
variant numbering and ALIGN's padding unit are matmul's own (``host.py``).

It never sees a measurement. From the config (BLOCK_M/N/K, num_warps, num_stages, GROUP_M), the
problem (M, N, K, dtype) and the device's limits (shared memory per block, SM count) it estimates a
run time in arbitrary units, as the slowest of three limits, each with wave quantisation of the
grid over the SMs:

- tensor-core throughput, derated for small per-warp tiles (operand reuse in registers) and for
  tiles too small for Hopper's warp-group MMA (BLOCK_M < 64 per warp group);
- memory: bytes the grid pulls through L2 (every tile reads (BM + BN) * K elements) and unique
  bytes from DRAM, derated when the pipeline keeps too few bytes in flight per SM to cover the
  latency (stages x tile bytes x resident CTAs);
- a per-tile fixed cost (prologue: filling the pipeline, epilogue: writing C) times the number of
  waves.

matmul's variants (its ``VARIANT`` parameter; a config without one is the tiled kernel) change
the grid, not the per-step model: ``persistent`` runs one program per SM, so no tail-wave launch
and no per-tile prologue after the first (the flattened loop overlaps a tile's store with the
next tile's loads), but one CTA per SM and quantisation of the tiles over the SMs;
``ALIGN=1`` (matmul's staging of unaligned operands) is its GEMM on the padded problem plus
the copies (their launches, their bytes at STAGE_BW); ``tma_persistent`` adds copy-engine loads
(no operand registers, no unaligned-row penalty: its constraint wants 16-byte rows, a little
more tensor-core efficiency) and the output tile's
staging in shared memory, and takes split tiles (BLOCK_N 192, at a measured efficiency);
``split_k`` multiplies the programs by SPLIT_K and divides their K steps, for the fp32
workspace's round trip (written by the GEMM, read by a second launch that writes C); ``stream_k``
is persistent for all but the last wave and the tail, which it spreads evenly over the SMs as
runs of K steps (the tiles over the SMs no longer quantised), for two fp32 partial tiles written
and one read back per program and a counter's round trip; it loads by TMA where tma_persistent
could (and then stores by TMA too, staging the output tile).

Only the *order* it induces matters; its constants are round numbers of an H100/H200 class GPU
(they were sanity-checked, not fitted, on the recorded H200 tables). Spaces without BLOCK_M/N/K or
problems without M/N/K get a flat prior (every config scores the same).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from search_spaces.gemm.host import (
    ALIGN_ELEMS,
    PERSISTENT,
    SPLIT_K_VARIANT,
    STREAM_K,
    TILED,
    TMA_PERSISTENT,
)
from tuner.space import ProblemContext

#: what one SM's tensor cores sustain in a Triton GEMM, FLOP/s (~730 TFLOP/s / 132 SMs on H200)
SM_FLOPS = 5.5e12
#: L2 -> SM and DRAM bandwidth of the whole GPU, B/s (H200: 4.8 TB/s HBM3e)
L2_BW = 22e12
DRAM_BW = 4.8e12
#: memory latency under load, s: a k-step waits this long for its tiles unless the pipeline
#: (num_stages - 1 loads in flight) hides it
LATENCY_S = 1.2e-6
#: fixed cost per tile (CTA start, epilogue), s
TILE_OVERHEAD_S = 1.0e-6
#: tensor-core efficiency by warps per CTA (2 warps: no warp-group MMA, little latency hiding)
WARP_EFFICIENCY = {1: 0.3, 2: 0.5, 4: 0.88, 8: 1.0, 16: 0.95}
SMEM_PER_SM = 233_472
REGISTERS_PER_SM = 65536
THREADS_PER_SM = 2048
DEFAULT_SM_COUNT = 132
#: warp-wide load instructions one SM issues per second for tiles whose rows are too unaligned for
#: asynchronous copies (< 4 bytes: loads go through registers, one or two elements a thread)
SYNC_LOAD_RATE = 2.5e8
#: matmul's split_k VARIANT value (``host.SPLIT_K_VARIANT``; the others keep their names)
SPLIT_K = SPLIT_K_VARIANT
#: tensor-core efficiency gained when TMA feeds the MMA (no load instructions or addresses
#: competing with it for issue slots and registers)
TMA_MMA_GAIN = 1.08
#: memory latency a TMA k-step waits, relative to LATENCY_S: one copy instruction per tile,
#: issued as soon as a stage frees, instead of per-thread address arithmetic and copies
TMA_LATENCY = 0.7
#: what a persistent program pays per tile after its first (the store, overlapped with the
#: next tile's loads by the flattened loop), s
PERSISTENT_TILE_S = 0.3e-6
#: the speed of matmul stream_k's stream-K steps against its data-parallel ones: measured, not
#: derived (H200, bench/results/matmul_variants_stream_k_tma_store_h200.txt: 128x256 tiles
#: fit 0.63 on 3072^3 and 0.69 on 4096^3 against the TMA persistent kernel's waves; the cause
#: is not found, bench/NOTES.md)
STREAM_K_STEP_EFFICIENCY = 0.65
#: the tensor-core speed of matmul tma_persistent's split tiles (BLOCK_N 192: two MMAs, N=128
#: and N=64, per K step) against a power-of-two tile's: measured, not derived (H200,
#: bench/results/matmul_split_tile_h200/: 128x192/4 stages against 128x256/3 stages, both TMA
#: persistent, fits 0.79 on 3072^3 and 0.83 on 8192^3)
SPLIT_TILE_EFFICIENCY = 0.81
#: a kernel launch on the same stream right after another (split-K's reduction), s
LAUNCH_S = 2.5e-6
#: matmul ALIGN=1's staging copies (search_spaces.matmul stage; their padding unit is
#: ``host.ALIGN_ELEMS``): the bytes read plus written per second by its copy kernel (unaligned
#: 2-byte reads)
STAGE_BW = 2.5e12
#: soft maximum exponent: how sharply the slowest limit dominates the others
P = 3.0

GEMM_PARAMS = ("BLOCK_M", "BLOCK_N", "BLOCK_K")


def applies(names: tuple[str, ...] | list[str], ctx: ProblemContext) -> bool:
    return all(n in names for n in GEMM_PARAMS) and all(d in ctx.shape for d in "MNK")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _alignment(row_bytes: int) -> int:
    """Largest power-of-two vector (<= 16 B) that every row start is aligned to."""
    v = 16
    while v > 1 and row_bytes % v:
        v //= 2
    return v


def _softmax(*terms: float) -> float:
    return float(sum(t ** P for t in terms) ** (1.0 / P))


def _stream_k_tma(ctx: ProblemContext, aligned: bool = False) -> bool:
    """Whether matmul's stream_k loads by TMA on this problem (search_spaces.matmul
    stream_k_tma_problem): sm_90+, 16-bit inputs, 16-byte aligned rows of A and B (or
    ``aligned``: ALIGN's buffers)."""
    e = ctx.elem_bytes
    return (ctx.capability >= 90 and ctx.dtype in ("float16", "bfloat16")
            and (aligned or (ctx.shape["K"] * e % 16 == 0 and ctx.shape["N"] * e % 16 == 0)))


def _staged(config: Mapping[str, int], ctx: ProblemContext) -> tuple[ProblemContext, float]:
    """matmul ALIGN=1 (search_spaces.matmul stage): the problem its GEMM kernels see (K and
    N rounded up to ALIGN_ELEMS: aligned rows) and the seconds its copies take: A and B where
    staged (one launch), C back where the variant stores by descriptor (another), each launch
    plus its bytes."""
    M, N, K = ctx.shape["M"], ctx.shape["N"], ctx.shape["K"]
    e = ctx.elem_bytes
    kp, np_ = _cdiv(K, ALIGN_ELEMS) * ALIGN_ELEMS, _cdiv(N, ALIGN_ELEMS) * ALIGN_ELEMS
    operands = 0
    if kp != K:
        operands += M * (K + kp) * e
    if kp != K or N * e % 16:
        operands += (K * N + kp * np_) * e
    copied = [operands] if operands else []
    variant = int(config.get("VARIANT", TILED))
    if N * e % 16 and (variant == TMA_PERSISTENT or (
            variant == STREAM_K and _stream_k_tma(ctx, aligned=True))):
        copied.append(2 * M * N * e)
    t = sum(LAUNCH_S + nbytes / STAGE_BW for nbytes in copied)
    return ProblemContext({**ctx.shape, "K": kp, "N": np_}, ctx.dtype, ctx.smem_limit,
                          ctx.sm_count, ctx.capability), t


def estimate_s(config: Mapping[str, int], ctx: ProblemContext) -> float:
    """Estimated run time in seconds (a ranking score, not a prediction to trust)."""
    if int(config.get("ALIGN", 0)):
        staged_ctx, t_copies = _staged(config, ctx)
        return t_copies + estimate_s({**config, "ALIGN": 0}, staged_ctx)
    variant = int(config.get("VARIANT", TILED))
    split = int(config.get("SPLIT_K", 1)) if variant == SPLIT_K else 1
    M, N, K = ctx.shape["M"], ctx.shape["N"], ctx.shape["K"]
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    warps = int(config.get("num_warps", 4))
    stages = int(config.get("num_stages", 3))
    e = ctx.elem_bytes
    sms = ctx.sm_count or DEFAULT_SM_COUNT
    stream_k = variant == STREAM_K
    tma = variant == TMA_PERSISTENT or (stream_k and _stream_k_tma(ctx))

    # -- residency: CTAs per SM from shared memory, registers and threads
    smem = max(1, stages * bk * (bm + bn) * e + (bm * bn * e if tma else 0))
    # unaligned rows (K or N not a multiple of 16 bytes) load in narrower vectors; below 4 bytes
    # there is no asynchronous copy: tiles go through registers, a pipeline stage holds them
    # there, and the stages do not hide latency (warps do)
    vec_a, vec_b = _alignment(K * e), _alignment(N * e)
    sync = min(vec_a, vec_b) < 4 and not tma  # (TMA needs 16-byte rows: its constraint)
    acc_regs = bm * bn / (32 * warps)
    if sync:  # one register per load (<= 4 B), twice: as loaded and in the dot's layout
        operand_regs = 2 * (bm * bk * e / vec_a + bk * bn * e / vec_b) / (32 * warps)
    elif tma:  # the copy engine writes shared memory: no addresses or operands in registers
        operand_regs = 0.0
    else:
        operand_regs = (bm + bn) * bk * e / 4 / (32 * warps) / 2
    want_regs = acc_regs + operand_regs + 32
    regs = min(255.0, want_regs)
    occ = max(1, min(SMEM_PER_SM // smem, REGISTERS_PER_SM // int(regs * 32 * warps),
                     THREADS_PER_SM // (32 * warps), 32))
    tiles = _cdiv(M, bm) * _cdiv(N, bn)
    k_iters = _cdiv(_cdiv(K, bk), split)  # split-K: each program's share of the K steps
    programs = tiles * split
    persistent = variant in (PERSISTENT, TMA_PERSISTENT, STREAM_K)
    if persistent:
        # one program per SM walks ceil(tiles / SMs) tiles; only the first tile pays the
        # pipeline's fill and the launch, later ones overlap their store with the next loads
        occ = 1
        programs = sms if stream_k else min(tiles, sms)
    waves = _cdiv(programs, sms * occ)
    resident = min(programs, sms * occ)  # CTAs running at once
    per_sm = _cdiv(resident, sms)  # CTAs sharing one SM's tensor cores

    # -- one k-step of one CTA: the slowest of tensor cores, L2 bandwidth, memory latency
    eff = WARP_EFFICIENCY.get(warps, 0.8)
    if bm < 64:  # below the warp-group MMA's 64 rows: mma.sync, padded
        eff *= 0.6
    if tma:
        eff = min(1.0, eff * TMA_MMA_GAIN)
    if bn & (bn - 1):  # a split tile (matmul tma_persistent's 192 = 128 + 64)
        eff *= SPLIT_TILE_EFFICIENCY
    t_mma = 2.0 * bm * bn * bk * per_sm / (SM_FLOPS * eff)
    t_l2 = (bm + bn) * bk * e * resident / L2_BW
    t_lat = LATENCY_S / max(1, stages - 1)
    if tma:
        t_lat *= TMA_LATENCY
    t_ld = 0.0
    if sync:
        instrs = (bm * bk * e / vec_a + bk * bn * e / vec_b) / 32
        t_ld = instrs * per_sm / SYNC_LOAD_RATE
        t_lat = LATENCY_S / max(1, min(4, per_sm * warps // 4))
    t_step = _softmax(t_mma, t_l2, t_lat, t_ld)
    if persistent:
        t_tile = k_iters * t_step + PERSISTENT_TILE_S
    else:
        t_tile = k_iters * t_step + LATENCY_S + TILE_OVERHEAD_S
    spill = 1.0
    if acc_regs >= 256:  # the accumulator alone fills the register file: it spills
        spill = 4.0
    elif want_regs > 255:  # operands held in registers spill
        spill = 1.0 + 8.0 * (want_regs / 255.0 - 1.0)
    t_tile *= spill
    if stream_k:
        # whole tiles but the last wave and the tail, then runs of `per` K steps (the
        # search_spaces.matmul stream_k_plan); a run meets up to three tiles; where tiles
        # are shared, two fp32 partials written and one read back at one SM's share of L2;
        # the stream-K steps run at STREAM_K_STEP_EFFICIENCY of the others (measured)
        full = max(tiles // sms - 1, 0) * sms
        per = max(_cdiv((tiles - full) * k_iters, sms), k_iters)
        fix = (3 * bm * bn * 4 / (L2_BW / sms) + LATENCY_S) if tiles % sms else 0.0
        t_grid = (full // sms * t_tile + per * t_step * spill / STREAM_K_STEP_EFFICIENCY
                  + 2 * PERSISTENT_TILE_S + fix + LATENCY_S + TILE_OVERHEAD_S)
    elif persistent:
        t_grid = _cdiv(tiles, sms) * t_tile + LATENCY_S + TILE_OVERHEAD_S
    else:
        t_grid = waves * t_tile
    c_bytes = M * N * (4 * split if split > 1 else e)
    t_dram = ((M * K + K * N) * e + c_bytes) / DRAM_BW
    t = _softmax(t_grid, t_dram)
    if split > 1:  # the reduction: a second launch reading the fp32 partials, writing C
        t += LAUNCH_S + M * N * (4 * split + e) / DRAM_BW
    return t


def estimate(config: Mapping[str, int], ctx: ProblemContext) -> float:
    """log of :func:`estimate_s` (0.0 where the model does not apply)."""
    if not all(n in config for n in GEMM_PARAMS) or not all(d in ctx.shape for d in "MNK"):
        return 0.0
    return math.log(max(estimate_s(config, ctx), 1e-12))
