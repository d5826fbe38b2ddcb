"""``verification.compare``'s pass, in two passes over the output and its reference on the GPU.

The comparison of ``tuner/verification.py`` is some 25 whole-tensor torch ops (fp32 copies,
masks, a float64 copy of the allowances): on an H200, 40 ms for softmax 8192x50257's output
(411 M elements; the kernel itself runs 0.57 ms), paid by every config a search verifies. Its
floor is reading the output and the reference: 2.5 GB there, ~0.6 ms at the copy bandwidth.

``clearly_passes`` reads both twice (the groups' scales, then every element's error and the
groups' sums in float64) and says whether the output passes with room: every element within
``1 - MARGIN`` of its allowance, every group's error sum and declared row sum within ``1 -
MARGIN`` of its bound. Only then does ``compare`` take its answer (the largest absolute error,
the same number the torch ops give: the same fp32 subtraction). Anything else (an element
over or near its allowance, a NaN, a bias near its bound) goes to the torch ops, which decide
and explain exactly as before: the two differ only in the order of float64 sums and in a
fused multiply-add of an allowance, far inside the margin, so the fused pass can only hand
over to the exact path, never pass what it fails.

Used for outputs on the GPU of at least ``FUSED_MIN_ELEMENTS``; smaller ones compare in
about a millisecond as they are. The two kernels are compiled once per pair of dtypes (the
lengths are not specialised on), 0.5-2 s on an H200 host with an empty Triton cache: the
measuring child starts that compile for its task's dtype against an fp32 reference in a
thread at the task's setup (``warm_async``), while the first configs compile in the pool,
and waits for it before a batch (``wait_warm``), so that no timing shares the host with it.
"""

from __future__ import annotations

import logging
import os
import threading

import torch
import triton
import triton.language as tl

log = logging.getLogger(__name__)

#: outputs this large (elements) on the GPU are checked by the fused pass first
FUSED_MIN_ELEMENTS = int(os.environ.get("TUNER_FUSED_CHECK_MIN_ELEMENTS", str(1 << 24)))
#: how far inside its bound every element and sum must be for the fused pass to say "passes"
MARGIN = 1e-5
#: dtypes the fused pass reads (anything else is compared by the torch ops)
DTYPES = (torch.float16, torch.bfloat16, torch.float32)
#: elements of a group one program reads (the inner loop's block is BLOCK)
CHUNK = 8192
BLOCK = 1024


@triton.jit(do_not_specialize=["n", "chunks"])
def _scale_pass(ref_ptr, part_ptr, n, chunks, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """Each (group, chunk): the largest |ref| over its finite elements."""
    pid = tl.program_id(0)
    group = pid // chunks
    start = (pid % chunks) * CHUNK
    base = group.to(tl.int64) * n
    top = tl.zeros([BLOCK], dtype=tl.float32)
    for off in range(0, CHUNK, BLOCK):
        idx = start + off + tl.arange(0, BLOCK)
        inside = idx < n
        r = tl.abs(tl.load(ref_ptr + base + idx, mask=inside, other=0.0).to(tl.float32))
        top = tl.maximum(top, tl.where(r < float("inf"), r, 0.0))
    tl.store(part_ptr + pid, tl.max(top, axis=0))


@triton.jit(do_not_specialize=["n", "chunks"])
def _error_pass(got_ptr, ref_ptr, scale_ptr, over_ptr, worst_ptr, sums_ptr, n, chunks,
                atol, rtol, floor, normal, strict, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """Each (group, chunk): elements not clearly within their allowance (a NaN counts), the
    largest |error|, and in float64 the error sum, the allowances' squares, the directed
    rounding below the normal range and the output's sum (the torch ops' quantities)."""
    pid = tl.program_id(0)
    group = pid // chunks
    start = (pid % chunks) * CHUNK
    base = group.to(tl.int64) * n
    scale = tl.load(scale_ptr + group)
    over = tl.zeros([BLOCK], dtype=tl.int32)
    worst = tl.zeros([BLOCK], dtype=tl.float32)
    err_sum = tl.zeros([BLOCK], dtype=tl.float64)
    allowed_sq = tl.zeros([BLOCK], dtype=tl.float64)
    directed = tl.zeros([BLOCK], dtype=tl.float64)
    got_sum = tl.zeros([BLOCK], dtype=tl.float64)
    for off in range(0, CHUNK, BLOCK):
        idx = start + off + tl.arange(0, BLOCK)
        inside = idx < n
        r = tl.load(ref_ptr + base + idx, mask=inside, other=0.0).to(tl.float32)
        g = tl.load(got_ptr + base + idx, mask=inside, other=0.0).to(tl.float32)
        finite = tl.abs(r) < float("inf")
        r = tl.where(finite, r, 0.0)
        g = tl.where(finite, g, 0.0)
        e = g - r
        size = tl.abs(r)
        allowed = atol * scale + rtol * size + floor
        ae = tl.abs(e)
        over += (inside & ~(ae <= allowed * strict)).to(tl.int32)
        worst = tl.maximum(worst, tl.where(inside & (ae == ae), ae, 0.0))
        err_sum += tl.where(inside, e, 0.0).to(tl.float64)
        a64 = allowed.to(tl.float64)
        allowed_sq += tl.where(inside, a64 * a64, 0.0)
        directed += tl.where(inside & (size < normal), tl.minimum(size, floor), 0.0).to(tl.float64)
        got_sum += tl.where(inside, g, 0.0).to(tl.float64)
    tl.store(over_ptr + pid, tl.sum(over, axis=0))
    tl.store(worst_ptr + pid, tl.max(worst, axis=0))
    at = 4 * pid.to(tl.int64)  # 4 sums a program: past 2**31 for 2**29 programs
    tl.store(sums_ptr + at, tl.sum(err_sum, axis=0))
    tl.store(sums_ptr + at + 1, tl.sum(allowed_sq, axis=0))
    tl.store(sums_ptr + at + 2, tl.sum(directed, axis=0))
    tl.store(sums_ptr + at + 3, tl.sum(got_sum, axis=0))


#: the warm-up threads started (by dtype pair), joined by ``wait_warm``
_warming: dict[tuple[torch.dtype, torch.dtype], threading.Thread] = {}


def warm_async(got_dtype: torch.dtype, ref_dtype: torch.dtype = torch.float32) -> None:
    """Compile (or load) the two kernels for this pair of dtypes in a thread of this process
    (once per pair): a tiny check on the current GPU."""
    key = (got_dtype, ref_dtype)
    if key in _warming or got_dtype not in DTYPES or ref_dtype not in DTYPES:
        return

    def warm() -> None:
        try:
            ref = torch.zeros(1, 16, dtype=ref_dtype, device="cuda")
            clearly_passes(ref.to(got_dtype), ref, 1, 1e-3, 1e-3, 0.0, 1e-30, None, _wait=False)
        except Exception:  # the check falls back to the torch ops; the log says why
            log.exception("compiling the fused output check for %s against %s", got_dtype,
                          ref_dtype)

    thread = threading.Thread(target=warm, name="warm-output-check", daemon=True)
    _warming[key] = thread
    thread.start()


def wait_warm() -> None:
    """Wait for the warm-ups started (a timing must not share the host with a compile)."""
    for thread in list(_warming.values()):
        thread.join()


def applies(got: torch.Tensor, ref: torch.Tensor) -> bool:
    """Whether ``compare`` checks this pair with the fused pass first: both on one GPU, of the
    same shape, dtypes it reads, and at least ``FUSED_MIN_ELEMENTS`` elements (under 2**31:
    int32 offsets within a group)."""
    return (got.is_cuda and ref.is_cuda and got.device == ref.device
            and got.shape == ref.shape and FUSED_MIN_ELEMENTS <= got.numel() < 2 ** 31
            and got.dtype in DTYPES and ref.dtype in DTYPES)


def clearly_passes(got: torch.Tensor, ref: torch.Tensor, groups: int, atol: float,
                   rtol: float, floor: float, normal: float,
                   row_sum: float | None, _wait: bool = True) -> float | None:
    """The largest |got - ref| where the output passes ``compare`` with room (module
    docstring), else None: the torch ops must decide. ``groups``: rows of the last dimension
    (a row-wise check) or 1; ``floor`` and ``normal``: the dtype's rounding floor and smallest
    normal number (``verification.rounding_floor``)."""
    if _wait:
        wait_warm()
    got, ref = got.contiguous().reshape(groups, -1), ref.contiguous().reshape(groups, -1)
    n = got.shape[1]
    chunks = triton.cdiv(n, CHUNK)
    grid = (groups * chunks,)
    parts = torch.empty(groups * chunks, dtype=torch.float32, device=got.device)
    _scale_pass[grid](ref, parts, n, chunks, CHUNK=CHUNK, BLOCK=BLOCK, num_warps=4)
    scale = parts.view(groups, chunks).amax(dim=1).contiguous()
    over = torch.empty(groups * chunks, dtype=torch.int32, device=got.device)
    worst = torch.empty(groups * chunks, dtype=torch.float32, device=got.device)
    sums = torch.empty(groups * chunks * 4, dtype=torch.float64, device=got.device)
    _error_pass[grid](got, ref, scale, over, worst, sums, n, chunks, atol, rtol, floor,
                      normal, 1.0 - MARGIN, CHUNK=CHUNK, BLOCK=BLOCK, num_warps=4)
    s = sums.view(groups, chunks, 4).sum(dim=1)
    bound = s[:, 1].sqrt() + s[:, 2]
    strict = (1.0 - MARGIN) * bound
    bad = (over.sum() > 0) | (s[:, 0].abs() > strict).any()
    if row_sum is not None:
        bad = bad | ((s[:, 3] - row_sum).abs() > strict).any()
    if bool(bad):
        return None
    return float(worst.max())
