"""2-D convolution as an implicit GEMM: ``out = conv2d(x, w, stride, padding, dilation)``, no
bias, fp32 accumulation, in two layouts: NCHW (``conv2d``) and NHWC (``conv2d_nhwc``).

The GEMM is never materialised: its rows are the output pixels (M = N * P * Q), its columns the
output channels (K), its reduction the filter taps (C * R * S). A program computes one
BLOCK_M x BLOCK_N tile of the output; for each BLOCK_K slice of the reduction it gathers the
input patch elements with computed offsets (a tap in the padding, or past the reduction's end,
is masked and reads 0) and loads the filter slice, then ``tl.dot``. The reduction runs in the
order the layout stores it: (c, r, s) for NCHW, (r, s, c) for NHWC, so that the filter slice is
one contiguous run of its flattened row in both (``w.reshape(K, C*R*S)`` for NCHW, the
channels-last filter as ``K x (R*S*C)``), and for NHWC input the taps of one filter row are
contiguous too (S * C elements at dilation 1). The decomposition of the reduction index into
(c, r, s) is done once per BLOCK_K slice, by constants (C, R and S are constexprs: a filter
shape is a binary of its own, as it is a tuning problem of its own), that of the pixel index
into (n, p, q) once per tile: the per-element work of the gather is two adds, four compares, a
pointer add and the load. Each row's pointer is int64 (a batch may hold more than 2**31
elements), the taps int32 offsets from it (within one padded image, at most 2**31 - 1
elements). fp32 inputs are multiplied in IEEE fp32 (``input_precision="ieee"``, no TF32), as
cuDNN does with TF32 off: the issue's fp32 target.

The space is the tile over (output pixels x output channels x taps), GROUP_M, warps, stages and
``GATHER_KM``: the input tile gathered as (M, K), the threads of a warp along the taps (one
tap's decomposition per thread, but a dozen rows' window positions held per thread) or as
(K, M) and transposed, along the pixels (fewer registers, twice the loop instructions on
sm_90; NCHW's pixels are the contiguous direction). Register use, not shared memory, bounds the
tiles: every thread keeps its rows' window positions and pointers for the whole loop.

NCHW's space has two more parameters. ``PADDED=1`` gathers without masks
(``_conv2d_padded_kernel``): the launch first writes the input with its padding and one zero
channel after the last (``padded_input``: one pass over the input, timed with the kernel; 60
MB read and 83 MB written for AlexNet conv1 at N=100, ~0.035 ms at the H200's 4.2 TB/s copy
bandwidth), the filter is
packed as one row of output channels per tap (``packed_filter``, zero rows past the last tap;
once per filter tensor, kept while the tensor lives unmodified), and each tap's offset from
its window's origin comes from a table (``tap_offsets``, once per filter shape and input
strides; the taps past the reduction's end point at the zero channel). A window then never
leaves its padded image, rows past M read the last pixel's window and the reduction's tail
multiplies zeros by zeros: the gather is an add and the load, and the fp32 K loop on sm_90 is
81-89% FFMA instead of 50% (the masked gather's row positions spill). ``NSPLIT`` (PADDED=1
only) computes NSPLIT column tiles of BLOCK_N from one gathered input tile (AlexNet's 96
output channels as three of 32: the input gathered once, no padded columns). The space keeps
the masked gather: the padded copy is a pass over the input, which may outweigh what it saves
where the reduction and the output channels are few (a 1x1 convolution with few filters).

The layout is the problem, not a search parameter (a stored config must never be served for the
other layout, whose gather differs), so each is a kernel of its own, as ``matmul_epilogue``
registers its epilogues; both share this module's kernels and prior; NHWC's space is the
original one (no PADDED, NSPLIT: its 16-bit target is met).

Dimensions: N, C, H, W (input), K (output channels), R, S (filter height, width), STRIDE, PAD1,
DIL, the same for both spatial axes (torch's ``stride``, ``padding``, ``dilation`` as single
integers). Every dimension is at least 1 (the protocol's and the conformance suite's rule),
and a padding of 0 is the most common one: so the padding dimension is ``PAD1 = padding + 1``
(``PAD1=1``: no padding), named so that no one reads it as the padding itself. The alternatives
were worse: an output-size dimension instead of H makes the input size ambiguous (224 and 226
give the same 55 at stride 4), and a PAD with lo 0 fails the suite. The suite's 7-per-dimension
problem must have an output (H + 2 * pad >= DIL * (R - 1) + 1 with all at 7 and pad 6): that
caps DIL at 3 (a larger dilation needs a kernel-chosen example shape in the suite).

Same three layers as ``matmul``: ``_conv2d_kernel`` and ``_conv2d_padded_kernel`` -> ``conv2d``
(the launcher) -> ``Conv2dKernel`` (the TunableKernel, one instance per layout).
"""

from __future__ import annotations

import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import triton
import triton.language as tl

from search_spaces.gemm.conv_geometry import (
    MAX_IMAGE,  # noqa: F401 - read as conv2d's by tests
    RED_ALIGN,
    Geometry,
    _round_up,
    geometry,
)
from search_spaces.gemm.host import tile_shared_memory
from search_spaces.gemm.tiles import grouped_tile
from tuner.config import KernelConfig
from tuner.dtypes import element_bytes, next_pow2, torch_dtype
from tuner.kernel import Dim, OutputCheck, Tolerance, builtin_version
from tuner.space import Param, ProblemContext, SearchSpace

#: the layouts, by the ``CHANNELS_LAST`` constexpr the kernel takes
LAYOUTS = ("nchw", "nhwc")


@triton.jit
def _conv2d_kernel(
    x_ptr, w_ptr, out_ptr,
    M, K_OUT, H, W, P, Q, CONV_STRIDE, PAD, DIL,
    stride_xn, stride_xc, stride_xh, stride_xw, stride_wk,
    stride_on, stride_ok, stride_op, stride_oq,
    C: tl.constexpr, R: tl.constexpr, S: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    CHANNELS_LAST: tl.constexpr, GATHER_KM: tl.constexpr,
):
    pid_m, pid_n = grouped_tile(M, K_OUT, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < M
    mask_n = offs_n < K_OUT

    # Each row's output pixel (image n, row p, column q) and its window's top-left input
    # position, which may lie in the padding (negative): a pointer per row (int64: a batch may
    # hold 2**31 elements); the taps are int32 offsets from it (within one padded image). A row
    # past M gets a window far above the image: the row bound check masks it.
    n = offs_m // (P * Q)
    p = (offs_m % (P * Q)) // Q
    q = offs_m % Q
    h0 = tl.where(mask_m, p * CONV_STRIDE - PAD, -(1 << 30))
    w0 = q * CONV_STRIDE - PAD
    x_rows = x_ptr + (n.to(tl.int64) * stride_xn + h0.to(tl.int64) * stride_xh
                      + w0.to(tl.int64) * stride_xw)
    # The filter as K_OUT rows of C * R * S taps, contiguous in the reduction order: int32
    # offsets from a pointer advanced per slice (a tensor of pointers would take two registers
    # per element for the whole loop).
    offs_k = tl.arange(0, BLOCK_K)
    w_offs = offs_n[None, :] * stride_wk + offs_k[:, None]

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, C * R * S, BLOCK_K):
        # the slice's taps: (c, r, s) from the flat index, by constants (C, R, S are constexpr:
        # multiplications, not divisions), once per slice, not per element
        kk = k0 + offs_k
        mask_k = kk < C * R * S
        if CHANNELS_LAST:  # reduction order (r, s, c)
            r = kk // (S * C)
            s = (kk // C) % S
            c = kk % C
        else:  # reduction order (c, r, s)
            c = kk // (R * S)
            r = (kk // S) % R
            s = kk % S
        dh = r * DIL
        dw = s * DIL
        x_taps = c * stride_xc + dh * stride_xh + dw * stride_xw
        # a tap past the reduction's end lies far right of the image: the column check masks
        # it (rows past M are far above it: the two never cancel)
        dw = tl.where(mask_k, dw, 1 << 30)
        if GATHER_KM:  # the tile gathered as (K, M): threads run along the pixels
            ih = dh[:, None] + h0[None, :]
            iw = dw[:, None] + w0[None, :]
            a_mask = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            a = tl.trans(tl.load(x_rows[None, :] + x_taps[:, None], mask=a_mask, other=0.0))
        else:  # as (M, K): threads run along the taps
            ih = h0[:, None] + dh[None, :]
            iw = w0[:, None] + dw[None, :]
            a_mask = (ih >= 0) & (ih < H) & (iw >= 0) & (iw < W)
            a = tl.load(x_rows[:, None] + x_taps[None, :], mask=a_mask, other=0.0)
        b = tl.load((w_ptr + k0) + w_offs, mask=mask_k[:, None] & mask_n[None, :], other=0.0)
        # IEEE fp32 products for fp32 inputs (no TF32); fp16 and bf16 ignore the argument
        acc = tl.dot(a, b, acc, input_precision="ieee")

    out_rows = out_ptr + (n.to(tl.int64) * stride_on + p.to(tl.int64) * stride_op
                          + q.to(tl.int64) * stride_oq)
    tl.store(out_rows[:, None] + offs_n[None, :] * stride_ok, acc.to(out_ptr.dtype.element_ty),
             mask=mask_m[:, None] & mask_n[None, :])


@triton.jit
def _filter_slice(w_ptr, k0, offs_k, offs_n, K_OUT):
    """Taps k0 .. k0 + BLOCK_K of the packed filter (rows of K_OUT output channels, zeros past
    the last tap), columns ``offs_n``; columns past K_OUT read 0."""
    return tl.load(w_ptr + (k0 + offs_k)[:, None] * K_OUT + offs_n[None, :],
                   mask=(offs_n < K_OUT)[None, :], other=0.0)


@triton.jit
def _store_tile(out_rows, offs_n, mask_m, acc, K_OUT, stride_ok):
    tl.store(out_rows[:, None] + offs_n[None, :] * stride_ok, acc.to(out_rows.dtype.element_ty),
             mask=mask_m[:, None] & (offs_n < K_OUT)[None, :])


@triton.jit
def _conv2d_padded_kernel(
    x_ptr, w_ptr, taps_ptr, out_ptr,
    M, K_OUT, P, Q, CONV_STRIDE,
    stride_xn, stride_xh, stride_xw,
    stride_on, stride_ok, stride_op, stride_oq,
    K_RED: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    GATHER_KM: tl.constexpr, NSPLIT: tl.constexpr,
):
    """The implicit GEMM on operands prepared by the launcher (``PADDED=1``): ``x`` with its
    padding written out and one zero channel after the last, the filter packed as rows of
    output channels, one per tap (``w_ptr``; zero rows past the last tap), and each tap's
    offset from its window's origin (``taps_ptr``; past the last tap: the origin's pixel of
    the zero channel). No load in the loop is masked but the filter's columns: a window never
    leaves the padded image, rows past M read the last pixel's window, and the reduction's
    tail reads zeros times zero weights. Offsets are int32 (the padded input has fewer than
    2**31 elements: the space's constraint). A program computes NSPLIT tiles of BLOCK_N output
    channels side by side from one gathered input tile."""
    pid_m, pid_n = grouped_tile(M, K_OUT, BLOCK_M, BLOCK_N * NSPLIT, GROUP_M)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * (BLOCK_N * NSPLIT) + tl.arange(0, BLOCK_N)
    m = tl.minimum(offs_m, M - 1)
    n = m // (P * Q)
    pq = m - n * (P * Q)
    p = pq // Q
    q = pq - p * Q
    rows = n * stride_xn + p * (CONV_STRIDE * stride_xh) + q * (CONV_STRIDE * stride_xw)
    offs_k = tl.arange(0, BLOCK_K)

    acc0 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc1 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)  # (unused ones are folded away)
    acc2 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc3 = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K_RED, BLOCK_K):
        taps = tl.load(taps_ptr + k0 + offs_k)
        if GATHER_KM:  # as (K, M): threads along the pixels
            a = tl.trans(tl.load(x_ptr + (rows[None, :] + taps[:, None])))
        else:  # as (M, K): threads along the taps
            a = tl.load(x_ptr + (rows[:, None] + taps[None, :]))
        acc0 = tl.dot(a, _filter_slice(w_ptr, k0, offs_k, offs_n, K_OUT), acc0,
                      input_precision="ieee")
        if NSPLIT > 1:
            acc1 = tl.dot(a, _filter_slice(w_ptr, k0, offs_k, offs_n + BLOCK_N, K_OUT), acc1,
                          input_precision="ieee")
        if NSPLIT > 2:
            acc2 = tl.dot(a, _filter_slice(w_ptr, k0, offs_k, offs_n + 2 * BLOCK_N, K_OUT),
                          acc2, input_precision="ieee")
        if NSPLIT > 3:
            acc3 = tl.dot(a, _filter_slice(w_ptr, k0, offs_k, offs_n + 3 * BLOCK_N, K_OUT),
                          acc3, input_precision="ieee")

    # the output pixels again, unclamped, after the loop (nothing of them lives through it)
    mask_m = offs_m < M
    n = offs_m // (P * Q)
    pq = offs_m - n * (P * Q)
    p = pq // Q
    q = pq - p * Q
    out_rows = out_ptr + (n.to(tl.int64) * stride_on + p.to(tl.int64) * stride_op
                          + q.to(tl.int64) * stride_oq)
    _store_tile(out_rows, offs_n, mask_m, acc0, K_OUT, stride_ok)
    if NSPLIT > 1:
        _store_tile(out_rows, offs_n + BLOCK_N, mask_m, acc1, K_OUT, stride_ok)
    if NSPLIT > 2:
        _store_tile(out_rows, offs_n + 2 * BLOCK_N, mask_m, acc2, K_OUT, stride_ok)
    if NSPLIT > 3:
        _store_tile(out_rows, offs_n + 3 * BLOCK_N, mask_m, acc3, K_OUT, stride_ok)


def _shrunk_side(size: int, extent: int, pad: int, stride: int) -> int:
    """The smallest input side congruent to ``size`` mod 16 x ``stride`` (the output side then
    keeps its residue mod 16) that still gives two outputs (``extent``: the dilated filter's)
    and is 1 only if ``size`` is; ``size`` itself when that is not smaller."""
    step = 16 * stride
    lo = max(1, extent - 2 * pad + stride)
    small = lo + (size - lo) % step
    if small == 1 and size != 1:
        small += step
    return small if small < size else size


def _filter_rows(w: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """The filter as K rows of taps in the kernel's reduction order, a view of ``w`` in the
    layout's memory format (a copy otherwise: such a filter is not what make_inputs gives)."""
    K = w.shape[0]
    rows = w.permute(0, 2, 3, 1) if channels_last else w
    return rows.reshape(K, -1)


def _args(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, g: Geometry,
          channels_last: bool) -> tuple[Any, ...]:
    rows = _filter_rows(w, channels_last)
    return (x, rows, out, g.M, g.K, g.H, g.W, g.P, g.Q, g.stride, g.pad, g.dil, *x.stride(),
            rows.stride(0), *out.stride())


# -- PADDED=1: operands prepared on the host ----------------------------------------------------

#: packed filters by ``id()`` of the filter tensor, with the key they were packed for (its
#: version counter among it: an in-place change repacks); an entry goes when its tensor does
_PACKED: dict[int, tuple[tuple[Any, ...], torch.Tensor]] = {}
#: tap tables by (filter shape, dilation, padded input strides, order, device)
_TAPS: dict[tuple[Any, ...], torch.Tensor] = {}


@triton.jit
def _pad_kernel(x_ptr, xp_ptr, ROWS, C, H, W, PAD, HP, WP,
                stride_xn, stride_xc, stride_xh, stride_xw,
                BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr):
    """BLOCK_R rows of the padded input (N x (C + 1) x HP rows of WP, contiguous), each
    element read from ``x`` or 0: one pass, no separate fill."""
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    h = rows % HP
    c = (rows // HP) % (C + 1)
    n = rows // (HP * (C + 1))
    ih = h - PAD
    row_ok = (rows < ROWS) & (c < C) & (ih >= 0) & (ih < H)
    src = x_ptr + (n.to(tl.int64) * stride_xn + c.to(tl.int64) * stride_xc
                   + ih.to(tl.int64) * stride_xh)
    dst = xp_ptr + rows.to(tl.int64) * WP
    for w0 in range(0, WP, BLOCK_W):
        ow = w0 + tl.arange(0, BLOCK_W)
        iw = ow - PAD
        ok = row_ok[:, None] & ((iw >= 0) & (iw < W))[None, :]
        v = tl.load(src[:, None] + iw[None, :].to(tl.int64) * stride_xw, mask=ok, other=0.0)
        tl.store(dst[:, None] + ow[None, :], v, mask=(rows < ROWS)[:, None] & (ow < WP)[None, :])


def _padded_shape(x: torch.Tensor, pad: int) -> tuple[int, int, int, int]:
    N, C, H, W = x.shape
    return N, C + 1, H + 2 * pad, W + 2 * pad


def _pad_launch(x: torch.Tensor, xp: torch.Tensor, pad: int
                ) -> tuple[tuple[int], tuple[Any, ...], dict[str, int]]:
    """``_pad_kernel``'s grid, arguments and constexprs for ``xp = padded_input(x, pad)``."""
    N, C, H, W = x.shape
    _, _, hp, wp = xp.shape
    rows = N * (C + 1) * hp
    block_w = min(256, next_pow2(wp))
    block_r = max(1, 2048 // block_w)
    return ((triton.cdiv(rows, block_r),), (x, xp, rows, C, H, W, pad, hp, wp, *x.stride()),
            {"BLOCK_R": block_r, "BLOCK_W": block_w, "num_warps": 4})


def padded_input(x: torch.Tensor, pad: int) -> torch.Tensor:
    """``x`` with ``pad`` zeros around every image and one zero channel after the last, as a
    contiguous (N, C + 1, H + 2 * pad, W + 2 * pad) tensor: the input ``PADDED=1`` gathers
    from, made at every launch (it is part of the timed work; one kernel, where torch's pad is
    a fill and a copy). In it no window leaves its image, and every window's origin has a zero
    pixel in the last channel, where the taps past the reduction's end point."""
    xp = torch.empty(_padded_shape(x, pad), dtype=x.dtype, device=x.device)
    grid, args, meta = _pad_launch(x, xp, pad)
    _pad_kernel[grid](*args, **meta)
    return xp


def packed_filter(w: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """The filter as one row of K output channels per tap, in the layout's reduction order,
    with zero rows up to a multiple of RED_ALIGN taps (contiguous, so that each BLOCK_K slice
    loads as whole rows). Packed once per filter tensor and kept while the tensor lives and is
    not modified (its version counter is part of the key), as weights are packed for a
    library; a tensor without a version counter (inference mode) is packed at every launch."""
    try:
        key: tuple[Any, ...] | None = (w._version, w.data_ptr(), tuple(w.shape), w.stride(),
                                       w.dtype, w.device, channels_last)
    except RuntimeError:  # inference tensors track no version
        key = None
    hit = _PACKED.get(id(w)) if key is not None else None
    if hit is not None and hit[0] == key:
        return hit[1]
    rows = _filter_rows(w, channels_last)
    k_out, red = rows.shape
    packed = w.new_zeros((_round_up(red, RED_ALIGN), k_out))
    packed[:red] = rows.t()
    if key is not None:
        if hit is None:
            weakref.finalize(w, _PACKED.pop, id(w), None)
        _PACKED[id(w)] = (key, packed)
    return packed


def tap_offsets(C: int, R: int, S: int, dil: int, strides: tuple[int, ...],
                channels_last: bool) -> list[int]:
    """Each tap's offset from its window's origin in an input of ``strides`` (channel, row,
    column), in the layout's reduction order ((c, r, s) for NCHW, (r, s, c) for NHWC), then
    the zero channel's origin pixel (channel C) up to a multiple of RED_ALIGN taps."""
    sc, sh, sw = strides
    if channels_last:
        taps = [c * sc + r * dil * sh + s * dil * sw
                for r in range(R) for s in range(S) for c in range(C)]
    else:
        taps = [c * sc + r * dil * sh + s * dil * sw
                for c in range(C) for r in range(R) for s in range(S)]
    return taps + [C * sc] * (_round_up(len(taps), RED_ALIGN) - len(taps))


def _tap_table(g: Geometry, xp: torch.Tensor, channels_last: bool) -> torch.Tensor:
    key = (g.C, g.R, g.S, g.dil, xp.stride()[1:], channels_last, xp.device)
    table = _TAPS.get(key)
    if table is None:
        if len(_TAPS) >= 64:
            _TAPS.clear()
        table = torch.tensor(tap_offsets(g.C, g.R, g.S, g.dil, xp.stride()[1:], channels_last),
                             dtype=torch.int32, device=xp.device)
        _TAPS[key] = table
    return table


def _padded_args(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, g: Geometry,
                 channels_last: bool, compiling: bool = False) -> tuple[Any, ...]:
    """``_conv2d_padded_kernel``'s arguments: the padded input, the packed filter and the tap
    table made (``compiling``: empty tensors of their shapes and dtypes, nothing launched)."""
    if compiling:
        xp = torch.empty(_padded_shape(x, g.pad), dtype=x.dtype, device=x.device)
        packed = torch.empty((_round_up(g.K_RED, RED_ALIGN), g.K), dtype=w.dtype,
                             device=w.device)
        taps = torch.empty(packed.shape[0], dtype=torch.int32, device=x.device)
    else:
        xp = padded_input(x, g.pad)
        packed = packed_filter(w, channels_last)
        taps = _tap_table(g, xp, channels_last)
    sn, _, sh, sw = xp.stride()
    return (xp, packed, taps, out, g.M, g.K, g.P, g.Q, g.stride, sn, sh, sw, *out.stride())


def _geometry_of(x: torch.Tensor, w: torch.Tensor, stride: int, pad: int,
                 dil: int) -> Geometry:
    (N, C, H, W), (K, _, R, S) = x.shape, w.shape
    return geometry({"N": N, "C": C, "H": H, "W": W, "K": K, "R": R, "S": S, "STRIDE": stride,
                     "PAD1": pad + 1, "DIL": dil})


def _meta(g: Geometry, config: KernelConfig, channels_last: bool) -> dict[str, int]:
    """The config's constexprs, the filter's (C, R, S: the reduction's decomposition by
    constants; each filter shape is a binary of its own) and the layout's; for ``PADDED=1``
    the reduction's length (its taps come from a table)."""
    meta = dict(config.meta)
    if meta.pop("PADDED", 0):
        return {**meta, "K_RED": g.K_RED}
    meta.pop("NSPLIT", None)
    return {**meta, "C": g.C, "R": g.R, "S": g.S, "CHANNELS_LAST": int(channels_last)}


def _grid(g: Geometry, meta: Mapping[str, int]) -> tuple[int]:
    columns = meta["BLOCK_N"] * meta.get("NSPLIT", 1)
    return (triton.cdiv(g.M, meta["BLOCK_M"]) * triton.cdiv(g.K, columns),)


def _kernel_and_args(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, stride: int, pad: int,
                     dil: int, config: KernelConfig, channels_last: bool, compiling: bool = False
                     ) -> tuple[Any, tuple[Any, ...], dict[str, int], tuple[int]]:
    g = _geometry_of(x, w, stride, pad, dil)
    meta = _meta(g, config, channels_last)
    if config.get("PADDED", 0):
        why = g.padded_problem()
        if why:
            raise ValueError(why)
        args = _padded_args(x, w, out, g, channels_last, compiling)
        return _conv2d_padded_kernel, args, meta, _grid(g, meta)
    return _conv2d_kernel, _args(x, w, out, g, channels_last), meta, _grid(g, meta)


def conv2d(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, stride: int, pad: int, dil: int,
           config: KernelConfig, channels_last: bool) -> None:
    """out = conv2d(x, w, stride=stride, padding=pad, dilation=dil) with the given launch
    config; x (N, C, H, W), w (K, C, R, S), out (N, K, P, Q) in any strides, the filter in
    the layout's memory format (contiguous for NCHW, channels-last for NHWC). With
    ``PADDED=1`` the launch first writes the padded input (``padded_input``) and packs the
    filter (once per filter tensor: ``packed_filter``)."""
    kernel, args, meta, grid = _kernel_and_args(x, w, out, stride, pad, dil, config,
                                                channels_last)
    kernel[grid](*args, **meta, num_warps=config.num_warps, num_stages=config.num_stages)


def compile_conv2d(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, stride: int, pad: int,
                   dil: int, config: KernelConfig, channels_last: bool) -> None:
    """Compile (or load from Triton's disk cache) without launching: with ``PADDED=1`` the
    padding kernel too, on empty operands of the launch's shapes (nothing runs)."""
    kernel, args, meta, grid = _kernel_and_args(x, w, out, stride, pad, dil, config,
                                                channels_last, compiling=True)
    if config.get("PADDED", 0):
        pad_grid, pad_args, pad_meta = _pad_launch(x, args[0], pad)
        _pad_kernel.warmup(*pad_args, **pad_meta, grid=pad_grid)
    kernel.warmup(*args, **meta, num_warps=config.num_warps, num_stages=config.num_stages,
                  grid=grid)


# -- the search space ---------------------------------------------------------------------------

def _columns(config: Mapping[str, int]) -> int:
    """Output channels a program computes: NSPLIT tiles of BLOCK_N (one without NSPLIT)."""
    return config["BLOCK_N"] * config.get("NSPLIT", 1)


def _shared_memory(config: KernelConfig, ctx: ProblemContext) -> str | None:
    # as a GEMM: each pipeline stage holds one gathered input tile and the filter tiles
    return tile_shared_memory(config["num_stages"], config["BLOCK_M"], _columns(config),
                              config["BLOCK_K"], ctx)


def _registers(config: KernelConfig, ctx: ProblemContext) -> str | None:
    """A thread's share of the accumulators and of the gathered input tile. Beside them it
    holds each of its rows' window position and pointer for the whole loop (the gather computes
    offsets per element: no copy engine), so this kernel spills long before matmul's limit:
    compiled for sm_90 (ptxas, AlexNet conv1 in fp16 and fp32, both gathers), every tile with
    128 accumulator registers a thread or 64 gathered elements spilled 1.6-4.7 KB of stack,
    and 128 x 128 x 16 with 8 warps (64 and 8) 16-624 B."""
    warps = 32 * config["num_warps"]
    acc = config["BLOCK_M"] * _columns(config) // warps
    gathered = config["BLOCK_M"] * config["BLOCK_K"] // warps
    if acc >= 128 or gathered >= 64:
        return (f"a thread would hold {acc} accumulator registers and {gathered} gathered "
                "input elements (128 or 64 spill: ptxas sm_90)")
    return None


def _variant(config: KernelConfig, ctx: ProblemContext) -> str | None:
    """NSPLIT > 1 is PADDED=1's; PADDED=1's offsets into its padded input are int32; the last
    of NSPLIT column tiles must hold an output channel."""
    if "PADDED" not in config:
        return None
    g = Geometry.of(ctx.shape)
    if config["NSPLIT"] > 1 and not config["PADDED"]:
        return "NSPLIT > 1 needs PADDED=1 (the masked gather computes one column tile)"
    if config["PADDED"] and g.padded_problem():
        return g.padded_problem()
    if (config["NSPLIT"] - 1) * config["BLOCK_N"] >= g.K:
        return (f"NSPLIT={config['NSPLIT']} tiles of BLOCK_N={config['BLOCK_N']}: the last "
                f"would start past the {g.K} output channels")
    return None


def _redundant_tile(config: KernelConfig, ctx: ProblemContext) -> str | None:
    """No tile larger than the (power-of-two padded) implicit GEMM needs: output pixels,
    output channels, filter taps (16 at least: ``tl.dot``'s smallest)."""
    g = Geometry.of(ctx.shape)
    for block, size, what in (("BLOCK_M", g.M, "output pixels"), ("BLOCK_N", g.K,
                              "output channels"), ("BLOCK_K", g.K_RED, "filter taps")):
        cap = max(16, next_pow2(size))
        if config[block] > cap:
            return f"{block}={config[block]} is larger than the {size} {what} need ({cap})"
    return None


# (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, GATHER_KM, warps, stages), from sm_90 compiles of AlexNet
# conv1 (ptxas, no GPU run yet): the fewest loop instructions per multiply-add without large
# spills. 16-bit: tensor-core tiles whose gather dominates the loop (128 wide in N: AlexNet's 96
# output channels in one column tile, the input gathered once). fp32: IEEE products on the CUDA
# cores, where FFMA is 68-76% of the loop's instructions in these tiles. Small tiles last, for
# small problems.
_KNOWN_GOOD_16 = [
    (64, 128, 32, 8, 0, 8, 3), (128, 128, 16, 8, 0, 8, 3), (128, 128, 32, 8, 0, 8, 2),
    (64, 128, 16, 8, 0, 4, 3), (64, 128, 64, 8, 0, 8, 2), (128, 64, 32, 8, 0, 8, 3),
    (64, 128, 32, 8, 1, 8, 3), (64, 64, 16, 8, 0, 4, 3), (32, 64, 32, 8, 0, 2, 3),
]
_KNOWN_GOOD_32 = [
    (128, 128, 16, 8, 0, 8, 2), (64, 128, 32, 8, 0, 8, 2), (128, 128, 16, 8, 1, 8, 2),
    (128, 128, 32, 8, 0, 8, 2), (256, 64, 16, 8, 0, 8, 2), (128, 64, 16, 8, 0, 4, 2),
    (64, 128, 16, 8, 1, 4, 2), (64, 64, 32, 8, 0, 4, 2), (32, 64, 32, 8, 0, 2, 3),
]
_PARAMS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "GATHER_KM", "num_warps", "num_stages")
#: NCHW's configs add (PADDED, NSPLIT). fp32 first: PADDED=1 tiles whose K loop, compiled for
#: sm_90 (ptxas, AlexNet conv1), is 81-89% FFMA with no spill in it (the masked gather's best
#: on the H200, 128 x 32 x 16 with 2 warps: 50%, 86 spill loads a K step), most with NSPLIT=3
#: column tiles of 32 (AlexNet's 96 output channels from one gathered input tile, no padded
#: columns; 64 x 32 x 3 with 4 warps takes 128 registers, 4 programs an SM, 128 x 32 x 3 255);
#: then the masked gather's H200 best (1.588 ms) and its sm_90 known-good.
_KNOWN_GOOD_NCHW_32: list[tuple[int, ...]] = [
    (64, 32, 16, 8, 1, 4, 3, 1, 3), (128, 32, 16, 8, 1, 4, 3, 1, 3),
    (64, 32, 16, 8, 1, 2, 3, 1, 3), (32, 32, 16, 8, 1, 2, 3, 1, 3),
    (128, 32, 16, 8, 0, 2, 3, 1, 1), (256, 32, 16, 8, 1, 8, 3, 1, 3),
    (128, 16, 16, 8, 1, 4, 3, 1, 3), (64, 32, 32, 8, 1, 4, 3, 1, 3),
    (128, 64, 16, 8, 1, 8, 3, 1, 2), (64, 32, 16, 8, 1, 4, 3, 1, 1),
    (128, 32, 16, 8, 0, 2, 3, 0, 1), *[(*c, 0, 1) for c in _KNOWN_GOOD_32],
]
#: 16-bit: the masked gather's tiles first, as before (the prior ranks them), then unmasked
_KNOWN_GOOD_NCHW_16: list[tuple[int, ...]] = [
    *[(*c, 0, 1) for c in _KNOWN_GOOD_16],
    *[(*c, 1, 1) for c in _KNOWN_GOOD_16[:3]],
]
_PARAMS_NCHW = (*_PARAMS, "PADDED", "NSPLIT")

class Conv2dKernel:
    """conv2d in one layout: ``nchw`` (torch's default) or ``nhwc`` (channels_last tensors)."""

    dims = (
        Dim("N", 1, 4096, "images"),
        Dim("C", 1, 8192, "input channels"),
        Dim("H", 1, 16384, "input height"),
        Dim("W", 1, 16384, "input width"),
        Dim("K", 1, 8192, "output channels"),
        Dim("R", 1, 64, "filter height"),
        Dim("S", 1, 64, "filter width"),
        Dim("STRIDE", 1, 64, "stride, both axes"),
        Dim("PAD1", 1, 65, "padding + 1, both axes (PAD1=1: no padding; every dim is >= 1)"),
        Dim("DIL", 1, 3, "dilation, both axes (at most 3: the conformance suite's "
                         "7-per-dimension problem must have an output)"),
    )
    dtypes = ("float16", "bfloat16", "float32")
    # Triton's CPU interpreter computes bf16 tl.dot wrongly (silently).
    interpreter_unsupported_dtypes = ("bfloat16",)
    #: its compile hook builds the GPU binary from host tensors (``tuner.host_compile``)
    compiles_on_host = True
    #: one output tensor at one scale, not rows computed as units
    output_check = OutputCheck()

    def __init__(self, layout: str) -> None:
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
        self.layout = layout
        self.channels_last = layout == "nhwc"
        self.name = "conv2d_nhwc" if self.channels_last else "conv2d"
        self.ref = f"search_spaces.conv2d:{layout.upper()}"
        self.description = (f"2-D convolution, {layout.upper()} input and output "
                            f"({'channels_last' if self.channels_last else 'contiguous'} "
                            "tensors), as an implicit GEMM: output pixels x output channels "
                            "x filter taps, stride, padding (PAD1 = padding + 1), dilation; "
                            "fp32 accumulation, IEEE fp32 products (no TF32)")

    @property
    def version(self) -> str:
        # with the matmul code they reach (tile order, K loop, tile constraints)
        return builtin_version(self, _conv2d_kernel, _conv2d_padded_kernel, _pad_kernel)

    def space(self) -> SearchSpace:
        params = [
            Param.pow2("BLOCK_M", 16, 256),
            Param.pow2("BLOCK_N", 16, 256),
            Param.pow2("BLOCK_K", 16, 128),
            Param.ints("GROUP_M", (1, 8)),
            Param.ints("GATHER_KM", (0, 1)),
            Param.pow2("num_warps", 2, 8),
            Param.ints("num_stages", (1, 2, 3, 4)),
        ]
        if not self.channels_last:  # NHWC's space is as it was (its 16-bit tiles are met)
            params += [Param.ints("PADDED", (0, 1)), Param.ints("NSPLIT", (1, 2, 3, 4))]
        return SearchSpace(params=tuple(params),
                           constraints=(_variant, _shared_memory, _registers, _redundant_tile))

    def known_good_configs(self, shape: Mapping[str, int], dtype: str) -> list[KernelConfig]:
        names: tuple[str, ...]
        known: Sequence[tuple[int, ...]]
        if self.channels_last:
            names, known = _PARAMS, _KNOWN_GOOD_32 if dtype == "float32" else _KNOWN_GOOD_16
        else:
            names = _PARAMS_NCHW
            known = _KNOWN_GOOD_NCHW_32 if dtype == "float32" else _KNOWN_GOOD_NCHW_16
        return [KernelConfig(dict(zip(names, c, strict=True))) for c in known]

    def default_config(self, shape: Mapping[str, int], dtype: str) -> KernelConfig:
        """64 x 64 x 32 tiles, cut to small problems (never larger than the GEMM needs), the
        masked gather: runs on every shape and dtype, on any GPU with >= 100 KB of shared
        memory."""
        g = Geometry.of(shape)
        config = {"BLOCK_M": min(64, max(16, next_pow2(g.M))),
                  "BLOCK_N": min(64, max(16, next_pow2(g.K))),
                  "BLOCK_K": min(32, max(16, next_pow2(g.K_RED))), "GROUP_M": 8,
                  "GATHER_KM": 0, "num_warps": 4, "num_stages": 2}
        if not self.channels_last:
            config |= {"PADDED": 0, "NSPLIT": 1}
        return KernelConfig(config)

    def make_inputs(
        self, shape: Mapping[str, int], dtype: str, device: str, seed: int
    ) -> dict[str, Any]:
        g = geometry(shape)
        gen = torch.Generator(device=device).manual_seed(seed)
        dt = torch_dtype(dtype)
        fmt = torch.channels_last if self.channels_last else torch.contiguous_format
        x = torch.randn((g.N, g.C, g.H, g.W), generator=gen, device=device, dtype=torch.float32)
        # Scaled so that every output element is ~N(0, 1) whatever C * R * S is.
        w = torch.randn((g.K, g.C, g.R, g.S), generator=gen, device=device,
                        dtype=torch.float32) * g.K_RED ** -0.5
        out = torch.empty((g.N, g.K, g.P, g.Q), device=device, dtype=dt)
        return {"x": x.to(dt).contiguous(memory_format=fmt),
                "w": w.to(dt).contiguous(memory_format=fmt),
                "out": out.contiguous(memory_format=fmt),
                "stride": g.stride, "pad": g.pad, "dil": g.dil}

    def compile_shape(self, shape: Mapping[str, int], dtype: str) -> dict[str, int]:
        """A smaller problem compiled to the same binary: at most 17 images (N keeps its
        residue mod 16, 1 stays 1) and images of a few output rows and columns (H and W shrink
        by multiples of 16 x STRIDE: they and the output's P and Q keep their residues mod 16,
        and with them every stride and the pixel count; P and Q stay at least 2, and H and W
        are 1 only if they were). The filter, the channels, stride, padding and dilation are
        kept: they set the reduction."""
        g = Geometry.of(shape)
        small = dict(shape)
        residue = g.N % 16
        small["N"] = g.N if g.N <= 17 else residue + (16 if residue <= 1 else 0)
        for axis, taps in (("H", g.R), ("W", g.S)):
            small[axis] = _shrunk_side(shape[axis], g.dil * (taps - 1) + 1, g.pad, g.stride)
        return small

    def launch(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        conv2d(inputs["x"], inputs["w"], inputs["out"], inputs["stride"], inputs["pad"],
               inputs["dil"], config, self.channels_last)

    def compile(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        compile_conv2d(inputs["x"], inputs["w"], inputs["out"], inputs["stride"], inputs["pad"],
                       inputs["dil"], config, self.channels_last)

    def reference(self, inputs: dict[str, Any]) -> torch.Tensor:
        """torch's conv2d in float64 (on the inputs' device): exact beside any fp32 kernel, and
        no TF32 or reduced-precision algorithm whatever the backend's flags say."""
        x, w = inputs["x"].double().contiguous(), inputs["w"].double().contiguous()
        y = torch.nn.functional.conv2d(x, w, stride=inputs["stride"], padding=inputs["pad"],
                                       dilation=inputs["dil"])
        return y.float()

    def tolerance(self, dtype: str) -> Tolerance:
        # fp16/bf16: matmul's (exact products summed in fp32, one rounding to the dtype: rtol
        # 4u of the element, atol 2u of the output's largest |value|). fp32: IEEE products,
        # one sequential fp32 sum of C*R*S terms, against a float64 reference: the error is a
        # random walk of roundings, ~sqrt(C*R*S) x 2**-24 of the scale (1e-6 at 363 taps, 3e-5
        # at 200,704); atol 1e-4 of the scale covers that, and a TF32 product (2**-11 of each)
        # or a bias of 3 TF32 ulps is over it.
        return {"float16": Tolerance(1e-3, 2e-3), "bfloat16": Tolerance(8e-3, 1.6e-2),
                "float32": Tolerance(1e-4, 1e-5)}[dtype]

    def flops(self, shape: Mapping[str, int]) -> float:
        g = Geometry.of(shape)
        return 2.0 * g.M * g.K * g.K_RED

    def bytes(self, shape: Mapping[str, int], dtype: str) -> float:
        """The floor: the input, the filter and the output, each once."""
        g = Geometry.of(shape)
        elements = g.N * g.C * g.H * g.W + g.K * g.K_RED + g.M * g.K
        return float(element_bytes(dtype) * max(0, elements))

    def baseline(self, inputs: dict[str, Any]) -> torch.Tensor:
        """torch's conv2d (cuDNN) on the same tensors, in their dtype and memory format
        (channels_last for NHWC); fp32 with TF32 off, as this kernel computes it."""
        x = inputs["x"]
        allowed = torch.backends.cudnn.allow_tf32
        torch.backends.cudnn.allow_tf32 = allowed and x.dtype != torch.float32
        try:
            return torch.nn.functional.conv2d(x, inputs["w"], stride=inputs["stride"],
                                              padding=inputs["pad"], dilation=inputs["dil"])
        finally:  # the process's setting, as it was
            torch.backends.cudnn.allow_tf32 = allowed

    def prior(self, config: KernelConfig, ctx: ProblemContext) -> float | None:
        """fp16/bf16: matmul's analytic cost model on the implicit GEMM (M = output pixels,
        N = output channels, K = filter taps): waves, occupancy, shared memory and L2 traffic
        per tile rank tile shapes as they do for a tensor-core GEMM (it does not see the
        gather; its top configs for AlexNet conv1 are the 128 x 128 x 16-32 tiles with 8 warps
        that sm_90 compiles also favour; a program's NSPLIT column tiles count as one tile
        NSPLIT times as wide). fp32: None; its IEEE products run on the CUDA cores, which the
        model does not describe (it ranked the tiles with the densest FFMA loops 145th-745th of
        2,420)."""
        from search_spaces.gemm import prior as cost_model  # here: measuring children never rank

        g = Geometry.of(ctx.shape)
        if g.problem() or ctx.dtype == "float32":
            return None
        gemm = ProblemContext({"M": g.M, "N": g.K, "K": g.K_RED}, ctx.dtype, ctx.smem_limit,
                              ctx.sm_count)
        if config.get("NSPLIT", 1) > 1:
            config = KernelConfig({**config, "BLOCK_N": _columns(config)})
        return cost_model.estimate(config, gemm)


NCHW = Conv2dKernel("nchw")
NHWC = Conv2dKernel("nhwc")
#: both layouts, by their registered names
KERNELS = {k.name: k for k in (NCHW, NHWC)}
