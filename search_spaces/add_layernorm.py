"""Fused residual add and LayerNorm: ``s = x + r`` (the residual stream the next layer reads)
and ``y = LayerNorm(s) * w + b``, both written in one kernel, fp32 math.

``s`` is rounded to the dtype before it is normalised, as ``layer_norm(x + r)`` in the dtype
does: ``y`` is the LayerNorm of the stored ``s``. Statistics are taken of ``s - s[0]`` (the
row's first element): shifting by a sample of the row keeps the variance's sum of squares
well conditioned for rows far from zero (|x| ~ 1e4 and a std of 1), and makes a constant row
exact (every difference is 0, so the variance is 0 and ``y`` is ``b``, bit for bit).

A row that fits one column block (``BLOCK_N >= N``) is read once: x and r in, s out, the
statistics and y from registers. A longer row is streamed twice: the first pass writes s and
sums the shifted values and their squares per lane, the second reads s back (from L2, just
written) with w and b and writes y. Each program takes ``ROWS`` consecutive rows. Same three
layers as ``softmax``: ``_add_layernorm_kernel`` -> ``add_layernorm`` (the launcher) ->
``AddLayerNormKernel`` (the TunableKernel).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from search_spaces.vector_add import streaming_seconds
from tuner.config import KernelConfig
from tuner.dtypes import element_bytes, next_pow2, torch_dtype
from tuner.kernel import Dim, OutputCheck, Tolerance, builtin_version, shrunk_dim
from tuner.space import Param, ProblemContext, SearchSpace

#: LayerNorm's epsilon (torch's default)
EPS = 1e-5


@triton.jit
def _add_layernorm_kernel(x_ptr, r_ptr, w_ptr, b_ptr, y_ptr, s_ptr, M, N, stride, eps,
                          BLOCK_N: tl.constexpr, ROWS: tl.constexpr, ONE_PASS: tl.constexpr):
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK_N)
    dt = s_ptr.dtype.element_ty
    for i in range(ROWS):
        row = pid * ROWS + i
        if row < M:
            base = row.to(tl.int64) * stride
            # the shift: s's first element as stored (x + r rounded to the dtype)
            shift = (tl.load(x_ptr + base).to(tl.float32)
                     + tl.load(r_ptr + base).to(tl.float32)).to(dt).to(tl.float32)
            if ONE_PASS:
                mask = cols < N
                x = tl.load(x_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
                r = tl.load(r_ptr + base + cols, mask=mask, other=0.0).to(tl.float32)
                s = (x + r).to(dt)
                tl.store(s_ptr + base + cols, s, mask=mask)
                d = tl.where(mask, s.to(tl.float32) - shift, 0.0)
                mean = tl.sum(d, 0) / N
                c = tl.where(mask, d - mean, 0.0)
                rstd = 1.0 / tl.sqrt(tl.sum(c * c, 0) / N + eps)
                w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
                b = tl.load(b_ptr + cols, mask=mask, other=0.0).to(tl.float32)
                tl.store(y_ptr + base + cols, (c * rstd * w + b).to(dt), mask=mask)
            else:
                acc = tl.zeros([BLOCK_N], tl.float32)
                acc2 = tl.zeros([BLOCK_N], tl.float32)
                for start in range(0, N, BLOCK_N):
                    c = start + cols
                    mask = c < N
                    x = tl.load(x_ptr + base + c, mask=mask, other=0.0).to(tl.float32)
                    r = tl.load(r_ptr + base + c, mask=mask, other=0.0).to(tl.float32)
                    s = (x + r).to(dt)
                    tl.store(s_ptr + base + c, s, mask=mask)
                    d = tl.where(mask, s.to(tl.float32) - shift, 0.0)
                    acc += d
                    acc2 += d * d
                mean = tl.sum(acc, 0) / N
                var = tl.maximum(tl.sum(acc2, 0) / N - mean * mean, 0.0)
                rstd = 1.0 / tl.sqrt(var + eps)
                for start in range(0, N, BLOCK_N):
                    c = start + cols
                    mask = c < N
                    s = tl.load(s_ptr + base + c, mask=mask, other=0.0).to(tl.float32)
                    w = tl.load(w_ptr + c, mask=mask, other=0.0).to(tl.float32)
                    b = tl.load(b_ptr + c, mask=mask, other=0.0).to(tl.float32)
                    y = ((s - shift) - mean) * rstd * w + b
                    tl.store(y_ptr + base + c, y.to(dt), mask=mask)


def _check(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, b: torch.Tensor,
           y: torch.Tensor, s: torch.Tensor) -> None:
    if x.dim() != 2 or not (x.shape == r.shape == y.shape == s.shape):
        raise ValueError("add_layernorm needs 2-D x, residual and both outputs of one shape")
    if w.shape != (x.shape[1],) or b.shape != (x.shape[1],):
        raise ValueError(f"weight and bias must have shape ({x.shape[1]},)")
    if not all(t.is_contiguous() for t in (x, r, w, b, y, s)):
        raise ValueError("add_layernorm needs contiguous tensors")


def _launch(x: torch.Tensor, config: KernelConfig) -> tuple[tuple[int], dict[str, int]]:
    meta = dict(config.meta)
    meta["ONE_PASS"] = int(meta["BLOCK_N"] >= x.shape[1])
    return (triton.cdiv(x.shape[0], meta["ROWS"]),), meta


def add_layernorm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, b: torch.Tensor,
                  y: torch.Tensor, s: torch.Tensor, config: KernelConfig,
                  eps: float = EPS) -> None:
    """s = x + r; y = layer_norm(s) * w + b, over the last dimension (contiguous tensors)."""
    _check(x, r, w, b, y, s)
    grid, meta = _launch(x, config)
    _add_layernorm_kernel[grid](x, r, w, b, y, s, x.shape[0], x.shape[1], x.stride(0), eps,
                                **meta, num_warps=config.num_warps,
                                num_stages=config.num_stages)


def compile_add_layernorm(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, b: torch.Tensor,
                          y: torch.Tensor, s: torch.Tensor, config: KernelConfig,
                          eps: float = EPS) -> None:
    """Compile (or load from Triton's disk cache) without launching."""
    _check(x, r, w, b, y, s)
    grid, meta = _launch(x, config)
    _add_layernorm_kernel.warmup(x, r, w, b, y, s, x.shape[0], x.shape[1], x.stride(0), eps,
                                 **meta, num_warps=config.num_warps,
                                 num_stages=config.num_stages, grid=grid)


def _redundant(config: KernelConfig, ctx: ProblemContext) -> str | None:
    """No column block wider than the row needs, no more rows per program than there are,
    no thread without a column of its own, and pipelining stages only where there is a loop
    (two passes or several rows); else configs that differ in them are one binary's twins."""
    n, m = ctx.shape["N"], ctx.shape["M"]
    cap = max(64, next_pow2(n))
    if config["BLOCK_N"] > cap:
        return f"BLOCK_N={config['BLOCK_N']} is wider than N={n} needs ({cap})"
    if config["ROWS"] > 1 and config["ROWS"] > m:
        return f"ROWS={config['ROWS']} is more than M={m}"
    if config["BLOCK_N"] < 32 * config["num_warps"] and config["num_warps"] > 1:
        return f"BLOCK_N={config['BLOCK_N']} leaves threads of {config['num_warps']} warps idle"
    looped = config["BLOCK_N"] < n or config["ROWS"] > 1
    if not looped and config["num_stages"] != 1:
        return "num_stages only pipelines a loop (two passes or several rows)"
    return None


def _registers(config: KernelConfig, ctx: ProblemContext) -> str | None:
    """A thread holds BLOCK_N / (32 x num_warps) columns of each live block array. ptxas
    (sm_90, fp16 and fp32) needs ~2 registers a column plus ~24 in one pass (64 columns:
    114-146) and ~3.5 in two (64 columns: 242-255), within 255 a thread and 65,536 a block;
    beyond, it spills (two passes of 128 columns: over 1 KB a thread)."""
    threads = 32 * config["num_warps"]
    per_thread = config["BLOCK_N"] // threads
    per_column = 2.2 if config["BLOCK_N"] >= ctx.shape["N"] else 3.5
    limit = min(255, 65536 // threads)
    if 24 + per_thread * per_column > limit:
        return (f"each thread would hold {per_thread} columns per block array: ~"
                f"{24 + per_thread * per_column:.0f} registers, over {limit}")
    return None


class AddLayerNormKernel:
    name = "add_layernorm"
    ref = "search_spaces.add_layernorm:KERNEL"
    description = ("fused residual add + LayerNorm: s = x + r, y = layer_norm(s) * w + b, "
                   "both written, fp32 math")
    dims = (Dim("M", 1, 1 << 20, "rows (tokens)"), Dim("N", 1, 1 << 17, "hidden size"))
    dtypes = ("float16", "bfloat16", "float32")
    interpreter_unsupported_dtypes: tuple[str, ...] = ()
    #: its compile hook builds the GPU binary from host tensors (``tuner.host_compile``)
    compiles_on_host = True
    #: both outputs are rows: compared per row
    output_check = OutputCheck(rowwise=True)

    @property
    def version(self) -> str:
        return builtin_version(self, _add_layernorm_kernel)

    def space(self) -> SearchSpace:
        return SearchSpace(
            params=(
                Param.pow2("BLOCK_N", 64, 16384),
                Param.ints("ROWS", (1, 2, 4)),
                Param.pow2("num_warps", 1, 16),
                Param.ints("num_stages", (1, 2, 3)),
            ),
            constraints=(_redundant, _registers),
        )

    def default_config(self, shape: Mapping[str, int], dtype: str) -> KernelConfig:
        """One row per program, in one block up to 8,192 columns, 16 columns a thread."""
        n = shape.get("N", 4096)
        block = min(8192, max(64, next_pow2(n)))
        warps = max(1, min(16, block // 512))
        return KernelConfig(BLOCK_N=block, ROWS=1, num_warps=warps,
                            num_stages=1 if block >= n else 2)

    def known_good_configs(self, shape: Mapping[str, int], dtype: str) -> list[KernelConfig]:
        ctx = ProblemContext(shape, dtype)
        n = max(64, next_pow2(shape.get("N", 4096)))
        configs = [self.default_config(shape, dtype)]
        for block in sorted({min(n, b) for b in (16384, 8192, 4096, 1024)}, reverse=True):
            for warps in (4, 8, 16):
                for stages in (1, 2):
                    configs.append(KernelConfig(BLOCK_N=block, ROWS=1, num_warps=warps,
                                                num_stages=stages))
        if n <= 1024:  # short rows: several per program
            configs += [KernelConfig(BLOCK_N=n, ROWS=rows, num_warps=w, num_stages=2)
                        for rows in (2, 4) for w in (1, 2, 4)]
        space = self.space()
        return [c for c in dict.fromkeys(configs) if space.violation(c, ctx) is None]

    def make_inputs(
        self, shape: Mapping[str, int], dtype: str, device: str, seed: int
    ) -> dict[str, Any]:
        gen = torch.Generator(device=device).manual_seed(seed)
        m, n, dt = shape["M"], shape["N"], torch_dtype(dtype)

        def randn(*size: int) -> torch.Tensor:
            return torch.randn(size, generator=gen, device=device, dtype=torch.float32)

        return {"x": randn(m, n).to(dt), "residual": (2.0 * randn(m, n)).to(dt),
                "weight": (1.0 + 0.25 * randn(n)).to(dt), "bias": (0.5 * randn(n)).to(dt),
                "out": torch.empty((m, n), device=device, dtype=dt),
                "residual_out": torch.empty((m, n), device=device, dtype=dt),
                "eps": EPS, "_outputs": ("out", "residual_out")}

    def compile_shape(self, shape: Mapping[str, int], dtype: str) -> dict[str, int]:
        """A few rows of full length: the row length sets ONE_PASS and the stride; the number
        of rows only keeps its divisibility by 16 (and == 1)."""
        return {"M": shrunk_dim(shape["M"], 16), "N": shape["N"]}

    @staticmethod
    def _tensors(inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor,
                                                   torch.Tensor, torch.Tensor, torch.Tensor]:
        return (inputs["x"], inputs["residual"], inputs["weight"], inputs["bias"],
                inputs["out"], inputs["residual_out"])

    def launch(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        add_layernorm(*self._tensors(inputs), config, inputs["eps"])

    def compile(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        compile_add_layernorm(*self._tensors(inputs), config, inputs["eps"])

    def reference(self, inputs: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """(y, s) in fp32; y normalises s as stored (rounded to the dtype), as torch's
        ``layer_norm(x + r)`` in the dtype does, in float64: torch's fp32 layer_norm loses
        ~3e-4 of a row's scale on rows of mean 1e4 and std 2, over the kernel's error."""
        x, r = inputs["x"], inputs["residual"]
        s = x.float() + r.float()
        y = torch.nn.functional.layer_norm(s.to(x.dtype).double(), (x.shape[1],),
                                           inputs["weight"].double(),
                                           inputs["bias"].double(), inputs["eps"])
        return y.float(), s

    def tolerance(self, dtype: str) -> Tolerance:
        # s is one rounding of an exact sum; y is fp32 math (a few ulps of fp32) rounded once
        # to the dtype: within u = 2**-11 (fp16) or 2**-8 (bf16) of itself. rtol is 4u, atol
        # (x the row's largest |value|) 4u, for y's elements where (s - mean) * rstd * w and
        # b cancel. fp32: rsqrt and division are approximate on a GPU (a few ulps).
        return {"float16": Tolerance(2e-3, 2e-3), "bfloat16": Tolerance(1.6e-2, 1.6e-2),
                "float32": Tolerance(1e-5, 1e-5)}[dtype]

    def flops(self, shape: Mapping[str, int]) -> float:
        # add, shift, sum, centre, square and sum, scale by rstd, by w, add b: per element
        return 8.0 * shape["M"] * shape["N"]

    def bytes(self, shape: Mapping[str, int], dtype: str) -> float:
        # read x and r, write y and s; w and b once
        m, n = shape["M"], shape["N"]
        return float(element_bytes(dtype) * (4 * m * n + 2 * n))

    def torch_baseline(self, inputs: dict[str, Any]) -> None:
        self.baseline(inputs)

    def baseline(self, inputs: dict[str, Any]) -> torch.Tensor:
        """``s = x + r`` into the residual output, then ``layer_norm(s)`` (two kernels)."""
        s = torch.add(inputs["x"], inputs["residual"], out=inputs["residual_out"])
        return torch.nn.functional.layer_norm(s, (s.shape[1],), inputs["weight"],
                                              inputs["bias"], inputs["eps"])

    def prior(self, config: KernelConfig, ctx: ProblemContext) -> float | None:
        """``streaming_seconds``: one pass moves x, r, s and y; two passes also read s back
        (counted at half: most of it is still in L2). In flight: x and r's blocks."""
        m, n, elem = ctx.shape["M"], ctx.shape["N"], ctx.elem_bytes
        passes = 4.0 if config["BLOCK_N"] >= n else 4.5
        in_flight = 2 * min(config["BLOCK_N"], n) * elem * config["ROWS"] ** 0.5
        programs = -(-m // config["ROWS"])
        return math.log(streaming_seconds(ctx, passes * m * n * elem, programs,
                                          config["num_warps"], in_flight))


KERNEL = AddLayerNormKernel()
