"""out = gelu(x + bias), the fused epilogue of a linear layer: a user's kernel, tuned through
``TUNER_KERNELS=bias_gelu:KERNEL`` (with this folder on ``PYTHONPATH``).

Written the way a model's code writes it. Adapting its ``@triton.autotune`` version took the
decorator's name and the ``KERNEL`` description at the end; there is no reference function:
the tuner compares every config's output with the first config's.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import tuner

CONFIGS = [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=warps, num_stages=1)
           for bm, bn, warps in ((1, 1024, 4), (4, 512, 4), (8, 256, 4), (16, 128, 4),
                                 (8, 512, 8), (32, 128, 8))]


@tuner.autotune(configs=CONFIGS, key=["M", "N"], name="bias_gelu")
@triton.jit
def bias_gelu_kernel(x_ptr, b_ptr, out_ptr, M, N, stride_x, stride_out,
                     BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """GELU (tanh approximation) of x + bias over one BLOCK_M x BLOCK_N tile."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < M) & (cols[None, :] < N)
    x = tl.load(x_ptr + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
    b = tl.load(b_ptr + cols, mask=cols < N, other=0.0)
    h = x.to(tl.float32) + b.to(tl.float32)[None, :]
    inner = 0.7978845608028654 * (h + 0.044715 * h * h * h)
    tanh = 2.0 * tl.sigmoid(2.0 * inner) - 1.0
    y = 0.5 * h * (1.0 + tanh)
    tl.store(out_ptr + rows[:, None] * stride_out + cols[None, :],
             y.to(out_ptr.dtype.element_ty), mask=mask)


def grid(meta):
    return (triton.cdiv(meta["M"], meta["BLOCK_M"]), triton.cdiv(meta["N"], meta["BLOCK_N"]))


def bias_gelu(x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The launcher the model calls (unchanged by the adaptation)."""
    M, N = x.shape
    out = torch.empty_like(x)
    bias_gelu_kernel[grid](x, bias, out, M, N, x.stride(0), out.stride(0))
    return out


# -- what the tuner needs: how to make arguments for a shape -----------------------------------

def make_inputs(shape, dtype, device, seed):
    gen = torch.Generator(device=device).manual_seed(seed)
    M, N = shape["M"], shape["N"]
    x = (2.0 * torch.randn(M, N, generator=gen, device=device)).to(getattr(torch, dtype))
    b = torch.randn(N, generator=gen, device=device).to(getattr(torch, dtype))
    return {"x_ptr": x, "b_ptr": b, "out_ptr": torch.empty_like(x), "M": M, "N": N,
            "stride_x": x.stride(0), "stride_out": x.stride(0)}


KERNEL = tuner.Kernel(
    bias_gelu_kernel, grid=grid, make_inputs=make_inputs,
    dims={"M": (1, 1 << 20), "N": (1, 1 << 18)},
    bytes=lambda s, dtype: (2 * s["M"] * s["N"] + s["N"]) * (4 if dtype == "float32" else 2),
    flops=lambda s: 12.0 * s["M"] * s["N"],
)
