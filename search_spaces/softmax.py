"""Row-wise softmax of an M x N matrix (``out[i] = softmax(x[i])``), fp32 math, any N.

A row that fits one column block (``BLOCK_N >= N``) is read once: max, exp, sum and store from
registers. A longer row is read twice: an online pass keeps a running max and sum per lane
across column blocks, the lanes are combined, and a second pass writes ``exp(x - max) / sum``
(the row is still in L2 when it is read again). Each program takes ``ROWS`` consecutive rows.

Split rows (``SPLIT > 1``): a long row on few programs leaves SMs idle (16 rows of 131,072: 16
programs on 132 SMs). Then ``SPLIT`` programs share a row, each a chunk of it: a first kernel
writes each chunk's max and sum (of ``exp(x - chunk max)``) to a small fp32 workspace, a second
combines the row's partials in a fixed order (deterministic) and writes its chunk (read again,
from L2 when the matrix fits there).

Rows whose length is not a multiple of 16 bytes (50,257 columns) start at unaligned addresses:
a block that starts at the row's first element cannot be loaded 16 bytes at a time. Every
span of a row is therefore cut where the addresses are aligned: a body of whole 16-byte groups,
loaded and stored in blocks of ``BLOCK_N`` whose masks keep the groups whole (so the compiler
vectorises them), and its two ends (fewer than 16 bytes each) as one small masked tensor.
Same three layers as ``matmul``: the ``@triton.jit`` kernels -> ``softmax`` (the launcher) ->
``SoftmaxKernel`` (the TunableKernel).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from search_spaces.vector_add import streaming_seconds
from tuner.config import KernelConfig
from tuner.dtypes import next_pow2, torch_dtype
from tuner.kernel import Dim, OutputCheck, Tolerance, shrunk_dim, source_version
from tuner.space import Param, ProblemContext, SearchSpace

#: stands in for -inf in the online pass: exp(NEG - m) is 0 for any real max m, and
#: NEG - NEG is 0, not the NaN that -inf - -inf would give on lanes past the row's end
NEG = tl.constexpr(-1.0e30)
#: a split row's chunks are a multiple of this many columns (whole 16-byte groups of an
#: aligned row)
CHUNK_ALIGN = 16
#: a split row's chunk is at least this long: a shorter one costs more in the second launch
#: and the combine than its extra parallelism saves
MIN_SPLIT_CHUNK = 1024


@triton.jit
def _span(lo, hi, VEC: tl.constexpr):
    """Cut the elements [lo, hi) (offsets from an aligned base) where VEC-element groups
    start: the body [lo_al, hi_al) of whole groups, and the ends' offsets and mask (a
    2 x VEC-lane tensor: the head [lo, lo_al) and the tail [hi_al, hi), each < VEC long)."""
    lo_al = tl.multiple_of((lo + VEC - 1) // VEC * VEC, VEC)
    hi_al = tl.multiple_of(tl.maximum(lo_al, hi // VEC * VEC), VEC)
    k = tl.arange(0, 2 * VEC)
    head = k < VEC
    ends = tl.where(head, lo + k, hi_al + k - VEC)
    ends_mask = tl.where(head, ends < tl.minimum(lo_al, hi), ends < hi)
    return lo_al, hi_al, ends, ends_mask


@triton.jit
def _span_stats(x_ptr, lo_al, hi_al, ends, ends_mask, BLOCK_N: tl.constexpr):
    """The max and the sum of exp(x - max) over a span (body in blocks, online; then its
    ends). An empty span gives (NEG, a finite sum) that any real max weighs by 0."""
    cols = tl.arange(0, BLOCK_N)
    m = tl.full([BLOCK_N], NEG, tl.float32)
    s = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, hi_al - lo_al, BLOCK_N):
        offs = lo_al + start + cols
        mask = offs < hi_al
        x = tl.load(x_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_last")
        x = tl.where(mask, x.to(tl.float32), NEG)
        m_new = tl.maximum(m, x)
        s = s * tl.exp(m - m_new) + tl.exp(x - m_new)
        m = m_new
    e = tl.load(x_ptr + ends, mask=ends_mask, other=0.0).to(tl.float32)
    e = tl.where(ends_mask, e, NEG)
    span_max = tl.maximum(tl.max(m, 0), tl.max(e, 0))
    total = tl.sum(s * tl.exp(m - span_max), 0) + tl.sum(
        tl.where(ends_mask, tl.exp(e - span_max), 0.0), 0)
    return span_max, total


@triton.jit
def _span_write(x_ptr, out_ptr, lo_al, hi_al, ends, ends_mask, row_max, total,
                BLOCK_N: tl.constexpr):
    """out = exp(x - row_max) / total over a span, x read again: last block first (the
    blocks ``_span_stats`` read last are the likeliest still in L2, which its loads asked to
    keep them in), out stored streaming (evict first) so that it does not push x out."""
    cols = tl.arange(0, BLOCK_N)
    blocks = tl.cdiv(hi_al - lo_al, BLOCK_N)
    for i in range(0, blocks):
        offs = lo_al + (blocks - 1 - i) * BLOCK_N + cols
        mask = offs < hi_al
        x = tl.load(x_ptr + offs, mask=mask, other=0.0, eviction_policy="evict_first")
        y = tl.exp(x.to(tl.float32) - row_max) / total
        tl.store(out_ptr + offs, y.to(out_ptr.dtype.element_ty), mask=mask,
                 cache_modifier=".cs")
    e = tl.load(x_ptr + ends, mask=ends_mask, other=0.0).to(tl.float32)
    y = tl.exp(e - row_max) / total
    tl.store(out_ptr + ends, y.to(out_ptr.dtype.element_ty), mask=ends_mask)


@triton.jit
def _span_one_pass(x_ptr, out_ptr, lo_al, hi_al, ends, ends_mask, BLOCK_N: tl.constexpr):
    """softmax of a whole row whose body fits one block: read once, written from registers."""
    offs = lo_al + tl.arange(0, BLOCK_N)
    mask = offs < hi_al
    x = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    x = tl.where(mask, x, NEG)
    e = tl.load(x_ptr + ends, mask=ends_mask, other=0.0).to(tl.float32)
    e = tl.where(ends_mask, e, NEG)
    row_max = tl.maximum(tl.max(x, 0), tl.max(e, 0))
    num = tl.where(mask, tl.exp(x - row_max), 0.0)
    num_e = tl.where(ends_mask, tl.exp(e - row_max), 0.0)
    total = tl.sum(num, 0) + tl.sum(num_e, 0)
    tl.store(out_ptr + offs, (num / total).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(out_ptr + ends, (num_e / total).to(out_ptr.dtype.element_ty), mask=ends_mask)


@triton.jit
def _softmax_kernel(x_ptr, out_ptr, M, N, stride, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
                    ONE_PASS: tl.constexpr, VEC: tl.constexpr):
    """One program per ROWS whole rows (SPLIT = 1)."""
    pid = tl.program_id(0)
    for r in range(ROWS):
        row = pid * ROWS + r
        if row < M:
            lo = row.to(tl.int64) * stride
            lo_al, hi_al, ends, ends_mask = _span(lo, lo + N, VEC)
            if ONE_PASS:
                _span_one_pass(x_ptr, out_ptr, lo_al, hi_al, ends, ends_mask, BLOCK_N)
            else:
                row_max, total = _span_stats(x_ptr, lo_al, hi_al, ends, ends_mask, BLOCK_N)
                _span_write(x_ptr, out_ptr, lo_al, hi_al, ends, ends_mask, row_max, total,
                            BLOCK_N)


@triton.jit
def _chunk(N, stride, CHUNK, SPLIT: tl.constexpr, VEC: tl.constexpr):
    """This program's row, and its chunk of the row cut as ``_span`` cuts."""
    pid = tl.program_id(0)
    row = pid // SPLIT
    c0 = (pid % SPLIT) * CHUNK
    lo = row.to(tl.int64) * stride + tl.minimum(c0, N)
    hi = row.to(tl.int64) * stride + tl.minimum(c0 + CHUNK, N)
    lo_al, hi_al, ends, ends_mask = _span(lo, hi, VEC)
    return row, lo_al, hi_al, ends, ends_mask


@triton.jit
def _softmax_partials_kernel(x_ptr, part_max_ptr, part_sum_ptr, N, stride, CHUNK,
                             BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
                             VEC: tl.constexpr):
    """Split rows, first kernel: each chunk's max and sum of exp(x - max)."""
    row, lo_al, hi_al, ends, ends_mask = _chunk(N, stride, CHUNK, SPLIT, VEC)
    chunk_max, total = _span_stats(x_ptr, lo_al, hi_al, ends, ends_mask, BLOCK_N)
    pid = tl.program_id(0)
    tl.store(part_max_ptr + pid, chunk_max)
    tl.store(part_sum_ptr + pid, total)


@triton.jit
def _softmax_split_write_kernel(x_ptr, out_ptr, part_max_ptr, part_sum_ptr, N, stride, CHUNK,
                                BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
                                VEC: tl.constexpr):
    """Split rows, second kernel: combine the row's partials (every chunk's program combines
    them alike, in one order), then write this chunk."""
    row, lo_al, hi_al, ends, ends_mask = _chunk(N, stride, CHUNK, SPLIT, VEC)
    parts = row * SPLIT + tl.arange(0, SPLIT)
    maxes = tl.load(part_max_ptr + parts)
    row_max = tl.max(maxes, 0)
    total = tl.sum(tl.load(part_sum_ptr + parts) * tl.exp(maxes - row_max), 0)
    _span_write(x_ptr, out_ptr, lo_al, hi_al, ends, ends_mask, row_max, total, BLOCK_N)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def split_chunk(n: int, split: int) -> int:
    """The columns of each of a row's ``split`` chunks (the last may be shorter): a
    ``split``-th of the row rounded up to whole ``CHUNK_ALIGN``s."""
    return _cdiv(_cdiv(n, split), CHUNK_ALIGN) * CHUNK_ALIGN if split > 1 else n


def _check(x: torch.Tensor, out: torch.Tensor) -> None:
    if x.dim() != 2 or x.shape != out.shape:
        raise ValueError("softmax needs a 2-D x and an output of its shape")
    if x.stride(1) != 1 or out.stride(1) != 1 or x.stride(0) != out.stride(0):
        raise ValueError("softmax needs unit column strides and one row stride for x and out")


def _vec(x: torch.Tensor) -> int:
    return max(1, 16 // x.element_size())


def _run(x: torch.Tensor, out: torch.Tensor, config: KernelConfig, warmup: bool) -> None:
    _check(x, out)
    M, N = x.shape
    opts: dict[str, Any] = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    block, split, vec = config["BLOCK_N"], _split_of(config), _vec(x)
    if split == 1:
        grid = (triton.cdiv(M, config["ROWS"]),)
        args = (x, out, M, N, x.stride(0))
        meta = {"BLOCK_N": block, "ROWS": config["ROWS"], "ONE_PASS": int(block >= N),
                "VEC": vec}
        if warmup:
            _softmax_kernel.warmup(*args, **meta, **opts, grid=grid)
        else:
            _softmax_kernel[grid](*args, **meta, **opts)
        return
    chunk = split_chunk(N, split)
    part_max = torch.empty(M * split, device=x.device, dtype=torch.float32)
    part_sum = torch.empty_like(part_max)
    meta = {"BLOCK_N": block, "SPLIT": split, "VEC": vec}
    first = (x, part_max, part_sum, N, x.stride(0), chunk)
    second = (x, out, part_max, part_sum, N, x.stride(0), chunk)
    if warmup:
        _softmax_partials_kernel.warmup(*first, **meta, **opts, grid=(M * split,))
        _softmax_split_write_kernel.warmup(*second, **meta, **opts, grid=(M * split,))
    else:
        _softmax_partials_kernel[(M * split,)](*first, **meta, **opts)
        _softmax_split_write_kernel[(M * split,)](*second, **meta, **opts)


def softmax(x: torch.Tensor, out: torch.Tensor, config: KernelConfig) -> None:
    """out = softmax(x, dim=-1) with the given launch config (rows contiguous, x and out of
    one row stride). A config without SPLIT runs one program per ROWS rows."""
    _run(x, out, config, warmup=False)


def compile_softmax(x: torch.Tensor, out: torch.Tensor, config: KernelConfig) -> None:
    """Compile (or load from Triton's disk cache) without launching."""
    _run(x, out, config, warmup=True)


def _split_of(config: KernelConfig) -> int:
    """The config's SPLIT; 1 for a config from before the parameter (tables, stored bests)."""
    return config.get("SPLIT", 1)


def _redundant_block(config: KernelConfig, ctx: ProblemContext) -> str | None:
    """No column block wider than a program's span needs (its row, or its chunk of a split
    row), no more rows per program than there are, and pipelining stages only where there
    is a loop (two passes or several rows): else configs differ in nothing they run."""
    split = _split_of(config)
    span = split_chunk(ctx.shape["N"], split)
    cap = max(64, next_pow2(span))
    if config["BLOCK_N"] > cap:
        what = f"a chunk of {span}" if split > 1 else f"N={ctx.shape['N']}"
        return f"BLOCK_N={config['BLOCK_N']} is wider than {what} needs ({cap})"
    if config["ROWS"] > 1 and config["ROWS"] > ctx.shape["M"]:
        return f"ROWS={config['ROWS']} is more than M={ctx.shape['M']}"
    looped = config["BLOCK_N"] < span or config["ROWS"] > 1
    if not looped and config["num_stages"] != 1:
        return "num_stages only pipelines a loop (two passes or several rows)"
    return None


def _split(config: KernelConfig, ctx: ProblemContext) -> str | None:
    """Split rows only where every chunk has at least ``MIN_SPLIT_CHUNK`` columns (each
    split gets at least a block's worth) and one row per program (ROWS is for short rows)."""
    split, n = _split_of(config), ctx.shape["N"]
    if split == 1:
        return None
    if config["ROWS"] != 1:
        return "a split row takes one row per program (ROWS=1)"
    if _cdiv(n, split) < MIN_SPLIT_CHUNK:
        return (f"SPLIT={split} leaves chunks of {_cdiv(n, split)} columns (under "
                f"{MIN_SPLIT_CHUNK})")
    return None


def _registers(config: KernelConfig, ctx: ProblemContext) -> str | None:
    """A thread holds BLOCK_N / (32 * num_warps) fp32 values of each live block array (the
    running max and sum, then x): more than 64 each spills."""
    per_thread = config["BLOCK_N"] // (32 * config["num_warps"])
    if per_thread > 64:
        return f"each thread would hold {per_thread} values per block array (over 64)"
    return None


#: the part of a re-read that still costs HBM bandwidth when the data is in L2
L2_REREAD = 0.3
#: L2 an H200 keeps for one kernel's re-reads (of its 50 MB, two partitions)
L2_BYTES = 30e6


def estimated_seconds(config: KernelConfig, ctx: ProblemContext) -> float:
    """``streaming_seconds`` of the variant the config runs: one pass moves x and out once;
    two passes read each row again (from L2 while the resident programs' rows fit there);
    split rows add a launch, and the second kernel reads x again (from L2 when it fits)."""
    m, n, elem = ctx.shape["M"], ctx.shape["N"], ctx.elem_bytes
    split, block, warps = _split_of(config), config["BLOCK_N"], config["num_warps"]
    span = split_chunk(n, split)
    one_pass = block >= span
    per_thread = max(1, block // (32 * warps))
    registers = int(24 + per_thread * (2 if one_pass else 3.5))
    resident = max(1, min(64 // warps, 65536 // (32 * warps * registers)))
    matrix = m * n * elem
    if split == 1:
        programs = _cdiv(m, config["ROWS"])
        in_l2 = ctx.sm_count * resident * n * elem < L2_BYTES
        reread = 0.0 if one_pass else (L2_REREAD if in_l2 else 1.0)
        launches = 1
    else:
        programs = m * split
        reread = L2_REREAD if matrix < L2_BYTES else 1.0
        launches = 2
    in_flight = min(block, span) * elem * (config["ROWS"] ** 0.5 if one_pass else 1.0)
    return streaming_seconds(ctx, (2 + reread) * matrix, programs, warps, in_flight,
                             launches=launches, registers=registers)


class SoftmaxKernel:
    name = "softmax"
    ref = "search_spaces.softmax:KERNEL"
    description = ("row-wise softmax of an M x N matrix, fp32 math, online two-pass for long "
                   "rows, split rows (several programs a row) for few long rows")
    dims = (Dim("M", 1, 1 << 20, "rows"), Dim("N", 1, 1 << 18, "columns (the softmax axis)"))
    dtypes = ("float16", "bfloat16", "float32")
    interpreter_unsupported_dtypes: tuple[str, ...] = ()
    #: each row is a distribution: compared per row, and sums to 1
    output_check = OutputCheck(rowwise=True, row_sum=1.0)

    @property
    def version(self) -> str:
        return source_version(sys.modules[__name__])

    def space(self) -> SearchSpace:
        return SearchSpace(
            params=(
                Param.pow2("BLOCK_N", 64, 16384),
                Param.ints("ROWS", (1, 2, 4)),
                Param.pow2("SPLIT", 1, 64),
                Param.pow2("num_warps", 1, 16),
                Param.ints("num_stages", (1, 2, 3)),
            ),
            constraints=(_redundant_block, _split, _registers),
        )

    def default_config(self, shape: Mapping[str, int], dtype: str) -> KernelConfig:
        """One row per program, the row in one block up to 4,096 columns (the Triton
        tutorial's warps for that width); two stages for the two-pass loop."""
        n = shape.get("N", 1024)
        block = min(4096, max(64, next_pow2(n)))
        warps = 4 if block <= 1024 else 8
        return KernelConfig(BLOCK_N=block, ROWS=1, SPLIT=1, num_warps=warps,
                            num_stages=1 if block >= n else 2)

    def known_good_configs(self, shape: Mapping[str, int], dtype: str) -> list[KernelConfig]:
        """Whole rows in blocks of 1,024 to 16,384 columns; for long rows on few programs
        (under two per SM), split rows with one-block chunks; several short rows a
        program. Only configs the space allows."""
        m, n = shape.get("M", 1), shape.get("N", 1024)
        width = max(64, next_pow2(n))
        configs = [self.default_config(shape, dtype)]
        for block in sorted({min(width, b) for b in (16384, 8192, 2048, 1024)}, reverse=True):
            for warps in (4, 8, 16):
                for stages in (1, 2):
                    configs.append(KernelConfig(BLOCK_N=block, ROWS=1, SPLIT=1,
                                                num_warps=warps, num_stages=stages))
        if m < 2 * 132:
            for split in (4, 8, 16, 32, 64):
                block = min(16384, max(64, next_pow2(split_chunk(n, split))))
                for warps in (4, 8, 16):
                    configs.append(KernelConfig(BLOCK_N=block, ROWS=1, SPLIT=split,
                                                num_warps=warps, num_stages=1))
        if width <= 1024:  # short rows: several per program
            configs += [KernelConfig(BLOCK_N=width, ROWS=rows, SPLIT=1, num_warps=w,
                                     num_stages=2)
                        for rows in (2, 4) for w in (1, 2, 4)]
        ctx, space = ProblemContext(shape, dtype), self.space()
        return [c for c in dict.fromkeys(configs)
                if space.contains(c) and space.violation(c, ctx) is None]

    def make_inputs(
        self, shape: Mapping[str, int], dtype: str, device: str, seed: int
    ) -> dict[str, Any]:
        gen = torch.Generator(device=device).manual_seed(seed)
        x = torch.randn((shape["M"], shape["N"]), generator=gen, device=device,
                        dtype=torch.float32) * 3.0
        dt = torch_dtype(dtype)
        return {"x": x.to(dt),
                "out": torch.empty((shape["M"], shape["N"]), device=device, dtype=dt)}

    def compile_shape(self, shape: Mapping[str, int], dtype: str) -> dict[str, int]:
        """Compile on a few rows of full length: the row length sets the ONE_PASS constexpr,
        the stride and the split chunk; the number of rows only keeps its divisibility by 16
        (and ==1)."""
        return {"M": shrunk_dim(shape["M"], 16), "N": shape["N"]}

    def launch(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        softmax(inputs["x"], inputs["out"], config)

    def compile(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        compile_softmax(inputs["x"], inputs["out"], config)

    def reference(self, inputs: dict[str, Any]) -> torch.Tensor:
        return torch.softmax(inputs["x"].float(), dim=-1)

    def tolerance(self, dtype: str) -> Tolerance:
        # Every step is relative (exp, sum, divide in fp32): the error of an element is its
        # rounding to the dtype, at most u = 2**-11 (fp16) or 2**-8 (bf16) of itself; rtol is
        # 4u. atol (x the row's max) only covers exps that differ in their last bits far below
        # it; an absolute atol would pass a long row's ~1e-6 elements whatever they are.
        # fp32: GPU exp and divide are approximate (a few ulps, more for large |x - max|).
        return {"float16": Tolerance(1e-5, 2e-3), "bfloat16": Tolerance(1e-5, 1.6e-2),
                "float32": Tolerance(1e-6, 1e-4)}[dtype]

    def flops(self, shape: Mapping[str, int]) -> float:
        return 5.0 * shape["M"] * shape["N"]  # max, subtract, exp, sum, divide per element

    def bytes(self, shape: Mapping[str, int], dtype: str) -> float:
        elem = 4 if dtype == "float32" else 2
        return float(2 * elem * shape["M"] * shape["N"])  # read x once, write out once

    def torch_baseline(self, inputs: dict[str, Any]) -> None:
        torch.softmax(inputs["x"], dim=-1)

    def baseline(self, inputs: dict[str, Any]) -> torch.Tensor:
        """The same rows by torch.softmax in the input's dtype."""
        return torch.softmax(inputs["x"], dim=-1)

    def prior(self, config: KernelConfig, ctx: ProblemContext) -> float | None:
        """The log of ``estimated_seconds``: a streaming model of the variant the config runs
        (one pass, two passes, split rows), for ranking only."""
        return math.log(estimated_seconds(config, ctx))


KERNEL = SoftmaxKernel()
