"""Attention forward pass, FlashAttention-2 style: ``out = softmax(q @ k^T / sqrt(D)) @ v``.

q, k, v and out are (B, H, S, D) contiguous tensors (self-attention: as many keys as queries).
Each program takes BLOCK_M query rows of one (batch, head) and walks the keys BLOCK_N at a
time with an online softmax: a running row max ``m`` and row sum ``l`` in fp32, the fp32
accumulator rescaled by ``exp(m_old - m_new)`` whenever the max grows, one division by ``l``
at the end. Scores never leave the chip, so memory traffic is q, k, v and out once (plus K/V
re-reads that L2 serves: programs running together are the query blocks of a few heads).
Causal rows differ in length: the grid runs the longest query blocks first over groups of
heads whose K and V fit in L2 together (``_query_block``), so the last programs to start are
the shortest and the SMs finish together.

As the Triton tutorial ``06-fused-attention`` does: ``log2(e)`` is folded into the softmax
scale so that every exponential is one ``exp2``; the probabilities go into the second dot in
the input dtype (fp16/bf16 tensor cores; fp32 inputs use TF32 for both dots); the K/V loads are
pipelined by the loop's ``num_stages``. The key loop is split so that masks cost only where
they are needed: blocks of keys that every query row of the program may see (all of them for
full-attention, those before the program's first row for causal) run without any mask, and
only the blocks that straddle the diagonal (causal) or the end of the sequence (an S that is
not a multiple of BLOCK_N) are masked. Keys past S get -inf; query rows past S are computed on
zeros and never stored. A program's first key block starts at or before its first query, so
every row sees a key there; the running max also starts finite, so a later fully masked block
of a row (causal, BLOCK_N < BLOCK_M) only adds zeros, never NaN.

The K/V tiles come by pointer loads (``TMA=0``: cp.async, pipelined) or, ``TMA=1``, by the
Hopper's tensor memory accelerator from host-side descriptors of the (B * H * S, D) views (the
tutorial's Hopper path: no address arithmetic in the loop, fewer registers). A descriptor's
last key block of a head may run into the next head's rows (zeros past the tensor's end):
those keys are past S, masked to -inf, and their V rows weighted by exactly 0.

``SUBTILE=1`` holds the query block as two halves of BLOCK_M / 2 rows (``_attend_halves``):
both halves' score MMAs are issued before either half's softmax, so that on Hopper, whose MMAs
run asynchronously, one half's exponentials overlap the other half's MMAs (measured 4-5%
faster on the causal D128 target with 4 warps; ties at D64). Causal, the key blocks past the
first half's last row are the second half's alone.

Any head dim up to 256: the tile's D is BLOCK_D = max(16, next_pow2(D)) (``tl.dot`` needs 16),
masked only when it is wider than D (a constexpr decision: power-of-two D loads unmasked).

Causal is a property of the problem, not a tuning knob: ``flash_attention`` and
``flash_attention_causal`` are two registered kernels sharing this module (as
``matmul_epilogue`` registers one kernel per epilogue), so a causal config is never served for
full attention or the reverse. Same three layers as ``matmul``: ``_flash_attention_kernel`` ->
``flash_attention`` (the launcher) -> ``FlashAttentionKernel`` (the TunableKernel).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

try:  # host-side TMA descriptors (Triton 3.4 and later)
    from triton.tools.tensor_descriptor import TensorDescriptor
except ImportError:  # pragma: no cover - older Triton: the space offers TMA=0 only
    TensorDescriptor = None

from tuner.config import KernelConfig
from tuner.dtypes import next_pow2, torch_dtype
from tuner.kernel import Dim, OutputCheck, Tolerance, builtin_version
from tuner.space import DEFAULT_SMEM_LIMIT, Param, ProblemContext, SearchSpace

#: the running max's start: below any real score, yet finite, so that a row whose first block
#: is fully masked gets exp2(-inf - NEG) = 0 and a rescale of exp2(NEG - NEG) = 1, never NaN
NEG = tl.constexpr(-1.0e30)
LOG2E = 1.4426950408889634


@triton.jit
def _load_tile(ptrs, rows_ok, d_ok, MASK_ROWS: tl.constexpr, MASK_D: tl.constexpr):
    """A (rows, BLOCK_D) tile; masks only where the constexprs say the tile can overhang."""
    if MASK_ROWS:
        if MASK_D:
            tile = tl.load(ptrs, mask=rows_ok & d_ok, other=0.0)
        else:
            tile = tl.load(ptrs, mask=rows_ok, other=0.0)
    else:
        if MASK_D:
            tile = tl.load(ptrs, mask=d_ok, other=0.0)
        else:
            tile = tl.load(ptrs)
    return tile


@triton.jit
def _online_softmax(qk, m_i, l_i, cols, offs_m, S, qk_scale, MASKED: tl.constexpr,
                    CAUSAL: tl.constexpr):
    """One key block's scores ``qk`` folded into the rows' running max ``m_i`` and sum
    ``l_i``: (p, the factor the accumulator is rescaled by, the new sum, the new max). MASKED
    blocks mask keys past S (and, causal, keys after the query)."""
    if MASKED:
        keep = cols[None, :] < S
        if CAUSAL:
            keep = keep & (offs_m[:, None] >= cols[None, :])
        qk = tl.where(keep, qk * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(qk, 1))
        qk = qk - m_new[:, None]
    else:
        m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
        qk = qk * qk_scale - m_new[:, None]
    p = tl.math.exp2(qk)
    alpha = tl.math.exp2(m_i - m_new)
    return p, alpha, l_i * alpha + tl.sum(p, 1), m_new


@triton.jit
def _load_kv(tile, key_row, start_n, keys_ok, d_ok, HEAD_DIM: tl.constexpr,
             MASKED: tl.constexpr, MASK_D: tl.constexpr, TMA: tl.constexpr):
    """The key block at ``start_n`` of K or V: by descriptor (TMA) or by pointers (one
    return: Triton 3.6 compiles the statements after a constexpr branch's return too)."""
    if TMA:
        block = tile.load([key_row + start_n, 0])
    else:
        block = _load_tile(tile + start_n * HEAD_DIM, keys_ok, d_ok, MASKED, MASK_D)
    return block


@triton.jit
def _attend(acc, l_i, m_i, q, k_tile, v_tile, key_row, offs_m, offs_n, d_ok, lo, hi, S,
            qk_scale, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
            CAUSAL: tl.constexpr, MASK_D: tl.constexpr, TMA: tl.constexpr,
            WS: tl.constexpr = 0):
    """Fold the keys [lo, hi) into the online softmax (``lo`` a multiple of BLOCK_N).
    ``k_tile``/``v_tile`` point at key 0's block, or (TMA) are descriptors of the (B * H * S,
    D) views whose row ``key_row`` is key 0; MASKED blocks mask keys past S (and, causal,
    keys after the query)."""
    for start_n in tl.range(lo, hi, BLOCK_N, warp_specialize=WS != 0):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        keys_ok = cols[:, None] < S
        k = _load_kv(k_tile, key_row, start_n, keys_ok, d_ok, HEAD_DIM, MASKED, MASK_D, TMA)
        qk = tl.dot(q, tl.trans(k))
        p, alpha, l_i, m_new = _online_softmax(qk, m_i, l_i, cols, offs_m, S, qk_scale,
                                               MASKED, CAUSAL)
        v = _load_kv(v_tile, key_row, start_n, keys_ok, d_ok, HEAD_DIM, MASKED, MASK_D, TMA)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _attend_halves(acc0, l0, m0, acc1, l1, m1, q0, q1, k_tile, v_tile, key_row, offs_m0,
                   offs_m1, offs_n, d_ok, lo, hi, S, qk_scale, HEAD_DIM: tl.constexpr,
                   BLOCK_N: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                   MASK_D: tl.constexpr, TMA: tl.constexpr):
    """``_attend`` for a query block held as two halves (SUBTILE): both halves' scores are
    asked of the tensor cores before either half's softmax, so that one half's exponentials
    can run while the other's MMAs do."""
    for start_n in tl.range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        keys_ok = cols[:, None] < S
        k = tl.trans(_load_kv(k_tile, key_row, start_n, keys_ok, d_ok, HEAD_DIM, MASKED,
                              MASK_D, TMA))
        qk0 = tl.dot(q0, k)
        qk1 = tl.dot(q1, k)
        p0, alpha0, l0, n0 = _online_softmax(qk0, m0, l0, cols, offs_m0, S, qk_scale, MASKED,
                                             CAUSAL)
        v = _load_kv(v_tile, key_row, start_n, keys_ok, d_ok, HEAD_DIM, MASKED, MASK_D, TMA)
        acc0 = tl.dot(p0.to(v.dtype), v, acc0 * alpha0[:, None])
        p1, alpha1, l1, n1 = _online_softmax(qk1, m1, l1, cols, offs_m1, S, qk_scale, MASKED,
                                             CAUSAL)
        acc1 = tl.dot(p1.to(v.dtype), v, acc1 * alpha1[:, None])
        m0 = n0
        m1 = n1
    return acc0, l0, m0, acc1, l1, m1


@triton.jit
def _store_rows(out_ptr, head, offs_m, offs_d, d_ok, acc, l_i, S, HEAD_DIM: tl.constexpr,
                MASK_D: tl.constexpr):
    """Rows ``offs_m`` of the output: the accumulator over its sum, rows past S not stored."""
    rows_ok = offs_m[:, None] < S
    out = (acc / l_i[:, None]).to(out_ptr.dtype.element_ty)
    out_tile = out_ptr + head + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    if MASK_D:
        tl.store(out_tile, out, mask=rows_ok & d_ok)
    else:
        tl.store(out_tile, out, mask=rows_ok)


@triton.jit
def _query_block(pid, num_m, heads, group, CAUSAL: tl.constexpr):
    """The (batch * head, query block) of program ``pid``. Full attention: query blocks
    fastest, so the programs running together share one head's K and V in L2. Causal: the
    heads in groups of ``group`` (as many as L2 holds the K and V of), and within a group
    the query blocks from the last (the longest rows) to the first, every head of the group
    at each: the grid's work comes longest first over all of it, so the last programs to
    start are the shortest and the tail is short."""
    if CAUSAL:
        first = pid // (group * num_m) * group  # the group's first head
        size = tl.minimum(group, heads - first)  # the last group may be smaller
        r = pid - first * num_m
        bh = first + r % size
        start_m = num_m - 1 - r // size
    else:
        bh = pid // num_m
        start_m = pid % num_m
    return bh, start_m


@triton.jit(do_not_specialize=["group"])
def _flash_attention_kernel(q_ptr, k_ptr, v_ptr, out_ptr, S, qk_scale, group,
                            HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            CAUSAL: tl.constexpr, MASK_D: tl.constexpr,
                            TMA: tl.constexpr, WS: tl.constexpr = 0,
                            SUBTILE: tl.constexpr = 0):
    # WS (benchmarks only, bench.flash_variants): 1 asks Triton to warp-specialise the key
    # loops (K/V loads, the two MMAs and the softmax in separate warp groups); 0 (the product)
    # does not. SUBTILE: 1 holds the query block as two halves whose MMAs and softmaxes
    # interleave (``_attend_halves``); a config without it (stored before it existed) is 0.
    # One grid axis: B * H may pass the 65,535 of the others
    num_m = tl.cdiv(S, BLOCK_M)
    bh, start_m = _query_block(tl.program_id(0), num_m, tl.num_programs(0) // num_m, group,
                               CAUSAL)
    head = bh.to(tl.int64) * S * HEAD_DIM  # B * H * S * D may pass 2**31; one head may not

    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d[None, :] < HEAD_DIM
    if TMA:  # k_ptr, v_ptr are descriptors: the hardware copies the tiles
        k_tile = k_ptr
        v_tile = v_ptr
    else:
        k_tile = k_ptr + head + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
        v_tile = v_ptr + head + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    key_row = bh * S  # this head's key 0 in the (B * H * S, D) views (TMA)
    if CAUSAL:
        # keys before the block's first row: every row sees them all, no mask
        lo = (start_m * BLOCK_M) // BLOCK_N * BLOCK_N
        hi = tl.minimum((start_m + 1) * BLOCK_M, S)
    else:  # whole key blocks unmasked, then the last partial one
        lo = S // BLOCK_N * BLOCK_N
        hi = S

    if SUBTILE:
        offs_m0 = start_m * BLOCK_M + tl.arange(0, BLOCK_M // 2)
        offs_m1 = offs_m0 + BLOCK_M // 2
        q0 = _load_tile(q_ptr + head + offs_m0[:, None] * HEAD_DIM + offs_d[None, :],
                        offs_m0[:, None] < S, d_ok, True, MASK_D)
        q1 = _load_tile(q_ptr + head + offs_m1[:, None] * HEAD_DIM + offs_d[None, :],
                        offs_m1[:, None] < S, d_ok, True, MASK_D)
        m0 = tl.full([BLOCK_M // 2], NEG, tl.float32)
        l0 = tl.zeros([BLOCK_M // 2], tl.float32)
        acc0 = tl.zeros([BLOCK_M // 2, BLOCK_D], tl.float32)
        m1 = tl.full([BLOCK_M // 2], NEG, tl.float32)
        l1 = tl.zeros([BLOCK_M // 2], tl.float32)
        acc1 = tl.zeros([BLOCK_M // 2, BLOCK_D], tl.float32)
        acc0, l0, m0, acc1, l1, m1 = _attend_halves(
            acc0, l0, m0, acc1, l1, m1, q0, q1, k_tile, v_tile, key_row, offs_m0, offs_m1,
            offs_n, d_ok, 0, lo, S, qk_scale, HEAD_DIM, BLOCK_N, False, CAUSAL, MASK_D, TMA)
        # causal: the first half's rows see no key past its last row, so the key blocks after
        # it are the second half's alone
        mid = tl.minimum(tl.cdiv(start_m * BLOCK_M + BLOCK_M // 2, BLOCK_N) * BLOCK_N, hi)
        if not CAUSAL:
            mid = hi
        acc0, l0, m0, acc1, l1, m1 = _attend_halves(
            acc0, l0, m0, acc1, l1, m1, q0, q1, k_tile, v_tile, key_row, offs_m0, offs_m1,
            offs_n, d_ok, lo, mid, S, qk_scale, HEAD_DIM, BLOCK_N, True, CAUSAL, MASK_D, TMA)
        acc1, l1, m1 = _attend(acc1, l1, m1, q1, k_tile, v_tile, key_row, offs_m1, offs_n,
                               d_ok, mid, hi, S, qk_scale, HEAD_DIM, BLOCK_N, True, CAUSAL,
                               MASK_D, TMA)
        _store_rows(out_ptr, head, offs_m0, offs_d, d_ok, acc0, l0, S, HEAD_DIM, MASK_D)
        _store_rows(out_ptr, head, offs_m1, offs_d, d_ok, acc1, l1, S, HEAD_DIM, MASK_D)
    else:
        offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
        q = _load_tile(q_ptr + head + offs_m[:, None] * HEAD_DIM + offs_d[None, :],
                       offs_m[:, None] < S, d_ok, True, MASK_D)
        m_i = tl.full([BLOCK_M], NEG, tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_tile, v_tile, key_row, offs_m, offs_n,
                                d_ok, 0, lo, S, qk_scale, HEAD_DIM, BLOCK_N, False,
                                CAUSAL, MASK_D, TMA, WS)
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_tile, v_tile, key_row, offs_m, offs_n,
                                d_ok, lo, hi, S, qk_scale, HEAD_DIM, BLOCK_N, True,
                                CAUSAL, MASK_D, TMA, WS)
        _store_rows(out_ptr, head, offs_m, offs_d, d_ok, acc, l_i, S, HEAD_DIM, MASK_D)


def block_d(head_dim: int) -> int:
    """The tile's head-dim width: a power of two, at least the 16 ``tl.dot`` needs."""
    return max(16, next_pow2(head_dim))


#: bytes of K and V that the heads of one causal group may take in L2 (the H100/H200 have 50
#: MB, in two halves): 8 heads of S=4096, D=128 in 16-bit
L2_GROUP_BYTES = 16 << 20


def head_group(heads: int, S: int, D: int, elem_bytes: int) -> int:
    """Heads whose causal programs are interleaved (:func:`_query_block`): as many as
    ``L2_GROUP_BYTES`` holds the K and V of, at least 1, at most all."""
    return max(1, min(heads, L2_GROUP_BYTES // (2 * S * D * elem_bytes)))


def _launch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, causal: bool,
            config: KernelConfig) -> tuple[tuple[int], tuple[Any, ...], dict[str, int]]:
    for name, t in (("q", q), ("k", k), ("v", v), ("out", out)):
        if t.shape != q.shape or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous tensor of q's shape (B, H, S, D), "
                             f"got {tuple(t.shape)}")
    B, H, S, D = q.shape
    meta = dict(config.meta)
    meta.update(HEAD_DIM=D, BLOCK_D=block_d(D), CAUSAL=int(causal), MASK_D=int(block_d(D) != D))
    meta.setdefault("TMA", 0)
    keys: Any = k
    values: Any = v
    if meta["TMA"]:
        if TensorDescriptor is None:
            raise ValueError("TMA=1 needs triton.tools.tensor_descriptor (Triton 3.4 or later)")
        block = [meta["BLOCK_N"], D]
        keys = TensorDescriptor.from_tensor(k.view(B * H * S, D), block)
        values = TensorDescriptor.from_tensor(v.view(B * H * S, D), block)
    grid = (triton.cdiv(S, meta["BLOCK_M"]) * B * H,)
    group = head_group(B * H, S, D, q.element_size())
    return grid, (q, keys, values, out, S, LOG2E / math.sqrt(D), group), meta


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                    causal: bool, config: KernelConfig, warp_spec: int = 0) -> None:
    """out = softmax(q @ k^T / sqrt(D) [causal mask]) @ v with the given launch config
    (``warp_spec``: the kernel's WS, for benchmarks)."""
    grid, args, meta = _launch(q, k, v, out, causal, config)
    _flash_attention_kernel[grid](*args, **meta, WS=warp_spec, num_warps=config.num_warps,
                                  num_stages=config.num_stages)


def compile_flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            out: torch.Tensor, causal: bool, config: KernelConfig) -> None:
    """Compile (or load from Triton's disk cache) without launching."""
    grid, args, meta = _launch(q, k, v, out, causal, config)
    _flash_attention_kernel.warmup(*args, **meta, num_warps=config.num_warps,
                                   num_stages=config.num_stages, grid=grid)


# -- the space's constraints ---------------------------------------------------------------------

def shared_memory(config: KernelConfig, head_dim: int, elem_bytes: int) -> int:
    """Bytes of shared memory a config's tiles take: the Q tile once, and one K and one V tile
    per pipeline stage (the probabilities stay in registers: Hopper's MMA reads its A operand
    from there)."""
    d = block_d(head_dim)
    return elem_bytes * d * (config["BLOCK_M"] + 2 * config["num_stages"] * config["BLOCK_N"])


def _shared_memory(config: KernelConfig, ctx: ProblemContext) -> str | None:
    need = shared_memory(config, ctx.shape["D"], ctx.elem_bytes)
    if need > ctx.smem_limit:
        return f"needs {need} B of shared memory; the device allows {ctx.smem_limit} B"
    return None


#: 32-bit registers of an SM, shared by the threads of the programs it runs
REGISTERS_PER_SM = 65536


def thread_registers(warps: int) -> int:
    """The most registers a thread of a ``warps``-warp program can have: 255, or fewer when
    the program's threads would not fit the register file (16 warps: 128)."""
    return min(255, REGISTERS_PER_SM // (32 * warps))


def _registers(config: KernelConfig, ctx: ProblemContext) -> str | None:
    """The fp32 accumulator (BLOCK_M x BLOCK_D) and scores (BLOCK_M x BLOCK_N) live in
    registers together: as many as a thread can have, or more, spill."""
    bm, warps = config["BLOCK_M"], config["num_warps"]
    regs = bm * (block_d(ctx.shape["D"]) + config["BLOCK_N"]) // (32 * warps)
    limit = thread_registers(warps)
    if regs >= limit:
        return (f"the accumulator and scores need {regs} registers per thread (a thread of "
                f"{warps} warps has {limit})")
    return None


def _rows_per_warp(config: KernelConfig, ctx: ProblemContext) -> str | None:
    """Each warp owns 16 whole query rows or more (of each half, with SUBTILE): with fewer,
    warps split rows, and every block's row max and row sum go through shared memory between
    warps."""
    bm, warps, halves = config["BLOCK_M"], config["num_warps"], config.get("SUBTILE", 0)
    if (bm // 2 if halves else bm) < 16 * warps:
        what = f"half of BLOCK_M={bm} (SUBTILE=1)" if halves else f"BLOCK_M={bm}"
        return f"{what} gives {warps} warps fewer than 16 rows each"
    return None


def _tma(config: KernelConfig, ctx: ProblemContext) -> str | None:
    """TMA copies whole (BLOCK_N, D) tiles of the (B * H * S, D) views: an sm90 device or
    newer, D the tile's width (a power of two >= 16, no padding columns), rows 16-byte
    aligned, and the row coordinates (32-bit) within reach."""
    if not config.get("TMA"):
        return None
    if ctx.capability < 90:
        return f"TMA needs compute capability 9.0 or newer (the device has {ctx.capability})"
    D = ctx.shape["D"]
    if block_d(D) != D or D * ctx.elem_bytes % 16:
        return f"TMA needs a power-of-two head dim of at least 16 (D={D})"
    rows = ctx.shape["B"] * ctx.shape["H"] * ctx.shape["S"]
    if rows >= 2**31:
        return f"TMA row coordinates are 32-bit: B * H * S = {rows}"
    return None


def _redundant_block(config: KernelConfig, ctx: ProblemContext) -> str | None:
    # a block longer than the (power-of-two padded) sequence only computes masked rows or keys
    cap = max(16, next_pow2(ctx.shape["S"]))
    for block in ("BLOCK_M", "BLOCK_N"):
        if config[block] > cap:
            return f"{block}={config[block]} is longer than S={ctx.shape['S']} needs ({cap})"
    return None


#: (BLOCK_M, BLOCK_N, num_warps, num_stages, TMA, SUBTILE) known to run well on sm90, most
#: likely first.
#: Wide heads (D > 64), measured on the H200 (bf16 B4 H32 S4096 D128 causal): 128x64 with 4
#: warps, 2 stages and TMA (1.246 ms: 96 KiB and <= 255 registers a thread let two programs
#: share an SM and take turns), 128x128 with 8 warps and 3 stages (1.28-1.30 ms, TMA or not),
#: 256x64 with 8 warps and TMA (1.35 ms); 128x64 with 8 warps and 2 stages ran 1.63 ms. Narrow
#: heads (fp16 B16 H16 S1024 D64): 128x64 with 8 or 4 warps, 3-4 stages (0.194-0.198 ms).
#: The first wide one as two halves (SUBTILE) took 1.165 ms against 1.218 whole in one run
#: (bench/NOTES.md); narrow heads tie.
_KNOWN_GOOD = {
    "wide": [(128, 64, 4, 2, 1, 1), (128, 64, 4, 2, 1, 0), (128, 128, 8, 3, 1, 0),
             (128, 128, 8, 3, 0, 0), (256, 64, 8, 3, 1, 0), (128, 64, 8, 3, 0, 0),
             (128, 64, 4, 2, 0, 1), (128, 128, 8, 2, 1, 0), (64, 64, 4, 3, 1, 0),
             (64, 64, 4, 3, 0, 0), (128, 64, 8, 4, 0, 0)],
    "narrow": [(128, 64, 8, 3, 0, 0), (128, 64, 4, 3, 0, 0), (128, 64, 4, 3, 0, 1),
               (128, 64, 8, 4, 0, 0), (128, 64, 8, 3, 1, 0), (64, 64, 4, 3, 0, 0),
               (128, 64, 4, 4, 0, 0), (128, 64, 4, 2, 1, 0), (64, 64, 4, 3, 1, 0),
               (128, 128, 8, 3, 0, 0), (128, 32, 4, 4, 0, 0)],
}
_PARAMS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages", "TMA", "SUBTILE")
#: K/V tiles by pointer loads (0) or by the Hopper's tensor memory accelerator (1), where
#: this Triton has host-side descriptors
TMA_VALUES = (0, 1) if TensorDescriptor is not None else (0,)

#: scores the reference materialises at once (fp32: 512 MiB)
REFERENCE_CHUNK = 1 << 27

#: exp2 per SM per second: the 16 special-function lanes of an SM at ~1.8 GHz
EXP_RATE = 2.9e10
#: fp32 operations per SM per second: 128 lanes at ~1.8 GHz
ALU_RATE = 2.3e11
#: fp32 operations per score besides its exp2 (scale, max, subtract, sum, convert), and per
#: accumulator element per key block (the rescale)
SCORE_OPS, RESCALE_OPS = 5, 1

# The prior's constants below were fitted (least squares on log time, then rounded) to the 37
# configs the H200 measured on the two target problems (bench/results/targets_14_h200.json,
# targets_flash_causal_h200.json, the demo database): rank correlation 0.81 (causal, 17 configs)
# and 0.79 (full, 20 configs), where the previous model's was -0.33 and 0.77.

#: registers a thread holds besides the tiles (row max and sum, indices, loop state)
THREAD_REGS = 24
#: registers per 16-byte vector of a K or V tile a thread loads by pointers (TMA=0): its 64-bit
#: address, and the next key block's (the copy engine computes TMA's)
POINTER_REGS = 4
#: the part of a program's softmax that its second warp group does not run under the first's
#: MMAs (the two wait on the same K/V barriers, so they mostly work in step)
INTRA_SOFTMAX = 0.35
#: the same between programs sharing an SM (independent: they take turns, FlashAttention-3's
#: ping-pong between warp groups, but the measured tables show little of it)
INTER_SOFTMAX = 1.0
#: one key block's dependency chain in one program besides its work, s: MMA latency, the row
#: max and sum's reductions, the K/V barrier waits (~2,000 cycles)
STEP_CHAIN_S = 1.0e-6
#: a K/V tile's load latency that the num_stages - 1 tiles in flight must cover (TMA: 0.7 x)
LOAD_LATENCY_S = 0.6e-6
#: run time added per fraction of registers past a thread's limit (spills to local memory)
SPILL_COST = 1.8
#: per program besides its key blocks: Q's load, the pipeline's fill, the output's store, s
PROGRAM_S = 6.0e-6
#: the sum of the parts above is a serial model; the H200 ran the targets this much faster
CALIBRATION = 0.65


def _alike_mod16(d: int) -> int:
    """The smallest size that specialises like ``d`` (same residue mod 16; 1 only for 1)."""
    r = d % 16
    if d == 1:
        return 1
    return 16 if r == 0 else 17 if r == 1 else r


class FlashAttentionKernel:
    """softmax(q @ k^T / sqrt(D)) @ v over (B, H, S, D) tensors, causal or not."""

    dims = (Dim("B", 1, 4096, "batch"), Dim("H", 1, 1024, "heads"),
            Dim("S", 1, 131072, "sequence length (queries = keys)"),
            Dim("D", 1, 256, "head dim (any; tiles pad it to a power of two >= 16)"))
    dtypes = ("float16", "bfloat16", "float32")
    # Triton's CPU interpreter computes bf16 tl.dot wrongly (silently).
    interpreter_unsupported_dtypes = ("bfloat16",)
    #: its compile hook builds the GPU binary from host tensors (``tuner.host_compile``)
    compiles_on_host = True
    #: each query row is a weighted mean of value rows: compared per row, at the row's scale
    output_check = OutputCheck(rowwise=True)

    def __init__(self, causal: bool) -> None:
        self.causal = causal
        self.name = "flash_attention_causal" if causal else "flash_attention"
        self.ref = f"search_spaces.flash_attention:{'CAUSAL' if causal else 'KERNEL'}"
        mask = "causal (query i sees keys <= i)" if causal else "full (no mask)"
        self.description = (f"attention forward softmax(q k^T / sqrt(D)) v, {mask}, "
                            "(B, H, S, D) tensors, online softmax over key blocks, fp32 math")

    @property
    def version(self) -> str:
        return builtin_version(self, _flash_attention_kernel)

    def space(self) -> SearchSpace:
        return SearchSpace(
            params=(
                Param.pow2("BLOCK_M", 16, 256),
                Param.pow2("BLOCK_N", 16, 256),
                Param.pow2("num_warps", 1, 16),
                Param.ints("num_stages", (1, 2, 3, 4, 5)),
                Param("TMA", TMA_VALUES, "categorical"),
                Param("SUBTILE", (0, 1), "categorical"),
            ),
            constraints=(_shared_memory, _registers, _rows_per_warp, _redundant_block, _tma),
        )

    def default_config(self, shape: Mapping[str, int], dtype: str) -> KernelConfig:
        """The tutorial's sm90 choice (BLOCK_M 128, BLOCK_N 64, 3 stages; 8 warps from
        D=128 up, else 4), fitted to the problem: blocks no longer than S needs, fewer
        stages and then narrower key blocks until it fits in shared memory."""
        d = block_d(shape.get("D", 64))
        cap = max(16, next_pow2(shape.get("S", 1024)))
        bm = min(128, cap)
        bn = min(64 if d <= 128 else 32, cap)
        warps = max(1, min(8 if d >= 128 else 4, bm // 16))
        stages = 3
        elem = 4 if dtype == "float32" else 2
        while stages > 1 and elem * d * (bm + 2 * stages * bn) > DEFAULT_SMEM_LIMIT:
            stages -= 1
        while bn > 16 and elem * d * (bm + 2 * stages * bn) > DEFAULT_SMEM_LIMIT:
            bn //= 2
        return KernelConfig(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages, TMA=0,
                            SUBTILE=0)

    def known_good_configs(self, shape: Mapping[str, int], dtype: str) -> list[KernelConfig]:
        """The default, then the configs measured best on sm90 for this head dim
        (``_KNOWN_GOOD``; TMA ones where this Triton has descriptors), keeping those that pass
        the space's constraints on this problem (H200 limits)."""
        listed = _KNOWN_GOOD["wide" if shape.get("D", 64) > 64 else "narrow"]
        configs = [self.default_config(shape, dtype)]
        configs += [KernelConfig(dict(zip(_PARAMS, c, strict=True))) for c in listed
                    if c[4] in TMA_VALUES]
        space = self.space()
        ctx = ProblemContext({"B": 1, "H": 1, "S": 1024, "D": 64, **shape}, dtype)
        return [c for c in dict.fromkeys(configs) if space.violation(c, ctx) is None]

    def make_inputs(
        self, shape: Mapping[str, int], dtype: str, device: str, seed: int
    ) -> dict[str, Any]:
        gen = torch.Generator(device=device).manual_seed(seed)
        size = (shape["B"], shape["H"], shape["S"], shape["D"])
        dt = torch_dtype(dtype)
        # q, k ~ N(0, 1): scores q.k / sqrt(D) ~ N(0, 1), softmax rows neither flat nor one-hot
        q, k, v = (torch.randn(size, generator=gen, device=device, dtype=torch.float32).to(dt)
                   for _ in range(3))
        return {"q": q, "k": k, "v": v, "out": torch.empty(size, device=device, dtype=dt)}

    def compile_shape(self, shape: Mapping[str, int], dtype: str) -> dict[str, int]:
        """Compile on a tiny problem: S is the kernel's only specialised integer argument
        (Triton specialises it on divisibility by 16 and ==1; the causal head group is not
        specialised), D is a constexpr and stays; B and H only size the grid. Each of B, H,
        S becomes the smallest size alike mod 16."""
        return {"B": _alike_mod16(shape["B"]), "H": _alike_mod16(shape["H"]),
                "S": _alike_mod16(shape["S"]), "D": shape["D"]}

    def launch(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        flash_attention(inputs["q"], inputs["k"], inputs["v"], inputs["out"], self.causal,
                        config)

    def compile(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        compile_flash_attention(inputs["q"], inputs["k"], inputs["v"], inputs["out"],
                                self.causal, config)

    def reference(self, inputs: dict[str, Any]) -> torch.Tensor:
        """softmax(q k^T / sqrt(D)) v in fp32, written out (not SDPA): scores materialised a
        chunk of (heads, query rows) at a time, at most ``REFERENCE_CHUNK`` of them."""
        q, k, v = (inputs[n].float() for n in ("q", "k", "v"))
        B, H, S, D = q.shape
        q, k, v = (t.reshape(B * H, S, D) for t in (q, k, v))
        out = torch.empty_like(q)
        rows = min(S, max(1, REFERENCE_CHUNK // S))
        heads = max(1, REFERENCE_CHUNK // (rows * S))
        keys = torch.arange(S, device=q.device)
        for h in range(0, B * H, heads):
            for r in range(0, S, rows):
                scores = q[h:h + heads, r:r + rows] @ k[h:h + heads].transpose(1, 2)
                scores *= D ** -0.5
                if self.causal:
                    later = keys[None, :] > keys[r:r + rows, None]
                    scores.masked_fill_(later, float("-inf"))
                out[h:h + heads, r:r + rows] = torch.softmax(scores, dim=-1) @ v[h:h + heads]
        return out.reshape(B, H, S, D)

    def tolerance(self, dtype: str) -> Tolerance:
        # atol is x the row's largest |value|. fp16/bf16: the scores are exact products summed
        # in fp32; the probabilities are rounded to the dtype for the second dot (u of each
        # weight, u = 2**-11 fp16, 2**-8 bf16: an error of ~u of the row's typical value,
        # random in sign), and the output once more: atol 4u, rtol 8u. fp32 goes through TF32
        # in both dots on the GPU (u = 2**-11 of every operand, scores off by ~u * sqrt(D) /
        # sqrt(D)): errors follow the row's scale, atol 8u, as matmul's fp32.
        return {"float16": Tolerance(2e-3, 4e-3), "bfloat16": Tolerance(1.6e-2, 3.2e-2),
                "float32": Tolerance(4e-3, 2e-3)}[dtype]

    def flops(self, shape: Mapping[str, int]) -> float:
        # two dots of 2 * S * S * D per head; causal computes half of the score matrix
        full = 4.0 * shape["B"] * shape["H"] * shape["S"] * shape["S"] * shape["D"]
        return full / 2 if self.causal else full

    def bytes(self, shape: Mapping[str, int], dtype: str) -> float:
        elem = 4 if dtype == "float32" else 2
        return float(4 * elem * shape["B"] * shape["H"] * shape["S"] * shape["D"])  # q,k,v,out

    def baseline(self, inputs: dict[str, Any]) -> torch.Tensor:
        """torch's fused attention on the same inputs, in their dtype (on the GPU: the flash
        backend for fp16/bf16, memory-efficient attention for fp32)."""
        return torch.nn.functional.scaled_dot_product_attention(
            inputs["q"], inputs["k"], inputs["v"], is_causal=self.causal)

    def prior(self, config: KernelConfig, ctx: ProblemContext) -> float | None:
        """log of :func:`estimate_s`: ranks configs before any is measured."""
        return math.log(max(estimate_s(config, ctx, self.causal), 1e-12))


def _key_steps(S: int, bm: int, bn: int, causal: bool) -> tuple[float, int]:
    """Key blocks walked by all of one head's programs together, and by the longest one."""
    num_m, longest = triton.cdiv(S, bm), triton.cdiv(S, bn)
    if not causal:
        return float(num_m * longest), longest
    # program i walks cdiv(min((i + 1) * bm, S), bn) blocks: about (i + 1) * bm / bn, plus
    # half a block on average where the diagonal does not end on a block boundary
    total = bm / bn * num_m * (num_m + 1) / 2 + (0.5 * num_m if bm % bn else 0.0)
    return min(total, float(num_m * longest)), longest


def thread_registers_needed(config: KernelConfig, head_dim: int, elem_bytes: int) -> float:
    """Registers a thread of ``config`` wants: its share of the fp32 accumulator and scores,
    of the probabilities in the input dtype, ``THREAD_REGS``, and (pointer loads) the K and V
    tiles' addresses."""
    bm, bn, threads = config["BLOCK_M"], config["BLOCK_N"], 32 * config["num_warps"]
    d = block_d(head_dim)
    regs = (bm * (d + bn) + bm * bn * elem_bytes / 4) / threads + THREAD_REGS
    if not config.get("TMA"):
        regs += POINTER_REGS * 2 * bn * d * elem_bytes / 16 / threads
    return regs


def programs_per_sm(config: KernelConfig, head_dim: int, elem_bytes: int) -> int:
    """Programs an SM runs at once: shared memory, registers (allocated 8 a thread at a
    time, at most a thread's limit) and threads allow."""
    from search_spaces.gemm import prior as cm

    threads = 32 * config["num_warps"]
    regs = min(thread_registers_needed(config, head_dim, elem_bytes),
               thread_registers(config["num_warps"]))
    regs = 8 * math.ceil(regs / 8)
    smem = max(1, shared_memory(config, head_dim, elem_bytes))
    return max(1, min(cm.SMEM_PER_SM // smem, cm.REGISTERS_PER_SM // (regs * threads),
                      cm.THREADS_PER_SM // threads))


def estimate_s(config: KernelConfig, ctx: ProblemContext, causal: bool) -> float:
    """Estimated run time in seconds, a ranking score with the GEMM cost model's H200
    constants (``search_spaces/gemm/prior.py``). A program's key block is a chain: its two
    MMAs on the tensor cores, its softmax (exponentials on the special function units, fp32
    arithmetic: the second warp group of a program hides part of it), a fixed latency, and
    the K/V load latency that the stages in flight do not cover. The programs an SM runs at
    once (shared memory, registers, threads: :func:`programs_per_sm`) take turns on the tensor
    cores and the special function units, so one round of theirs costs the longest of the
    chain, their summed work and their L2 traffic; registers past a thread's limit spill.
    Causal programs come longest first over the grid (:func:`_query_block`), so the SMs share
    the key blocks evenly, bounded below by the longest program; full attention runs in
    waves."""
    from search_spaces.gemm import prior as cm  # here: measuring children never rank

    B, H, S, D = (ctx.shape[n] for n in ("B", "H", "S", "D"))
    bm, bn = config["BLOCK_M"], config["BLOCK_N"]
    warps, stages = config["num_warps"], config["num_stages"]
    d, e, sms = block_d(D), ctx.elem_bytes, ctx.sm_count or cm.DEFAULT_SM_COUNT
    occ = programs_per_sm(config, D, e)

    # one key block of one program, on the whole SM's units (fewer than 4 warps reach only
    # part of them)
    share = min(1.0, warps / 4)
    t_mma = 4.0 * bm * bn * d / (cm.SM_FLOPS * share)
    t_softmax = (bm * bn * (1.0 / EXP_RATE + SCORE_OPS / ALU_RATE)
                 + RESCALE_OPS * bm * d / ALU_RATE) / share
    work = t_mma + t_softmax * (INTRA_SOFTMAX if warps >= 8 else 1.0)
    latency = LOAD_LATENCY_S * (0.7 if config.get("TMA") else 1.0)
    exposed = max(0.0, latency - (stages - 1) * work) if stages > 1 else 2.0 * latency
    chain = work + STEP_CHAIN_S + exposed
    l2 = occ * 2.0 * bn * d * e / (cm.L2_BW / sms)
    turns = occ * (t_mma + INTER_SOFTMAX * t_softmax)
    t_round = (chain ** cm.P + turns ** cm.P + l2 ** cm.P) ** (1.0 / cm.P)
    want, limit = thread_registers_needed(config, D, e), thread_registers(warps)
    if want > limit:
        t_round *= 1.0 + SPILL_COST * (want / limit - 1.0)

    head_steps, longest = _key_steps(S, bm, bn, causal)
    programs = triton.cdiv(S, bm) * B * H
    if causal:
        t_grid = (max(head_steps * B * H * t_round / (occ * sms), longest * chain)
                  + programs * PROGRAM_S / (occ * sms))
    else:
        waves = triton.cdiv(programs, sms * occ)
        t_grid = waves * (longest * t_round + PROGRAM_S)
    t_dram = 4.0 * B * H * S * D * e / cm.DRAM_BW
    return CALIBRATION * float((t_grid ** cm.P + t_dram ** cm.P) ** (1.0 / cm.P))


KERNEL = FlashAttentionKernel(causal=False)
CAUSAL = FlashAttentionKernel(causal=True)
#: both variants, by their registered names
KERNELS = {k.name: k for k in (KERNEL, CAUSAL)}
