"""Matmul C = A @ B (row-major A: MxK, B: KxN), fp32 accumulation, grouped tile order.

Every edge is masked (or, for TMA, zero-filled and clipped), so any M, N, K >= 1 is computed
right. The algorithm is a search parameter, ``VARIANT`` (an int: ``VARIANTS`` names them):

- ``tiled`` (0): one program per output tile (``_matmul_kernel``);
- ``persistent`` (1): one program per SM walking the tiles in grouped order, the tile loop
  flattened with the K loop so a tile's store overlaps the next tile's loads;
- ``tma_persistent`` (2): the same loop with device-side tensor descriptors (TMA loads and
  store on sm_90+; 16-bit inputs, 16-byte aligned rows);
- ``split_k`` (3): ``SPLIT_K`` programs per tile each sum a share of K into an fp32 workspace,
  and a second kernel adds the shares in a fixed order (deterministic; no atomics);
- ``stream_k`` (4): one program per SM; all tiles but the last wave and the tail run as in
  ``persistent``, the rest are cut along K into equal runs, one a program ("DP + two-tile
  SK": each run is 1-2 tiles of K steps, so a tile is shared by at most two programs, whose
  fp32 partials the second to finish adds; one launch, no spinning, deterministic). Loads by
  TMA where ``stream_k_tma`` allows (sm_90+, 16-bit, aligned rows), else by pointers.

``ALIGN`` (0 or 1) applies to every variant: with 1, operands whose rows would load slowly
(K not a multiple of 16, or B's rows not 16-byte aligned) are first copied into zero-padded
buffers with aligned rows (``stage``: one read and one write of each, inside the timed launch).
Unaligned rows otherwise load one 2-byte element at a time, with no asynchronous copies, and
rule out TMA; cuBLAS is as slow there, and the tuned staged kernels ran 2.1-4.4x faster than
it on the H200 (bench/NOTES.md, GPU time: a staged call also costs 2-3 launches of host time).

Warp specialisation (``tl.range(..., warp_specialize=True)``) is not a variant: Triton's docs
give it for Blackwell; on the H200 with Triton 3.6 it compiles for ``tma_persistent`` and
times within -3%..+2% of the plain loop (the kernel's ``WS`` switch, used by
``bench.matmul_variants`` only). Every K loop has an ``EVEN_K`` specialisation (no K mask).
The three layers follow the Liger-Kernel habit: the @triton.jit kernels -> ``matmul`` (the
launcher) -> ``MatmulKernel`` (the TunableKernel the tuner drives).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

# the GEMM family's code (search_spaces/gemm/); INTERPRETER_SMS, stream_k_plan and ROUND_TF32
# (noqa: F401) are not used here: kept for callers that read them as matmul's
from search_spaces.gemm.host import (  # noqa: F401
    _PARAMS,
    ALIGN_ELEMS,
    ALIGNS,
    BLOCK_NS,
    INTERPRETER_SMS,
    PERSISTENT,
    SPLIT_K_VARIANT,
    SPLIT_KS,
    STREAM_K,
    TILED,
    TMA_PERSISTENT,
    VARIANTS,
    _aligned_rows,
    _descriptors_for,
    _split_k,
    _variant_params,
    align_constraint,
    align_of,
    even_k,
    num_sms,
    output_tiles,
    persistent_constraint,
    round_up,
    second_block,
    set_tma_allocator,
    split_tile_constraint,
    staging_needed,
    stream_k_buffers,
    stream_k_constraint,
    stream_k_plan,
    stream_k_tma,
    tiled_default,
    tiled_known_good,
    tiled_space,
    variant_of,
)
from search_spaces.gemm.tiles import (
    ROUND_TF32,  # noqa: F401
    grouped_tile,
    store_tile,
    tile_coords,
    tile_dot,
)
from tuner.config import KernelConfig
from tuner.dtypes import element_bytes, torch_dtype
from tuner.kernel import Dim, Tolerance, builtin_version, shrunk_dim
from tuner.space import Param, ProblemContext, SearchSpace


@triton.jit
def _matmul_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    pid_m, pid_n = grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = tile_dot(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, pid_m,
                   pid_n, 0, tl.cdiv(K, BLOCK_K), BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K)
    store_tile(c_ptr, acc, M, N, stride_cm, stride_cn, pid_m, pid_n, BLOCK_M, BLOCK_N)


@triton.jit
def _matmul_persistent_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr, NUM_SMS: tl.constexpr,
):
    # One program per SM walks the tiles start, start + NUM_SMS, ... in grouped order; the
    # flattened loop lets the compiler pipeline the next tile's loads under this tile's store.
    start = tl.program_id(0)
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    # The store's tile is counted apart from the loads' (as the tutorial does: Triton's
    # pipeliner mishandles one value used both before and after the K loop).
    tile_c = start - NUM_SMS
    for tile_id in tl.range(start, num_tiles, NUM_SMS, flatten=True):
        pid_m, pid_n = tile_coords(tile_id, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = tile_dot(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                       pid_m, pid_n, 0, k_tiles, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K)
        tile_c += NUM_SMS
        pid_cm, pid_cn = tile_coords(tile_c, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        store_tile(c_ptr, acc, M, N, stride_cm, stride_cn, pid_cm, pid_cn, BLOCK_M, BLOCK_N)


@triton.jit
def _gemm_descriptors(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_bk, stride_cm,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Tensor descriptors of A (M x K), B (K x N) and C (M x N), rows contiguous, in the
    tiles the kernel loads and stores."""
    a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1],
                                       block_shape=[BLOCK_M, BLOCK_K])
    b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_bk, 1],
                                       block_shape=[BLOCK_K, BLOCK_N])
    c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, 1],
                                       block_shape=[BLOCK_M, BLOCK_N])
    return a_desc, b_desc, c_desc


@triton.jit
def _matmul_tma_persistent_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_bk, stride_cm,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    NUM_SMS: tl.constexpr, WS: tl.constexpr = 0, SPLIT_N: tl.constexpr = 0,
):
    # The persistent loop with tensor-descriptor (TMA on sm_90+) loads and stores: the copy
    # engine moves whole tiles, zero-filling past M, N and K and clipping the store, so no
    # address or mask is computed per element. Rows must be contiguous and 16-byte aligned.
    # SPLIT_N > 0 (BLOCK_N not a power of two, e.g. 192 = 128 + 64: ``second_block``): the tile's
    # columns are two power-of-two blocks, BLOCK_N - SPLIT_N and SPLIT_N wide, each with its
    # own B and C descriptors and accumulator, both fed by the one A tile. Tile widths of 3 x
    # 2^k are how 3072-wide outputs fill whole waves (16 x 24 tiles of 128x192: 2.9 waves on
    # 132 SMs, against 2.2 for 128x256).
    # WS (benchmarks only, bench.matmul_variants): 1 asks Triton to warp-specialise the tile
    # loop (loads, MMAs and the epilogue in separate warp groups), flattened; 2 the same loop
    # not flattened; 0 (the product) neither.
    a_desc, b_desc, c_desc = _gemm_descriptors(a_ptr, b_ptr, c_ptr, M, N, K, stride_am,
                                               stride_bk, stride_cm, BLOCK_M,
                                               BLOCK_N - SPLIT_N, BLOCK_K)
    if SPLIT_N > 0:
        b2_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_bk, 1],
                                            block_shape=[BLOCK_K, SPLIT_N])
        c2_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, 1],
                                            block_shape=[BLOCK_M, SPLIT_N])
    start = tl.program_id(0)
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    tile_c = start - NUM_SMS
    # Split tiles run the tile loop unflattened: flattened, their two MMAs per K step measured
    # 25-33% slower on the H200 (Triton 3.6; bench/NOTES.md), whole tiles 1-2% faster.
    for tile_id in tl.range(start, num_tiles, NUM_SMS, flatten=WS != 2 and SPLIT_N == 0,
                            warp_specialize=WS != 0):
        pid_m, pid_n = tile_coords(tile_id, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N - SPLIT_N), dtype=tl.float32)
        if SPLIT_N > 0:
            acc2 = tl.zeros((BLOCK_M, SPLIT_N), dtype=tl.float32)
        for ki in range(k_tiles):
            a = a_desc.load([pid_m * BLOCK_M, ki * BLOCK_K])
            b = b_desc.load([ki * BLOCK_K, pid_n * BLOCK_N])
            acc = tl.dot(a, b, acc)
            if SPLIT_N > 0:
                b2 = b2_desc.load([ki * BLOCK_K, pid_n * BLOCK_N + BLOCK_N - SPLIT_N])
                acc2 = tl.dot(a, b2, acc2)
        tile_c += NUM_SMS
        pid_cm, pid_cn = tile_coords(tile_c, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        c_desc.store([pid_cm * BLOCK_M, pid_cn * BLOCK_N], acc.to(c_ptr.dtype.element_ty))
        if SPLIT_N > 0:
            c2_desc.store([pid_cm * BLOCK_M, pid_cn * BLOCK_N + BLOCK_N - SPLIT_N],
                          acc2.to(c_ptr.dtype.element_ty))


@triton.jit
def _matmul_split_k_kernel(
    a_ptr, b_ptr, ws_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr, SPLIT_K: tl.constexpr,
):
    # Program (tile, split) sums its share of the K steps (the last shares may be short or
    # empty) and writes the fp32 partial tile to its own slice of the workspace: no atomics,
    # so the reduction below adds the splits in one fixed order (deterministic).
    pid_m, pid_n = grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    split = tl.program_id(1)
    k_tiles = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_tiles, SPLIT_K)
    k_first = (split * per_split).to(tl.int64)
    k_steps = min(per_split, k_tiles - split * per_split)
    acc = tile_dot(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, pid_m,
                   pid_n, k_first, k_steps, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K)
    ws = ws_ptr + split.to(tl.int64) * M * N
    store_tile(ws, acc, M, N, N, 1, pid_m, pid_n, BLOCK_M, BLOCK_N)


@triton.jit
def _split_k_reduce_kernel(ws_ptr, c_ptr, M, N, stride_cm, stride_cn, SPLIT_K: tl.constexpr,
                           BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    # C = the sum of the SPLIT_K partial products, split 0 first, in fp32, rounded once.
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    offs = rm[:, None].to(tl.int64) * N + rn[None, :]
    acc = tl.load(ws_ptr + offs, mask=mask, other=0.0)
    for s in tl.static_range(1, SPLIT_K):
        acc += tl.load(ws_ptr + s * M * N + offs, mask=mask, other=0.0)
    c_ptrs = c_ptr + rm[:, None].to(tl.int64) * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _tma_steps_dot(a_desc, b_desc, pid_m, pid_n, k_first, k_steps, BLOCK_M: tl.constexpr,
                   BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """``tile_dot`` with tensor-descriptor (TMA) loads: zero-filled past M, N and K."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for ki in range(k_first, k_first + k_steps):
        a = a_desc.load([pid_m * BLOCK_M, ki * BLOCK_K])
        b = b_desc.load([ki * BLOCK_K, pid_n * BLOCK_N])
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _store_c(c_dst, c_ptr, acc, M, N, stride_cm, stride_cn, pid_m, pid_n,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, USE_TMA: tl.constexpr):
    """stream_k's store of a finished tile: by C's tensor descriptor (TMA) or by pointers.
    The descriptor's store needs no BLOCK_M x BLOCK_N int64 address tensor: with pointer
    stores the TMA kernel spilled (sm_90 compiles, bench/results/sm90_resources_stream_k.md:
    960 B of stack at 128x256 on 8 warps, none with the descriptor)."""
    if USE_TMA:
        c_dst.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_ptr.dtype.element_ty))
    else:
        store_tile(c_ptr, acc, M, N, stride_cm, stride_cn, pid_m, pid_n, BLOCK_M, BLOCK_N)


@triton.jit
def _matmul_stream_k_kernel(
    a_ptr, b_ptr, c_ptr, ws_ptr, cnt_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr, NUM_SMS: tl.constexpr, USE_TMA: tl.constexpr,
):
    # NUM_SMS programs. Data-parallel part: the first (tiles // NUM_SMS - 1) * NUM_SMS tiles,
    # whole K, walked as the persistent kernel walks them. Stream-K part: the rest (one full
    # wave plus the tail, "DP + two-tile SK"), as one range of sk_tiles * k_tiles K steps cut
    # into NUM_SMS equal runs of whole steps, run p taking steps [p * per, (p + 1) * per).
    # per >= k_tiles, so a tile meets at most two runs: a tile a run covers whole is stored
    # directly; a tile two runs share gets an fp32 partial from each (slot 1 of the run that
    # ends in it, slot 0 of the run that starts in it), and the second of the two to bump the
    # tile's counter adds the other's partial to its own and writes C. Two partials: a + b is
    # b + a bit for bit, so the result does not depend on which one finishes (deterministic).
    # The finisher sets the counter back to 0 for the next launch: no memset, no spinning.
    start = tl.program_id(0)
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    full = tl.maximum(num_tiles // NUM_SMS - 1, 0) * NUM_SMS
    if USE_TMA:
        a_src, b_src, c_dst = _gemm_descriptors(a_ptr, b_ptr, c_ptr, M, N, K, stride_am,
                                                stride_bk, stride_cm, BLOCK_M, BLOCK_N, BLOCK_K)
    else:
        a_src = a_ptr
        b_src = b_ptr
        c_dst = c_ptr
    tile_c = start - NUM_SMS
    for tile_id in tl.range(start, full, NUM_SMS, flatten=True):
        pid_m, pid_n = tile_coords(tile_id, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        if USE_TMA:
            acc = _tma_steps_dot(a_src, b_src, pid_m, pid_n, 0, k_tiles, BLOCK_M, BLOCK_N,
                                 BLOCK_K)
        else:
            acc = tile_dot(a_src, b_src, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                           pid_m, pid_n, 0, k_tiles, BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K)
        tile_c += NUM_SMS
        pid_cm, pid_cn = tile_coords(tile_c, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        _store_c(c_dst, c_ptr, acc, M, N, stride_cm, stride_cn, pid_cm, pid_cn, BLOCK_M,
                 BLOCK_N, USE_TMA)

    sk_steps = (num_tiles - full) * k_tiles
    per = tl.maximum(tl.cdiv(sk_steps, NUM_SMS), k_tiles)
    it = start * per
    it_end = tl.minimum(it + per, sk_steps)
    first_t = it // k_tiles
    # A run of per <= 2 * k_tiles steps meets at most three tiles. Unrolled, so that the
    # partial tile's offsets (a BLOCK_M x BLOCK_N int32 tensor: 128 registers a thread at
    # 128x256 on 8 warps) are computed where they are used, not hoisted out of a loop and
    # held beside the accumulator through the K loop (on the H200 the rolled loop ran the
    # stream-K part ~40% slower than the data-parallel one: 4096^3 in 128x256 tiles, stream_k
    # 0.254 ms against persistent's 0.198).
    for _piece in tl.static_range(3):
        if it < it_end:
            t = it // k_tiles
            k_first = it - t * k_tiles
            k_stop = tl.minimum(it_end - t * k_tiles, k_tiles)
            pid_m, pid_n = tile_coords(full + t, M, N, BLOCK_M, BLOCK_N, GROUP_M)
            if USE_TMA:
                acc = _tma_steps_dot(a_src, b_src, pid_m, pid_n, k_first, k_stop - k_first,
                                     BLOCK_M, BLOCK_N, BLOCK_K)
            else:
                acc = tile_dot(a_src, b_src, M, N, K, stride_am, stride_ak, stride_bk,
                               stride_bn, pid_m, pid_n, k_first.to(tl.int64), k_stop - k_first,
                               BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K)
            if (k_first == 0) & (k_stop == k_tiles):
                _store_c(c_dst, c_ptr, acc, M, N, stride_cm, stride_cn, pid_m, pid_n, BLOCK_M,
                         BLOCK_N, USE_TMA)
            else:
                offs = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
                mine = 2 * start + tl.where(t == first_t, 0, 1)
                tl.store(ws_ptr + mine.to(tl.int64) * (BLOCK_M * BLOCK_N) + offs, acc)
                # every thread's partial is written before one thread releases the counter
                tl.debug_barrier()
                arrived = tl.atomic_add(cnt_ptr + t, 1, sem="acq_rel", scope="gpu")
                if arrived == 1:
                    tl.debug_barrier()
                    # the run that ends in tile t (slot 1) and the next one (slot 0)
                    first_p = (t * k_tiles) // per
                    other = tl.where(start == first_p, 2 * first_p + 2, 2 * first_p + 1)
                    acc += tl.load(ws_ptr + other.to(tl.int64) * (BLOCK_M * BLOCK_N) + offs,
                                   cache_modifier=".cg")
                    _store_c(c_dst, c_ptr, acc, M, N, stride_cm, stride_cn, pid_m, pid_n,
                             BLOCK_M, BLOCK_N, USE_TMA)
                    tl.store(cnt_ptr + t, 0)
            it = (t + 1) * k_tiles


@triton.jit
def _copy_block(src_ptr, dst_ptr, block, rows, cols, dst_rows, dst_cols, stride_src,
                stride_dst, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Block ``block`` (row-block major) of ``dst[:dst_rows, :dst_cols] = src[:rows, :cols]``,
    zero past src's edges."""
    blocks_c = tl.cdiv(dst_cols, BLOCK_C)
    r = (block // blocks_c) * BLOCK_R + tl.arange(0, BLOCK_R)
    c = (block % blocks_c) * BLOCK_C + tl.arange(0, BLOCK_C)
    r64 = r.to(tl.int64)[:, None]
    x = tl.load(src_ptr + r64 * stride_src + c[None, :],
                mask=(r[:, None] < rows) & (c[None, :] < cols), other=0.0)
    tl.store(dst_ptr + r64 * stride_dst + c[None, :], x,
             mask=(r[:, None] < dst_rows) & (c[None, :] < dst_cols))


# Its sizes are specialised on (divisibility by 16), which lets the copy vectorise: left
# unspecialised (do_not_specialize) the same ALIGN=1 config ran 0.0589 ms against 0.0441 ms on
# 1500x3001x999 fp16 (bench/results/tuning_time_33b_h100/). Only ``first2``, the program split
# (compared with the program id, never an address), is not: the compile pool builds the copy on
# compile_shape inputs, whose sizes divide like the problem's but whose block counts do not
# (bench/results/compile_keys_h100.md), and a specialised split made the GPU child compile the
# copy again for every unaligned problem.
@triton.jit(do_not_specialize=["first2"])
def _stage_kernel(src_ptr, dst_ptr, rows, cols, dst_rows, dst_cols, stride_src, stride_dst,
                  src2_ptr, dst2_ptr, rows2, cols2, dst_rows2, dst_cols2, stride_src2,
                  stride_dst2, first2, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                  TWO: tl.constexpr):
    """ALIGN's copies (``stage``) in one launch: programs ``0 .. first2 - 1`` copy the first
    pair's blocks, the rest (with ``TWO``) the second's. Rows of either side may be
    unaligned."""
    pid = tl.program_id(0)
    if TWO and pid >= first2:
        _copy_block(src2_ptr, dst2_ptr, pid - first2, rows2, cols2, dst_rows2, dst_cols2,
                    stride_src2, stride_dst2, BLOCK_R, BLOCK_C)
    else:
        _copy_block(src_ptr, dst_ptr, pid, rows, cols, dst_rows, dst_cols, stride_src,
                    stride_dst, BLOCK_R, BLOCK_C)


#: the split-K reduction's tile (fixed: a memory-bound pass over SPLIT_K x M x N fp32)
_REDUCE_BLOCK_M, _REDUCE_BLOCK_N = 16, 128

#: the staging copy's block (rows x columns) and warps
_STAGE_BLOCK_R, _STAGE_BLOCK_C, _STAGE_WARPS = 16, 128, 4


def _launches(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor,
              config: KernelConfig, sms: int | None = None,
              tma: bool | None = None, warp_spec: int = 0,
              ) -> list[tuple[Any, tuple[int, ...], tuple[Any, ...], dict[str, Any]]]:
    """The kernel launches computing ``out = a @ b`` with ``config``: (kernel, grid, args,
    constexprs and launch options) each, in order. ``sms`` (the persistent variants'
    programs; the device's SM count by default), ``tma`` (whether stream_k loads by
    descriptors; ``stream_k_tma`` by default) and ``warp_spec`` (tma_persistent's warp
    specialisation, see its kernel) are for tests and benchmarks."""
    (M, K), N = a.shape, b.shape[1]
    variant = variant_of(config)
    if sms is None:
        sms = num_sms(a.device)
    opts = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    tile = {k: config[k] for k in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M")}
    ab = (a.stride(0), a.stride(1), b.stride(0), b.stride(1))
    cs = (out.stride(0), out.stride(1))
    tiles = output_tiles(config, {"M": M, "N": N})
    if variant == TMA_PERSISTENT:
        if a.stride(1) != 1 or b.stride(1) != 1 or out.stride(1) != 1:
            raise ValueError("the tma_persistent variant needs row-major A, B and C")
        grid = (min(sms, tiles),)
        return [(_matmul_tma_persistent_kernel, grid,
                 (a, b, out, M, N, K, a.stride(0), b.stride(0), out.stride(0)),
                 {**tile, "NUM_SMS": sms, "WS": warp_spec,
                  "SPLIT_N": second_block(config["BLOCK_N"]), **opts})]
    meta = {**tile, "EVEN_K": even_k(K, config["BLOCK_K"]), **opts}
    if variant == PERSISTENT:
        grid = (min(sms, tiles),)
        return [(_matmul_persistent_kernel, grid, (a, b, out, M, N, K, *ab, *cs),
                 {**meta, "NUM_SMS": sms})]
    if variant == STREAM_K:
        ws, cnt = stream_k_buffers(a.device, sms, config["BLOCK_M"], config["BLOCK_N"])
        use_tma = stream_k_tma(a, b, out) if tma is None else tma
        return [(_matmul_stream_k_kernel, (sms,), (a, b, out, ws, cnt, M, N, K, *ab, *cs),
                 {**meta, "NUM_SMS": sms, "USE_TMA": use_tma})]
    if variant == SPLIT_K_VARIANT:
        split = int(config["SPLIT_K"])
        ws = torch.empty((split, M, N), device=a.device, dtype=torch.float32)
        reduce_grid = (triton.cdiv(M, _REDUCE_BLOCK_M), triton.cdiv(N, _REDUCE_BLOCK_N))
        return [(_matmul_split_k_kernel, (tiles, split), (a, b, ws, M, N, K, *ab),
                 {**meta, "SPLIT_K": split}),
                (_split_k_reduce_kernel, reduce_grid, (ws, out, M, N, *cs),
                 {"SPLIT_K": split, "BLOCK_M": _REDUCE_BLOCK_M, "BLOCK_N": _REDUCE_BLOCK_N,
                  "num_warps": 4, "num_stages": 1})]
    return [(_matmul_kernel, (tiles,), (a, b, out, M, N, K, *ab, *cs), meta)]


Launch = tuple[Any, tuple[int, ...], tuple[Any, ...], dict[str, Any]]


def _copy_launch(*pairs: tuple[torch.Tensor, torch.Tensor]) -> Launch:
    """One ``_stage_kernel`` launch copying each ``src`` (one or two pairs) into the top-left
    of its ``dst`` (2-D, rows contiguous on both sides) and zero-filling the rest of ``dst``."""
    args: list[Any] = []
    blocks = []
    for src, dst in pairs:
        if src.stride(1) != 1 or dst.stride(1) != 1:
            raise ValueError("ALIGN=1 stages row-major operands only")
        blocks.append(triton.cdiv(dst.shape[0], _STAGE_BLOCK_R)
                      * triton.cdiv(dst.shape[1], _STAGE_BLOCK_C))
        args += [src, dst, *src.shape, *dst.shape, src.stride(0), dst.stride(0)]
    if len(pairs) == 1:
        args += args  # the second pair's arguments, unused (TWO=False)
    return (_stage_kernel, (sum(blocks),), (*args, blocks[0]),
            {"BLOCK_R": _STAGE_BLOCK_R, "BLOCK_C": _STAGE_BLOCK_C, "TWO": len(pairs) == 2,
             "num_warps": _STAGE_WARPS})


def _stores_by_descriptor(config: KernelConfig, a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the variant stores C by a tensor descriptor once its operands are aligned:
    tma_persistent always, stream_k where ``stream_k_tma`` would hold."""
    variant = variant_of(config)
    return variant == TMA_PERSISTENT or (variant == STREAM_K and _descriptors_for(a, b))


def stage(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, config: KernelConfig,
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list[Launch], list[Launch]]:
    """ALIGN=1's operands: (a, b, out) as the GEMM kernels get them, the copies to run before
    them and the copy to run after. Where K is not a multiple of ALIGN_ELEMS, A becomes an
    M x K' buffer and B a K' x N' one (K' = K rounded up, zeros past K: they add nothing to
    the products), both copied by one launch; where only B's rows are unaligned, B alone is
    copied. Buffers' rows are
    multiples of ALIGN_ELEMS elements (16 B and more), so Triton vectorises every load and
    the descriptor variants run. C is written through an aligned buffer only for kernels
    that store it by descriptor. With ALIGN=0, or nothing unaligned, nothing changes."""
    if not align_of(config):
        return a, b, out, [], []
    (M, K), N = a.shape, b.shape[1]
    kp = round_up(K, ALIGN_ELEMS)
    copies: list[tuple[torch.Tensor, torch.Tensor]] = []
    post: list[Launch] = []
    if kp != K or not _aligned_rows(a):
        staged = torch.empty((M, kp), device=a.device, dtype=a.dtype)
        copies.append((a, staged))
        a = staged
    if kp != K or not _aligned_rows(b):
        staged = torch.empty((kp, round_up(N, ALIGN_ELEMS)), device=b.device, dtype=b.dtype)
        copies.append((b, staged))
        b = staged[:, :N]
    if not _aligned_rows(out) and _stores_by_descriptor(config, a, b):
        staged = torch.empty((M, round_up(N, ALIGN_ELEMS)), device=out.device,
                             dtype=out.dtype)[:, :N]
        post.append(_copy_launch((staged, out)))
        out = staged
    # A's and B's copies as one launch (host time counts on small problems)
    return a, b, out, [_copy_launch(*copies)] if copies else [], post


def _all_launches(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, config: KernelConfig,
                  sms: int | None = None, tma: bool | None = None,
                  warp_spec: int = 0) -> list[Launch]:
    """Every launch of ``out = a @ b`` with ``config``, in order: ALIGN's copies (``stage``)
    around the variant's kernels (``_launches``)."""
    a, b, gemm_out, pre, post = stage(a, b, out, config)
    return pre + _launches(a, b, gemm_out, config, sms, tma, warp_spec) + post


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, config: KernelConfig, *,
           sms: int | None = None, tma: bool | None = None,
           warp_spec: int = 0) -> None:
    """out = a @ b with the given config (its VARIANT picks the algorithm, its ALIGN whether
    unaligned operands are first copied into aligned rows; the split-K workspace and ALIGN's
    buffers are allocated here, so a timed launch includes them, the copies and the
    reduction; stream_k's buffers are cached across launches). ``sms`` and ``tma``: see
    ``_launches``."""
    launches = _all_launches(a, b, out, config, sms, tma, warp_spec)
    if any(kw.get("USE_TMA") for _, _, _, kw in launches) or (
            variant_of(config) == TMA_PERSISTENT):
        set_tma_allocator(a.device)
    for kernel, grid, args, kwargs in launches:
        kernel[grid](*args, **kwargs)


def compile_matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor,
                   config: KernelConfig, *, sms: int | None = None,
                   tma: bool | None = None) -> None:
    """Compile (or load from Triton's disk cache) every kernel of the config without
    launching."""
    for kernel, grid, args, kwargs in _all_launches(a, b, out, config, sms, tma):
        kernel.warmup(*args, grid=grid, **kwargs)


# The other variants' (VARIANT, SPLIT_K, then _PARAMS): the persistent tutorial's big tiles
# (128x256x64, 8 warps, 3 stages; 128x128x64 with 4 stages) for large 16-bit problems, and
# split-K for skinny and deep-K ones (few output tiles, many K steps); TMA persistent's split
# 128x192 tile (4 warps, 4 stages), the best measured on 3072^3 (bench/NOTES.md).
_KNOWN_GOOD_VARIANTS = [
    (TMA_PERSISTENT, 1, 128, 256, 64, 8, 8, 3), (TMA_PERSISTENT, 1, 128, 128, 64, 8, 4, 4),
    (TMA_PERSISTENT, 1, 128, 128, 64, 8, 8, 4), (TMA_PERSISTENT, 1, 128, 192, 64, 8, 4, 4),
    (PERSISTENT, 1, 128, 256, 64, 8, 8, 3), (PERSISTENT, 1, 128, 128, 64, 8, 4, 4),
    (SPLIT_K_VARIANT, 4, 16, 64, 128, 1, 4, 4), (SPLIT_K_VARIANT, 2, 16, 128, 64, 1, 4, 4),
    (SPLIT_K_VARIANT, 4, 64, 64, 64, 8, 4, 4), (SPLIT_K_VARIANT, 2, 64, 128, 64, 8, 4, 4),
    (STREAM_K, 1, 128, 256, 64, 8, 8, 3), (STREAM_K, 1, 128, 128, 64, 8, 4, 4),
    (STREAM_K, 1, 128, 128, 64, 8, 8, 4),
]


#: the SM count the known-good configs were chosen for (H100/H200 SXM)
_H200_SMS = 132


# ALIGN=1's (VARIANT, SPLIT_K, then _PARAMS), for problems whose operands it stages: the
# staged TMA tiles of bench/results/align_probe_h200.md, then the pointer-loaded tiled kernel
_KNOWN_GOOD_ALIGNED = [
    (TMA_PERSISTENT, 1, 128, 128, 64, 8, 4, 4), (TMA_PERSISTENT, 1, 128, 256, 64, 8, 8, 3),
    (TILED, 1, 128, 128, 32, 8, 4, 4), (TILED, 1, 64, 128, 64, 8, 4, 4),
]



class MatmulKernel:
    name = "matmul"
    ref = "search_spaces.matmul:KERNEL"
    description = ("C = A @ B, row-major, fp32 accumulate, masked edges, grouped tile order; "
                   "variants tiled, persistent, tma_persistent, split_k, stream_k")
    dims = (Dim("M", 1, 65536, "rows of A and C"), Dim("N", 1, 65536, "columns of B and C"),
            Dim("K", 1, 65536, "the reduction dimension"))
    dtypes = ("float16", "bfloat16", "float32")
    # Triton's CPU interpreter computes bf16 tl.dot wrongly (silently).
    interpreter_unsupported_dtypes = ("bfloat16",)
    #: its compile hook builds the GPU binary from host tensors (``tuner.host_compile``)
    compiles_on_host = True

    @property
    def version(self) -> str:
        return builtin_version(self, _matmul_kernel, _matmul_persistent_kernel,
                               _matmul_tma_persistent_kernel, _matmul_split_k_kernel,
                               _split_k_reduce_kernel, _matmul_stream_k_kernel, _stage_kernel)

    def space(self) -> SearchSpace:
        """The tiled space plus the algorithm: VARIANT (categorical, ``VARIANTS`` names its
        values), SPLIT_K (split_k's alone: a constraint keeps it 1 elsewhere) and BLOCK_N 192
        (tma_persistent's alone: ``split_tile_constraint``). A config
        recorded before variants existed (no VARIANT, no SPLIT_K) is the tiled kernel: each new
        parameter's first value (a replay table's configs are mapped to it). ALIGN (last, 0
        first) copies unaligned operands into aligned rows first (``stage``;
        ``align_constraint`` keeps it to problems where that copies something)."""
        tiled = tiled_space()
        params = tuple(Param.ints("BLOCK_N", BLOCK_NS) if p.name == "BLOCK_N" else p
                       for p in tiled.params)
        return SearchSpace(
            params=(Param("VARIANT", tuple(range(len(VARIANTS))), "categorical"),
                    Param.ints("SPLIT_K", SPLIT_KS), *params,
                    Param("ALIGN", ALIGNS, "categorical")),
            constraints=(_variant_params, _split_k, align_constraint, persistent_constraint,
                         stream_k_constraint, split_tile_constraint, *tiled.constraints),
        )

    def known_good_configs(self, shape: Mapping[str, int], dtype: str) -> list[KernelConfig]:
        """The tiled kernel's first (they run everywhere), then those of the other variants
        that suit the problem: the persistent ones where 128x128 tiles fill more than one wave
        of an H200's SMs, split-K where 64x64 tiles fill less than two (idle SMs, or a
        half-empty last wave) and K is deep, stream-K's where its tiles fill at least one wave
        with a partial last one, the split 128x192 tile where N is whole 192-wide tiles (a warm
        start spends a trial on each). Where ALIGN=1 would stage the operands, its tiles come
        before all of them."""
        tiled = [KernelConfig({**c, "VARIANT": TILED, "SPLIT_K": 1, "ALIGN": 0})
                 for c in tiled_known_good()]
        names = ("VARIANT", "SPLIT_K", *_PARAMS)
        others = [KernelConfig({**dict(zip(names, c, strict=True)), "ALIGN": 0})
                  for c in _KNOWN_GOOD_VARIANTS]
        m, n, k = shape.get("M", 1), shape.get("N", 1), shape.get("K", 1)
        big = triton.cdiv(m, 128) * triton.cdiv(n, 128) > _H200_SMS
        few = triton.cdiv(m, 64) * triton.cdiv(n, 64) < 2 * _H200_SMS and k >= 1024
        suits = {PERSISTENT: big, TMA_PERSISTENT: big, SPLIT_K_VARIANT: few}

        def tail(c: KernelConfig) -> bool:
            tiles = triton.cdiv(m, c["BLOCK_M"]) * triton.cdiv(n, c["BLOCK_N"])
            return tiles >= _H200_SMS and tiles % _H200_SMS > 0 and k > c["BLOCK_K"]

        def fits(c: KernelConfig) -> bool:  # a split tile (192 wide) where N is whole tiles
            return n % c["BLOCK_N"] == 0 if c["BLOCK_N"] & (c["BLOCK_N"] - 1) else True

        good = tiled + [c for c in others if fits(c) and (
            tail(c) if c["VARIANT"] == STREAM_K else suits[c["VARIANT"]])]
        if not staging_needed(shape, 4 if dtype == "float32" else 2):
            return good
        # unaligned operands: the staged tiles first (ALIGN=1; bench/NOTES.md measured them
        # 1.2-3.3x cuBLAS where every unstaged config loads 2-byte elements)
        staged = [KernelConfig({**dict(zip(names, c, strict=True)), "ALIGN": 1})
                  for c in _KNOWN_GOOD_ALIGNED
                  if c[0] != TMA_PERSISTENT or dtype in ("float16", "bfloat16")]
        return staged + good

    def default_config(self, shape: Mapping[str, int], dtype: str) -> KernelConfig:
        """The tiled kernel's: runs on every shape and dtype, on any GPU with >= 100 KB of
        smem."""
        return KernelConfig({**tiled_default(shape), "VARIANT": TILED, "SPLIT_K": 1,
                             "ALIGN": 0})

    def make_inputs(
        self, shape: Mapping[str, int], dtype: str, device: str, seed: int
    ) -> dict[str, Any]:
        M, N, K = shape["M"], shape["N"], shape["K"]
        gen = torch.Generator(device=device).manual_seed(seed)
        # Scaled so that every output element is ~N(0, 1) whatever K is.
        scale = K ** -0.25
        a = torch.randn((M, K), generator=gen, device=device, dtype=torch.float32) * scale
        b = torch.randn((K, N), generator=gen, device=device, dtype=torch.float32) * scale
        dt = torch_dtype(dtype)
        out = torch.empty((M, N), device=device, dtype=dt)
        return {"a": a.to(dt), "b": b.to(dt), "out": out}

    def same_kernel(self, config: KernelConfig, shape: Mapping[str, int],
                    dtype: str) -> KernelConfig:
        """The config that runs the same code as ``config`` on this problem: SPLIT_K is read
        by split_k alone (elsewhere it is 1), and ALIGN=1 copies nothing where the rows are
        aligned (there it is 0). Every other parameter changes the binary or its launch."""
        split = config.get("SPLIT_K", 1) if variant_of(config) == SPLIT_K_VARIANT else 1
        align = align_of(config) if staging_needed(shape, element_bytes(dtype)) else 0
        if (config.get("SPLIT_K", 1), align_of(config)) == (split, align):
            return config
        return KernelConfig({**config, "SPLIT_K": split, "ALIGN": align})

    def compile_shape(self, shape: Mapping[str, int], dtype: str) -> dict[str, int]:
        """Compile on a small problem: every dimension (and so every stride) keeps its residue
        mod 256 (its divisibility by 16, and by every BLOCK), and 1 stays 1."""
        return {d: shrunk_dim(shape[d]) for d in ("M", "N", "K")}

    def launch(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        matmul(inputs["a"], inputs["b"], inputs["out"], config)

    def compile(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        compile_matmul(inputs["a"], inputs["b"], inputs["out"], config)

    def reference(self, inputs: dict[str, Any]) -> torch.Tensor:
        return torch.matmul(inputs["a"].float(), inputs["b"].float())

    def tolerance(self, dtype: str) -> Tolerance:
        # atol is x the output's largest |value|. Products are exact and summed in fp32: the
        # error is the result's rounding, u = 2**-11 (fp16) or 2**-8 (bf16) of itself (rtol
        # 4u), plus summation order, far below u of the scale (atol 2u). fp32 inputs go through
        # TF32 tensor cores on the GPU (10-bit mantissa, u = 2**-11 of every product): their
        # errors scale with the output's scale, not the element (atol 8u).
        return {"float16": Tolerance(1e-3, 2e-3), "bfloat16": Tolerance(8e-3, 1.6e-2),
                "float32": Tolerance(4e-3, 2e-3)}[dtype]

    def flops(self, shape: Mapping[str, int]) -> float:
        return 2.0 * shape["M"] * shape["N"] * shape["K"]

    def bytes(self, shape: Mapping[str, int], dtype: str) -> float:
        elem = 4 if dtype == "float32" else 2
        return float(elem * (shape["M"] * shape["K"] + shape["K"] * shape["N"]
                             + shape["M"] * shape["N"]))

    def torch_baseline(self, inputs: dict[str, Any]) -> None:
        torch.matmul(inputs["a"], inputs["b"], out=inputs["out"])

    def baseline(self, inputs: dict[str, Any]) -> torch.Tensor:
        """The same product by torch.matmul (cuBLAS) in the inputs' dtype, into the same
        output; fp32 with TF32 allowed, as ``tl.dot`` computes it (like for like)."""
        a, b, out = inputs["a"], inputs["b"], inputs["out"]
        if a.dtype != torch.float32:
            return torch.matmul(a, b, out=out)
        allowed = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            return torch.matmul(a, b, out=out)
        finally:  # the reference (fp32, in this process) must stay exact
            torch.backends.cuda.matmul.allow_tf32 = allowed

    def prior(self, config: KernelConfig, ctx: ProblemContext) -> float | None:
        """The analytic cost model's log-time (search_spaces/gemm/prior.py): ranks configs
        before any is measured (median best/optimum 1.000 at 16 trials on 14 H200 tables)."""
        from search_spaces.gemm import prior as cost_model  # here: measuring children never rank

        return cost_model.estimate(config, ctx)


KERNEL = MatmulKernel()
