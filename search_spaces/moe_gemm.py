"""Mixture-of-experts grouped GEMM: ``out[m, k] = a[m] @ w[topk_ids[m, k]].T`` for every token
``m`` and each of its ``TOPK`` routed experts, fp32 accumulation (vLLM's fused-MoE first GEMM,
without the routed weight).

``a`` is [M, K] (hidden states), ``w`` is [E, N, K] (per-expert weights, vLLM's layout), ``out``
is [M, TOPK, N]. The (token, slot) pairs are sorted by expert and each expert's list padded to a
multiple of ``BLOCK_SIZE_M`` with a sentinel (``M * TOPK``), as vLLM's ``moe_align_block_size``
does; each program computes one ``BLOCK_SIZE_M x BLOCK_SIZE_N`` tile of one expert, gathering its
rows of ``a`` and scattering its rows of ``out``. The parameter names are vLLM's, so that
``tuner export --format vllm`` writes the file vLLM reads.

The sorting and padding are done in ``make_inputs``, once for every ``BLOCK_SIZE_M`` of the
space, not in the timed launch: they depend on the routing and BLOCK_SIZE_M only, cost the same
for every other parameter, and vLLM times them apart from the GEMM too; the timed launch is the
GEMM alone. The routing is seeded random (distinct experts per token when ``TOPK <= E``), so
some experts may get no tokens (they get no tiles). Same three layers as ``matmul``:
``_moe_gemm_kernel`` -> ``moe_gemm`` (the launcher) -> ``MoeGemmKernel`` (the TunableKernel).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from search_spaces import matmul as matmul_module
from search_spaces.matmul import tile_accumulator_registers, tile_shared_memory
from tuner.config import KernelConfig
from tuner.dtypes import next_pow2, torch_dtype
from tuner.kernel import Dim, Tolerance, shrunk_dim, source_version
from tuner.space import Param, ProblemContext, SearchSpace

#: the BLOCK_SIZE_M values of the space: make_inputs aligns the routing for each
BLOCK_SIZES_M = (16, 32, 64, 128)


@triton.jit
def _moe_gemm_kernel(
    a_ptr, w_ptr, c_ptr, sorted_ids_ptr, expert_ids_ptr, N, K, num_padded, num_valid,
    stride_am, stride_ak, stride_we, stride_wn, stride_wk, stride_cm, stride_cn,
    TOPK: tl.constexpr, BLOCK_SIZE_M: tl.constexpr, BLOCK_SIZE_N: tl.constexpr,
    BLOCK_SIZE_K: tl.constexpr, GROUP_SIZE_M: tl.constexpr,
):
    # Grouped ordering over (padded row block, column block), as in matmul: the row blocks of a
    # group share the weight tiles they read (one expert's, while the group stays in it).
    pid = tl.program_id(0)
    num_pid_m = tl.cdiv(num_padded, BLOCK_SIZE_M)
    num_pid_n = tl.cdiv(N, BLOCK_SIZE_N)
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m

    # num_padded is a multiple of BLOCK_SIZE_M: every row of the block is a (token, slot) pair
    # or the sentinel num_valid, and the whole block belongs to one expert.
    rows = tl.load(sorted_ids_ptr + pid_m * BLOCK_SIZE_M + tl.arange(0, BLOCK_SIZE_M))
    rows = rows.to(tl.int64)  # rows * stride_cm and expert * stride_we may pass 2**31
    row_mask = rows < num_valid
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)

    offs_n = pid_n * BLOCK_SIZE_N + tl.arange(0, BLOCK_SIZE_N)
    offs_k = tl.arange(0, BLOCK_SIZE_K)
    a_ptrs = a_ptr + (rows[:, None] // TOPK) * stride_am + offs_k[None, :] * stride_ak
    w_ptrs = (w_ptr + expert * stride_we + offs_k[:, None] * stride_wk
              + offs_n[None, :] * stride_wn)
    mask_n = offs_n[None, :] < N

    acc = tl.zeros((BLOCK_SIZE_M, BLOCK_SIZE_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_SIZE_K)):
        k_left = K - k * BLOCK_SIZE_K
        a = tl.load(a_ptrs, mask=row_mask[:, None] & (offs_k[None, :] < k_left), other=0.0)
        w = tl.load(w_ptrs, mask=(offs_k[:, None] < k_left) & mask_n, other=0.0)
        acc = tl.dot(a, w, acc)
        a_ptrs += BLOCK_SIZE_K * stride_ak
        w_ptrs += BLOCK_SIZE_K * stride_wk

    c = acc.to(c_ptr.dtype.element_ty)
    c_ptrs = c_ptr + rows[:, None] * stride_cm + offs_n[None, :] * stride_cn
    tl.store(c_ptrs, c, mask=row_mask[:, None] & mask_n)


def align_block_size(topk_ids: torch.Tensor, num_experts: int,
                     block_size_m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's ``moe_align_block_size``, in torch: the flat (token * TOPK + slot) indices sorted
    by expert, each expert's run padded to a multiple of ``block_size_m`` with the sentinel
    ``topk_ids.numel()``, and the expert of each block. An expert with no tokens gets no block."""
    flat = topk_ids.flatten().to(torch.int64)
    sentinel = flat.numel()
    order = torch.sort(flat, stable=True).indices
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    ids, experts, start = [], [], 0
    for expert, count in enumerate(counts):
        padded = -(-count // block_size_m) * block_size_m
        run = torch.full((padded,), sentinel, dtype=torch.int64, device=flat.device)
        run[:count] = order[start:start + count]
        ids.append(run)
        experts += [expert] * (padded // block_size_m)
        start += count
    sorted_ids = torch.cat(ids).to(torch.int32)
    return sorted_ids, torch.tensor(experts, dtype=torch.int32, device=flat.device)


def _args(inputs: dict[str, Any], block_size_m: int) -> tuple[Any, ...]:
    a, w, out = inputs["a"], inputs["w"], inputs["out"]
    sorted_ids = inputs[f"_sorted_ids_{block_size_m}"]
    c = out.view(-1, out.shape[-1])  # [M * TOPK, N]: row m * TOPK + slot
    return (a, w, c, sorted_ids, inputs[f"_expert_ids_{block_size_m}"], w.shape[1], w.shape[2],
            sorted_ids.numel(), c.shape[0], a.stride(0), a.stride(1), w.stride(0), w.stride(1),
            w.stride(2), c.stride(0), c.stride(1))


def _grid(inputs: dict[str, Any], meta: Mapping[str, int]) -> tuple[int]:
    padded = inputs[f"_sorted_ids_{meta['BLOCK_SIZE_M']}"].numel()
    n = inputs["w"].shape[1]
    return (padded // meta["BLOCK_SIZE_M"] * triton.cdiv(n, meta["BLOCK_SIZE_N"]),)


def _meta(inputs: dict[str, Any], config: KernelConfig) -> dict[str, int]:
    return {**config.meta, "TOPK": inputs["out"].shape[1]}


def moe_gemm(inputs: dict[str, Any], config: KernelConfig) -> None:
    """inputs["out"][m, k] = a[m] @ w[topk_ids[m, k]].T with the given launch config; the
    routing aligned to the config's BLOCK_SIZE_M comes from ``make_inputs``."""
    meta = _meta(inputs, config)
    _moe_gemm_kernel[_grid(inputs, meta)](*_args(inputs, meta["BLOCK_SIZE_M"]), **meta,
                                          num_warps=config.num_warps,
                                          num_stages=config.num_stages)


def compile_moe_gemm(inputs: dict[str, Any], config: KernelConfig) -> None:
    """Compile (or load from Triton's disk cache) without launching."""
    meta = _meta(inputs, config)
    _moe_gemm_kernel.warmup(*_args(inputs, meta["BLOCK_SIZE_M"]), **meta,
                            num_warps=config.num_warps, num_stages=config.num_stages,
                            grid=_grid(inputs, meta))


def _shared_memory(config: KernelConfig, ctx: ProblemContext) -> str | None:
    # Each pipeline stage holds one tile of the gathered rows and one of the expert's weights.
    return tile_shared_memory(config["num_stages"], config["BLOCK_SIZE_M"],
                              config["BLOCK_SIZE_N"], config["BLOCK_SIZE_K"], ctx)


def _accumulator_registers(config: KernelConfig, ctx: ProblemContext) -> str | None:
    return tile_accumulator_registers(config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"],
                                      config["num_warps"])


def _redundant_tile(config: KernelConfig, ctx: ProblemContext) -> str | None:
    # A row block taller than all M * TOPK routed rows (padded to a power of two) only computes
    # sentinel rows, whatever the routing; likewise a tile wider than N or deeper than K.
    rows = ctx.shape["M"] * ctx.shape["TOPK"]
    for block, size, what, floor in (("BLOCK_SIZE_M", rows, "M * TOPK", 16),
                                     ("BLOCK_SIZE_N", ctx.shape["N"], "N", 32),
                                     ("BLOCK_SIZE_K", ctx.shape["K"], "K", 32)):
        cap = max(floor, next_pow2(size))
        if config[block] > cap:
            return f"{block}={config[block]} is larger than {what}={size} needs ({cap})"
    return None


# vLLM's get_default_config for unquantized weights (few tokens, then many), vLLM's tuned H100
# bf16 choices for Mixtral-like shapes at small, medium and large token counts, and two of the
# Triton matmul tutorial's: (BLOCK_SIZE_M, BLOCK_SIZE_N, BLOCK_SIZE_K, GROUP_SIZE_M, warps, stages)
_KNOWN_GOOD = [
    (16, 32, 64, 1, 4, 3), (64, 64, 32, 8, 4, 3),
    (16, 64, 128, 1, 4, 4), (32, 128, 64, 16, 4, 4), (64, 128, 64, 16, 4, 3),
    (128, 128, 64, 16, 8, 4), (128, 256, 64, 8, 8, 3), (64, 256, 32, 8, 4, 4),
]
_PARAMS = ("BLOCK_SIZE_M", "BLOCK_SIZE_N", "BLOCK_SIZE_K", "GROUP_SIZE_M", "num_warps",
           "num_stages")


class MoeGemmKernel:
    name = "moe_gemm"
    ref = "search_spaces.moe_gemm:KERNEL"
    description = ("mixture-of-experts grouped GEMM (vLLM's fused MoE, first GEMM): M tokens "
                   "[M, K] routed to TOPK of E experts [E, N, K], out [M, TOPK, N]; tokens "
                   "sorted by expert and padded per expert to BLOCK_SIZE_M")
    dims = (Dim("M", 1, 65536, "tokens"), Dim("N", 1, 65536, "output columns per expert"),
            Dim("K", 1, 65536, "hidden size (the reduction)"),
            Dim("E", 1, 256, "experts"), Dim("TOPK", 1, 8, "experts per token"))
    dtypes = ("float16", "bfloat16", "float32")
    # Triton's CPU interpreter computes bf16 tl.dot wrongly (silently).
    interpreter_unsupported_dtypes = ("bfloat16",)

    @property
    def version(self) -> str:
        # matmul's tile constraints are part of this kernel's space
        return source_version(sys.modules[__name__], matmul_module)

    def space(self) -> SearchSpace:
        return SearchSpace(
            params=(
                Param("BLOCK_SIZE_M", BLOCK_SIZES_M, "pow2"),
                Param.pow2("BLOCK_SIZE_N", 32, 256),
                Param.pow2("BLOCK_SIZE_K", 32, 256),
                Param.ints("GROUP_SIZE_M", (1, 8, 16, 32, 64)),
                Param.pow2("num_warps", 2, 8),
                Param.ints("num_stages", (2, 3, 4, 5)),
            ),
            constraints=(_shared_memory, _accumulator_registers, _redundant_tile),
        )

    def known_good_configs(self, shape: Mapping[str, int], dtype: str) -> list[KernelConfig]:
        return [KernelConfig(dict(zip(_PARAMS, c, strict=True))) for c in _KNOWN_GOOD]

    def default_config(self, shape: Mapping[str, int], dtype: str) -> KernelConfig:
        """vLLM's default for unquantized weights: small tiles while there are no more tokens
        than experts (decode), else 64 x 64 x 32; runs everywhere (<= 48 KB of smem)."""
        if shape.get("M", 128) <= shape.get("E", 8):
            return KernelConfig(BLOCK_SIZE_M=16, BLOCK_SIZE_N=32, BLOCK_SIZE_K=64,
                                GROUP_SIZE_M=1, num_warps=4, num_stages=3)
        return KernelConfig(BLOCK_SIZE_M=64, BLOCK_SIZE_N=64, BLOCK_SIZE_K=32, GROUP_SIZE_M=8,
                            num_warps=4, num_stages=3)

    def make_inputs(
        self, shape: Mapping[str, int], dtype: str, device: str, seed: int
    ) -> dict[str, Any]:
        M, N, K, E, topk = shape["M"], shape["N"], shape["K"], shape["E"], shape["TOPK"]
        gen = torch.Generator(device=device).manual_seed(seed)
        scale = K ** -0.25  # every output element ~N(0, 1) whatever K is
        a = torch.randn((M, K), generator=gen, device=device, dtype=torch.float32) * scale
        w = torch.randn((E, N, K), generator=gen, device=device, dtype=torch.float32) * scale
        dt = torch_dtype(dtype)
        topk_ids = route(M, E, topk, gen, device)
        inputs: dict[str, Any] = {"a": a.to(dt), "w": w.to(dt),
                                  "out": torch.empty((M, topk, N), device=device,
                                                     dtype=dt),
                                  "_topk_ids": topk_ids}
        add_routing(inputs, topk_ids, E)
        return inputs

    def compile_shape(self, shape: Mapping[str, int], dtype: str) -> dict[str, int]:
        """Compile on a small problem: M, N and K keep their residue mod 256 (so M * TOPK, N * K
        and every stride keep their divisibility by 16) and 1 stays 1; TOPK is a constexpr and
        stays; E is no kernel argument (only its weights' size is): under 32, alike mod 16."""
        return {**{d: shrunk_dim(shape[d]) for d in ("M", "N", "K")},
                "E": shrunk_dim(shape["E"], 16), "TOPK": shape["TOPK"]}

    def launch(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        moe_gemm(inputs, config)

    def compile(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        compile_moe_gemm(inputs, config)

    def reference(self, inputs: dict[str, Any]) -> torch.Tensor:
        """Per expert, its rows' product in fp32, scattered back to [M, TOPK, N]."""
        a, w, out = inputs["a"].float(), inputs["w"].float(), inputs["out"]
        topk = out.shape[1]
        result = torch.zeros((out.shape[0] * topk, out.shape[2]), device=a.device)
        for expert, rows in enumerate(inputs["_expert_rows"]):
            result[rows] = a[rows // topk] @ w[expert].T
        return result.view(out.shape)

    def tolerance(self, dtype: str) -> Tolerance:
        # Each output element is one K-long dot product accumulated in fp32, as in matmul: the
        # same tolerances (matmul.py says why).
        return {"float16": Tolerance(1e-3, 2e-3), "bfloat16": Tolerance(8e-3, 1.6e-2),
                "float32": Tolerance(4e-3, 2e-3)}[dtype]

    def flops(self, shape: Mapping[str, int]) -> float:
        return 2.0 * shape["M"] * shape["TOPK"] * shape["N"] * shape["K"]

    def bytes(self, shape: Mapping[str, int], dtype: str) -> float:
        elem = 4 if dtype == "float32" else 2
        rows = shape["M"] * shape["TOPK"]
        experts = min(shape["E"], rows)  # at most this many experts' weights are read
        return float(elem * (shape["M"] * shape["K"] + experts * shape["N"] * shape["K"]
                             + rows * shape["N"]))

    def torch_baseline(self, inputs: dict[str, Any]) -> None:
        self.baseline(inputs)

    def baseline(self, inputs: dict[str, Any]) -> torch.Tensor:
        """The issue's comparison: a loop of per-expert torch matmuls in the inputs' dtype
        (gather the expert's rows, multiply, scatter), on the same precomputed routing (no
        host synchronisation in the loop); fp32 with TF32 allowed, as tl.dot computes it."""
        a, w, out = inputs["a"], inputs["w"], inputs["out"]
        topk = out.shape[1]
        flat = out.view(-1, out.shape[2])
        allowed = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            for expert, rows in enumerate(inputs["_expert_rows"]):
                flat.index_copy_(0, rows, a.index_select(0, rows // topk) @ w[expert].T)
        finally:  # the reference (fp32, in this process) must stay exact
            torch.backends.cuda.matmul.allow_tf32 = allowed
        return out

    def prior(self, config: KernelConfig, ctx: ProblemContext) -> float | None:
        return None  # no cost model for the grouped GEMM yet


def route(M: int, E: int, topk: int, gen: torch.Generator, device: str) -> torch.Tensor:
    """Seeded random routing [M, TOPK] (int32): TOPK distinct experts per token when there are
    that many, else drawn with repeats."""
    if topk <= E:
        scores = torch.rand((M, E), generator=gen, device=device)
        return scores.argsort(dim=1)[:, :topk].to(torch.int32)
    return torch.randint(0, E, (M, topk), generator=gen, device=device, dtype=torch.int32)


def add_routing(inputs: dict[str, Any], topk_ids: torch.Tensor, num_experts: int) -> None:
    """Put the routing into ``inputs`` as the launcher, reference and baseline read it: the
    alignment for every BLOCK_SIZE_M of the space, and each expert's flat row indices."""
    for block_size_m in BLOCK_SIZES_M:
        sorted_ids, expert_ids = align_block_size(topk_ids, num_experts, block_size_m)
        inputs[f"_sorted_ids_{block_size_m}"] = sorted_ids
        inputs[f"_expert_ids_{block_size_m}"] = expert_ids
    flat = topk_ids.flatten().to(torch.int64)
    inputs["_expert_rows"] = [torch.nonzero(flat == e).flatten() for e in range(num_experts)]


KERNEL = MoeGemmKernel()
