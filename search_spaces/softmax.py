"""Row-wise softmax of an M x N matrix (``out[i] = softmax(x[i])``), fp32 math, any N.

A row that fits one column block (``BLOCK_N >= N``) is read once: max, exp, sum and store from
registers. A longer row is read twice: an online pass keeps a running max and sum per lane
across column blocks, the lanes are combined, and a second pass writes ``exp(x - max) / sum``.
Each program takes ``ROWS`` consecutive rows. Same three layers as ``matmul``:
``_softmax_kernel`` -> ``softmax`` (the launcher) -> ``SoftmaxKernel`` (the TunableKernel).
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
from tuner.kernel import Dim, OutputCheck, Tolerance, shrunk_dim, source_version
from tuner.space import Param, ProblemContext, SearchSpace

#: stands in for -inf in the online pass: exp(NEG - m) is 0 for any real max m, and
#: NEG - NEG is 0, not the NaN that -inf - -inf would give on lanes past the row's end
NEG = tl.constexpr(-1.0e30)


@triton.jit
def _softmax_kernel(x_ptr, out_ptr, M, N, stride_x, stride_out,
                    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, ONE_PASS: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    for r in range(ROWS):
        row = pid * ROWS + r
        if row < M:
            x_row = x_ptr + row * stride_x
            out_row = out_ptr + row * stride_out
            if ONE_PASS:
                mask = cols < N
                x = tl.load(x_row + cols, mask=mask, other=0.0).to(tl.float32)
                x = tl.where(mask, x, float("-inf"))
                e = tl.exp(x - tl.max(x, 0))
                y = e / tl.sum(e, 0)
                tl.store(out_row + cols, y.to(out_ptr.dtype.element_ty), mask=mask)
            else:
                m = tl.full([BLOCK_N], NEG, tl.float32)
                s = tl.zeros([BLOCK_N], tl.float32)
                for start in range(0, N, BLOCK_N):
                    c = start + cols
                    mask = c < N
                    x = tl.load(x_row + c, mask=mask, other=0.0).to(tl.float32)
                    x = tl.where(mask, x, NEG)
                    m_new = tl.maximum(m, x)
                    s = s * tl.exp(m - m_new) + tl.exp(x - m_new)
                    m = m_new
                row_max = tl.max(m, 0)
                total = tl.sum(s * tl.exp(m - row_max), 0)
                for start in range(0, N, BLOCK_N):
                    c = start + cols
                    mask = c < N
                    x = tl.load(x_row + c, mask=mask, other=0.0).to(tl.float32)
                    y = tl.exp(x - row_max) / total
                    tl.store(out_row + c, y.to(out_ptr.dtype.element_ty), mask=mask)


def _args(x: torch.Tensor, out: torch.Tensor) -> tuple[Any, ...]:
    M, N = x.shape
    return (x, out, M, N, x.stride(0), out.stride(0))


def _launch_meta(x: torch.Tensor, config: KernelConfig) -> tuple[tuple[int], dict[str, int]]:
    meta = dict(config.meta)
    meta["ONE_PASS"] = int(meta["BLOCK_N"] >= x.shape[1])
    return (triton.cdiv(x.shape[0], meta["ROWS"]),), meta


def softmax(x: torch.Tensor, out: torch.Tensor, config: KernelConfig) -> None:
    """out = softmax(x, dim=-1) with the given launch config (rows contiguous)."""
    grid, meta = _launch_meta(x, config)
    _softmax_kernel[grid](*_args(x, out), **meta, num_warps=config.num_warps,
                          num_stages=config.num_stages)


def compile_softmax(x: torch.Tensor, out: torch.Tensor, config: KernelConfig) -> None:
    """Compile (or load from Triton's disk cache) without launching."""
    grid, meta = _launch_meta(x, config)
    _softmax_kernel.warmup(*_args(x, out), **meta, num_warps=config.num_warps,
                           num_stages=config.num_stages, grid=grid)




def _redundant_block(config: KernelConfig, ctx: ProblemContext) -> str | None:
    """No column block wider than the row needs, no more rows per program than there are."""
    cap = max(64, next_pow2(ctx.shape["N"]))
    if config["BLOCK_N"] > cap:
        return f"BLOCK_N={config['BLOCK_N']} is wider than N={ctx.shape['N']} needs ({cap})"
    if config["ROWS"] > 1 and config["ROWS"] > ctx.shape["M"]:
        return f"ROWS={config['ROWS']} is more than M={ctx.shape['M']}"
    return None


def _registers(config: KernelConfig, ctx: ProblemContext) -> str | None:
    """A thread holds BLOCK_N / (32 * num_warps) fp32 values of each live block array (the
    running max and sum, then x): more than 64 each spills."""
    per_thread = config["BLOCK_N"] // (32 * config["num_warps"])
    if per_thread > 64:
        return f"each thread would hold {per_thread} values per block array (over 64)"
    return None


class SoftmaxKernel:
    name = "softmax"
    ref = "search_spaces.softmax:KERNEL"
    description = "row-wise softmax of an M x N matrix, fp32 math, online two-pass for long rows"
    dims = (Dim("M", 1, 1 << 20, "rows"), Dim("N", 1, 1 << 18, "columns (the softmax axis)"))
    dtypes = ("float16", "bfloat16", "float32")
    interpreter_unsupported_dtypes: tuple[str, ...] = ()
    #: each row is a distribution: compared per row, and sums to 1
    output_check = OutputCheck(rowwise=True, row_sum=1.0)

    @property
    def version(self) -> str:
        return source_version(sys.modules[__name__])

    def space(self) -> SearchSpace:
        return SearchSpace(
            params=(
                Param.pow2("BLOCK_N", 64, 16384),
                Param.ints("ROWS", (1, 2, 4)),
                Param.pow2("num_warps", 1, 16),
                Param.ints("num_stages", (1, 2, 3)),
            ),
            constraints=(_redundant_block, _registers),
        )

    def default_config(self, shape: Mapping[str, int], dtype: str) -> KernelConfig:
        """One row per program, the row in one block up to 4,096 columns (the Triton
        tutorial's warps for that width)."""
        block = min(4096, max(64, next_pow2(shape.get("N", 1024))))
        warps = 4 if block <= 1024 else 8
        return KernelConfig(BLOCK_N=block, ROWS=1, num_warps=warps, num_stages=2)

    def known_good_configs(self, shape: Mapping[str, int], dtype: str) -> list[KernelConfig]:
        n = max(64, next_pow2(shape.get("N", 1024)))
        configs = [self.default_config(shape, dtype)]
        for block in sorted({min(n, 16384), min(n, 8192), min(n, 2048), min(n, 1024)},
                            reverse=True):
            for warps in (4, 8, 16):
                if block // (32 * warps) <= 64:
                    configs.append(KernelConfig(BLOCK_N=block, ROWS=1, num_warps=warps,
                                                num_stages=2))
        if n <= 1024:  # short rows: several per program
            configs += [KernelConfig(BLOCK_N=n, ROWS=rows, num_warps=w, num_stages=2)
                        for rows in (2, 4) if rows <= shape.get("M", 1) for w in (1, 2, 4)]
        return list(dict.fromkeys(configs))

    def make_inputs(
        self, shape: Mapping[str, int], dtype: str, device: str, seed: int
    ) -> dict[str, Any]:
        gen = torch.Generator(device=device).manual_seed(seed)
        x = torch.randn((shape["M"], shape["N"]), generator=gen, device=device,
                        dtype=torch.float32) * 3.0
        dt = torch_dtype(dtype)
        return {"x": x.to(dt),
                "out": torch.empty((shape["M"], shape["N"]), device=device, dtype=dt)}

    def compile_shape(self, shape: Mapping[str, int], dtype: str) -> dict[str, int]:
        """Compile on a few rows of full length: the row length sets the ONE_PASS constexpr
        and the strides; the number of rows only keeps its divisibility by 16 (and ==1)."""
        return {"M": shrunk_dim(shape["M"], 16), "N": shape["N"]}

    def launch(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        softmax(inputs["x"], inputs["out"], config)

    def compile(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        compile_softmax(inputs["x"], inputs["out"], config)

    def reference(self, inputs: dict[str, Any]) -> torch.Tensor:
        return torch.softmax(inputs["x"].float(), dim=-1)

    def tolerance(self, dtype: str) -> Tolerance:
        # Every step is relative (exp, sum, divide in fp32): the error of an element is its
        # rounding to the dtype, at most u = 2**-11 (fp16) or 2**-8 (bf16) of itself; rtol is
        # 4u. atol (x the row's max) only covers exps that differ in their last bits far below
        # it; an absolute atol would pass a long row's ~1e-6 elements whatever they are.
        # fp32: GPU exp and divide are approximate (a few ulps, more for large |x - max|).
        return {"float16": Tolerance(1e-5, 2e-3), "bfloat16": Tolerance(1e-5, 1.6e-2),
                "float32": Tolerance(1e-6, 1e-4)}[dtype]

    def flops(self, shape: Mapping[str, int]) -> float:
        return 5.0 * shape["M"] * shape["N"]  # max, subtract, exp, sum, divide per element

    def bytes(self, shape: Mapping[str, int], dtype: str) -> float:
        elem = 4 if dtype == "float32" else 2
        return float(2 * elem * shape["M"] * shape["N"])  # read x once, write out once

    def torch_baseline(self, inputs: dict[str, Any]) -> None:
        torch.softmax(inputs["x"], dim=-1)

    def baseline(self, inputs: dict[str, Any]) -> torch.Tensor:
        """The same rows by torch.softmax in the input's dtype."""
        return torch.softmax(inputs["x"], dim=-1)

    def prior(self, config: KernelConfig, ctx: ProblemContext) -> float | None:
        """No model of this kernel's run time: strategies rank its configs flat."""
        return None


KERNEL = SoftmaxKernel()
