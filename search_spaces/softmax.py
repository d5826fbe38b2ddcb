"""Row-wise softmax of an M x N matrix (``out[i] = softmax(x[i])``), fp32 math, any N.

A row that fits one column block (``BLOCK_N >= N``) is read once: max, exp, sum and store from
registers (up to 65,536 columns on 32 warps). A longer row is read twice: an online first pass
keeps one running max (a block's max, then one rescale of the per-lane sums) and the sums of
exp(x - max), and a second pass writes ``exp(x - max) / sum``, last block first (those are the
likeliest still in L2). Each program takes ``ROWS`` consecutive rows; on a persistent grid
(``PROGRAMS_PER_SM`` > 0: that many programs an SM stride over the rows) the rows in flight,
whose second read should come from L2, are capped at that many an SM.

The column loops are pipelined when ``num_stages`` > 1 (``tl.range(num_stages=...)``: Triton
pipelines a loop without a dot only when the loop asks; the kernel-wide num_stages does
nothing there): ``num_stages - 1`` blocks of x are in flight in shared memory (cp.async) while
one is computed. ``EVICT`` = 1 asks L2 to keep the first pass's lines (evict_last) and to let
the second pass's go (evict_first), and stores out streaming (``.cs``).

Arithmetic per element is kept small (the kernel was issue-bound, not memory-bound: ~33 SASS
instructions an element before): exp is ``exp2(fma(x, log2 e, -c))`` with ``c`` the row's
max scaled by log2 e (``tl.exp2`` of fp32 is one ``ex2.approx.ftz`` instruction; ``tl.exp``
adds a range check and two predicated multiplies), one reciprocal a row instead of a divide
an element, and whole blocks are loaded without masks (only a span's last partial block is
masked). Every exp of a row subtracts the same ``c``, so its rounding cancels in the
normalisation (large magnitudes stay accurate).

Split rows (``SPLIT > 1``): a long row on few programs leaves SMs idle (16 rows of 131,072: 16
programs on 132 SMs). Then ``SPLIT`` programs share a row, each a chunk of it: a first kernel
writes each chunk's scaled max and sum to a small fp32 workspace, a second combines the row's
partials in a fixed order (deterministic) and writes its chunk (read again, from L2 when the
matrix fits there). ``SYNC`` = 1 does both in one launch: each program publishes its chunk's
partials, counts itself in at its row's counter and waits there until the row's ``SPLIT``
programs are in, then combines and writes, from registers where its chunk is one block. A
program waits on others, so the grid must be resident at once: at most one program an SM
(the ``_sync`` constraint); kernels on other streams that hold SMs for long (NCCL's) delay
it until they end. Triton's CPU interpreter runs programs one after another and can never
pass such a wait, so there a SYNC config runs the same math in the two launches.

Rows whose length is not a multiple of 16 bytes (50,257 columns) start at unaligned addresses:
a block that starts at the row's first element cannot be loaded 16 bytes at a time. Every
span of a row is therefore cut where the addresses are aligned: a body of whole 16-byte groups,
loaded and stored in blocks of ``BLOCK_N`` (so the compiler vectorises them), and its two ends
(fewer than 16 bytes each) as one small masked tensor.
Same three layers as ``matmul``: the ``@triton.jit`` kernels -> ``softmax`` (the launcher) ->
``SoftmaxKernel`` (the TunableKernel).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from search_spaces.vector_add import sm_count
from tuner.config import KernelConfig
from tuner.dtypes import next_pow2, torch_dtype
from tuner.host_compile import on_gpu
from tuner.kernel import Dim, OutputCheck, Tolerance, builtin_version, shrunk_dim
from tuner.space import Param, ProblemContext, SearchSpace

#: stands in for -inf as the running max before any element: exp(NEG - m) is 0 for any real
#: max m, and NEG - NEG is 0, not the NaN that -inf - -inf would give
NEG = tl.constexpr(-1.0e30)
#: what a masked-off lane loads: its exp is 0 against any finite max (never NaN: the running
#: max starts at NEG, so it is always finite)
NEG_INF = tl.constexpr(float("-inf"))
#: exp(d) = exp2(d * LOG2E); maxes are kept scaled by it (``c = max * LOG2E``)
LOG2E = tl.constexpr(1.4426950408889634)
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
def _load(ptrs, mask, MASKED: tl.constexpr, KEEP: tl.constexpr, EVICT: tl.constexpr):
    """x at ``ptrs`` (-inf where a MASKED load's mask is off). EVICT: a first read asks L2 to
    keep the lines for the second (KEEP), the second read lets them go first."""
    if MASKED:
        if EVICT:
            if KEEP:
                x = tl.load(ptrs, mask=mask, other=NEG_INF, eviction_policy="evict_last")
            else:
                x = tl.load(ptrs, mask=mask, other=NEG_INF, eviction_policy="evict_first")
        else:
            x = tl.load(ptrs, mask=mask, other=NEG_INF)
    else:
        if EVICT:
            if KEEP:
                x = tl.load(ptrs, eviction_policy="evict_last")
            else:
                x = tl.load(ptrs, eviction_policy="evict_first")
        else:
            x = tl.load(ptrs)
    return x


@triton.jit
def _store(ptrs, y, mask, MASKED: tl.constexpr, EVICT: tl.constexpr):
    """out at ``ptrs``; EVICT: streaming (``.cs``), so that it does not push x out of L2."""
    y = y.to(ptrs.dtype.element_ty)
    if MASKED:
        if EVICT:
            tl.store(ptrs, y, mask=mask, cache_modifier=".cs")
        else:
            tl.store(ptrs, y, mask=mask)
    else:
        if EVICT:
            tl.store(ptrs, y, cache_modifier=".cs")
        else:
            tl.store(ptrs, y)


@triton.jit
def _exp_from(x, c):
    """exp(x - m) for the max m whose scaled value is ``c`` (= m * log2 e rounded): one fma
    and one exp2 of fp32 (``ex2.approx.ftz.f32``, a single MUFU instruction; tl.exp adds a
    range check and two predicated multiplies). Every exp of a row subtracts the same ``c``,
    so the rounding of ``c`` is a common factor that the division by the sum cancels."""
    return tl.exp2(tl.fma(x, LOG2E, -c))


@triton.jit
def _online(c, s, x):
    """One block into the running scaled max ``c`` (a scalar) and the per-lane sums ``s`` of
    exp(x - max): the block's max, one rescale of s, one exp per element."""
    c_new = tl.maximum(c, tl.max(x, 0) * LOG2E)
    return c_new, s * tl.exp2(c - c_new) + _exp_from(x, c_new)


@triton.jit
def _span_stats(x_ptr, lo_al, hi_al, ends, ends_mask, BLOCK_N: tl.constexpr,
                STAGES: tl.constexpr, EVICT: tl.constexpr):
    """The scaled max (max * log2 e) and the sum of exp(x - max) over a span: its whole
    blocks unmasked, in a column loop pipelined over STAGES, then its last partial block
    masked, then its ends. An empty span gives (NEG * log2 e, 0)."""
    cols = tl.arange(0, BLOCK_N)
    c = tl.full([], NEG * LOG2E, tl.float32)
    s = tl.zeros([BLOCK_N], tl.float32)
    body = hi_al - lo_al
    full = body // BLOCK_N * BLOCK_N
    for start in tl.range(0, full, BLOCK_N, num_stages=STAGES):
        x = _load(x_ptr + (lo_al + start + cols), None, False, True, EVICT)
        c, s = _online(c, s, x.to(tl.float32))
    if full < body:
        offs = lo_al + full + cols
        x = _load(x_ptr + offs, offs < hi_al, True, True, EVICT)
        c, s = _online(c, s, x.to(tl.float32))
    e = tl.load(x_ptr + ends, mask=ends_mask, other=NEG_INF).to(tl.float32)
    span_c = tl.maximum(c, tl.max(e, 0) * LOG2E)
    total = tl.sum(s, 0) * tl.exp2(c - span_c) + tl.sum(_exp_from(e, span_c), 0)
    return span_c, total


@triton.jit
def _span_write(x_ptr, out_ptr, lo_al, hi_al, ends, ends_mask, row_c, total,
                BLOCK_N: tl.constexpr, STAGES: tl.constexpr, EVICT: tl.constexpr):
    """out = exp(x - max) / total over a span (``row_c``: the row's scaled max), x read
    again last block first (the blocks ``_span_stats`` read last are the likeliest still in
    L2): the partial block masked, then the whole blocks unmasked in a pipelined loop; one
    reciprocal a span and a multiply per element."""
    cols = tl.arange(0, BLOCK_N)
    inv = 1.0 / total
    body = hi_al - lo_al
    full = body // BLOCK_N * BLOCK_N
    if full < body:
        offs = lo_al + full + cols
        mask = offs < hi_al
        x = _load(x_ptr + offs, mask, True, False, EVICT).to(tl.float32)
        _store(out_ptr + offs, _exp_from(x, row_c) * inv, mask, True, EVICT)
    for i in tl.range(0, full // BLOCK_N, num_stages=STAGES):
        offs = lo_al + (full - BLOCK_N - i * BLOCK_N) + cols
        x = _load(x_ptr + offs, None, False, False, EVICT).to(tl.float32)
        _store(out_ptr + offs, _exp_from(x, row_c) * inv, None, False, EVICT)
    e = tl.load(x_ptr + ends, mask=ends_mask, other=NEG_INF).to(tl.float32)
    tl.store(out_ptr + ends, (_exp_from(e, row_c) * inv).to(out_ptr.dtype.element_ty),
             mask=ends_mask)


@triton.jit
def _span_one_pass(x_ptr, out_ptr, lo_al, hi_al, ends, ends_mask, BLOCK_N: tl.constexpr):
    """softmax of a whole row whose body fits one block: read once (held in the input's
    dtype), written from registers."""
    offs = lo_al + tl.arange(0, BLOCK_N)
    mask = offs < hi_al
    x = tl.load(x_ptr + offs, mask=mask, other=NEG_INF)
    e = tl.load(x_ptr + ends, mask=ends_mask, other=NEG_INF)
    row_c = tl.maximum(tl.max(x.to(tl.float32), 0), tl.max(e.to(tl.float32), 0)) * LOG2E
    num = _exp_from(x.to(tl.float32), row_c)
    num_e = _exp_from(e.to(tl.float32), row_c)
    inv = 1.0 / (tl.sum(num, 0) + tl.sum(num_e, 0))
    tl.store(out_ptr + offs, (num * inv).to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(out_ptr + ends, (num_e * inv).to(out_ptr.dtype.element_ty), mask=ends_mask)


@triton.jit
def _row(x_ptr, out_ptr, row, N, stride, BLOCK_N: tl.constexpr, ONE_PASS: tl.constexpr,
         VEC: tl.constexpr, STAGES: tl.constexpr, EVICT: tl.constexpr):
    """softmax of one whole row."""
    lo = tl.cast(row, tl.int64) * stride
    lo_al, hi_al, ends, ends_mask = _span(lo, lo + N, VEC)
    if ONE_PASS:
        _span_one_pass(x_ptr, out_ptr, lo_al, hi_al, ends, ends_mask, BLOCK_N)
    else:
        row_c, total = _span_stats(x_ptr, lo_al, hi_al, ends, ends_mask, BLOCK_N, STAGES,
                                   EVICT)
        _span_write(x_ptr, out_ptr, lo_al, hi_al, ends, ends_mask, row_c, total, BLOCK_N,
                    STAGES, EVICT)


@triton.jit
def _softmax_kernel(x_ptr, out_ptr, M, N, stride, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
                    ONE_PASS: tl.constexpr, VEC: tl.constexpr, STAGES: tl.constexpr,
                    EVICT: tl.constexpr, PERSISTENT: tl.constexpr):
    """Whole rows (SPLIT = 1): a program takes ROWS consecutive rows; on a persistent grid
    (PERSISTENT) it then strides over the matrix by the grid's ROWS-row groups."""
    pid = tl.program_id(0)
    if PERSISTENT:
        for first in range(pid * ROWS, M, tl.num_programs(0) * ROWS):
            for r in range(ROWS):
                if first + r < M:
                    _row(x_ptr, out_ptr, first + r, N, stride, BLOCK_N, ONE_PASS, VEC, STAGES,
                         EVICT)
    else:
        for r in range(ROWS):
            if pid * ROWS + r < M:
                _row(x_ptr, out_ptr, pid * ROWS + r, N, stride, BLOCK_N, ONE_PASS, VEC, STAGES,
                     EVICT)


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
                             VEC: tl.constexpr, STAGES: tl.constexpr, EVICT: tl.constexpr):
    """Split rows, first kernel: each chunk's scaled max and sum of exp(x - max)."""
    row, lo_al, hi_al, ends, ends_mask = _chunk(N, stride, CHUNK, SPLIT, VEC)
    chunk_c, total = _span_stats(x_ptr, lo_al, hi_al, ends, ends_mask, BLOCK_N, STAGES,
                                 EVICT)
    pid = tl.program_id(0)
    tl.store(part_max_ptr + pid, chunk_c)
    tl.store(part_sum_ptr + pid, total)


@triton.jit
def _softmax_split_write_kernel(x_ptr, out_ptr, part_max_ptr, part_sum_ptr, N, stride, CHUNK,
                                BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
                                VEC: tl.constexpr, STAGES: tl.constexpr,
                                EVICT: tl.constexpr):
    """Split rows, second kernel: combine the row's partials (every chunk's program combines
    them alike, in one order), then write this chunk."""
    row, lo_al, hi_al, ends, ends_mask = _chunk(N, stride, CHUNK, SPLIT, VEC)
    parts = row * SPLIT + tl.arange(0, SPLIT)
    scaled = tl.load(part_max_ptr + parts)
    row_c = tl.max(scaled, 0)
    total = tl.sum(tl.load(part_sum_ptr + parts) * tl.exp2(scaled - row_c), 0)
    _span_write(x_ptr, out_ptr, lo_al, hi_al, ends, ends_mask, row_c, total, BLOCK_N, STAGES,
                EVICT)


@triton.jit
def _softmax_split_sync_kernel(x_ptr, out_ptr, part_max_ptr, part_sum_ptr, arrive_ptr, N,
                               stride, CHUNK, BLOCK_N: tl.constexpr, SPLIT: tl.constexpr,
                               ONE_BLOCK: tl.constexpr, VEC: tl.constexpr,
                               STAGES: tl.constexpr, EVICT: tl.constexpr):
    """Split rows in one launch (the whole grid resident: one program an SM at most). Each
    program publishes its chunk's partials, counts itself in at ``arrive_ptr[row]`` and waits
    until the row's SPLIT programs are in; then combines them as the two-launch write kernel
    does (same order, same result) and writes its chunk: from registers when the chunk is one
    block (ONE_BLOCK), else read again (from L2). Leaving, each counts itself again; the last
    of the row (count 2 * SPLIT - 1) sets the counter back to 0 for the stream's next launch."""
    row, lo_al, hi_al, ends, ends_mask = _chunk(N, stride, CHUNK, SPLIT, VEC)
    pid = tl.program_id(0)
    if ONE_BLOCK:
        offs = lo_al + tl.arange(0, BLOCK_N)
        mask = offs < hi_al
        x = tl.load(x_ptr + offs, mask=mask, other=NEG_INF).to(tl.float32)
        e = tl.load(x_ptr + ends, mask=ends_mask, other=NEG_INF).to(tl.float32)
        chunk_c = tl.maximum(tl.max(x, 0), tl.max(e, 0)) * LOG2E
        total = tl.sum(_exp_from(x, chunk_c), 0) + tl.sum(_exp_from(e, chunk_c), 0)
    else:
        chunk_c, total = _span_stats(x_ptr, lo_al, hi_al, ends, ends_mask, BLOCK_N, STAGES,
                                     EVICT)
    tl.store(part_max_ptr + pid, chunk_c)
    tl.store(part_sum_ptr + pid, total)
    # every thread's stores before the count (the barrier, then the release at GPU scope)
    tl.debug_barrier()
    tl.atomic_add(arrive_ptr + row, 1, sem="release", scope="gpu")
    while tl.atomic_add(arrive_ptr + row, 0, sem="acquire", scope="gpu") < SPLIT:
        pass
    tl.debug_barrier()
    parts = row * SPLIT + tl.arange(0, SPLIT)
    # volatile: the partials were written by other SMs (no stale L1 line)
    scaled = tl.load(part_max_ptr + parts, volatile=True)
    row_c = tl.max(scaled, 0)
    row_total = tl.sum(tl.load(part_sum_ptr + parts, volatile=True) * tl.exp2(scaled - row_c),
                       0)
    if ONE_BLOCK:
        inv = 1.0 / row_total
        tl.store(out_ptr + offs, (_exp_from(x, row_c) * inv).to(out_ptr.dtype.element_ty),
                 mask=mask)
        tl.store(out_ptr + ends, (_exp_from(e, row_c) * inv).to(out_ptr.dtype.element_ty),
                 mask=ends_mask)
    else:
        _span_write(x_ptr, out_ptr, lo_al, hi_al, ends, ends_mask, row_c, row_total, BLOCK_N,
                    STAGES, EVICT)
    left = tl.atomic_add(arrive_ptr + row, 1, sem="relaxed", scope="gpu")
    if left == 2 * SPLIT - 1:
        tl.atomic_xchg(arrive_ptr + row, 0, sem="relaxed", scope="gpu")


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
    # the column loops' pipelining depth (a loop without a dot is pipelined only when asked)
    common = {"BLOCK_N": block, "VEC": vec, "STAGES": config.num_stages,
              "EVICT": _evict_of(config)}
    if split == 1:
        groups = triton.cdiv(M, config["ROWS"])
        per_sm = _per_sm_of(config)
        programs = min(groups, per_sm * sm_count(x.device)) if per_sm else groups
        grid = (max(1, programs),)
        args = (x, out, M, N, x.stride(0))
        meta = {**common, "ROWS": config["ROWS"], "ONE_PASS": int(block >= N),
                "PERSISTENT": int(per_sm > 0)}
        if warmup:
            _softmax_kernel.warmup(*args, **meta, **opts, grid=grid)
        else:
            _softmax_kernel[grid](*args, **meta, **opts)
        return
    chunk = split_chunk(N, split)
    part_max = torch.empty(M * split, device=x.device, dtype=torch.float32)
    part_sum = torch.empty_like(part_max)
    meta = {**common, "SPLIT": split}
    if _sync_of(config) and not _interpreting(x):
        sync_args = (x, out, part_max, part_sum, _arrive_counters(x.device, M), N,
                     x.stride(0), chunk)
        sync_meta = {**meta, "ONE_BLOCK": int(block >= chunk)}
        if warmup:
            _softmax_split_sync_kernel.warmup(*sync_args, **sync_meta, **opts,
                                              grid=(M * split,))
        else:
            _softmax_split_sync_kernel[(M * split,)](*sync_args, **sync_meta, **opts)
        return
    first = (x, part_max, part_sum, N, x.stride(0), chunk)
    second = (x, out, part_max, part_sum, N, x.stride(0), chunk)
    if warmup:
        _softmax_partials_kernel.warmup(*first, **meta, **opts, grid=(M * split,))
        _softmax_split_write_kernel.warmup(*second, **meta, **opts, grid=(M * split,))
    else:
        _softmax_partials_kernel[(M * split,)](*first, **meta, **opts)
        _softmax_split_write_kernel[(M * split,)](*second, **meta, **opts)


#: SYNC's row counters, one zeroed int32 tensor per (device, stream): every launch leaves its
#: rows' counters at 0 again, and launches on one stream run in order, so a stream's next
#: launch finds them zeroed (two streams never share one)
_ARRIVE: dict[tuple[int, int], torch.Tensor] = {}


def _arrive_counters(device: torch.device, rows: int) -> torch.Tensor:
    """This stream's zeroed row counters, at least ``rows`` of them (grown by replacing); on
    the host (a compile from host tensors, ``tuner.host_compile``) one set."""
    if device.type == "cuda":
        stream = torch.cuda.current_stream(device)
        key = (stream.device_index, stream.cuda_stream)
    else:
        key = (-1, 0)
    counters = _ARRIVE.get(key)
    if counters is None or counters.numel() < rows:
        counters = torch.zeros(max(rows, 256), device=device, dtype=torch.int32)
        _ARRIVE[key] = counters
    return counters


def _interpreting(x: torch.Tensor) -> bool:
    """Triton's CPU interpreter (tensors on the CPU, unless they stand in for the GPU's in a
    compile from host tensors, ``tuner.host_compile``): it runs programs one after another."""
    return not on_gpu(x) or os.environ.get("TRITON_INTERPRET") == "1"


def softmax(x: torch.Tensor, out: torch.Tensor, config: KernelConfig) -> None:
    """out = softmax(x, dim=-1) with the given launch config (rows contiguous, x and out of
    one row stride). A config without SPLIT, EVICT or PROGRAMS_PER_SM (from before those
    parameters) runs one program per ROWS rows with the cache hints."""
    _run(x, out, config, warmup=False)


def compile_softmax(x: torch.Tensor, out: torch.Tensor, config: KernelConfig) -> None:
    """Compile (or load from Triton's disk cache) without launching."""
    _run(x, out, config, warmup=True)


def _split_of(config: KernelConfig) -> int:
    """The config's SPLIT; 1 for a config from before the parameter (tables, stored bests)."""
    return config.get("SPLIT", 1)


def _sync_of(config: KernelConfig) -> int:
    """The config's SYNC; 0 (two launches) for a config from before the parameter."""
    return config.get("SYNC", 0)


def _evict_of(config: KernelConfig) -> int:
    """The config's EVICT; 1 (the hints every config had) for one from before the parameter."""
    return config.get("EVICT", 1)


def _per_sm_of(config: KernelConfig) -> int:
    """The config's PROGRAMS_PER_SM; 0 (a program per ROWS rows) for one from before it."""
    return config.get("PROGRAMS_PER_SM", 0)


def _two_pass(config: KernelConfig, ctx: ProblemContext) -> bool:
    """Whether the config reads x twice: a span (a whole row, or a split row's chunk) wider
    than one column block, or split rows in two launches (the second reads its chunk again);
    one launch (SYNC) keeps a one-block chunk in registers."""
    split = _split_of(config)
    if split > 1 and not _sync_of(config):
        return True
    return config["BLOCK_N"] < split_chunk(ctx.shape["N"], split)


def _redundant_block(config: KernelConfig, ctx: ProblemContext) -> str | None:
    """No column block wider than a program's span needs (its row, or its chunk of a split
    row), no more rows per program than there are; pipelining stages only where there is a
    column loop (a span wider than a block), and cache hints only where x is read twice:
    else configs differ in nothing they run."""
    split = _split_of(config)
    span = split_chunk(ctx.shape["N"], split)
    cap = max(64, next_pow2(span))
    if config["BLOCK_N"] > cap:
        what = f"a chunk of {span}" if split > 1 else f"N={ctx.shape['N']}"
        return f"BLOCK_N={config['BLOCK_N']} is wider than {what} needs ({cap})"
    if config["ROWS"] > 1 and config["ROWS"] > ctx.shape["M"]:
        return f"ROWS={config['ROWS']} is more than M={ctx.shape['M']}"
    if config["BLOCK_N"] >= span and config["num_stages"] != 1:
        return "num_stages only pipelines a column loop (a span wider than BLOCK_N)"
    if not _two_pass(config, ctx) and config.get("EVICT"):  # (a config without it: not set)
        return "EVICT only steers a second read of x (one pass reads it once)"
    return None


def _split(config: KernelConfig, ctx: ProblemContext) -> str | None:
    """Split rows only where every chunk has at least ``MIN_SPLIT_CHUNK`` columns (each
    split gets at least a block's worth), one row per program (ROWS is for short rows) and
    the plain grid (the split kernels have no persistent loop)."""
    split, n = _split_of(config), ctx.shape["N"]
    if split == 1:
        return None
    if config["ROWS"] != 1:
        return "a split row takes one row per program (ROWS=1)"
    if _per_sm_of(config):
        return "split rows run on the plain grid (PROGRAMS_PER_SM=0)"
    if _cdiv(n, split) < MIN_SPLIT_CHUNK:
        return (f"SPLIT={split} leaves chunks of {_cdiv(n, split)} columns (under "
                f"{MIN_SPLIT_CHUNK})")
    return None


def _sync(config: KernelConfig, ctx: ProblemContext) -> str | None:
    """One launch (SYNC) only for split rows (only they wait on other programs), and only
    where the grid of M * SPLIT programs is resident at once, one an SM at most: a program
    waiting on one that cannot start would wait for ever."""
    if not _sync_of(config):
        return None
    split, m = _split_of(config), ctx.shape["M"]
    if split == 1:
        return "SYNC=1 combines a split row's chunks in one launch: it needs SPLIT > 1"
    if m * split > ctx.sm_count:
        return (f"SYNC=1 needs its M * SPLIT = {m * split} programs resident at once: at most "
                f"one an SM ({ctx.sm_count})")
    return None


def _persistent(config: KernelConfig, ctx: ProblemContext) -> str | None:
    """A persistent grid only where there are more row groups than its programs (else it is
    the plain grid again)."""
    per_sm = _per_sm_of(config)
    groups = _cdiv(ctx.shape["M"], config["ROWS"])
    if per_sm and groups <= per_sm * ctx.sm_count:
        return (f"{groups} row groups fit a grid of {per_sm} x {ctx.sm_count} SMs: the "
                "persistent grid would be the plain one")
    return None


def _registers(config: KernelConfig, ctx: ProblemContext) -> str | None:
    """A thread holds BLOCK_N / (32 * num_warps) fp32 values of each live block array (the
    running sums, then x): more than 64 each spills."""
    per_thread = config["BLOCK_N"] // (32 * config["num_warps"])
    if per_thread > 64:
        return f"each thread would hold {per_thread} values per block array (over 64)"
    return None


def _pipeline_smem(config: KernelConfig, ctx: ProblemContext) -> int:
    """Shared memory of the pipelined column loops: num_stages - 1 blocks of x in flight
    (ptxas-checked: the two passes' buffers are one allocation), plus the reductions'."""
    stages = config["num_stages"] if config["BLOCK_N"] < split_chunk(
        ctx.shape["N"], _split_of(config)) else 1
    return (stages - 1) * config["BLOCK_N"] * ctx.elem_bytes + 1024


def _smem(config: KernelConfig, ctx: ProblemContext) -> str | None:
    """The pipelined loop's blocks must fit in shared memory."""
    need = _pipeline_smem(config, ctx)
    if need > ctx.smem_limit:
        return f"{config['num_stages']} stages of {config['BLOCK_N']} columns need {need} " \
               f"bytes of shared memory (over {ctx.smem_limit})"
    return None


def _config(block: int, span: int, rows: int = 1, split: int = 1, warps: int = 4,
            stages: int = 1, per_sm: int = 0, evict: int = 1, sync: int = 0) -> KernelConfig:
    """A config with what its variant does not use set as the space requires: one block a
    span pipelines nothing (num_stages 1) and, where x is read once (whole rows, or split
    rows in one launch, in one block), no cache hints (EVICT 0)."""
    looped = block < span
    twice = looped or (split > 1 and not sync)
    return KernelConfig(BLOCK_N=block, ROWS=rows, SPLIT=split, PROGRAMS_PER_SM=per_sm,
                        EVICT=evict if twice else 0, SYNC=sync, num_warps=warps,
                        num_stages=stages if looped else 1)


class SoftmaxKernel:
    name = "softmax"
    ref = "search_spaces.softmax:KERNEL"
    description = ("row-wise softmax of an M x N matrix, fp32 math, online two-pass for long "
                   "rows (pipelined column loops, L2 cache hints, persistent grid), split rows "
                   "(several programs a row) for few long rows")
    dims = (Dim("M", 1, 1 << 20, "rows"), Dim("N", 1, 1 << 18, "columns (the softmax axis)"))
    dtypes = ("float16", "bfloat16", "float32")
    interpreter_unsupported_dtypes: tuple[str, ...] = ()
    #: its compile hook builds the GPU binary from host tensors (``tuner.host_compile``)
    compiles_on_host = True
    #: each row is a distribution: compared per row, and sums to 1
    output_check = OutputCheck(rowwise=True, row_sum=1.0)

    @property
    def version(self) -> str:
        return builtin_version(self, _softmax_kernel, _softmax_partials_kernel,
                               _softmax_split_write_kernel, _softmax_split_sync_kernel)

    def space(self) -> SearchSpace:
        return SearchSpace(
            params=(
                Param.pow2("BLOCK_N", 64, 65536),
                Param.ints("ROWS", (1, 2, 4)),
                Param.pow2("SPLIT", 1, 64),
                Param.ints("PROGRAMS_PER_SM", (0, 1, 2, 4)),
                Param.ints("EVICT", (0, 1)),
                Param.ints("SYNC", (0, 1)),
                Param.pow2("num_warps", 1, 32),
                Param.ints("num_stages", (1, 2, 3, 4)),
            ),
            constraints=(_redundant_block, _split, _sync, _registers, _persistent, _smem),
        )

    def default_config(self, shape: Mapping[str, int], dtype: str) -> KernelConfig:
        """One row per program, the row in one block up to 4,096 columns (the Triton
        tutorial's warps for that width); a longer row in blocks of 4,096, two ahead in
        flight (three stages), with the cache hints."""
        n = shape.get("N", 1024)
        block = min(4096, max(64, next_pow2(n)))
        warps = 4 if block <= 1024 else 8
        return _config(block, n, warps=warps, stages=3)

    def known_good_configs(self, shape: Mapping[str, int], dtype: str) -> list[KernelConfig]:
        """Whole rows in blocks of 1,024 to 16,384 columns; a long row pipelined (16 to 32
        values a thread, 16-48 KB in flight a program; also on a persistent grid of two
        programs an SM, whose rows in flight fit in L2) or, up to 65,536 columns, in one
        block of 32 warps; for long rows on few programs (under two per SM), split rows with
        one-block or pipelined chunks; several short rows a program. Only configs the space
        allows."""
        m, n = shape.get("M", 1), shape.get("N", 1024)
        width = max(64, next_pow2(n))
        configs = [self.default_config(shape, dtype)]
        if width > 16384:  # long rows: pipelined two passes, or one block of 32 warps
            configs += [_config(b, n, warps=w, stages=st, per_sm=p, evict=e)
                        for b, w, st, p, e in ((8192, 16, 3, 0, 1), (4096, 8, 3, 0, 1),
                                               (16384, 16, 2, 0, 1), (8192, 8, 3, 0, 1),
                                               (4096, 4, 4, 2, 1), (4096, 8, 3, 2, 1),
                                               (2048, 4, 4, 2, 1), (8192, 16, 3, 0, 0),
                                               (16384, 16, 1, 0, 1), (2048, 16, 1, 0, 1))]
            configs += [_config(width, n, warps=32)]
        else:
            for block in sorted({min(width, b) for b in (16384, 8192, 2048, 1024)},
                                reverse=True):
                for warps in (4, 8, 16):
                    for stages in (1, 3):
                        configs.append(_config(block, n, warps=warps, stages=stages))
        if m < 2 * 132:
            for split in (4, 8, 16, 32, 64):
                chunk = split_chunk(n, split)
                block = min(16384, max(64, next_pow2(chunk)))
                for warps in (4, 8, 16):
                    configs.append(_config(block, chunk, split=split, warps=warps))
                    # one launch, where the grid is resident at once (the filter below)
                    configs.append(_config(block, chunk, split=split, warps=warps, sync=1))
                if block >= 4096:  # a long chunk: four blocks, pipelined
                    configs.append(_config(block // 4, chunk, split=split, warps=4,
                                           stages=3))
        if width <= 1024:  # short rows: several per program
            configs += [_config(width, n, rows=rows, warps=w)
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
        from search_spaces.softmax_prior import estimated_seconds  # here: children never rank

        return math.log(estimated_seconds(config, ctx))


KERNEL = SoftmaxKernel()
