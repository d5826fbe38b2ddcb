"""flash-linear-attention (``fla-core``, import ``fla``) kernels, tuned through ``tuner.Kernel``.

Importing fla on a machine without a GPU works as it is: ``fla.utils`` asks Triton's active
driver for its backend, which raises under ``TRITON_INTERPRET=1`` without CUDA, and falls back
to ``device = "cpu"`` with a ``UserWarning`` ("Triton is not supported on current platform,
roll back to CPU"). No environment variable and no edit of the library is needed.

Lines each adaptation took (non-blank lines of its ``tuner.Kernel(...)`` call and of the
make_inputs and reference helpers it uses, as formatted here), and what it exercises:

- ``fla_l2norm_fwd``: ``modules/norm/l2norm.py`` ``l2norm_fwd_kernel``, 14 lines (16 when
  every argument was spelled out): adapted by its launcher, ``l2norm_fwd(x)`` (``call=``). fla's
  ``CachedAutotuner`` (``fla_cache_autotune``); a key of constexprs (``D``, ``NB``);
  ``do_not_specialize=["T"]``; a grid that reads the config (``BT``); 2 outputs.
- ``fla_layer_norm_fwd``: ``modules/norm/layernorm.py`` ``layer_norm_fwd_kernel``, 18 lines
  (21 spelled out), by its launcher ``layer_norm_fwd``.
  Bool constexprs in the key (``HAS_RESIDUAL``, ...); residual in and out; 4 outputs.
- ``fla_swiglu_fwd``: ``modules/activations/ops.py`` ``swiglu_fwd_kernel``, 10 lines (12
  spelled out), by its launcher ``swiglu_fwd``. Inputs
  read through a row stride (the two halves of one tensor, as ``x.chunk(2, -1)`` gives).
- ``fla_rotary_fwd``: ``modules/rotary/ops.py`` ``rotary_embedding_kernel``, 24 lines. Configs
  without meta-parameters (``triton.Config({}, num_warps=w, num_stages=s)``); a 3-D grid.
- ``fla_qk_rmsnorm_fwd``: ``ops/cyfa/qk_norm.py`` ``_qk_rmsnorm_fwd_kernel``, 19 lines.
  ``CachedAutotuner``; bools in the key; 4 outputs.
- ``fla_grpo_fwd``: ``modules/grpo/ops.py`` ``grpo_fwd_kernel``, 24 lines. A loss over a
  vocabulary (online logsumexp); integer token ids; 2 outputs.

Spelled out (``make_inputs=``, ``grid=``), about half of each make_inputs is the library
launcher's work again: every kernel argument by name, the constexpr flags (``IS_VARLEN=False``,
``HAS_BIAS=True``, ...), block sizes derived from the shape (``BD``, ``NB``) and strides. With
``call=`` (the library's own launcher) and ``call_inputs=`` (its inputs), the launcher says all
of that itself: its launch is intercepted (``tuner.launching.capture_launch``) and its
arguments and grid are what the tuner launches with.

On an H100 (torch 2.11, Triton 3.6) each kernel's first config verifies against its reference
in fp16 and fp32 at its first GPU shape, and its arguments name that problem.

- ``fla_chunk_global_cumsum``: ``ops/utils/cumsum.py`` ``chunk_global_cumsum_scalar_kernel``,
  13 lines. ``triton.heuristics`` over ``triton.autotune``, as 203 of the 258 autotuned
  kernels a scan of fla-core 0.6.0's sources finds are; ``None`` arguments. It was blocked
  (``tuner.Kernel`` looked for the autotuner at the outermost object only) until the launch
  kept every heuristics layer and dropped only the autotuner (``tuner.launching.Chain``).

Not yet in the corpus, though nothing blocks them any more: plain autotuned kernels whose grid
needs a size no kernel argument carries (rows or batch: ``l2norm_fwd_kernel_row``,
``layer_norm_fwd_kernel_row``, ``softmax_fwd_kernel``, ``logcumsumexp_fwd_kernel``,
``chunk_hgrn_fwd_kernel_h``, ``fused_addcmul_fwd_kernel``): a grid now sees every value
``make_inputs`` returned, tensors as tensors, also on the interpreter.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
import triton
from fla.modules.activations.ops import swiglu_fwd, swiglu_fwd_kernel
from fla.modules.grpo.ops import grpo_fwd_kernel
from fla.modules.norm.l2norm import l2norm_fwd, l2norm_fwd_kernel
from fla.modules.norm.layernorm import layer_norm_fwd, layer_norm_fwd_kernel
from fla.modules.rotary.ops import rotary_embedding_kernel
from fla.ops.cyfa.qk_norm import _qk_rmsnorm_fwd_kernel
from fla.ops.utils.cumsum import chunk_global_cumsum_scalar_kernel
from fla.utils import get_multiprocessor_count

import tuner
from tests.corpus import catalogue, generator, randn
from tuner.kernel import OutputCheck

Args = dict[str, Any]
Shape = dict[str, int]
ROWWISE = OutputCheck(rowwise=True)
_F32 = torch.float32


# -- l2norm: y = x / ||x||, row by row (D <= 512: the library's blocked kernel) ---------------

def _rows(shape: Shape, dtype: str, device: str, seed: int) -> Args:
    """[T, D] random rows: what the norms' launchers take."""
    return {"x": randn(generator(device, seed), shape["T"], shape["D"], dtype=dtype,
                       device=device)}


def _l2norm_reference(a: Args) -> tuple[torch.Tensor, torch.Tensor]:
    x = a["x"].float()
    rstd = 1 / torch.sqrt(x.square().sum(-1) + a["eps"])
    return x * rstd[:, None], rstd


L2NORM_FWD = tuner.Kernel(
    l2norm_fwd_kernel, name="fla_l2norm_fwd", call=lambda a: l2norm_fwd(a["x"]),
    call_inputs=_rows, reference=_l2norm_reference, outputs=["y", "rstd"],
    output_check=ROWWISE, dims={"T": (1, 1 << 24), "D": (1, 512)},
    problem=lambda a: {"T": a["T"], "D": a["D"]},
    bytes=lambda s, dtype: 2 * s["T"] * s["D"] * (4 if dtype == "float32" else 2))


# -- layer norm of x + residual, with weight and bias; the sum is stored too -----------------

def _layer_norm_inputs(shape: Shape, dtype: str, device: str, seed: int) -> Args:
    gen, T, D = generator(device, seed), shape["T"], shape["D"]
    x, res = (randn(gen, T, D, dtype=dtype, device=device) for _ in range(2))
    w, b = (randn(gen, D, dtype=dtype, device=device) for _ in range(2))
    return {"x": x, "res": res, "w": w, "b": b}


def _layer_norm_reference(a: Args) -> tuple[torch.Tensor, ...]:
    h = a["x"].float() + a["res"].float()
    mean, rstd = h.mean(-1), torch.rsqrt(h.var(-1, unbiased=False) + a["eps"])
    y = (h - mean[:, None]) * rstd[:, None] * a["w"].float() + a["b"].float()
    return y, h, mean, rstd


LAYER_NORM_FWD = tuner.Kernel(
    layer_norm_fwd_kernel, name="fla_layer_norm_fwd", call_inputs=_layer_norm_inputs,
    call=lambda a: layer_norm_fwd(a["x"], a["w"], a["b"], residual=a["res"],
                                  residual_dtype=a["x"].dtype),
    reference=_layer_norm_reference, outputs=["y", "res_out", "mean", "rstd"],
    output_check=ROWWISE, dims={"T": (1, 1 << 24), "D": (1, 512)},
    problem=lambda a: {"T": a["T"], "D": a["D"]},
    bytes=lambda s, dtype: 4 * s["T"] * s["D"] * (4 if dtype == "float32" else 2))


# -- SwiGLU, z = silu(x) * y, x and y the two halves of one [N, 2D] tensor -------------------

def _swiglu_inputs(shape: Shape, dtype: str, device: str, seed: int) -> Args:
    x = randn(generator(device, seed), shape["N"], 2 * shape["D"], dtype=dtype, device=device)
    return dict(zip("xy", x.chunk(2, -1), strict=True))  # two halves of one tensor


SWIGLU_FWD = tuner.Kernel(
    swiglu_fwd_kernel, name="fla_swiglu_fwd", call_inputs=_swiglu_inputs,
    call=lambda a: swiglu_fwd(a["x"], a["y"]), outputs=["z"],
    reference=lambda a: F.silu(a["x"].float()) * a["y"].float(),
    dims={"N": (1, 1 << 24), "D": (1, 1 << 16)},
    problem=lambda a: {"N": a["T"] // a["D"], "D": a["D"]},
    bytes=lambda s, dtype: 3 * s["N"] * s["D"] * (4 if dtype == "float32" else 2))


# -- rotary embedding of [B, T, H, D] heads (the whole head rotated, halves not interleaved) --

def _rotary_inputs(shape: Shape, dtype: str, device: str, seed: int) -> Args:
    gen, (B, T, H, D) = generator(device, seed), (shape[k] for k in "BTHD")
    x = randn(gen, B, T, H, D, dtype=dtype, device=device)
    angle = 6.3 * torch.rand(T, D // 2, generator=gen, device=device)
    blocks = triton.cdiv(T, get_multiprocessor_count())  # the library's chunk of positions
    return {"x": x, "cos": angle.cos().to(x.dtype), "sin": angle.sin().to(x.dtype),
            "y": torch.empty_like(x), "cu_seqlens": None, "chunk_indices": None,
            "seq_offsets": 0, "T": T, "B": B, "H": H, "D": D, "R": D // 2, "TR": T,
            "BT": min(128, triton.next_power_of_2(blocks)), "BD": triton.next_power_of_2(D),
            "IS_SEQLEN_OFFSETS_TENSOR": False, "IS_VARLEN": False, "INTERLEAVED": False,
            "CONJUGATE": False}


def _rotary_reference(a: Args) -> torch.Tensor:
    x, R = a["x"].float(), a["R"]
    cos, sin = (a[k].float()[:, None, :] for k in ("cos", "sin"))  # [T, 1, R]: every head
    x0, x1 = x[..., :R], x[..., R:]
    return torch.cat([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1)


ROTARY_FWD = tuner.Kernel(
    rotary_embedding_kernel, name="fla_rotary_fwd", make_inputs=_rotary_inputs,
    reference=_rotary_reference, outputs=["y"],
    grid=lambda m: (triton.cdiv(m["T"], m["BT"]), m["B"], m["H"]),
    dims={"B": (1, 1024), "T": (1, 1 << 20), "H": (1, 256), "D": (2, 256)},
    problem=lambda a: {k: a[k] for k in "BTHD"},
    bytes=lambda s, dtype: 2 * s["B"] * s["T"] * s["H"] * s["D"] * (
        4 if dtype == "float32" else 2))


# -- RMS norm of q and k with their weights, rstd kept (cyfa attention) ---------------------

def _qk_norm_inputs(shape: Shape, dtype: str, device: str, seed: int) -> Args:
    gen, N, D = generator(device, seed), shape["N"], shape["D"]
    q, k = (randn(gen, N, D, dtype=dtype, device=device) for _ in range(2))
    qw, kw = (randn(gen, D, dtype=dtype, device=device) for _ in range(2))
    rstd = {f"{t}_rstd": torch.empty(N, dtype=_F32, device=device) for t in "qk"}
    return {"q": q, "k": k, "q_weight": qw, "k_weight": kw, "q_out": torch.empty_like(q),
            "k_out": torch.empty_like(k), **rstd, "q_eps": 1e-6, "k_eps": 1e-5, "N": N, "D": D,
            "BD": triton.next_power_of_2(D), "STORE_Q": True, "STORE_RSTD": True}


def _qk_norm_reference(a: Args) -> tuple[torch.Tensor, ...]:
    (q, qr), (k, kr) = ((a[t].float(), torch.rsqrt(a[t].float().square().mean(-1)
                                                   + a[f"{t}_eps"])) for t in "qk")
    return (q * qr[:, None] * a["q_weight"].float(), k * kr[:, None] * a["k_weight"].float(),
            qr, kr)


QK_RMSNORM_FWD = tuner.Kernel(
    _qk_rmsnorm_fwd_kernel, name="fla_qk_rmsnorm_fwd", make_inputs=_qk_norm_inputs,
    reference=_qk_norm_reference, outputs=["q_out", "k_out", "q_rstd", "k_rstd"],
    output_check=ROWWISE, grid=lambda m: (triton.cdiv(m["N"], m["BT"]),),
    dims={"N": (1, 1 << 24), "D": (1, 1024)}, problem=lambda a: {"N": a["N"], "D": a["D"]},
    bytes=lambda s, dtype: 4 * s["N"] * s["D"] * (4 if dtype == "float32" else 2))


# -- GRPO loss per completion token: KL to the reference policy minus the advantage ----------

def _grpo_inputs(shape: Shape, dtype: str, device: str, seed: int) -> Args:
    gen, (B, L, N), start = generator(device, seed), (shape[k] for k in "BLN"), 3
    logits = randn(gen, B, L + 1, N, dtype=dtype, device=device)
    ids = torch.randint(0, N, (B, start + L), generator=gen, device=device)
    ref_logp = randn(gen, B, L, device=device, scale=0.5) - torch.log(torch.tensor(N + 0.0))
    f32 = {"dtype": _F32, "device": device}
    return {"logits_ptr": logits, "ref_logp_ptr": ref_logp, "input_ids_ptr": ids,
            "advantages_ptr": randn(gen, B, device=device),
            "completion_mask_ptr": torch.ones(B, L, dtype=torch.int32, device=device),
            "loss_ptr": torch.empty(B, L, **f32), "lse_ptr": torch.empty(B, L, **f32),
            "beta": 0.04, "save_kl": False, "B": B, "M": B * L, "N": N, "L": L,
            "start_idx": start}


def _grpo_reference(a: Args) -> tuple[torch.Tensor, torch.Tensor]:
    logits, L = a["logits_ptr"].float()[:, :-1], a["L"]
    lse = logits.logsumexp(-1)
    logp = logits.gather(-1, a["input_ids_ptr"][:, -L:, None]).squeeze(-1) - lse
    diff = a["ref_logp_ptr"] - logp
    return (diff.exp() - diff - 1) * a["beta"] - a["advantages_ptr"][:, None], lse


GRPO_FWD = tuner.Kernel(
    grpo_fwd_kernel, name="fla_grpo_fwd", make_inputs=_grpo_inputs,
    reference=_grpo_reference, outputs=["loss_ptr", "lse_ptr"], grid=lambda m: (m["M"],),
    dims={"B": (1, 4096), "L": (1, 1 << 16), "N": (2, 1 << 20)},
    problem=lambda a: {"B": a["B"], "L": a["L"], "N": a["N"]},
    bytes=lambda s, dtype: s["B"] * (s["L"] + 1) * s["N"] * (4 if dtype == "float32" else 2))


# -- triton.heuristics over triton.autotune (fla's usual order) --------------------------------

def _global_cumsum() -> tuner.Kernel:
    """The cumulative sum over T of each [B, T, H] sequence: ``IS_VARLEN`` and ``HAS_SCALE``
    come from the heuristics outside the autotuner."""
    def inputs(shape: Shape, dtype: str, device: str, seed: int) -> Args:
        B, T, H = shape["B"], shape["T"], shape["H"]
        s = randn(generator(device, seed), B, T, H, dtype=dtype, device=device)
        return {"s": s, "o": torch.empty(B, T, H, dtype=_F32, device=device), "scale": None,
                "cu_seqlens": None, "T": T, "B": B, "H": H, "REVERSE": False}

    return tuner.Kernel(
        chunk_global_cumsum_scalar_kernel, name="fla_chunk_global_cumsum",
        make_inputs=inputs, reference=lambda a: a["s"].float().cumsum(1), outputs=["o"],
        grid=lambda m: (m["B"] * m["H"],), dims={"B": 1024, "T": 1 << 20, "H": 256},
        problem=lambda a: {"B": a["B"], "T": a["T"], "H": a["H"]})


GLOBAL_CUMSUM = _global_cumsum()

KERNELS = catalogue(__name__, L2NORM_FWD=L2NORM_FWD, LAYER_NORM_FWD=LAYER_NORM_FWD,
                    SWIGLU_FWD=SWIGLU_FWD, ROTARY_FWD=ROTARY_FWD,
                    QK_RMSNORM_FWD=QK_RMSNORM_FWD, GRPO_FWD=GRPO_FWD,
                    GLOBAL_CUMSUM=GLOBAL_CUMSUM)


SHAPES: dict[str, Shape] = {
    "fla_l2norm_fwd": {"T": 37, "D": 24},
    "fla_layer_norm_fwd": {"T": 37, "D": 24},
    "fla_swiglu_fwd": {"N": 7, "D": 40},
    "fla_rotary_fwd": {"B": 2, "T": 9, "H": 3, "D": 16},
    "fla_qk_rmsnorm_fwd": {"N": 37, "D": 24},
    "fla_grpo_fwd": {"B": 2, "L": 5, "N": 100},
    "fla_chunk_global_cumsum": {"B": 2, "T": 37, "H": 3},
}

#: realistic sizes: 8,192 tokens (4 x 2,048), 128-wide heads, hidden sizes of 7B-class models
GPU_SHAPES: dict[str, list[Shape]] = {
    "fla_l2norm_fwd": [{"T": 8192 * 16, "D": 128}, {"T": 8192 * 32, "D": 64}],
    "fla_layer_norm_fwd": [{"T": 8192, "D": 512}, {"T": 8192 * 16, "D": 128}],
    "fla_swiglu_fwd": [{"N": 8192, "D": 11008}, {"N": 8192, "D": 14336}],
    "fla_rotary_fwd": [{"B": 4, "T": 2048, "H": 32, "D": 128},
                       {"B": 1, "T": 8192, "H": 8, "D": 128}],
    "fla_qk_rmsnorm_fwd": [{"N": 8192 * 32, "D": 128}, {"N": 8192 * 16, "D": 256}],
    "fla_grpo_fwd": [{"B": 8, "L": 1024, "N": 32000}, {"B": 4, "L": 1024, "N": 151936}],
    "fla_chunk_global_cumsum": [{"B": 4, "T": 8192, "H": 32}],
}
