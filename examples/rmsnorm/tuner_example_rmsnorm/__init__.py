"""RMSNorm, y = x / sqrt(mean(x^2) + eps) * w, row by row: a user's kernel, tuned as a plugin.

Written the way a model's code writes it: a ``@triton.jit`` kernel under an autotune decorator
and a launcher. It was a ``@triton.autotune`` kernel; adapting it took the decorator's name
(``tuner.autotune(..., name="rmsnorm")``) and the ``KERNEL`` description at the end, which this
package registers through its ``tuner.kernels`` entry point (see pyproject.toml).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import tuner
from tuner.kernel import OutputCheck

CONFIGS = [triton.Config({"BLOCK_N": block, "ROWS": 1}, num_warps=warps, num_stages=2)
           for block in (1024, 2048, 4096) for warps in (4, 8)]
CONFIGS.append(triton.Config({"BLOCK_N": 1024, "ROWS": 2}, num_warps=4, num_stages=2))


@tuner.autotune(configs=CONFIGS, key=["M", "N"], name="rmsnorm")
@triton.jit
def rmsnorm_kernel(x_ptr, w_ptr, y_ptr, M, N, stride_x, stride_y, eps,
                   BLOCK_N: tl.constexpr, ROWS: tl.constexpr):
    """RMSNorm of ROWS rows per program, BLOCK_N columns at a time (two passes over a row)."""
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    for r in range(ROWS):
        row = pid * ROWS + r
        if row < M:
            acc = tl.zeros([BLOCK_N], dtype=tl.float32)
            for start in range(0, N, BLOCK_N):
                c = start + cols
                x = tl.load(x_ptr + row * stride_x + c, mask=c < N, other=0.0).to(tl.float32)
                acc += x * x
            rstd = 1.0 / tl.sqrt(tl.sum(acc, axis=0) / N + eps)
            for start in range(0, N, BLOCK_N):
                c = start + cols
                mask = c < N
                x = tl.load(x_ptr + row * stride_x + c, mask=mask, other=0.0).to(tl.float32)
                w = tl.load(w_ptr + c, mask=mask, other=0.0).to(tl.float32)
                y = x * rstd * w
                tl.store(y_ptr + row * stride_y + c, y.to(y_ptr.dtype.element_ty), mask=mask)


def grid(meta):
    return (triton.cdiv(meta["M"], meta["ROWS"]),)


def rmsnorm(x: torch.Tensor, w: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """The launcher the model calls (unchanged by the adaptation)."""
    M, N = x.shape
    y = torch.empty_like(x)
    rmsnorm_kernel[grid](x, w, y, M, N, x.stride(0), y.stride(0), eps)
    return y


# -- what the tuner needs: how to make arguments for a shape, and a reference -------------------

def make_inputs(shape, dtype, device, seed):
    gen = torch.Generator(device=device).manual_seed(seed)
    M, N = shape["M"], shape["N"]
    x = torch.randn(M, N, generator=gen, device=device).to(getattr(torch, dtype))
    w = (1.0 + 0.1 * torch.randn(N, generator=gen, device=device)).to(getattr(torch, dtype))
    return {"x_ptr": x, "w_ptr": w, "y_ptr": torch.empty_like(x), "M": M, "N": N,
            "stride_x": x.stride(0), "stride_y": x.stride(0), "eps": 1e-6}


def reference(args):
    x = args["x_ptr"].float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + args["eps"]) * args["w_ptr"].float()


KERNEL = tuner.Kernel(
    rmsnorm_kernel, grid=grid, make_inputs=make_inputs, reference=reference,
    outputs=["y_ptr"], dims={"M": (1, 1 << 20), "N": (1, 1 << 18)},
    output_check=OutputCheck(rowwise=True),  # each row is normalised on its own
    bytes=lambda s, dtype: (2 * s["M"] * s["N"] + s["N"]) * (4 if dtype == "float32" else 2),
    flops=lambda s: 4.0 * s["M"] * s["N"],
)
