"""Attention forward pass, FlashAttention-2 style: ``out = softmax(q @ k^T / sqrt(D)) @ v``.

q, k, v and out are (B, H, S, D) contiguous tensors (self-attention: as many keys as queries).
Each program takes BLOCK_M query rows of one (batch, head) and walks the keys BLOCK_N at a
time with an online softmax: a running row max ``m`` and row sum ``l`` in fp32, the fp32
accumulator rescaled by ``exp(m_old - m_new)`` whenever the max grows, one division by ``l``
at the end. Scores never leave the chip, so memory traffic is q, k, v and out once (plus K/V
re-reads that L2 serves: consecutive programs are the query blocks of one head).

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
import sys
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
from tuner.kernel import Dim, OutputCheck, Tolerance, source_version
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
def _attend(acc, l_i, m_i, q, k_tile, v_tile, key_row, offs_m, offs_n, d_ok, lo, hi, S,
            qk_scale, HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, MASKED: tl.constexpr,
            CAUSAL: tl.constexpr, MASK_D: tl.constexpr, TMA: tl.constexpr):
    """Fold the keys [lo, hi) into the online softmax (``lo`` a multiple of BLOCK_N).
    ``k_tile``/``v_tile`` point at key 0's block, or (TMA) are descriptors of the (B * H * S,
    D) views whose row ``key_row`` is key 0; MASKED blocks mask keys past S (and, causal,
    keys after the query)."""
    for start_n in range(lo, hi, BLOCK_N):
        start_n = tl.multiple_of(start_n, BLOCK_N)
        cols = start_n + offs_n
        keys_ok = cols[:, None] < S
        if TMA:
            k = k_tile.load([key_row + start_n, 0])
        else:
            k = _load_tile(k_tile + start_n * HEAD_DIM, keys_ok, d_ok, MASKED, MASK_D)
        qk = tl.dot(q, tl.trans(k))
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
        l_i = l_i * alpha + tl.sum(p, 1)
        if TMA:
            v = v_tile.load([key_row + start_n, 0])
        else:
            v = _load_tile(v_tile + start_n * HEAD_DIM, keys_ok, d_ok, MASKED, MASK_D)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    return acc, l_i, m_i


@triton.jit
def _flash_attention_kernel(q_ptr, k_ptr, v_ptr, out_ptr, S, qk_scale,
                            HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
                            BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            CAUSAL: tl.constexpr, MASK_D: tl.constexpr,
                            TMA: tl.constexpr):
    # One grid axis (B * H may pass the 65,535 of the others), query blocks fastest: the
    # programs running together share one head's K and V in L2. Causal rows differ in length:
    # the longest go first, so the short ones fill the last wave.
    pid = tl.program_id(0)
    num_m = tl.cdiv(S, BLOCK_M)
    bh = pid // num_m
    start_m = pid % num_m
    if CAUSAL:
        start_m = num_m - 1 - start_m
    head = bh.to(tl.int64) * S * HEAD_DIM  # B * H * S * D may pass 2**31; one head may not

    offs_m = start_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_ok = offs_d[None, :] < HEAD_DIM
    rows_ok = offs_m[:, None] < S
    q_tile = q_ptr + head + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    q = _load_tile(q_tile, rows_ok, d_ok, True, MASK_D)
    if TMA:  # k_ptr, v_ptr are descriptors: the hardware copies the tiles
        k_tile = k_ptr
        v_tile = v_ptr
    else:
        k_tile = k_ptr + head + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
        v_tile = v_ptr + head + offs_n[:, None] * HEAD_DIM + offs_d[None, :]
    key_row = bh * S  # this head's key 0 in the (B * H * S, D) views (TMA)

    m_i = tl.full([BLOCK_M], NEG, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    if CAUSAL:
        # keys before the block's first row: every row sees them all, no mask
        diagonal = (start_m * BLOCK_M) // BLOCK_N * BLOCK_N
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_tile, v_tile, key_row, offs_m, offs_n,
                                d_ok, 0, diagonal, S, qk_scale, HEAD_DIM, BLOCK_N, False,
                                CAUSAL, MASK_D, TMA)
        end = tl.minimum((start_m + 1) * BLOCK_M, S)
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_tile, v_tile, key_row, offs_m, offs_n,
                                d_ok, diagonal, end, S, qk_scale, HEAD_DIM, BLOCK_N, True,
                                CAUSAL, MASK_D, TMA)
    else:
        full = S // BLOCK_N * BLOCK_N
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_tile, v_tile, key_row, offs_m, offs_n,
                                d_ok, 0, full, S, qk_scale, HEAD_DIM, BLOCK_N, False,
                                CAUSAL, MASK_D, TMA)
        acc, l_i, m_i = _attend(acc, l_i, m_i, q, k_tile, v_tile, key_row, offs_m, offs_n,
                                d_ok, full, S, S, qk_scale, HEAD_DIM, BLOCK_N, True,
                                CAUSAL, MASK_D, TMA)

    out = acc / l_i[:, None]
    out_tile = out_ptr + head + offs_m[:, None] * HEAD_DIM + offs_d[None, :]
    if MASK_D:
        tl.store(out_tile, out.to(out_ptr.dtype.element_ty), mask=rows_ok & d_ok)
    else:
        tl.store(out_tile, out.to(out_ptr.dtype.element_ty), mask=rows_ok)


def block_d(head_dim: int) -> int:
    """The tile's head-dim width: a power of two, at least the 16 ``tl.dot`` needs."""
    return max(16, next_pow2(head_dim))


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
    return grid, (q, keys, values, out, S, LOG2E / math.sqrt(D)), meta


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                    causal: bool, config: KernelConfig) -> None:
    """out = softmax(q @ k^T / sqrt(D) [causal mask]) @ v with the given launch config."""
    grid, args, meta = _launch(q, k, v, out, causal, config)
    _flash_attention_kernel[grid](*args, **meta, num_warps=config.num_warps,
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
    """Each warp owns 16 whole query rows or more: with fewer, warps split rows, and every
    block's row max and row sum go through shared memory between warps."""
    if config["BLOCK_M"] < 16 * config["num_warps"]:
        return (f"BLOCK_M={config['BLOCK_M']} gives {config['num_warps']} warps fewer than 16 "
                "rows each")
    return None


def _tma(config: KernelConfig, ctx: ProblemContext) -> str | None:
    """TMA copies whole (BLOCK_N, D) tiles of the (B * H * S, D) views: D must be the tile's
    width (a power of two >= 16, no padding columns), rows 16-byte aligned, and the row
    coordinates (32-bit) within reach."""
    if not config.get("TMA"):
        return None
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


#: (BLOCK_M, BLOCK_N, num_warps, num_stages) known to run well on sm90 (the tutorial's region:
#: BLOCK_M 128, 8 warps and 3-4 stages for D=128; 4 or 8 warps for D=64), most likely first
_KNOWN_GOOD = {
    "wide": [(128, 64, 8, 3), (128, 128, 8, 3), (128, 64, 8, 4), (128, 128, 8, 2),
             (128, 32, 8, 4), (128, 64, 4, 3), (64, 64, 4, 3), (64, 128, 4, 3)],
    "narrow": [(128, 64, 4, 3), (128, 128, 8, 3), (128, 64, 8, 4), (128, 128, 4, 3),
               (128, 64, 4, 4), (128, 128, 8, 4), (64, 64, 4, 3), (64, 128, 4, 3),
               (128, 32, 4, 4)],
}
_PARAMS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")
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
#: one key block's dependency chain in one program, s: the scores' MMA must finish before the
#: row max, the probabilities before the second MMA (~700 cycles that other programs on the
#: SM can fill, but not the program's own work)
STEP_CHAIN_S = 0.4e-6


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
        return source_version(sys.modules[__name__])

    def space(self) -> SearchSpace:
        return SearchSpace(
            params=(
                Param.pow2("BLOCK_M", 16, 256),
                Param.pow2("BLOCK_N", 16, 256),
                Param.pow2("num_warps", 1, 16),
                Param.ints("num_stages", (1, 2, 3, 4, 5)),
                Param("TMA", TMA_VALUES, "categorical"),
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
        return KernelConfig(BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages, TMA=0)

    def known_good_configs(self, shape: Mapping[str, int], dtype: str) -> list[KernelConfig]:
        """The default, then the tutorial's sm90 region for this head dim with pointer loads,
        then its first four with TMA loads (the tutorial's Hopper path), keeping those that
        pass the space's constraints on this problem (H200 limits)."""
        listed = _KNOWN_GOOD["wide" if shape.get("D", 64) > 64 else "narrow"]
        configs = [self.default_config(shape, dtype)]
        configs += [KernelConfig(dict(zip(_PARAMS, c, strict=True)), TMA=0) for c in listed]
        configs += [KernelConfig(dict(zip(_PARAMS, c, strict=True)), TMA=1)
                    for c in listed[:4] if 1 in TMA_VALUES]
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
        """Compile on a tiny problem: S is the kernel's only integer argument (Triton
        specialises it on divisibility by 16 and ==1), D is a constexpr and stays; B and H
        only size the grid. Each of B, H, S becomes the smallest size alike mod 16."""
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


def estimate_s(config: KernelConfig, ctx: ProblemContext, causal: bool) -> float:
    """Estimated run time in seconds, a ranking score in the manner of the GEMM cost model
    (``tuner/strategies/cost_model.py``, whose H200 constants it uses): one key block of one
    program costs its two dots on the tensor cores and its softmax (exponentials on the
    special function units, fp32 arithmetic; it overlaps the dots only across warp groups
    sharing an SM), pulling its K and V
    tiles through L2, and the memory latency the stages do not hide; programs run in waves of
    SMs x resident programs (shared memory, registers, threads); spills cost extra. A
    warp group's key blocks are a chain (MMA, softmax, MMA): small blocks pay its latency."""
    from tuner.strategies import cost_model as cm  # imported here: measuring children never rank

    B, H, S, D = (ctx.shape[n] for n in ("B", "H", "S", "D"))
    bm, bn = config["BLOCK_M"], config["BLOCK_N"]
    warps, stages = config["num_warps"], config["num_stages"]
    d, e, sms = block_d(D), ctx.elem_bytes, ctx.sm_count or cm.DEFAULT_SM_COUNT

    smem = max(1, shared_memory(config, D, e))
    live = bm * (d + bn) / (32 * warps)  # fp32 accumulator and scores per thread
    # + probabilities, addresses (TMA: the copy engine computes the K/V tiles' own)
    want = live + bm * bn * e / 4 / (32 * warps) + (16 if config.get("TMA") else 32)
    limit = thread_registers(warps)
    regs = min(float(limit), want)
    occ = max(1, min(cm.SMEM_PER_SM // smem, cm.REGISTERS_PER_SM // int(regs * 32 * warps),
                     cm.THREADS_PER_SM // (32 * warps), 32))
    programs = triton.cdiv(S, bm) * B * H
    slots = sms * occ
    per_sm = triton.cdiv(min(programs, slots), sms)

    eff = cm.WARP_EFFICIENCY.get(warps, 0.8)
    t_mma = 4.0 * bm * bn * d * per_sm / (cm.SM_FLOPS * eff)
    t_softmax = per_sm * (bm * bn / EXP_RATE
                          + (SCORE_OPS * bm * bn + RESCALE_OPS * bm * d) / ALU_RATE)
    # warp groups (4 warps: one MMA unit's worth) on the SM, of one program or several, take
    # turns: one's softmax runs under another's MMAs and fills its dependency chain
    groups = per_sm * max(1, warps // 4)
    overlap = 0.5 if groups > 1 else 0.0
    t_compute = max(t_mma, t_softmax) + (1.0 - overlap) * min(t_mma, t_softmax)
    t_chain = STEP_CHAIN_S + t_compute / groups  # one warp group's block, start to end
    t_l2 = 2.0 * bn * d * e * min(programs, slots) / cm.L2_BW
    t_lat = cm.LATENCY_S / max(1, stages - 1)
    t_step = (t_compute ** cm.P + t_chain ** cm.P + t_l2 ** cm.P
              + t_lat ** cm.P) ** (1.0 / cm.P)
    if stages == 1:  # no load in flight during the block's work: its latency adds up
        t_step += cm.LATENCY_S / groups
    if live >= limit:
        t_step *= 4.0
    elif want > limit:
        t_step *= 1.0 + 8.0 * (want / limit - 1.0)

    head_steps, longest = _key_steps(S, bm, bn, causal)
    fixed = cm.LATENCY_S + cm.TILE_OVERHEAD_S  # loading Q, storing the output
    waves = triton.cdiv(programs, slots)
    if causal:
        t_grid = max(head_steps * B * H / slots, longest) * t_step + waves * fixed
    else:
        t_grid = waves * (longest * t_step + fixed)
    t_dram = 4.0 * B * H * S * D * e / cm.DRAM_BW
    return float((t_grid ** cm.P + t_dram ** cm.P) ** (1.0 / cm.P))


KERNEL = FlashAttentionKernel(causal=False)
CAUSAL = FlashAttentionKernel(causal=True)
#: both variants, by their registered names
KERNELS = {k.name: k for k in (KERNEL, CAUSAL)}
