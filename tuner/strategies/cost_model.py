"""A cheap analytic prior for tiled GEMM-like configs: which configs to measure first.

It is matmul's own prior (``MatmulKernel.prior`` returns :func:`estimate`); the strategies never
call it directly: they rank configs with whatever prior the kernel gives them.

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

Only the *order* it induces matters; its constants are round numbers of an H100/H200 class GPU
(they were sanity-checked, not fitted, on the recorded H200 tables). Spaces without BLOCK_M/N/K or
problems without M/N/K get a flat prior (every config scores the same).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

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


def estimate_s(config: Mapping[str, int], ctx: ProblemContext) -> float:
    """Estimated run time in seconds (a ranking score, not a prediction to trust)."""
    M, N, K = ctx.shape["M"], ctx.shape["N"], ctx.shape["K"]
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    warps = int(config.get("num_warps", 4))
    stages = int(config.get("num_stages", 3))
    e = ctx.elem_bytes
    sms = ctx.sm_count or DEFAULT_SM_COUNT

    # -- residency: CTAs per SM from shared memory, registers and threads
    smem = max(1, stages * bk * (bm + bn) * e)
    # unaligned rows (K or N not a multiple of 16 bytes) load in narrower vectors; below 4 bytes
    # there is no asynchronous copy: tiles go through registers, a pipeline stage holds them
    # there, and the stages do not hide latency (warps do)
    vec_a, vec_b = _alignment(K * e), _alignment(N * e)
    sync = min(vec_a, vec_b) < 4
    acc_regs = bm * bn / (32 * warps)
    if sync:  # one register per load (<= 4 B), twice: as loaded and in the dot's layout
        operand_regs = 2 * (bm * bk * e / vec_a + bk * bn * e / vec_b) / (32 * warps)
    else:
        operand_regs = (bm + bn) * bk * e / 4 / (32 * warps) / 2
    want_regs = acc_regs + operand_regs + 32
    regs = min(255.0, want_regs)
    occ = max(1, min(SMEM_PER_SM // smem, REGISTERS_PER_SM // int(regs * 32 * warps),
                     THREADS_PER_SM // (32 * warps), 32))
    tiles = _cdiv(M, bm) * _cdiv(N, bn)
    waves = _cdiv(tiles, sms * occ)
    resident = min(tiles, sms * occ)  # CTAs running at once
    per_sm = _cdiv(resident, sms)  # CTAs sharing one SM's tensor cores
    k_iters = _cdiv(K, bk)

    # -- one k-step of one CTA: the slowest of tensor cores, L2 bandwidth, memory latency
    eff = WARP_EFFICIENCY.get(warps, 0.8)
    if bm < 64:  # below the warp-group MMA's 64 rows: mma.sync, padded
        eff *= 0.6
    t_mma = 2.0 * bm * bn * bk * per_sm / (SM_FLOPS * eff)
    t_l2 = (bm + bn) * bk * e * resident / L2_BW
    t_lat = LATENCY_S / max(1, stages - 1)
    t_ld = 0.0
    if sync:
        instrs = (bm * bk * e / vec_a + bk * bn * e / vec_b) / 32
        t_ld = instrs * per_sm / SYNC_LOAD_RATE
        t_lat = LATENCY_S / max(1, min(4, per_sm * warps // 4))
    t_step = _softmax(t_mma, t_l2, t_lat, t_ld)
    t_tile = k_iters * t_step + LATENCY_S + TILE_OVERHEAD_S
    if acc_regs >= 256:  # the accumulator alone fills the register file: it spills
        t_tile *= 4.0
    elif want_regs > 255:  # operands held in registers spill
        t_tile *= 1.0 + 8.0 * (want_regs / 255.0 - 1.0)
    t_grid = waves * t_tile
    t_dram = ((M * K + K * N) * e + M * N * e) / DRAM_BW
    return _softmax(t_grid, t_dram)


def estimate(config: Mapping[str, int], ctx: ProblemContext) -> float:
    """log of :func:`estimate_s` (0.0 where the model does not apply)."""
    if not all(n in config for n in GEMM_PARAMS) or not all(d in ctx.shape for d in "MNK"):
        return 0.0
    return math.log(max(estimate_s(config, ctx), 1e-12))
