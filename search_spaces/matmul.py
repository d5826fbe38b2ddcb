"""Tiled matmul C = A @ B (row-major A: MxK, B: KxN), fp32 accumulation, grouped tile order.

Every edge is masked, so any M, N, K >= 1 is computed right. The three layers follow the
Liger-Kernel habit: ``_matmul_kernel`` (the @triton.jit kernel) -> ``matmul`` (the launcher) ->
``MatmulKernel`` (the TunableKernel the tuner drives).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from tuner.config import KernelConfig
from tuner.dtypes import next_pow2, torch_dtype
from tuner.kernel import Dim, Tolerance, shrunk_dim, source_version
from tuner.space import Param, ProblemContext, SearchSpace


@triton.jit
def tile_coords(tile_id, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                GROUP_M: tl.constexpr):
    """Output tile ``tile_id`` as (pid_m, pid_n) in grouped order: GROUP_M rows of tiles are
    walked column by column so that the B tiles they share stay in L2."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = tile_id // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((tile_id % num_pid_in_group) % group_size_m)
    pid_n = (tile_id % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def grouped_tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """This program's output tile (pid_m, pid_n) in grouped order (one tile per program)."""
    return tile_coords(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)


@triton.jit
def tile_dot(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, pid_m, pid_n,
             k_first, k_steps, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """The fp32 tile (pid_m, pid_n) of A @ B over the K steps ``k_first`` to ``k_first +
    k_steps`` (each BLOCK_K long; none when ``k_steps <= 0``).

    No load inside the loop is masked along M or N: rows past M and columns past N read row
    and column 0 of the tile instead (inside A and B), and the caller's store drops them, as
    in Triton's persistent-matmul tutorial. With ``EVEN_K`` (K % BLOCK_K == 0, decided at
    launch) the K edge needs no mask either: the loads are plain, vectorised and pipelined
    without per-element predicates (most of what the masks cost on Hopper). The tile's first
    row and column are added to the pointers in int64 (M * K and K * N may pass 2**31); a
    ``k_first`` other than 0 must be int64 for the same reason."""
    rm = tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    rm = tl.where(pid_m * BLOCK_M + rm < M, rm, 0)
    rn = tl.where(pid_n * BLOCK_N + rn < N, rn, 0)
    rm = tl.max_contiguous(tl.multiple_of(rm, BLOCK_M), BLOCK_M)
    rn = tl.max_contiguous(tl.multiple_of(rn, BLOCK_N), BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    k0 = k_first * BLOCK_K
    a_ptrs = (a_ptr + (pid_m * BLOCK_M).to(tl.int64) * stride_am + k0 * stride_ak
              + rm[:, None] * stride_am + offs_k[None, :] * stride_ak)
    b_ptrs = (b_ptr + (pid_n * BLOCK_N).to(tl.int64) * stride_bn + k0 * stride_bk
              + offs_k[:, None] * stride_bk + rn[None, :] * stride_bn)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, k_steps):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k0 - k * BLOCK_K
            a = tl.load(a_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def store_tile(c_ptr, acc, M, N, stride_cm, stride_cn, pid_m, pid_n, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr):
    """Store the tile (pid_m, pid_n), converted to C's dtype, masked at the M and N edges."""
    rm = tl.arange(0, BLOCK_M)
    rn = tl.arange(0, BLOCK_N)
    mask = (pid_m * BLOCK_M + rm[:, None] < M) & (pid_n * BLOCK_N + rn[None, :] < N)
    c_ptrs = (c_ptr + (pid_m * BLOCK_M).to(tl.int64) * stride_cm
              + (pid_n * BLOCK_N).to(tl.int64) * stride_cn
              + rm[:, None] * stride_cm + rn[None, :] * stride_cn)
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _matmul_kernel(
    a_ptr, b_ptr, c_ptr, M, N, K,
    stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    pid_m, pid_n = grouped_tile(M, N, BLOCK_M, BLOCK_N, GROUP_M)
    acc = tile_dot(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, pid_m,
                   pid_n, 0, tl.cdiv(K, BLOCK_K), BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K)
    store_tile(c_ptr, acc, M, N, stride_cm, stride_cn, pid_m, pid_n, BLOCK_M, BLOCK_N)


def even_k(K: int, block_k: int) -> bool:
    """Whether every K step is whole (the ``EVEN_K`` constexpr: no K mask in the loop). The
    compile shape keeps K mod 256, so it compiles the binary the real problem runs."""
    return K % block_k == 0


def _args(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> tuple[Any, ...]:
    (M, K), N = a.shape, b.shape[1]
    return (a, b, out, M, N, K,
            a.stride(0), a.stride(1), b.stride(0), b.stride(1), out.stride(0), out.stride(1))


def _grid(a: torch.Tensor, b: torch.Tensor, meta: Mapping[str, int]) -> tuple[int]:
    return (triton.cdiv(a.shape[0], meta["BLOCK_M"]) * triton.cdiv(b.shape[1], meta["BLOCK_N"]),)


def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor, config: KernelConfig) -> None:
    """out = a @ b with the given launch config."""
    meta = {**config.meta, "EVEN_K": even_k(a.shape[1], config["BLOCK_K"])}
    _matmul_kernel[_grid(a, b, meta)](*_args(a, b, out), **meta, num_warps=config.num_warps,
                                      num_stages=config.num_stages)


def compile_matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor,
                   config: KernelConfig) -> None:
    """Compile (or load from Triton's disk cache) without launching."""
    meta = {**config.meta, "EVEN_K": even_k(a.shape[1], config["BLOCK_K"])}
    _matmul_kernel.warmup(*_args(a, b, out), **meta, num_warps=config.num_warps,
                          num_stages=config.num_stages, grid=_grid(a, b, meta))




def tile_shared_memory(stages: int, block_m: int, block_n: int, block_k: int,
                       ctx: ProblemContext) -> str | None:
    """Why a pipelined GEMM tile does not fit in shared memory (None when it does): each
    pipeline stage holds one A tile (block_m x block_k) and one B tile (block_k x block_n)."""
    need = stages * block_k * (block_m + block_n) * ctx.elem_bytes
    if need > ctx.smem_limit:
        return f"needs {need} B of shared memory; the device allows {ctx.smem_limit} B"
    return None


def tile_accumulator_registers(block_m: int, block_n: int, warps: int) -> str | None:
    """Why a GEMM tile's fp32 accumulator spills (None when it does not): it alone takes
    block_m * block_n / (32 * warps) registers per thread, and a thread has at most 255."""
    regs = block_m * block_n // (32 * warps)
    if regs >= 256:
        return f"the accumulator needs {regs} registers per thread (a thread has 255)"
    return None


def _shared_memory(config: KernelConfig, ctx: ProblemContext) -> str | None:
    # On the H200 replay table (shared/replay) this predicts all 92 OutOfResources exactly
    # (e.g. 128x128x128 with 4 stages: 262,144 B > 232,448 B) and over-predicts 4 configs
    # (BLOCK_M=32, BLOCK_N=256, BLOCK_K=128, 4 stages) that Triton ran with fewer stages, each
    # 2.7x slower than the best.
    return tile_shared_memory(config["num_stages"], config["BLOCK_M"], config["BLOCK_N"],
                              config["BLOCK_K"], ctx)


def _accumulator_registers(config: KernelConfig, ctx: ProblemContext) -> str | None:
    # The accumulator needs some registers left for addresses and operands; at 256 or more it
    # spills: on all eight recorded H200 tables (tests/data/replay) the best such config is
    # 3.3-11.8x slower than the table's best, and they compile slowest (5 s for 256 registers,
    # 33 s for 512, on 777x1234x4321: bench/NOTES.md).
    return tile_accumulator_registers(config["BLOCK_M"], config["BLOCK_N"], config["num_warps"])


def _redundant_tile(config: KernelConfig, ctx: ProblemContext) -> str | None:
    # A tile larger than the (power-of-two padded) problem only computes masked zeros; the
    # smaller tile with the same other parameters does the same work with fewer resources.
    for block, dim, floor in (("BLOCK_M", "M", 16), ("BLOCK_N", "N", 32), ("BLOCK_K", "K", 32)):
        cap = max(floor, next_pow2(ctx.shape[dim]))
        if config[block] > cap:
            return f"{block}={config[block]} is larger than {dim}={ctx.shape[dim]} needs ({cap})"
    return None


# The Triton matmul tutorial's CUDA configs (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages),
# plus two for skinny (decode-like) problems.
_KNOWN_GOOD = [
    (128, 256, 64, 8, 8, 3), (64, 256, 32, 8, 4, 4), (128, 128, 32, 8, 4, 4),
    (128, 64, 32, 8, 4, 4), (64, 128, 32, 8, 4, 4), (128, 32, 32, 8, 4, 4),
    (64, 32, 32, 8, 2, 5), (32, 64, 32, 8, 2, 5),
    (16, 64, 128, 1, 4, 4), (16, 128, 64, 1, 4, 4),
]
_PARAMS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")


class MatmulKernel:
    name = "matmul"
    ref = "search_spaces.matmul:KERNEL"
    description = "C = A @ B, row-major, fp32 accumulate, masked edges, grouped tile order"
    dims = (Dim("M", 1, 65536, "rows of A and C"), Dim("N", 1, 65536, "columns of B and C"),
            Dim("K", 1, 65536, "the reduction dimension"))
    dtypes = ("float16", "bfloat16", "float32")
    # Triton's CPU interpreter computes bf16 tl.dot wrongly (silently).
    interpreter_unsupported_dtypes = ("bfloat16",)

    @property
    def version(self) -> str:
        return source_version(sys.modules[__name__])

    def space(self) -> SearchSpace:
        return SearchSpace(
            params=(
                Param.pow2("BLOCK_M", 16, 256),
                Param.pow2("BLOCK_N", 32, 256),
                Param.pow2("BLOCK_K", 32, 256),
                Param.ints("GROUP_M", (1, 8)),
                Param.pow2("num_warps", 2, 8),
                Param.ints("num_stages", (2, 3, 4, 5)),
            ),
            constraints=(_shared_memory, _accumulator_registers, _redundant_tile),
        )

    def known_good_configs(self, shape: Mapping[str, int], dtype: str) -> list[KernelConfig]:
        return [KernelConfig(dict(zip(_PARAMS, c, strict=True))) for c in _KNOWN_GOOD]

    def default_config(self, shape: Mapping[str, int], dtype: str) -> KernelConfig:
        """A config that runs on every shape and dtype, on any GPU with >= 100 KB of smem."""
        block_m = 16 if shape.get("M", 128) <= 16 else 64
        return KernelConfig(BLOCK_M=block_m, BLOCK_N=64, BLOCK_K=32, GROUP_M=8,
                            num_warps=4, num_stages=3)

    def make_inputs(
        self, shape: Mapping[str, int], dtype: str, device: str, seed: int
    ) -> dict[str, Any]:
        M, N, K = shape["M"], shape["N"], shape["K"]
        gen = torch.Generator(device=device).manual_seed(seed)
        # Scaled so that every output element is ~N(0, 1) whatever K is.
        scale = K ** -0.25
        a = torch.randn((M, K), generator=gen, device=device, dtype=torch.float32) * scale
        b = torch.randn((K, N), generator=gen, device=device, dtype=torch.float32) * scale
        dt = torch_dtype(dtype)
        out = torch.empty((M, N), device=device, dtype=dt)
        return {"a": a.to(dt), "b": b.to(dt), "out": out}

    def compile_shape(self, shape: Mapping[str, int], dtype: str) -> dict[str, int]:
        """Compile on a small problem: every dimension (and so every stride) keeps its residue
        mod 256 (its divisibility by 16, and by every BLOCK), and 1 stays 1."""
        return {d: shrunk_dim(shape[d]) for d in ("M", "N", "K")}

    def launch(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        matmul(inputs["a"], inputs["b"], inputs["out"], config)

    def compile(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        compile_matmul(inputs["a"], inputs["b"], inputs["out"], config)

    def reference(self, inputs: dict[str, Any]) -> torch.Tensor:
        return torch.matmul(inputs["a"].float(), inputs["b"].float())

    def tolerance(self, dtype: str) -> Tolerance:
        # atol is x the output's largest |value|. Products are exact and summed in fp32: the
        # error is the result's rounding, u = 2**-11 (fp16) or 2**-8 (bf16) of itself (rtol
        # 4u), plus summation order, far below u of the scale (atol 2u). fp32 inputs go through
        # TF32 tensor cores on the GPU (10-bit mantissa, u = 2**-11 of every product): their
        # errors scale with the output's scale, not the element (atol 8u).
        return {"float16": Tolerance(1e-3, 2e-3), "bfloat16": Tolerance(8e-3, 1.6e-2),
                "float32": Tolerance(4e-3, 2e-3)}[dtype]

    def flops(self, shape: Mapping[str, int]) -> float:
        return 2.0 * shape["M"] * shape["N"] * shape["K"]

    def bytes(self, shape: Mapping[str, int], dtype: str) -> float:
        elem = 4 if dtype == "float32" else 2
        return float(elem * (shape["M"] * shape["K"] + shape["K"] * shape["N"]
                             + shape["M"] * shape["N"]))

    def torch_baseline(self, inputs: dict[str, Any]) -> None:
        torch.matmul(inputs["a"], inputs["b"], out=inputs["out"])

    def baseline(self, inputs: dict[str, Any]) -> torch.Tensor:
        """The same product by torch.matmul (cuBLAS) in the inputs' dtype, into the same
        output; fp32 with TF32 allowed, as ``tl.dot`` computes it (like for like)."""
        a, b, out = inputs["a"], inputs["b"], inputs["out"]
        if a.dtype != torch.float32:
            return torch.matmul(a, b, out=out)
        allowed = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            return torch.matmul(a, b, out=out)
        finally:  # the reference (fp32, in this process) must stay exact
            torch.backends.cuda.matmul.allow_tf32 = allowed

    def prior(self, config: KernelConfig, ctx: ProblemContext) -> float | None:
        """The analytic cost model's log-time (tuner/strategies/cost_model.py): ranks configs
        before any is measured (median best/optimum 1.000 at 16 trials on 14 H200 tables)."""
        from tuner.strategies import cost_model  # imported here: measuring children never rank

        return cost_model.estimate(config, ctx)


KERNEL = MatmulKernel()
