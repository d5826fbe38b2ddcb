"""Mixture-of-experts grouped GEMM: ``out[m, k] = a[m] @ w[topk_ids[m, k]].T`` for every token
``m`` and each of its ``TOPK`` routed experts, fp32 accumulation (vLLM's fused-MoE first GEMM,
without the routed weight).

``a`` is [M, K] (hidden states), ``w`` is [E, N, K] (per-expert weights, vLLM's layout), ``out``
is [M, TOPK, N]. The (token, slot) pairs are sorted by expert and each expert's list padded to a
multiple of ``BLOCK_SIZE_M`` with a sentinel (``M * TOPK``), as vLLM's ``moe_align_block_size``
does; each ``BLOCK_SIZE_M x BLOCK_SIZE_N`` tile belongs to one expert, gathers its rows of ``a``
and scatters its rows of ``out``. The parameter names are vLLM's, so that ``tuner export
--format vllm`` writes the file vLLM reads.

No load in a K loop is masked along M or N: a padding row gathers token 0 and a column past N
reads column 0 (both inside the tensors), and the store drops them; with ``EVEN_K`` (K %
BLOCK_SIZE_K == 0, decided at launch) the K edge needs no mask either, so the loads are plain and
pipelined without per-element predicates, as in ``matmul``.

Two kernels are registered from this module:

- ``moe_gemm`` (``KERNEL``): the tiled algorithm alone, one program per tile in grouped order.
  Its space has exactly the parameters of vLLM's kernel, so every config it stores is one vLLM's
  ``fused_moe_kernel`` takes as ``**config`` (an unknown key such as ``VARIANT`` would make that
  launch fail);
- ``moe_gemm_variants`` (``VARIANTS_KERNEL``): the same space plus ``VARIANT`` (``VARIANTS`` names
  its values), as matmul's: ``tiled`` (0); ``persistent`` (1), one program per SM walking the
  (row block, column block) tiles in grouped order with the tile loop flattened into the K loop;
  ``tma_persistent`` (2), that loop with the expert weights loaded by a tensor descriptor (TMA
  on sm_90+; the gathered rows of ``a`` stay pointer loads: Hopper's TMA cannot gather rows).

The sorting and padding are done in ``make_inputs``, once for every ``BLOCK_SIZE_M`` of the
space, not in the timed launch: they depend on the routing and BLOCK_SIZE_M only, cost the same
for every other parameter, and vLLM times them apart from the GEMM too; the timed launch is the
GEMM alone. The routing is seeded random (distinct experts per token when ``TOPK <= E``), so
some experts may get no tokens (they get no tiles). Same three layers as ``matmul``: the
@triton.jit kernels -> ``moe_gemm`` (the launcher) -> ``MoeGemmKernel`` (the TunableKernel).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import torch
import triton
import triton.language as tl

from search_spaces.gemm.host import (
    even_k,
    num_sms,
    set_tma_allocator,
    tile_accumulator_registers,
    tile_shared_memory,
    tma_unavailable,
    variant_of,  # VARIANT, or tiled (0, as here) without one: moe_gemm's configs have none
)
from search_spaces.gemm.tiles import tile_coords
from tuner.config import KernelConfig
from tuner.dtypes import next_pow2, torch_dtype
from tuner.kernel import Dim, Tolerance, builtin_version, shrunk_dim
from tuner.space import Param, ProblemContext, SearchSpace

#: the BLOCK_SIZE_M values of the space: make_inputs aligns the routing for each
BLOCK_SIZES_M = (16, 32, 64, 128)
#: The VARIANT parameter's values (moe_gemm_variants only), by name: as matmul's, without
#: split-K (a row block is one expert's: its K loop is as deep as the problem's)
VARIANTS = ("tiled", "persistent", "tma_persistent")
TILED, PERSISTENT, TMA_PERSISTENT = range(len(VARIANTS))


@triton.jit
def _row_block(sorted_ids_ptr, pid_m, num_valid, BLOCK_SIZE_M: tl.constexpr):
    """Row block ``pid_m``'s flat (token * TOPK + slot) rows and which of them are real (the
    others are the padding sentinel ``num_valid``)."""
    rows = tl.load(sorted_ids_ptr + pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M))
    return rows, rows < num_valid


@triton.jit
def _gathered_a(a_ptr, sorted_ids_ptr, pid_m, num_valid, stride_am, stride_ak,
                TOPK: tl.constexpr, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_K: tl.constexpr):
    """Pointers to the first K step of the block's rows of ``a``: a padding row reads token 0
    (inside ``a``; the store drops its output), so no load needs an M mask. int64: token *
    stride_am may pass 2**31."""
    rows, real = _row_block(sorted_ids_ptr, pid_m, num_valid, BLOCK_SIZE_M)
    tokens = tl.where(real, rows // TOPK, 0).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    return a_ptr + tokens[:, None] * stride_am + offs_k[None, :] * stride_ak


@triton.jit
def moe_tile_dot(a_ptr, w_ptr, sorted_ids_ptr, expert_ids_ptr, N, K, num_valid,
                 stride_am, stride_ak, stride_we, stride_wn, stride_wk, pid_m, pid_n,
                 TOPK: tl.constexpr, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
                 BLOCK_SIZE_K: tl.constexpr, EVEN_K: tl.constexpr):
    """The fp32 tile (pid_m, pid_n): the block's gathered rows of ``a`` times its expert's
    weights, over all of K. Columns past N read column 0 of the tile (inside ``w``), so only
    the K edge is ever masked, and only without ``EVEN_K``."""
    a_ptrs = _gathered_a(a_ptr, sorted_ids_ptr, pid_m, num_valid, stride_am, stride_ak, TOPK,
                         BLOCK_SIZE_M, BLOCK_SIZE_K)
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)  # expert * stride_we may pass 2**31
    rn = tl.arange(0, BLOCK_SIZE_N)
    rn = tl.where(pid_n * BLOCK_SIZE_N + rn < N, rn, 0)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    w_ptrs = (w_ptr + expert * stride_we + (pid_n * BLOCK_SIZE_N).to(tl.int64) * stride_wn
              + offs_k[:, None] * stride_wk + rn[None, :] * stride_wn)
    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            w = tl.load(w_ptrs)
        else:
            k_left = K - k * BLOCK_SIZE_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            w = tl.load(w_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(a, w, acc)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        w_ptrs += BLOCK_SIZE_K * stride_wk
    return acc


@triton.jit
def moe_store_tile(c_ptr, acc, sorted_ids_ptr, N, num_valid, stride_cm, stride_cn, pid_m, pid_n,
                   BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr):
    """Scatter the tile's real rows to their (token, slot) rows of ``out``, masked at N."""
    rows, real = _row_block(sorted_ids_ptr, pid_m, num_valid, BLOCK_SIZE_M)
    rn = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    c_ptrs = c_ptr + rows.to(tl.int64)[:, None] * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=real[:, None] & (rn[None, :] < N))


@triton.jit
def _moe_gemm_kernel(
    a_ptr, w_ptr, c_ptr, sorted_ids_ptr, expert_ids_ptr, N, K, num_padded, num_valid,
    stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_cm, stride_cn,
    TOPK: tl.constexpr, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr, EVEN_K: tl.constexpr,
):
    # Grouped ordering over (padded row block, column block), as in matmul: the row blocks of a
    # group share the weight tiles they read (one expert's, while the group stays in it).
    # num_padded is a multiple of BLOCK_SIZE_M and every block is one expert's.
    pid_m, pid_n = tile_coords(tl.program_id(0), num_padded, N, BLOCK_SIZE_M, BLOCK_SIZE_N,
                               GROUP_SIZE_M)
    acc = moe_tile_dot(a_ptr, w_ptr, sorted_ids_ptr, expert_ids_ptr, N, K, num_valid,
                       stride_am, stride_ak, stride_we, stride_wn, stride_wk, pid_m, pid_n,
                       TOPK, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, EVEN_K)
    moe_store_tile(c_ptr, acc, sorted_ids_ptr, N, num_valid, stride_cm, stride_cn, pid_m, pid_n,
                   BLOCK_SIZE_M, BLOCK_SIZE_N)


@triton.jit
def _moe_gemm_persistent_kernel(
    a_ptr, w_ptr, c_ptr, sorted_ids_ptr, expert_ids_ptr, N, K, num_padded, num_valid,
    stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_cm, stride_cn,
    TOPK: tl.constexpr, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr, EVEN_K: tl.constexpr,
    NUM_SMS: tl.constexpr,
):
    # matmul's persistent loop over the (row block, column block) tiles: one program per SM
    # walks tiles start, start + NUM_SMS, ... in grouped order; the store's tile is counted
    # apart from the loads' (Triton's pipeliner mishandles one value used both before and after
    # the K loop).
    start = tl.program_id(0)
    num_tiles = tl.cdiv(num_padded, BLOCK_SIZE_M) * tl.cdiv(N, BLOCK_SIZE_N)
    tile_c = start - NUM_SMS
    for tile_id in tl.range(start, num_tiles, NUM_SMS, flatten=True):
        pid_m, pid_n = tile_coords(tile_id, num_padded, N, BLOCK_SIZE_M, BLOCK_SIZE_N,
                                   GROUP_SIZE_M)
        acc = moe_tile_dot(a_ptr, w_ptr, sorted_ids_ptr, expert_ids_ptr, N, K, num_valid,
                           stride_am, stride_ak, stride_we, stride_wn, stride_wk, pid_m, pid_n,
                           TOPK, BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, EVEN_K)
        tile_c += NUM_SMS
        pid_cm, pid_cn = tile_coords(tile_c, num_padded, N, BLOCK_SIZE_M, BLOCK_SIZE_N,
                                     GROUP_SIZE_M)
        moe_store_tile(c_ptr, acc, sorted_ids_ptr, N, num_valid, stride_cm, stride_cn, pid_cm,
                       pid_cn, BLOCK_SIZE_M, BLOCK_SIZE_N)


@triton.jit
def _moe_gemm_tma_persistent_kernel(
    a_ptr, w_ptr, c_ptr, sorted_ids_ptr, expert_ids_ptr, N, K, num_padded, num_valid, w_rows,
    stride_am, stride_ak, stride_wn, stride_cm, stride_cn,
    TOPK: tl.constexpr, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr, EVEN_K: tl.constexpr,
    NUM_SMS: tl.constexpr,
):
    # The persistent loop with the weights read through a tensor descriptor over w as one
    # [E * N, K] matrix (TMA on sm_90+): the tile of expert e, column block n is rows e * N + n
    # * BLOCK_SIZE_N onward. Past N they are the next expert's rows (their columns are not
    # stored) or, past E * N, zeros; past K zeros. The gathered rows of a stay pointer loads.
    w_desc = tl.make_tensor_descriptor(w_ptr, shape=[w_rows, K], strides=[stride_wn, 1],
                                       block_shape=[BLOCK_SIZE_N, BLOCK_SIZE_K])
    start = tl.program_id(0)
    num_tiles = tl.cdiv(num_padded, BLOCK_SIZE_M) * tl.cdiv(N, BLOCK_SIZE_N)
    k_tiles = tl.cdiv(K, BLOCK_SIZE_K)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    tile_c = start - NUM_SMS
    for tile_id in tl.range(start, num_tiles, NUM_SMS, flatten=True):
        pid_m, pid_n = tile_coords(tile_id, num_padded, N, BLOCK_SIZE_M, BLOCK_SIZE_N,
                                   GROUP_SIZE_M)
        a_ptrs = _gathered_a(a_ptr, sorted_ids_ptr, pid_m, num_valid, stride_am, stride_ak,
                             TOPK, BLOCK_SIZE_M, BLOCK_SIZE_K)
        w_row = tl.load(expert_ids_ptr + pid_m) * N + pid_n * BLOCK_SIZE_N
        acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
        for ki in range(k_tiles):
            if EVEN_K:
                a = tl.load(a_ptrs)
            else:
                a = tl.load(a_ptrs, mask=offs_k[None, :] < K - ki * BLOCK_SIZE_K, other=0.0)
            w = w_desc.load([w_row, ki * BLOCK_SIZE_K])
            acc = tl.dot(a, w.T, acc)
            a_ptrs += BLOCK_SIZE_K * stride_ak
        tile_c += NUM_SMS
        pid_cm, pid_cn = tile_coords(tile_c, num_padded, N, BLOCK_SIZE_M, BLOCK_SIZE_N,
                                     GROUP_SIZE_M)
        moe_store_tile(c_ptr, acc, sorted_ids_ptr, N, num_valid, stride_cm, stride_cn, pid_cm,
                       pid_cn, BLOCK_SIZE_M, BLOCK_SIZE_N)


def align_block_size(topk_ids: torch.Tensor, num_experts: int,
                     block_size_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's ``moe_align_block_size``, in torch: the flat (token * TOPK + slot) indices sorted
    by expert, each expert's run padded to a multiple of ``block_size_m`` with the sentinel
    ``topk_ids.numel()``, and the expert of each block. An expert with no tokens gets no block."""
    flat = topk_ids.flatten().to(torch.int64)
    sentinel = flat.numel()
    order = torch.sort(flat, stable=True).indices
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    ids, experts, start = [], [], 0
    for expert, count in enumerate(counts):
        padded = -(-count // block_size_m) * block_size_m
        run = torch.full((padded,), sentinel, dtype=torch.int64, device=flat.device)
        run[:count] = order[start:start + count]
        ids.append(run)
        experts += [expert] * (padded // block_size_m)
        start += count
    sorted_ids = torch.cat(ids).to(torch.int32)
    return sorted_ids, torch.tensor(experts, dtype=torch.int32, device=flat.device)


_TILE = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M")

Launch = tuple[Any, tuple[int, ...], tuple[Any, ...], dict[str, Any]]


def _launch(inputs: dict[str, Any], config: Mapping[str, int]) -> Launch:
    """The kernel launch computing ``inputs["out"]`` with ``config``: (kernel, grid, args,
    constexprs and launch options)."""
    a, w, out = inputs["a"], inputs["w"], inputs["out"]
    bm, bn = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"]
    sorted_ids, expert_ids = inputs[f"_sorted_ids_{bm}"], inputs[f"_expert_ids_{bm}"]
    c = out.view(-1, out.shape[-1])  # [M * TOPK, N]: row m * TOPK + slot
    E, N, K = w.shape
    padded = sorted_ids.numel()
    tiles = padded // bm * triton.cdiv(N, bn)
    meta = {**{k: config[k] for k in _TILE}, "TOPK": out.shape[1],
            "EVEN_K": even_k(K, config["BLOCK_SIZE_K"]), "num_warps": config["num_warps"],
            "num_stages": config["num_stages"]}
    head = (a, w, c, sorted_ids, expert_ids, N, K, padded, c.shape[0])
    variant = variant_of(config)
    if variant == TILED:
        return (_moe_gemm_kernel, (tiles,),
                (*head, a.stride(0), a.stride(1), w.stride(0), w.stride(1), w.stride(2),
                 c.stride(0), c.stride(1)), meta)
    sms = num_sms(a.device)
    grid = (min(sms, tiles),)
    if variant == PERSISTENT:
        return (_moe_gemm_persistent_kernel, grid,
                (*head, a.stride(0), a.stride(1), w.stride(0), w.stride(1), w.stride(2),
                 c.stride(0), c.stride(1)), {**meta, "NUM_SMS": sms})
    if variant == TMA_PERSISTENT:
        if not w.is_contiguous():
            raise ValueError("the tma_persistent variant needs contiguous [E, N, K] weights")
        return (_moe_gemm_tma_persistent_kernel, grid,
                (*head, E * N, a.stride(0), a.stride(1), w.stride(1), c.stride(0),
                 c.stride(1)), {**meta, "NUM_SMS": sms})
    raise ValueError(f"unknown VARIANT {variant} (one of {list(range(len(VARIANTS)))})")


def moe_gemm(inputs: dict[str, Any], config: Mapping[str, int]) -> None:
    """inputs["out"][m, k] = a[m] @ w[topk_ids[m, k]].T with the given launch config (its
    VARIANT, when it has one, picks the algorithm); the routing aligned to the config's
    BLOCK_SIZE_M comes from ``make_inputs``."""
    if variant_of(config) == TMA_PERSISTENT:
        set_tma_allocator(inputs["a"].device)
    kernel, grid, args, kwargs = _launch(inputs, config)
    kernel[grid](*args, **kwargs)


def compile_moe_gemm(inputs: dict[str, Any], config: Mapping[str, int]) -> None:
    """Compile (or load from Triton's disk cache) without launching."""
    kernel, grid, args, kwargs = _launch(inputs, config)
    kernel.warmup(*args, grid=grid, **kwargs)


# -- the space's constraints ----------------------------------------------------------------

#: shared memory the persistent loops' store takes besides the pipeline, at most: its layout
#: conversion's scratch (Triton 3.9's sm_90 build: 32 KB at 128x256 and 8 warps, 8 KB at 64x64;
#: the tiled kernel reuses the pipeline's buffers for it, the flattened loop keeps them live)
PERSISTENT_STORE_SCRATCH = 32 << 10


def _shared_memory(config: KernelConfig, ctx: ProblemContext) -> str | None:
    # Each pipeline stage holds one tile of the gathered rows and one of the expert's weights
    # (every variant: the TMA one stores through pointers, with no output tile staged).
    bm, bn = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"]
    if variant_of(config) != TILED:
        scratch = min(bm * bn * ctx.elem_bytes, PERSISTENT_STORE_SCRATCH)
        ctx = replace(ctx, smem_limit=ctx.smem_limit - scratch)
    return tile_shared_memory(config["num_stages"], bm, bn, config["BLOCK_SIZE_K"], ctx)


def _accumulator_registers(config: KernelConfig, ctx: ProblemContext) -> str | None:
    return tile_accumulator_registers(config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"],
                                      config["num_warps"])


def _redundant_tile(config: KernelConfig, ctx: ProblemContext) -> str | None:
    # A row block taller than all M * TOPK routed rows (padded to a power of two) only computes
    # sentinel rows, whatever the routing; likewise a tile wider than N or deeper than K.
    rows = ctx.shape["M"] * ctx.shape["TOPK"]
    for block, size, what, floor in (("BLOCK_SIZE_M", rows, "M * TOPK", 16),
                                     ("BLOCK_SIZE_N", ctx.shape["N"], "N", 32),
                                     ("BLOCK_SIZE_K", ctx.shape["K"], "K", 32)):
        cap = max(floor, next_pow2(size))
        if config[block] > cap:
            return f"{block}={config[block]} is larger than {what}={size} needs ({cap})"
    return None


def most_tiles(config: Mapping[str, int], shape: Mapping[str, int]) -> int:
    """The most tiles any routing of the problem gives: every used expert's rows padded to a
    whole row block (at most min(E, M * TOPK) experts get rows)."""
    rows, bm = shape["M"] * shape["TOPK"], config["BLOCK_SIZE_M"]
    blocks = (rows + min(shape["E"], rows) * (bm - 1)) // bm
    return blocks * triton.cdiv(shape["N"], config["BLOCK_SIZE_N"])


def _variant_constraint(config: KernelConfig, ctx: ProblemContext) -> str | None:
    """persistent with no more tiles than SMs (whatever the routing) repeats the tiled kernel;
    tma_persistent needs tensor descriptors in this Triton, sm_90+, 16-bit inputs and 16-byte
    aligned weight rows (K x the element size)."""
    variant = variant_of(config)
    if variant == PERSISTENT:
        tiles = most_tiles(config, ctx.shape)
        if tiles <= ctx.sm_count:
            return (f"at most {tiles} tiles fit on {ctx.sm_count} SMs: persistent is the tiled "
                    "kernel")
    if variant != TMA_PERSISTENT:
        return None
    if why := tma_unavailable(ctx):
        return why
    row = ctx.shape["K"] * ctx.elem_bytes
    if row % 16:
        return f"TMA needs 16-byte aligned weight rows (K x {ctx.elem_bytes} B = {row} B)"
    return None


# -- the prior: matmul's cost model on the padded grouped problem, plus the weights' traffic --

#: L2 of an H100/H200, bytes: a group's tiles that fit in half of it are read from DRAM once
L2_BYTES = 50 << 20


def expected_row_blocks(shape: Mapping[str, int], block_size_m: int) -> tuple[float, float]:
    """(experts with tokens, row blocks per such expert) expected under make_inputs' uniform
    random routing: an expert's rows padded up to whole blocks cost half a block on average
    (its count varies around the mean), and at least one block."""
    M, E, topk = shape["M"], shape["E"], shape["TOPK"]
    rows = M * topk
    if topk <= E:  # distinct experts per token: expert e is missed by a token w.p. 1 - TOPK/E
        active = E * (1.0 - (1.0 - topk / E) ** M)
    else:
        active = E * (1.0 - (1.0 - 1.0 / E) ** rows)
    active = max(1.0, active)
    return active, max(1.0, rows / active / block_size_m + 0.5)


def _dram_bytes(config: Mapping[str, int], ctx: ProblemContext, active: float,
                blocks: float) -> float:
    """Bytes the grid reads from DRAM and writes: each expert's weights once per window of
    row blocks that runs at once (the grouped order keeps GROUP_SIZE_M row blocks together,
    and the concurrent tiles span at least concurrent / column blocks rows), the gathered rows
    once per window of column blocks unless a group's rows stay in L2, and the output."""
    from search_spaces.gemm import prior as cm

    M, N, K, topk = ctx.shape["M"], ctx.shape["N"], ctx.shape["K"], ctx.shape["TOPK"]
    e = ctx.elem_bytes
    bm, bn, bk = config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"], config["BLOCK_SIZE_K"]
    warps, stages = int(config["num_warps"]), int(config["num_stages"])
    group = int(config["GROUP_SIZE_M"])
    sms = ctx.sm_count or cm.DEFAULT_SM_COUNT
    if variant_of(config) == TILED:
        smem = max(1, stages * bk * (bm + bn) * e)
        occ = max(1, min(cm.SMEM_PER_SM // smem, cm.THREADS_PER_SM // (32 * warps)))
    else:
        occ = 1
    concurrent = sms * occ
    col_blocks = triton.cdiv(N, bn)
    rows_at_once = max(float(min(group, concurrent)), concurrent / col_blocks)
    cols_at_once = max(1.0, concurrent / rows_at_once)
    w_reads = 1.0 if N * K * e <= L2_BYTES // 2 else max(1.0, blocks / rows_at_once)
    a_reads = (1.0 if min(group, blocks * active) * bm * K * e <= L2_BYTES // 2
               else max(1.0, col_blocks / cols_at_once))
    return (active * N * K * e * w_reads + active * blocks * bm * K * e * a_reads
            + M * topk * N * e)


def estimate_s(config: Mapping[str, int], ctx: ProblemContext) -> float:
    """Estimated run time in seconds (a ranking score): matmul's cost model
    (``search_spaces/gemm/prior.py``) on the problem the grid computes, the expected padded
    rows (``expected_row_blocks``) x N x K, with its tiles in waves over the SMs and its
    variant (tma_persistent, whose weights alone come by TMA, between the model's persistent
    and TMA estimates), and as DRAM floor every active expert's weights, re-read as the grouped
    order and L2 allow (``_dram_bytes``)."""
    from search_spaces.gemm import prior as cm

    bm = config["BLOCK_SIZE_M"]
    active, blocks = expected_row_blocks(ctx.shape, bm)
    padded = max(1, round(active * blocks)) * bm
    gemm_ctx = replace(ctx, shape={"M": padded, "N": ctx.shape["N"], "K": ctx.shape["K"]})
    gemm = {"BLOCK_M": bm, "BLOCK_N": config["BLOCK_SIZE_N"], "BLOCK_K": config["BLOCK_SIZE_K"],
            "GROUP_M": config["GROUP_SIZE_M"], "num_warps": config["num_warps"],
            "num_stages": config["num_stages"]}
    variant = variant_of(config)
    if variant == TMA_PERSISTENT:
        t = math.sqrt(cm.estimate_s({**gemm, "VARIANT": cm.PERSISTENT}, gemm_ctx)
                      * cm.estimate_s({**gemm, "VARIANT": cm.TMA_PERSISTENT}, gemm_ctx))
    else:
        t = cm.estimate_s({**gemm, "VARIANT": cm.PERSISTENT if variant == PERSISTENT
                           else cm.TILED}, gemm_ctx)
    t_dram = _dram_bytes(config, ctx, active, blocks) / cm.DRAM_BW
    return float((t ** cm.P + t_dram ** cm.P) ** (1.0 / cm.P))


# -- configs ----------------------------------------------------------------------------------

#: the SM count the known-good configs were chosen for (H100/H200 SXM)
_H200_SMS = 132

_PARAMS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps",
           "num_stages")
# (BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, warps, stages): vLLM's
# get_default_config for unquantized weights (few tokens, then many); small row blocks with
# wide or deep tiles for decode sizes (a few rows per expert: the weights' bytes are the time);
# vLLM's tuned H100 bf16 choices for Mixtral-like shapes at medium token counts; for large
# token counts vLLM-style big tiles (BLOCK_SIZE_M 64/128, BLOCK_SIZE_N 128/256, BLOCK_SIZE_K 64,
# GROUP_SIZE_M 8-32, 8 warps, 3-4 stages), the first the H200's best at 4096 tokens of 8
# experts top-2 (bench/results/targets_13_h200.json); and the Triton tutorial's 64x256x32.
# The prior ranks them per problem (a warm start tries its best few).
_KNOWN_GOOD = [
    (16, 32, 64, 1, 4, 3), (64, 64, 32, 8, 4, 3),
    (16, 64, 128, 1, 4, 4), (16, 128, 64, 1, 4, 4), (16, 64, 256, 1, 4, 3),
    (16, 128, 128, 1, 4, 3), (32, 64, 128, 1, 4, 4),
    (32, 128, 64, 16, 4, 4), (64, 128, 64, 16, 4, 3),
    (128, 256, 64, 16, 8, 4), (128, 256, 64, 32, 8, 3), (128, 128, 64, 16, 8, 4),
    (128, 128, 64, 8, 8, 3), (64, 256, 64, 16, 8, 4), (64, 128, 64, 32, 8, 4),
    (64, 256, 32, 8, 4, 4),
]
# The other variants' (VARIANT, then _PARAMS): matmul's persistent and TMA winners' big tiles
# (128x256x64, 8 warps, 3 stages: the flattened loop keeps the pipeline's buffers live through
# the store, so one stage fewer than the tiled kernel's best; 128x128x64 with 4).
_KNOWN_GOOD_VARIANTS = [
    (TMA_PERSISTENT, 128, 256, 64, 16, 8, 3), (TMA_PERSISTENT, 128, 128, 64, 16, 8, 4),
    (TMA_PERSISTENT, 64, 256, 64, 16, 8, 3),
    (PERSISTENT, 128, 256, 64, 16, 8, 3), (PERSISTENT, 128, 128, 64, 16, 8, 4),
]


def _space_params() -> tuple[Param, ...]:
    return (
        Param("BLOCK_SIZE_M", BLOCK_SIZES_M, "pow2"),
        Param.pow2("BLOCK_SIZE_N", 32, 256),
        Param.pow2("BLOCK_SIZE_K", 32, 256),
        Param.ints("GROUP_SIZE_M", (1, 8, 16, 32, 64)),
        Param.pow2("num_warps", 2, 8),
        Param.ints("num_stages", (2, 3, 4, 5)),
    )


class MoeGemmKernel:
    """The tiled grouped GEMM, in vLLM's parameters (its configs export to vLLM's files)."""

    name = "moe_gemm"
    ref = "search_spaces.moe_gemm:KERNEL"
    description = ("mixture-of-experts grouped GEMM (vLLM's fused MoE, first GEMM): M tokens "
                   "[M, K] routed to TOPK of E experts [E, N, K], out [M, TOPK, N]; tokens "
                   "sorted by expert and padded per expert to BLOCK_SIZE_M")
    dims = (Dim("M", 1, 65536, "tokens"), Dim("N", 1, 65536, "output columns per expert"),
            Dim("K", 1, 65536, "hidden size (the reduction)"),
            Dim("E", 1, 256, "experts"), Dim("TOPK", 1, 8, "experts per token"))
    dtypes = ("float16", "bfloat16", "float32")
    # Triton's CPU interpreter computes bf16 tl.dot wrongly (silently).
    interpreter_unsupported_dtypes = ("bfloat16",)
    #: its compile hook builds the GPU binary from host tensors (``tuner.host_compile``)
    compiles_on_host = True

    @property
    def version(self) -> str:
        # with the matmul code they reach (tile order, K loop, tile constraints)
        return builtin_version(self, _moe_gemm_kernel, _moe_gemm_persistent_kernel,
                               _moe_gemm_tma_persistent_kernel)

    def space(self) -> SearchSpace:
        return SearchSpace(params=_space_params(),
                           constraints=(_shared_memory, _accumulator_registers, _redundant_tile))

    def known_good_configs(self, shape: Mapping[str, int], dtype: str) -> list[KernelConfig]:
        return [KernelConfig(dict(zip(_PARAMS, c, strict=True))) for c in _KNOWN_GOOD]

    def default_config(self, shape: Mapping[str, int], dtype: str) -> KernelConfig:
        """vLLM's default for unquantized weights: small tiles while there are no more tokens
        than experts (decode), else 64 x 64 x 32; runs everywhere (<= 48 KB of smem)."""
        if shape.get("M", 128) <= shape.get("E", 8):
            return KernelConfig(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=64,
                                GROUP_SIZE_M=1, num_warps=4, num_stages=3)
        return KernelConfig(BLOCK_SIZE_M=64, BLOCK_SIZE_N=64, BLOCK_SIZE_K=32, GROUP_SIZE_M=8,
                            num_warps=4, num_stages=3)

    def make_inputs(
        self, shape: Mapping[str, int], dtype: str, device: str, seed: int
    ) -> dict[str, Any]:
        M, N, K, E, topk = shape["M"], shape["N"], shape["K"], shape["E"], shape["TOPK"]
        gen = torch.Generator(device=device).manual_seed(seed)
        scale = K ** -0.25  # every output element ~N(0, 1) whatever K is
        a = torch.randn((M, K), generator=gen, device=device, dtype=torch.float32) * scale
        w = torch.randn((E, N, K), generator=gen, device=device, dtype=torch.float32) * scale
        dt = torch_dtype(dtype)
        topk_ids = route(M, E, topk, gen, device)
        inputs: dict[str, Any] = {"a": a.to(dt), "w": w.to(dt),
                                  "out": torch.empty((M, topk, N), device=device,
                                                     dtype=dt),
                                  "_topk_ids": topk_ids}
        add_routing(inputs, topk_ids, E)
        return inputs

    def compile_shape(self, shape: Mapping[str, int], dtype: str) -> dict[str, int]:
        """Compile on a small problem: M, N and K keep their residue mod 256 (so M * TOPK, N * K
        and every stride keep their divisibility by 16, and EVEN_K its value) and 1 stays 1;
        TOPK is a constexpr and stays; E is no kernel argument (only its weights' size is):
        under 32, alike mod 16."""
        return {**{d: shrunk_dim(shape[d]) for d in ("M", "N", "K")},
                "E": shrunk_dim(shape["E"], 16), "TOPK": shape["TOPK"]}

    def launch(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        moe_gemm(inputs, config)

    def compile(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        compile_moe_gemm(inputs, config)

    def reference(self, inputs: dict[str, Any]) -> torch.Tensor:
        """Per expert, its rows' product in fp32, scattered back to [M, TOPK, N]."""
        a, w, out = inputs["a"].float(), inputs["w"].float(), inputs["out"]
        topk = out.shape[1]
        result = torch.zeros((out.shape[0] * topk, out.shape[2]), device=a.device)
        for expert, rows in enumerate(inputs["_expert_rows"]):
            result[rows] = a[rows // topk] @ w[expert].T
        return result.view(out.shape)

    def tolerance(self, dtype: str) -> Tolerance:
        # Each output element is one K-long dot product accumulated in fp32, as in matmul: the
        # same tolerances (matmul.py says why).
        return {"float16": Tolerance(1e-3, 2e-3), "bfloat16": Tolerance(8e-3, 1.6e-2),
                "float32": Tolerance(4e-3, 2e-3)}[dtype]

    def flops(self, shape: Mapping[str, int]) -> float:
        return 2.0 * shape["M"] * shape["TOPK"] * shape["N"] * shape["K"]

    def bytes(self, shape: Mapping[str, int], dtype: str) -> float:
        elem = 4 if dtype == "float32" else 2
        rows = shape["M"] * shape["TOPK"]
        experts = min(shape["E"], rows)  # at most this many experts' weights are read
        return float(elem * (shape["M"] * shape["K"] + experts * shape["N"] * shape["K"]
                             + rows * shape["N"]))

    def torch_baseline(self, inputs: dict[str, Any]) -> None:
        self.baseline(inputs)

    def baseline(self, inputs: dict[str, Any]) -> torch.Tensor:
        """The issue's comparison: a loop of per-expert torch matmuls in the inputs' dtype
        (gather the expert's rows, multiply, scatter), on the same precomputed routing (no
        host synchronisation in the loop); fp32 with TF32 allowed, as tl.dot computes it."""
        a, w, out = inputs["a"], inputs["w"], inputs["out"]
        topk = out.shape[1]
        flat = out.view(-1, out.shape[2])
        allowed = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            for expert, rows in enumerate(inputs["_expert_rows"]):
                flat.index_copy_(0, rows, a.index_select(0, rows // topk) @ w[expert].T)
        finally:  # the reference (fp32, in this process) must stay exact
            torch.backends.cuda.matmul.allow_tf32 = allowed
        return out

    def prior(self, config: KernelConfig, ctx: ProblemContext) -> float | None:
        """log of ``estimate_s``: matmul's cost model on the padded grouped problem, with the
        experts' weights as its DRAM floor."""
        return math.log(max(estimate_s(config, ctx), 1e-12))


class MoeGemmVariantsKernel(MoeGemmKernel):
    """The grouped GEMM with the algorithm as a search dimension (``VARIANT``). A plugin, not a
    built-in: its configs carry VARIANT, which vLLM's kernel does not take, so they are not
    vLLM's (export moe_gemm's for vLLM)."""

    name = "moe_gemm_variants"
    ref = "search_spaces.moe_gemm:VARIANTS_KERNEL"
    description = ("mixture-of-experts grouped GEMM as moe_gemm, with the algorithm searched: "
                   "variants tiled, persistent, tma_persistent")

    def space(self) -> SearchSpace:
        """moe_gemm's space plus VARIANT (categorical; ``VARIANTS`` names its values)."""
        tiled = super().space()
        return SearchSpace(
            params=(Param("VARIANT", tuple(range(len(VARIANTS))), "categorical"),
                    *tiled.params),
            constraints=(_variant_constraint, *tiled.constraints),
        )

    def known_good_configs(self, shape: Mapping[str, int], dtype: str) -> list[KernelConfig]:
        """moe_gemm's (tiled), then the other variants' where 128x128 tiles of the routed rows
        fill more than one wave of an H200's SMs (the prior ranks them all)."""
        tiled = [KernelConfig({**c, "VARIANT": TILED})
                 for c in super().known_good_configs(shape, dtype)]
        big = (shape.get("M", 1) * shape.get("TOPK", 1) // 128
               * triton.cdiv(shape.get("N", 1), 128) > _H200_SMS)
        others = [KernelConfig(dict(zip(("VARIANT", *_PARAMS), c, strict=True)))
                  for c in _KNOWN_GOOD_VARIANTS]
        return tiled + (others if big else [])

    def default_config(self, shape: Mapping[str, int], dtype: str) -> KernelConfig:
        """moe_gemm's default, tiled."""
        return KernelConfig({**super().default_config(shape, dtype), "VARIANT": TILED})


def route(M: int, E: int, topk: int, gen: torch.Generator, device: str) -> torch.Tensor:
    """Seeded random routing [M, TOPK] (int32): TOPK distinct experts per token when there are
    that many, else drawn with repeats."""
    if topk <= E:
        scores = torch.rand((M, E), generator=gen, device=device)
        return scores.argsort(dim=1)[:, :topk].to(torch.int32)
    return torch.randint(0, E, (M, topk), generator=gen, device=device, dtype=torch.int32)


def add_routing(inputs: dict[str, Any], topk_ids: torch.Tensor, num_experts: int) -> None:
    """Put the routing into ``inputs`` as the launcher, reference and baseline read it: the
    alignment for every BLOCK_SIZE_M of the space, and each expert's flat row indices."""
    for block_size_m in BLOCK_SIZES_M:
        sorted_ids, expert_ids = align_block_size(topk_ids, num_experts, block_size_m)
        inputs[f"_sorted_ids_{block_size_m}"] = sorted_ids
        inputs[f"_expert_ids_{block_size_m}"] = expert_ids
    flat = topk_ids.flatten().to(torch.int64)
    inputs["_expert_rows"] = [torch.nonzero(flat == e).flatten() for e in range(num_experts)]


KERNEL = MoeGemmKernel()
VARIANTS_KERNEL = MoeGemmVariantsKernel()
