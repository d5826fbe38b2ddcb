"""Comparing a kernel's output with its reference: the one check every measured config passes.

The old check, ``|got - ref| <= atol + rtol * |ref|`` with an absolute atol, was nearly vacuous
wherever outputs are small: a softmax row of 50,257 has elements of ~1e-6, so an output that
zeroed everything below 0.9 x atol passed. Here everything is measured against the reference's
own scale, per *group*: each row of the last dimension for a row-wise kernel
(``OutputCheck(rowwise=True)``), else the whole tensor.

1. ``scale`` = the largest ``|ref|`` of the group.
2. Every element: ``|e_i| <= s_i`` with ``e_i = got_i - ref_i`` and
   ``s_i = atol * scale + rtol * |ref_i| + floor`` (``Tolerance``; ``floor`` is half the dtype's
   smallest subnormal, the rounding error of an output below its normal range).
3. No bias: ``|sum e_i| <= sqrt(sum s_i^2) + sum d_i``. A correct output's errors are
   roundings to nearest (plus fp32 arithmetic orders of magnitude smaller): zero mean,
   independent, each within one unit roundoff u of its element, while tolerances are ~4u.
   Their sum's standard deviation is then at most ``sqrt(sum (s_i/4)^2 / 3)``: the bound is
   ~7 standard deviations away, and for a group of one it is the per-element bound. Below the
   dtype's normal range rounding is biased, though: the spacing is fixed (fp16: 6e-8) while
   values crowd towards 0 (most of a long softmax row's fp16 elements are such), so correct
   rounding lowers a row of 262,144 by ~6e-4 in all. ``d_i = min(|ref_i|, floor)`` for those
   elements (0 for the others) is the most that rounding can move each of them. A bias ``b``
   on every element gives ``N * b``, over the bound once ``b`` passes ``max s_i / sqrt(N)``
   and the floor: a bias of one ulp at the scale of a 50,257-element row is far over it
   though each element is within tolerance.
4. Declared invariants: ``OutputCheck.row_sum`` (softmax rows sum to 1):
   ``|sum got_i - row_sum|`` within the same allowance, on the output alone (a wrong
   reference cannot hide it).

Calibrated on an H200 (``bench/verification_calibration.py``): every built-in and example
kernel, each dtype, odd shapes and rows up to 262,144, six configs and two seeds each: the
worst correct output used 0.24 of the per-element bound and 0.36 of the bias bound.
Round-toward-zero stores (the Triton interpreter's fp32 -> bf16) carry a bias of half an ulp
of every element, which long rows expose: the interpreter does not compute bf16 right.

Sums are taken in float64 (no summation error of their own). Everything is whole-tensor torch
ops: it runs on the GPU in the measuring child for every config; a large output on the GPU
is first checked by two fused passes (``tuner/verification_fused.py``), whose "passes with
room" is taken, and whose anything else is decided here. Errors name the row and say
how far off it is in ulps of the dtype at the row's scale.
"""

from __future__ import annotations

import logging
import math

import torch

from tuner import dtypes
from tuner.kernel import OutputCheck, Tolerance

log = logging.getLogger(__name__)


def torch_dtype(dtype: str) -> torch.dtype:
    """The dtype's torch dtype (an unknown name is compared as float32)."""
    return dtypes.torch_dtype(dtype) if dtype in dtypes.ELEMENT_BYTES else torch.float32


def rounding_floor(dtype: str) -> float:
    """Half the dtype's smallest subnormal: how far rounding moves an output below its normal
    range (fp16: 3e-8; bf16 and fp32: nothing an fp32 comparison can see)."""
    info = torch.finfo(torch_dtype(dtype))
    return float(info.smallest_normal) * float(info.eps) / 2


def ulp(value: float, dtype: str) -> float:
    """The spacing of the dtype's numbers at ``value`` (its ulp there)."""
    info = torch.finfo(torch_dtype(dtype))
    if not math.isfinite(value) or value <= float(info.smallest_normal):
        return float(info.smallest_normal) * float(info.eps)
    return 2.0 ** math.floor(math.log2(value)) * float(info.eps)


def _groups(t: torch.Tensor, rowwise: bool) -> torch.Tensor:
    """The tensor as (groups, elements): one row per row of the last dimension, or one row."""
    if rowwise and t.dim() >= 1:
        return t.reshape(-1, t.shape[-1]) if t.dim() > 1 else t.reshape(1, -1)
    return t.reshape(1, -1)


def _fused_applies(got: torch.Tensor, ref: torch.Tensor) -> bool:
    """Whether the fused pass checks this pair first (``verification_fused.applies``: a large
    output on the GPU; Triton is imported only then)."""
    if not got.is_cuda:
        return False
    from tuner import verification_fused as fused

    return fused.applies(got, ref)


def _fused_pass(got: torch.Tensor, ref: torch.Tensor, tol: Tolerance, dtype: str,
                check: OutputCheck) -> float | None:
    """``verification_fused.clearly_passes``, or None where it fails to run (the torch ops
    decide then; the log says why, once)."""
    from tuner import verification_fused as fused

    try:
        return fused.clearly_passes(
            got, ref, _group_count(got, check.rowwise), tol.atol, tol.rtol,
            rounding_floor(dtype), float(torch.finfo(torch_dtype(dtype)).smallest_normal),
            check.row_sum)
    except Exception:  # noqa: BLE001 - never a config's failure: the exact path decides
        if not _FUSED_FAILED:
            _FUSED_FAILED.append(True)
            log.exception("the fused output check failed; the torch ops check instead")
        return None


#: set once the fused pass failed in this process (logged once)
_FUSED_FAILED: list[bool] = []


def _group_count(t: torch.Tensor, rowwise: bool) -> int:
    """How many groups ``_groups`` makes of ``t``."""
    return t.numel() // t.shape[-1] if rowwise and t.dim() > 1 else 1


def compare(got: torch.Tensor, ref: torch.Tensor, tol: Tolerance, dtype: str,
            check: OutputCheck | None = None, label: str = "") -> str | float:
    """Why ``got`` is not ``ref`` (see the module docstring), else the largest absolute error.
    ``dtype`` is the output's dtype name; ``label`` prefixes every message."""
    check = check or OutputCheck()
    if got.shape != ref.shape:
        return f"{label}output shape {tuple(got.shape)} but the reference is {tuple(ref.shape)}"
    if got.numel() == 0:
        return 0.0
    if _fused_applies(got, ref):  # a large output: the fused pass first
        worst = _fused_pass(got, ref, tol, dtype, check)
        if worst is not None:
            return worst
    got, ref = got.float(), ref.float()
    finite = torch.isfinite(ref)
    bad_finite = ~torch.isfinite(got) & finite
    if bool(bad_finite.any()):
        count = int(bad_finite.sum())
        return f"{label}{count} output element(s) are NaN/Inf where the reference is finite"
    # elements whose reference is not finite are not compared
    g = _groups(torch.where(finite, got, 0.0), check.rowwise)
    r = _groups(torch.where(finite, ref, 0.0), check.rowwise)
    err = g - r
    size = r.abs()
    scale = size.amax(dim=1, keepdim=True)
    floor = rounding_floor(dtype)
    allowed = tol.atol * scale + tol.rtol * size + floor
    wrong = _elements(err, allowed, g, r, tol, check, label)
    if wrong:
        return wrong
    bound = _bias_bound(allowed, size, dtype, floor)
    wrong = (_bias(err, bound, scale, dtype, check, label)
             or _row_sums(g, bound, scale, dtype, check, label))
    return wrong or float(err.abs().max())


def _bias_bound(allowed: torch.Tensor, size: torch.Tensor, dtype: str,
                floor: float) -> torch.Tensor:
    """Per group, how far rounding can move the sum of a correct output: the random part
    (``sqrt(sum s_i^2)``) and the directed part below the normal range (module docstring)."""
    normal = float(torch.finfo(torch_dtype(dtype)).smallest_normal)
    directed = torch.where(size < normal, size.clamp_max(floor), 0.0)
    return allowed.double().square().sum(dim=1).sqrt() + directed.sum(dim=1, dtype=torch.float64)


def _where(group: int, index: int, shape: tuple[int, ...], check: OutputCheck) -> str:
    if check.rowwise and len(shape) > 1:
        return f"row {group}, column {index}"
    return f"flat index {index}"


def _elements(err: torch.Tensor, allowed: torch.Tensor, g: torch.Tensor, r: torch.Tensor,
              tol: Tolerance, check: OutputCheck, label: str) -> str | None:
    over = err.abs() > allowed
    if not bool(over.any()):
        return None
    ratio = err.abs() / allowed
    flat = int(torch.argmax(ratio))
    group, index = divmod(flat, r.shape[1])
    where = _where(group, index, tuple(r.shape), check)
    per = "row" if check.rowwise else "output"
    return (f"{label}{int(over.sum())} element(s) off the reference; worst at {where}: got "
            f"{g[group, index].item():.6g}, expected {r[group, index].item():.6g}, "
            f"{ratio[group, index].item():.3g}x the allowed {allowed[group, index].item():.3g} "
            f"(atol={tol.atol} x the {per}'s scale, rtol={tol.rtol})")


def _worst(excess: torch.Tensor, bound: torch.Tensor) -> tuple[int, float] | None:
    """The group whose |excess| is furthest over its bound, and by how much; None if none."""
    ratio = excess.abs() / bound.clamp_min(1e-300)
    over = excess.abs() > bound
    if not bool(over.any()):
        return None
    group = int(torch.argmax(torch.where(over, ratio, 0.0)))
    return group, float(ratio[group])


def _bias(err: torch.Tensor, bound: torch.Tensor, scale: torch.Tensor, dtype: str,
          check: OutputCheck, label: str) -> str | None:
    total = err.sum(dim=1, dtype=torch.float64)
    worst = _worst(total, bound)
    if worst is None:
        return None
    group, ratio = worst
    n = err.shape[1]
    mean, s = float(total[group]) / n, float(scale[group, 0])
    what = f"row {group}" if check.rowwise else "the output"
    return (f"{label}{what}: mean error {mean:+.2g} is {mean / ulp(s, dtype):+.2g} ulp of "
            f"{dtype} at the {'row' if check.rowwise else 'output'}'s scale {s:.2g}; rounding "
            f"allows a mean of {float(bound[group]) / n:.2g} over {n} element(s) ({ratio:.3g}x "
            "over): a bias, not rounding")


def _row_sums(g: torch.Tensor, bound: torch.Tensor, scale: torch.Tensor, dtype: str,
              check: OutputCheck, label: str) -> str | None:
    if check.row_sum is None:
        return None
    sums = g.sum(dim=1, dtype=torch.float64)
    worst = _worst(sums - check.row_sum, bound)
    if worst is None:
        return None
    group, ratio = worst
    s = float(scale[group, 0])
    what = f"row {group}" if check.rowwise else "the output"
    return (f"{label}{what} sums to {float(sums[group]):.8g}, not {check.row_sum:g}: "
            f"{float(sums[group]) - check.row_sum:+.2g} is {ratio:.3g}x what rounding allows "
            f"({float(bound[group]):.2g}; ulp of {dtype} at its scale {s:.2g}: "
            f"{ulp(s, dtype):.2g})")

