"""GEMM with a fused epilogue: C = act(A @ B + bias) (+ residual), act in none, relu, gelu, silu.

The K loop is ``matmul``'s (row-major A: MxK, B: KxN, fp32 accumulation, grouped tile order,
every edge masked); after it, still in registers and in fp32: the bias (a length-N vector,
broadcast over rows), then the activation, then the optional residual (an MxN tensor), then
one rounding to the output dtype and the store. GELU is the tanh approximation
(``torch.nn.functional.gelu(x, approximate="tanh")``, GPT-2's): tanh as ``2 sigmoid(2x) - 1``,
which the CPU interpreter and every GPU compute the same way.

The activation and the residual are part of the problem, not of the search: a config tuned for
one epilogue says nothing certain about another (a residual tile is one more load per output
tile), and a stored config must never be served for a different computation. So each epilogue
is a kernel of its own, ``matmul_epilogue_<act>`` and ``matmul_epilogue_<act>_residual`` (eight
in all), each with the dims M, N, K of ``matmul``. Integer flag dimensions (``ACT=2``) were the
alternative; they would mix flags with sizes in the shape (the serving index's nearest-shape
lookup and the cost model treat every dimension as a size) and need bounds starting at 1.
The space, its constraints, the known-good configs and the prior are ``matmul``'s, less split-K
(its partial sums would need the epilogue in its reduction): VARIANT tiled, persistent or
tma_persistent, each with matmul's K loop; the epilogue runs once per tile after the loop, when
the A and B tiles' registers and shared memory are free.

Same three layers as ``matmul``: ``_matmul_epilogue_kernel`` -> ``matmul_epilogue`` (the
launcher) -> ``MatmulEpilogueKernel`` (the TunableKernel, one instance per epilogue).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from search_spaces.gemm.host import (
    PERSISTENT,
    TILED,
    TMA_PERSISTENT,
    even_k,
    num_sms,
    output_tiles,
    persistent_constraint,
    set_tma_allocator,
    tiled_default,
    tiled_space,
    variant_of,
)
from search_spaces.gemm.tiles import grouped_tile, runs_ptx, tile_coords, tile_dot
from search_spaces.matmul import KERNEL as MATMUL
from tuner.config import KernelConfig
from tuner.dtypes import torch_dtype
from tuner.host_compile import on_gpu
from tuner.kernel import Dim, OutputCheck, Tolerance, builtin_version
from tuner.space import Param, ProblemContext, SearchSpace

#: the VARIANT values offered (matmul's numbering)
EPILOGUE_VARIANTS = (TILED, PERSISTENT, TMA_PERSISTENT)
#: the activations, by the ``ACT`` constexpr the kernel takes
ACTIVATIONS = ("none", "relu", "gelu", "silu")
#: sqrt(2 / pi), GELU's tanh approximation
_GELU_C = tl.constexpr(0.7978845608028654)


@triton.jit
def _tanh_approx(x):
    """tanh by the GPU's one-instruction approximation (sm_75+: ``tanh.approx.f32``, max
    relative error 2^-11, under a 16-bit output's rounding)."""
    return tl.inline_asm_elementwise("tanh.approx.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                     is_pure=True, pack=1)


@triton.jit
def _epilogue_math(acc, bias_ptr, N, pid_n, BLOCK_N: tl.constexpr, ACT: tl.constexpr,
                   FAST_ACT: tl.constexpr):
    """The bias and the activation, in fp32 on the accumulator of a tile in column block
    ``pid_n``. FAST_ACT (16-bit outputs on NVIDIA GPUs) computes GELU's and SiLU's tanh and
    sigmoid by ``_tanh_approx`` (sigmoid(x) = (1 + tanh(x / 2)) / 2); otherwise by an exp and
    a division, which the CPU interpreter and every GPU compute the same way."""
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    bias = tl.load(bias_ptr + offs_n, mask=offs_n < N, other=0.0).to(tl.float32)
    acc += bias[None, :]
    if ACT == 1:
        acc = tl.maximum(acc, 0.0)
    elif ACT == 2:
        inner = _GELU_C * (acc + 0.044715 * acc * acc * acc)
        if FAST_ACT:
            acc = 0.5 * acc * (1.0 + _tanh_approx(inner))
        else:
            acc = 0.5 * acc * (1.0 + (2.0 * tl.sigmoid(2.0 * inner) - 1.0))
    elif ACT == 3:
        if FAST_ACT:
            half = 0.5 * acc
            acc = half + half * _tanh_approx(half)
        else:
            acc = acc * tl.sigmoid(acc)
    return acc


@triton.jit
def _epilogue_store(acc, bias_ptr, res_ptr, c_ptr, M, N, stride_rm, stride_rn, stride_cm,
                    stride_cn, pid_m, pid_n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                    ACT: tl.constexpr, RESIDUAL: tl.constexpr, FAST_ACT: tl.constexpr):
    """The epilogue, in fp32 on the accumulator of tile (pid_m, pid_n), then one rounding to
    the output dtype and the masked store (by pointers)."""
    acc = _epilogue_math(acc, bias_ptr, N, pid_n, BLOCK_N, ACT, FAST_ACT)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    rows = offs_m[:, None].to(tl.int64)  # M * N may pass 2**31
    if RESIDUAL:
        r_ptrs = res_ptr + rows * stride_rm + offs_n[None, :] * stride_rn
        acc += tl.load(r_ptrs, mask=mask, other=0.0).to(tl.float32)
    c_ptrs = c_ptr + rows * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _matmul_epilogue_kernel(
    a_ptr, b_ptr, bias_ptr, res_ptr, c_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_rm, stride_rn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    ACT: tl.constexpr, RESIDUAL: tl.constexpr, EVEN_K: tl.constexpr, VARIANT: tl.constexpr,
    NUM_SMS: tl.constexpr, FAST_ACT: tl.constexpr = 0, TMA_STORE: tl.constexpr = 0,
):
    # VARIANT as matmul's: 0 one tile per program; 1 persistent (one program per SM walking
    # the tiles in a flattened loop); 2 the same with tensor-descriptor (TMA) loads, and with
    # TMA_STORE (the product's build of 2) the residual loaded and C stored by descriptors
    # too, as matmul's tma_persistent stores: whole tiles, clipped at M and N by the copy
    # engine, no address or mask per element.
    if VARIANT == 0:
        pid_m, pid_n = grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = tile_dot(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                       pid_m, pid_n, 0, tl.cdiv(K, BLOCK_K), BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K)
        _epilogue_store(acc, bias_ptr, res_ptr, c_ptr, M, N, stride_rm, stride_rn, stride_cm,
                        stride_cn, pid_m, pid_n, BLOCK_M, BLOCK_N, ACT, RESIDUAL, FAST_ACT)
    else:
        if VARIANT == 2:
            a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[stride_am, 1],
                                               block_shape=[BLOCK_M, BLOCK_K])
            b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[stride_bk, 1],
                                               block_shape=[BLOCK_K, BLOCK_N])
            if TMA_STORE:
                c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[stride_cm, 1],
                                                   block_shape=[BLOCK_M, BLOCK_N])
                if RESIDUAL:
                    r_desc = tl.make_tensor_descriptor(res_ptr, shape=[M, N],
                                                       strides=[stride_rm, 1],
                                                       block_shape=[BLOCK_M, BLOCK_N])
        start = tl.program_id(0)
        num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
        k_tiles = tl.cdiv(K, BLOCK_K)
        tile_c = start - NUM_SMS  # the store's tile, counted apart (see matmul's kernel)
        for tile_id in tl.range(start, num_tiles, NUM_SMS, flatten=True):
            pid_m, pid_n = tile_coords(tile_id, M, N, BLOCK_M, BLOCK_N, GROUP_M)
            if VARIANT == 2:
                acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
                for ki in range(k_tiles):
                    a = a_desc.load([pid_m * BLOCK_M, ki * BLOCK_K])
                    b = b_desc.load([ki * BLOCK_K, pid_n * BLOCK_N])
                    acc = tl.dot(a, b, acc)
            else:
                acc = tile_dot(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk,
                               stride_bn, pid_m, pid_n, 0, k_tiles, BLOCK_M, BLOCK_N, BLOCK_K,
                               EVEN_K)
            tile_c += NUM_SMS
            pid_cm, pid_cn = tile_coords(tile_c, M, N, BLOCK_M, BLOCK_N, GROUP_M)
            if VARIANT == 2 and TMA_STORE:
                acc = _epilogue_math(acc, bias_ptr, N, pid_cn, BLOCK_N, ACT, FAST_ACT)
                if RESIDUAL:
                    acc += r_desc.load([pid_cm * BLOCK_M, pid_cn * BLOCK_N]).to(tl.float32)
                c_desc.store([pid_cm * BLOCK_M, pid_cn * BLOCK_N],
                             acc.to(c_ptr.dtype.element_ty))
            else:
                _epilogue_store(acc, bias_ptr, res_ptr, c_ptr, M, N, stride_rm, stride_rn,
                                stride_cm, stride_cn, pid_cm, pid_cn, BLOCK_M, BLOCK_N, ACT,
                                RESIDUAL, FAST_ACT)


def _args(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor, residual: torch.Tensor | None,
          out: torch.Tensor) -> tuple[Any, ...]:
    (M, K), N = a.shape, b.shape[1]
    # Without a residual the pointer is never read (RESIDUAL=0): out stands in for it.
    res = out if residual is None else residual
    return (a, b, bias, res, out, M, N, K, a.stride(0), a.stride(1), b.stride(0), b.stride(1),
            res.stride(0), res.stride(1), out.stride(0), out.stride(1))


#: whether tma_persistent stores C by its descriptor (else by pointers, as the other variants):
#: no, pointer stores measured 1.6-2% faster on the H200 at the gelu target's 128x256 tile
#: (bench/NOTES.md), both without spills; the descriptor store stays for benchmarks
TMA_STORE_DEFAULT = False


def fast_activation(out: torch.Tensor) -> bool:
    """Whether the kernel computes tanh and sigmoid by the GPU's approximation (FAST_ACT): on
    NVIDIA GPUs (PTX inline assembly) for 16-bit outputs, whose rounding (2^-11 at best) the
    approximation's error stays under; never in the CPU interpreter, which runs no assembly."""
    return on_gpu(out) and out.element_size() == 2 and runs_ptx()


def _launch_meta(a: torch.Tensor, b: torch.Tensor, residual: torch.Tensor | None,
                 out: torch.Tensor, act: str, config: KernelConfig,
                 fast_act: bool | None = None, tma_store: bool | None = None,
                 ) -> tuple[tuple[int], dict[str, int]]:
    meta = dict(config.meta)
    meta["ACT"] = ACTIVATIONS.index(act)
    meta["RESIDUAL"] = int(residual is not None)
    meta["EVEN_K"] = even_k(a.shape[1], meta["BLOCK_K"])
    meta["VARIANT"] = variant = variant_of(config)
    meta["FAST_ACT"] = int(fast_activation(out) if fast_act is None else fast_act)
    if tma_store is None:
        tma_store = variant == TMA_PERSISTENT and TMA_STORE_DEFAULT
    meta["TMA_STORE"] = int(tma_store)
    tiles = output_tiles(config, {"M": a.shape[0], "N": b.shape[1]})
    if variant == TILED:
        meta["NUM_SMS"] = 1  # unused
        return (tiles,), meta
    if variant == TMA_PERSISTENT:
        rows = [a, b] + ([out] + ([residual] if residual is not None else [])
                         if meta["TMA_STORE"] else [])
        if any(t.stride(1) != 1 for t in rows):
            raise ValueError("the tma_persistent variant needs row-major A, B, C and residual")
    meta["NUM_SMS"] = num_sms(a.device)
    return (min(meta["NUM_SMS"], tiles),), meta


def matmul_epilogue(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor,
                    residual: torch.Tensor | None, out: torch.Tensor, act: str,
                    config: KernelConfig, *, fast_act: bool | None = None,
                    tma_store: bool | None = None) -> None:
    """out = act(a @ b + bias) (+ residual) with the given launch config. ``fast_act`` and
    ``tma_store`` (default: ``fast_activation(out)``, and descriptor stores for
    tma_persistent) are for benchmarks."""
    grid, meta = _launch_meta(a, b, residual, out, act, config, fast_act, tma_store)
    if meta["VARIANT"] == TMA_PERSISTENT:
        set_tma_allocator(a.device)
    _matmul_epilogue_kernel[grid](*_args(a, b, bias, residual, out), **meta,
                                  num_warps=config.num_warps, num_stages=config.num_stages)


def compile_matmul_epilogue(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor,
                            residual: torch.Tensor | None, out: torch.Tensor, act: str,
                            config: KernelConfig) -> None:
    """Compile (or load from Triton's disk cache) without launching."""
    grid, meta = _launch_meta(a, b, residual, out, act, config)
    _matmul_epilogue_kernel.warmup(*_args(a, b, bias, residual, out), **meta,
                                   num_warps=config.num_warps, num_stages=config.num_stages,
                                   grid=grid)


_TORCH_ACTS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "none": lambda x: x,
    "relu": torch.relu,
    "gelu": lambda x: torch.nn.functional.gelu(x, approximate="tanh"),
    "silu": torch.nn.functional.silu,
}
#: epilogue flops per output element besides the bias add
_ACT_FLOPS = {"none": 0, "relu": 1, "gelu": 10, "silu": 5}


class MatmulEpilogueKernel:
    """C = act(A @ B + bias) (+ residual), for one activation and residual choice."""

    dims = (Dim("M", 1, 65536, "rows of A and C"), Dim("N", 1, 65536, "columns of B and C"),
            Dim("K", 1, 65536, "the reduction dimension"))
    dtypes = ("float16", "bfloat16", "float32")
    # Triton's CPU interpreter computes bf16 tl.dot wrongly (silently).
    interpreter_unsupported_dtypes = ("bfloat16",)
    #: its compile hook builds the GPU binary from host tensors (``tuner.host_compile``)
    compiles_on_host = True
    #: a GEMM's output is one tensor at one scale, not rows computed as units
    output_check = OutputCheck()

    def __init__(self, act: str, residual: bool) -> None:
        if act not in ACTIVATIONS:
            raise ValueError(f"act must be one of {', '.join(ACTIVATIONS)}, not {act!r}")
        self.act, self.residual = act, residual
        suffix = f"{act}_residual" if residual else act
        self.name = f"matmul_epilogue_{suffix}"
        self.ref = f"search_spaces.matmul_epilogue:{suffix.upper()}"
        formula = "A @ B + bias" if act == "none" else f"{act}(A @ B + bias)"
        self.description = (f"C = {formula}{' + residual' if residual else ''}, the epilogue "
                            "fused after matmul's K loop in fp32, masked edges")

    @property
    def version(self) -> str:
        # with the matmul code they reach (tile order, K loop, tile constraints)
        return builtin_version(self, _matmul_epilogue_kernel)

    def space(self) -> SearchSpace:
        """matmul's tiled space plus VARIANT, of matmul's variants those that end with a
        tile in registers: tiled, persistent and tma_persistent (split-K's partial sums would
        need the epilogue in its reduction)."""
        tiled = tiled_space()
        return SearchSpace(
            params=(Param("VARIANT", EPILOGUE_VARIANTS, "categorical"), *tiled.params),
            constraints=(persistent_constraint, *tiled.constraints),
        )

    def known_good_configs(self, shape: Mapping[str, int], dtype: str) -> list[KernelConfig]:
        """matmul's, but split-K's and those that stage unaligned operands (ALIGN=1: not in
        this kernel)."""
        good = MATMUL.known_good_configs(shape, dtype)
        return [KernelConfig({k: v for k, v in c.items() if k not in ("SPLIT_K", "ALIGN")})
                for c in good if c["VARIANT"] in EPILOGUE_VARIANTS and not c.get("ALIGN")]

    def default_config(self, shape: Mapping[str, int], dtype: str) -> KernelConfig:
        """matmul's tiled one: runs on every shape and dtype, on any GPU with >= 100 KB of
        smem."""
        return KernelConfig({**tiled_default(shape), "VARIANT": TILED})

    def make_inputs(
        self, shape: Mapping[str, int], dtype: str, device: str, seed: int
    ) -> dict[str, Any]:
        M, N = shape["M"], shape["N"]
        inputs = MATMUL.make_inputs(shape, dtype, device, seed)  # a, b (A @ B ~ N(0, 1)), out
        gen = torch.Generator(device=device).manual_seed(seed + 1)
        dt = torch_dtype(dtype)
        # A bias of mean 1: relu keeps about four fifths of the outputs (a mean of 0 would
        # zero half of them, and with few columns often more, leaving the GEMM's result there
        # unchecked).
        bias = 1.0 + 0.5 * torch.randn((N,), generator=gen, device=device, dtype=torch.float32)
        inputs["bias"] = bias.to(dt)
        if self.residual:
            residual = torch.randn((M, N), generator=gen, device=device, dtype=torch.float32)
            inputs["residual"] = residual.to(dt)
        inputs["_outputs"] = ("out",)
        return inputs

    def compile_shape(self, shape: Mapping[str, int], dtype: str) -> dict[str, int]:
        """matmul's: every dimension keeps its residue mod 256, and 1 stays 1 (the bias and
        residual strides are N and 1, like the output's)."""
        return MATMUL.compile_shape(shape, dtype)

    def launch(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        matmul_epilogue(inputs["a"], inputs["b"], inputs["bias"], inputs.get("residual"),
                        inputs["out"], self.act, config)

    def compile(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        compile_matmul_epilogue(inputs["a"], inputs["b"], inputs["bias"],
                                inputs.get("residual"), inputs["out"], self.act, config)

    def reference(self, inputs: dict[str, Any]) -> torch.Tensor:
        y = torch.matmul(inputs["a"].float(), inputs["b"].float()) + inputs["bias"].float()
        y = _TORCH_ACTS[self.act](y)
        return y + inputs["residual"].float() if self.residual else y

    def tolerance(self, dtype: str) -> Tolerance:
        # matmul's: the epilogue adds fp32 roundings only (relu, GELU and SiLU have slopes of
        # at most 1.13, so they carry the product's error through about unchanged) and the
        # output is rounded to the dtype once.
        return MATMUL.tolerance(dtype)

    def flops(self, shape: Mapping[str, int]) -> float:
        per_element = 1 + _ACT_FLOPS[self.act] + int(self.residual)
        return MATMUL.flops(shape) + float(per_element * shape["M"] * shape["N"])

    def bytes(self, shape: Mapping[str, int], dtype: str) -> float:
        elem = 4 if dtype == "float32" else 2
        extra = shape["N"] + (shape["M"] * shape["N"] if self.residual else 0)
        return MATMUL.bytes(shape, dtype) + float(elem * extra)

    def baseline(self, inputs: dict[str, Any]) -> torch.Tensor:
        """What a user writes in torch, in the inputs' dtype: ``torch.addmm`` (``F.linear``'s
        product plus bias, one cuBLAS call), the activation, the residual add; fp32 with TF32
        allowed, as ``tl.dot`` computes it (like for like)."""
        a = inputs["a"]
        allowed = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = allowed or a.dtype == torch.float32
        try:
            y = _TORCH_ACTS[self.act](torch.addmm(inputs["bias"], a, inputs["b"]))
        finally:  # the reference (fp32, in this process) must stay exact
            torch.backends.cuda.matmul.allow_tf32 = allowed
        return y + inputs["residual"] if self.residual else y

    def prior(self, config: KernelConfig, ctx: ProblemContext) -> float | None:
        """matmul's analytic cost model: the epilogue is a few flops per output element,
        negligible beside the K loop."""
        return MATMUL.prior(config, ctx)


NONE = MatmulEpilogueKernel("none", residual=False)
RELU = MatmulEpilogueKernel("relu", residual=False)
GELU = MatmulEpilogueKernel("gelu", residual=False)
SILU = MatmulEpilogueKernel("silu", residual=False)
NONE_RESIDUAL = MatmulEpilogueKernel("none", residual=True)
RELU_RESIDUAL = MatmulEpilogueKernel("relu", residual=True)
GELU_RESIDUAL = MatmulEpilogueKernel("gelu", residual=True)
SILU_RESIDUAL = MatmulEpilogueKernel("silu", residual=True)
#: every variant, by its registered name
KERNELS = {k.name: k for k in (NONE, RELU, GELU, SILU, NONE_RESIDUAL, RELU_RESIDUAL,
                               GELU_RESIDUAL, SILU_RESIDUAL)}
