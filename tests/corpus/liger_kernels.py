"""Liger-Kernel (``liger-kernel``, import ``liger_kernel``) kernels, tuned via ``tuner.Kernel``.

liger_kernel imports on a machine without a GPU as it is (under ``TRITON_INTERPRET=1``).

Lines each adaptation took (non-blank lines of its ``tuner.Kernel(...)`` call and of the
make_inputs and reference helpers it uses, as formatted here), and what it exercises:

- ``liger_swiglu_mlp_fwd``: ``ops/mlp.py`` ``_swiglu_kernel_forward``, 32 lines (29 of them
  shared with the inference kernel). Host tensor descriptors whose block shapes each config's
  ``pre_hook`` sets; ``tl.dot``; 3 outputs: descriptors over strided views of one tensor.
- ``liger_swiglu_mlp_fwd_inference``: ``ops/mlp.py`` ``_swiglu_kernel_forward_inference``, 5
  lines of its own (34 with the shared ones). The same with one output.
- ``liger_swiglu_mlp_bwd_dI``: ``ops/mlp.py`` ``_swiglu_kernel_backward_dI``, 28 lines. Two
  products into one accumulator; descriptors over strided views.

- ``liger_moe_up_proj_swiglu``: ``ops/fused_moe_kernels.py`` ``_fused_up_proj_swiglu_kernel``,
  39 lines. The library keeps ``BLOCK_M`` out of its autotune list because "tile_row_start/
tile_expert and the grid dim-0 (num_m_tiles) must be recomputed for every candidate value":
exactly what ``prepare`` is for, so the adapter tunes ``BLOCK_M`` too and ``prepare`` runs the
library's routing kernels for each config. But no kernel argument carries the number of
M-tiles, so the grid must read ``tile_row_start_ptr.shape[0]``: Triton's GPU launcher passes
a grid the real tensors, its CPU interpreter pointers (``IndexError: list index out of
range``); it was blocked until ``tuner.Kernel`` called the grid with the values ``make_inputs``
and ``prepare`` gave, tensors as tensors. On an H100 (torch 2.11, Triton 3.6) the same
adapter verifies against its reference in fp16 and fp32 at T=8192, H=4096, I=1408, E=64,
K=8 with BLOCK_M 32, 64 and 128, as every kernel here does at its first GPU shape.

Left out: ``ops/dyt.py``'s kernels call ``libdevice.tanh``, which Triton's interpreter does not
run (``'NoneType' object has no attribute 'dtype'``); ``_token_gather_weighted_sum_kernel``
(grid ``(T,)``, ``T`` no argument; adaptable now, not yet written); ``ops/grpo_loss.py``'s
autotune is commented out; ``experimental/mm_int8int2.py`` multiplies int8 by packed int2 and
this project names no integer dtype (``tuner/dtypes.py``: float16, bfloat16, float32,
float8_e4m3fn).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
import triton
from liger_kernel.ops.fused_moe import compute_routing_metadata
from liger_kernel.ops.fused_moe_kernels import _fused_up_proj_swiglu_kernel
from liger_kernel.ops.mlp import (
    _swiglu_kernel_backward_dI,
    _swiglu_kernel_forward,
    _swiglu_kernel_forward_inference,
    get_bucket_m,
)
from triton.tools.tensor_descriptor import TensorDescriptor

import tuner
from tests.corpus import catalogue, generator, randn
from tuner.config import KernelConfig

Args = dict[str, Any]
Shape = dict[str, int]


# -- SwiGLU MLP (B sequences of S tokens, width dim, MLP width hidden), host tensor descriptors --

#: the MLP problem's dimensions, and its flops: two [B S, dim] x [dim, hidden] products
_MLP_DIMS = {"B": (1, 1024), "S": (1, 1 << 20), "dim": (16, 1 << 16), "hidden": (16, 1 << 17)}


def _mlp_flops(s: Shape) -> float:
    return 4.0 * s["B"] * s["S"] * s["dim"] * s["hidden"]


def _descriptors(**tensors: torch.Tensor) -> Args:
    """``desc_<name>`` for each tensor, block shape 1s (each config's pre_hook sets it), as the
    library's launcher makes them."""
    return {f"desc_{k}": TensorDescriptor.from_tensor(t, [1] * t.dim())
            for k, t in tensors.items()}


# forward: A = silu(x Wg^T) * (x Wu^T), and in training G = x Wg^T, U = x Wu^T beside it

def _swiglu_mlp_inputs(shape: Shape, dtype: str, device: str, seed: int,
                       training: bool = True) -> Args:
    gen, (B, S, dim, hidden) = generator(device, seed), (shape[k] for k in _MLP_DIMS)
    x = randn(gen, B, S, dim, dtype=dtype, device=device)
    wg, wu = (randn(gen, hidden, dim, dtype=dtype, device=device, scale=dim ** -0.5)
              for _ in range(2))
    agu = torch.empty(B, S, (3 if training else 1) * hidden, dtype=x.dtype, device=device)
    outs = dict(zip("AGU", agu.split(hidden, -1), strict=False))  # the library's views
    return {**_descriptors(input=x, Wg=wg, Wu=wu, **outs), "S": S, "dim": dim,
            "hidden_dim": hidden, "bucket_M": get_bucket_m(B * S), "gate_multiplier": 1.0}


def _swiglu_mlp_reference(a: Args) -> Any:
    x, wg, wu = (a[f"desc_{k}"].base.float() for k in ("input", "Wg", "Wu"))
    g, u = x @ wg.T, x @ wu.T
    return (F.silu(g) * u, g, u) if "desc_G" in a else F.silu(g) * u


_SWIGLU_MLP_FWD = {
    "reference": _swiglu_mlp_reference, "dims": _MLP_DIMS, "flops": _mlp_flops,
    "interpreter_unsupported_dtypes": ("bfloat16",),
    "grid": lambda m: (triton.cdiv(m["S"], m["BLOCK_M"]) * triton.cdiv(
        m["hidden_dim"], m["BLOCK_N"]), m["desc_input"].shape[0]),
    "problem": lambda a: {"B": a["desc_input"].shape[0], "S": a["S"], "dim": a["dim"],
                          "hidden": a["hidden_dim"]}}

SWIGLU_MLP_FWD = tuner.Kernel(
    _swiglu_kernel_forward, name="liger_swiglu_mlp_fwd", make_inputs=_swiglu_mlp_inputs,
    outputs=["desc_A", "desc_G", "desc_U"], **_SWIGLU_MLP_FWD)

SWIGLU_MLP_FWD_INFERENCE = tuner.Kernel(
    _swiglu_kernel_forward_inference, name="liger_swiglu_mlp_fwd_inference",
    make_inputs=lambda shape, dtype, device, seed: _swiglu_mlp_inputs(
        shape, dtype, device, seed, training=False),
    outputs=["desc_A"], **_SWIGLU_MLP_FWD)


# backward: dI = dG Wg + dU Wu, dG and dU views of one [B, S, 3 hidden] tensor

def _swiglu_mlp_dI_inputs(shape: Shape, dtype: str, device: str, seed: int) -> Args:
    gen, (B, S, dim, hidden) = generator(device, seed), (shape[k] for k in _MLP_DIMS)
    agu = randn(gen, B, S, 3 * hidden, dtype=dtype, device=device)
    dG, dU = agu[..., hidden:2 * hidden], agu[..., 2 * hidden:]  # the library's views
    wg, wu = (randn(gen, hidden, dim, dtype=dtype, device=device, scale=hidden ** -0.5)
              for _ in range(2))
    dI = torch.empty(B, S, dim, dtype=agu.dtype, device=device)
    return {**_descriptors(dG=dG, Wg=wg, dU=dU, Wu=wu, dI=dI), "S": S, "dim": dim,
            "hidden_dim": hidden, "bucket_M": get_bucket_m(B * S)}


def _swiglu_mlp_dI_reference(a: Args) -> torch.Tensor:
    dG, wg, dU, wu = (a[f"desc_{k}"].base.float() for k in ("dG", "Wg", "dU", "Wu"))
    return dG @ wg + dU @ wu


SWIGLU_MLP_BWD_DI = tuner.Kernel(
    _swiglu_kernel_backward_dI, name="liger_swiglu_mlp_bwd_dI",
    make_inputs=_swiglu_mlp_dI_inputs, reference=_swiglu_mlp_dI_reference, outputs=["desc_dI"],
    grid=lambda m: (triton.cdiv(m["S"], m["BLOCK_M"]) * triton.cdiv(m["dim"], m["BLOCK_N"]),
                    m["desc_dG"].shape[0]),
    problem=lambda a: {"B": a["desc_dG"].shape[0], "S": a["S"], "dim": a["dim"],
                       "hidden": a["hidden_dim"]},
    dims=_MLP_DIMS, flops=_mlp_flops, interpreter_unsupported_dtypes=("bfloat16",))


# -- fused MoE: gather tokens by expert, grouped GEMM with the gate/up weights, SwiGLU --------

def _moe_inputs(shape: Shape, dtype: str, device: str, seed: int) -> Args:
    gen, (T, H, N, E, K) = generator(device, seed), (shape[k] for k in "THIEK")  # N: I
    x = randn(gen, T, H, dtype=dtype, device=device)
    w = randn(gen, E, 2 * N, H, dtype=dtype, device=device, scale=H ** -0.5)
    topk = torch.rand(T, E, generator=gen, device=device).argsort(-1)[:, :K].int()
    return {"x_ptr": x, "gate_up_proj_ptr": w, "topk": topk, "E": E,
            "pre_act_ptr": torch.empty(T * K, 2 * N, dtype=x.dtype, device=device),
            "post_act_ptr": torch.empty(T * K, N, dtype=x.dtype, device=device),
            "H_dim": H, "I_dim": N, "stride_x_T": H, "stride_x_H": 1, "stride_w_E": 2 * N * H,
            "stride_w_N": H, "stride_w_K": 1, "stride_pre_TK": 2 * N, "stride_pre_N": 1,
            "stride_post_TK": N, "stride_post_N": 1}


def _moe_routing(config: KernelConfig, a: Args) -> Args:
    """The routing metadata for the config's BLOCK_M (the library's own three kernels)."""
    _, start, gather, _, _, row_start, expert = compute_routing_metadata(
        a["topk"], a["E"], config["BLOCK_M"])
    return {"x_gather_idx_ptr": gather, "expert_start_ptr": start,
            "tile_row_start_ptr": row_start, "tile_expert_ptr": expert}


def _moe_reference(a: Args) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows sorted by expert, stably (the order the routing kernels give)."""
    x, w, flat = a["x_ptr"].float(), a["gate_up_proj_ptr"].float(), a["topk"].flatten().long()
    order = flat.argsort(stable=True)
    rows, experts = x[order // a["topk"].shape[1]], flat[order]
    pre = x.new_empty(len(order), w.shape[1])
    for e in experts.unique().tolist():
        pre[experts == e] = rows[experts == e] @ w[e].T
    return pre, F.silu(pre[:, :a["I_dim"]]) * pre[:, a["I_dim"]:]


def _moe_up_proj() -> tuner.Kernel:
    lib = _fused_up_proj_swiglu_kernel
    return tuner.Kernel(
        lib, name="liger_moe_up_proj_swiglu", make_inputs=_moe_inputs, prepare=_moe_routing,
        reference=_moe_reference, outputs=["pre_act_ptr", "post_act_ptr"],
        configs=[triton.Config({**c.kwargs, "BLOCK_M": 64}, num_warps=c.num_warps,
                               num_stages=c.num_stages) for c in lib.configs],
        grid=lambda m: (m["tile_row_start_ptr"].shape[0], triton.cdiv(m["I_dim"], m["BLOCK_N"])),
        dims={"T": 1 << 20, "H": 1 << 16, "I": 1 << 16, "E": 1024, "K": 64},
        problem=lambda a: {"T": a["x_ptr"].shape[0], "H": a["H_dim"], "I": a["I_dim"],
                           "E": a["gate_up_proj_ptr"].shape[0],
                           "K": a["pre_act_ptr"].shape[0] // a["x_ptr"].shape[0]},
        interpreter_unsupported_dtypes=("bfloat16",))


MOE_UP_PROJ = _moe_up_proj()

KERNELS = catalogue(__name__, SWIGLU_MLP_FWD=SWIGLU_MLP_FWD,
                    SWIGLU_MLP_FWD_INFERENCE=SWIGLU_MLP_FWD_INFERENCE,
                    SWIGLU_MLP_BWD_DI=SWIGLU_MLP_BWD_DI, MOE_UP_PROJ=MOE_UP_PROJ)


SHAPES: dict[str, Shape] = {
    "liger_swiglu_mlp_fwd": {"B": 2, "S": 9, "dim": 40, "hidden": 24},
    "liger_swiglu_mlp_fwd_inference": {"B": 2, "S": 9, "dim": 40, "hidden": 24},
    "liger_swiglu_mlp_bwd_dI": {"B": 2, "S": 9, "dim": 40, "hidden": 24},
    "liger_moe_up_proj_swiglu": {"T": 9, "H": 32, "I": 24, "E": 4, "K": 2},
}

#: realistic sizes: 8,192 tokens, hidden sizes of 7B/8B-class models, Mixtral/Qwen-MoE experts
GPU_SHAPES: dict[str, list[Shape]] = {
    "liger_swiglu_mlp_fwd": [{"B": 4, "S": 2048, "dim": 4096, "hidden": 11008},
                             {"B": 1, "S": 8192, "dim": 4096, "hidden": 14336}],
    "liger_swiglu_mlp_fwd_inference": [{"B": 4, "S": 2048, "dim": 4096, "hidden": 11008},
                                       {"B": 1, "S": 8192, "dim": 4096, "hidden": 14336}],
    "liger_swiglu_mlp_bwd_dI": [{"B": 4, "S": 2048, "dim": 4096, "hidden": 11008},
                                {"B": 1, "S": 8192, "dim": 4096, "hidden": 14336}],
    "liger_moe_up_proj_swiglu": [{"T": 8192, "H": 4096, "I": 1408, "E": 64, "K": 8},
                                 {"T": 4096, "H": 4096, "I": 14336, "E": 8, "K": 2}],
}
