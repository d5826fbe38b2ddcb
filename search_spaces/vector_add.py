"""Elementwise C = A + B over N elements: the roofline's memory-bound example.

Every element is read twice and written once, so the floor is 3 x N x element bytes at the
copy bandwidth; nothing is computed worth counting. What a config changes is how many bytes
each SM keeps in flight (``BLOCK`` elements per program, ``num_warps``) and how programs are
laid on the GPU: one per block (``PROGRAMS_PER_SM=0``), or a persistent grid of
``PROGRAMS_PER_SM`` x SMs programs that stride over the blocks (``num_stages`` then pipelines
the strided loop's loads). A block wholly inside the vector is loaded without a mask (the
last, partial block alone is masked), so any N keeps 16-byte accesses. Offsets are int64:
N may reach 2**31 - 1. Same three layers as ``matmul``: ``_vector_add_kernel`` ->
``vector_add`` (the launcher) -> ``VectorAddKernel`` (the TunableKernel).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl

from tuner.config import KernelConfig
from tuner.dtypes import element_bytes, next_pow2, torch_dtype
from tuner.host_compile import device_on_gpu, gpu_sm_count
from tuner.kernel import Dim, Tolerance, builtin_version, shrunk_dim
from tuner.space import Param, ProblemContext, SearchSpace

#: the interpreter has no SMs: a few stand-ins make the persistent grid's stride loop iterate
INTERPRETER_SMS = 4


@triton.jit
def _add_block(a_ptr, b_ptr, out_ptr, start, N, BLOCK: tl.constexpr):
    """out[start:start+BLOCK] = a + b, fp32 math; unmasked when the block is whole."""
    offs = start + tl.arange(0, BLOCK)
    if start + BLOCK <= N:
        a = tl.load(a_ptr + offs).to(tl.float32)
        b = tl.load(b_ptr + offs).to(tl.float32)
        tl.store(out_ptr + offs, (a + b).to(out_ptr.dtype.element_ty))
    else:
        mask = offs < N
        a = tl.load(a_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + offs, (a + b).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _vector_add_kernel(a_ptr, b_ptr, out_ptr, N, BLOCK: tl.constexpr,
                       PERSISTENT: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    if PERSISTENT:
        step = tl.num_programs(0).to(tl.int64) * BLOCK
        for start in range(pid * BLOCK, N, step):
            _add_block(a_ptr, b_ptr, out_ptr, start, N, BLOCK)
    else:
        _add_block(a_ptr, b_ptr, out_ptr, pid * BLOCK, N, BLOCK)


def sm_count(device: torch.device) -> int:
    """The device's SMs (the persistent grid's unit); ``INTERPRETER_SMS`` off the GPU (the
    GPU's where host tensors stand in for its, ``tuner.host_compile``)."""
    if not device_on_gpu(device):
        return INTERPRETER_SMS
    return gpu_sm_count(device)


def _launch_meta(a: torch.Tensor, config: KernelConfig) -> tuple[tuple[int], dict[str, int]]:
    blocks = triton.cdiv(a.numel(), config["BLOCK"])
    per_sm = config["PROGRAMS_PER_SM"]
    programs = min(blocks, per_sm * sm_count(a.device)) if per_sm else blocks
    return (max(1, programs),), {"BLOCK": config["BLOCK"], "PERSISTENT": int(per_sm > 0)}


def _check(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
    if not (a.shape == b.shape == out.shape) or not all(
            t.is_contiguous() for t in (a, b, out)):
        raise ValueError("vector_add needs contiguous a, b and out of one shape")


def vector_add(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor,
               config: KernelConfig) -> None:
    """out = a + b (contiguous tensors of one shape) with the given launch config."""
    _check(a, b, out)
    grid, meta = _launch_meta(a, config)
    _vector_add_kernel[grid](a, b, out, a.numel(), **meta, num_warps=config.num_warps,
                             num_stages=config.num_stages)


def compile_vector_add(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor,
                       config: KernelConfig) -> None:
    """Compile (or load from Triton's disk cache) without launching."""
    _check(a, b, out)
    grid, meta = _launch_meta(a, config)
    _vector_add_kernel.warmup(a, b, out, a.numel(), **meta, num_warps=config.num_warps,
                              num_stages=config.num_stages, grid=grid)


def _blocks(config: KernelConfig, ctx: ProblemContext) -> int:
    return -(-ctx.shape["N"] // config["BLOCK"])


def _redundant(config: KernelConfig, ctx: ProblemContext) -> str | None:
    """No block wider than the vector needs; no thread without an element of its own (a block
    narrower than the warps wraps and repeats work); a persistent grid only where there are
    more blocks than programs (else it is the plain grid again), and pipelining stages only
    in its loop (the plain kernel has no loop: its stages would be duplicates)."""
    cap = max(256, next_pow2(ctx.shape["N"]))
    if config["BLOCK"] > cap:
        return f"BLOCK={config['BLOCK']} is wider than N={ctx.shape['N']} needs ({cap})"
    if config["BLOCK"] < 32 * config["num_warps"]:
        return f"BLOCK={config['BLOCK']} gives some of {config['num_warps']} warps' threads " \
               "no element"
    per_sm = config["PROGRAMS_PER_SM"]
    if per_sm and _blocks(config, ctx) <= per_sm * ctx.sm_count:
        return (f"{_blocks(config, ctx)} blocks fit a grid of {per_sm} x {ctx.sm_count} SMs: "
                "the persistent grid would be the plain one")
    if not per_sm and config["num_stages"] != 1:
        return "num_stages only pipelines the persistent grid's loop"
    return None


def _registers(config: KernelConfig, ctx: ProblemContext) -> str | None:
    """A thread holds BLOCK / (32 x num_warps) elements of a and of b: ptxas (sm_90) gives
    ~4 registers per element plus ~24, within 255 per thread and 65,536 per block; beyond,
    it spills (8 warps of 64 elements use 255 registers and spill, 16 warps of 32 spill)."""
    threads = 32 * config["num_warps"]
    per_thread = config["BLOCK"] // threads
    limit = min(32, (min(255, 65536 // threads) - 24) // 4)
    if per_thread > limit:
        return f"each thread would hold {per_thread} elements of each input (over {limit})"
    return None


#: bytes a streaming kernel keeps in flight per SM to cover HBM latency on an H200 (Little's
#: law: ~4.3 TB/s x ~1.2 us / 132 SMs)
BYTES_IN_FLIGHT_PER_SM = 40_000
#: the measured copy bandwidth of an H200, B/s; the GPU time of a launch (the first of a
#: timed call, and each one queued behind it) and of a program
COPY_BANDWIDTH = 4.27e12
LAUNCH_S = 2e-6
NEXT_LAUNCH_S = 1e-6
PROGRAM_S = 2e-8


def streaming_seconds(ctx: ProblemContext, hbm_bytes: float, programs: int, num_warps: int,
                      in_flight: float, launches: int = 1, persistent: bool = False,
                      registers: int = 0) -> float:
    """A cost model of a memory-bound kernel (the prior of vector_add, add_layernorm and
    softmax): ``hbm_bytes`` over the copy bandwidth, slowed where the programs resident on an
    SM (64 warps, 32 blocks and 65,536 registers an SM; ``registers`` a thread when known)
    keep fewer than ``BYTES_IN_FLIGHT_PER_SM`` in flight (``in_flight`` bytes each), by wave
    quantisation of a short grid (a persistent grid has none), a cost per program and one
    per launch. Only ranks configs: it is no measurement."""
    sms = max(1, ctx.sm_count)
    programs = max(1, programs)
    resident = max(1, min(32, 64 // num_warps))
    if registers:
        resident = max(1, min(resident, 65536 // (32 * num_warps * registers)))
    efficiency = min(1.0, min(resident, math.ceil(programs / sms)) * in_flight
                     / BYTES_IN_FLIGHT_PER_SM)
    waves = programs / (sms * resident)
    quantised = 1.0 if persistent or waves > 4 else math.ceil(waves) / waves
    launch = LAUNCH_S + NEXT_LAUNCH_S * (launches - 1)
    return launch + hbm_bytes / (COPY_BANDWIDTH * efficiency) * quantised \
        + PROGRAM_S * programs / sms


def estimated_seconds(config: KernelConfig, ctx: ProblemContext) -> float:
    """vector_add's ``streaming_seconds``: two loads of a block in flight per program (twice
    that in a persistent loop pipelined over two or more stages)."""
    per_sm = config["PROGRAMS_PER_SM"]
    blocks = _blocks(config, ctx)
    programs = min(blocks, per_sm * ctx.sm_count) if per_sm else blocks
    in_flight = config["BLOCK"] * ctx.elem_bytes * 2
    if per_sm:
        in_flight *= min(config["num_stages"], 2)
    return streaming_seconds(ctx, 3 * ctx.shape["N"] * ctx.elem_bytes, programs,
                             config["num_warps"], in_flight, persistent=per_sm > 0)


class VectorAddKernel:
    name = "vector_add"
    ref = "search_spaces.vector_add:KERNEL"
    description = "elementwise C = A + B, the memory-bound roofline example"
    dims = (Dim("N", 1, (1 << 31) - 1, "elements"),)
    dtypes = ("float16", "bfloat16", "float32")
    interpreter_unsupported_dtypes: tuple[str, ...] = ()
    #: its compile hook builds the GPU binary from host tensors (``tuner.host_compile``)
    compiles_on_host = True

    @property
    def version(self) -> str:
        return builtin_version(self, _vector_add_kernel)

    def space(self) -> SearchSpace:
        return SearchSpace(
            params=(
                Param.pow2("BLOCK", 256, 8192),
                Param.ints("PROGRAMS_PER_SM", (0, 1, 2, 4, 8)),
                Param.pow2("num_warps", 1, 16),
                Param.ints("num_stages", (1, 2, 3)),
            ),
            constraints=(_redundant, _registers),
        )

    def default_config(self, shape: Mapping[str, int], dtype: str) -> KernelConfig:
        """One program per block of 4,096 elements, 8 warps: 16 elements per thread, two or
        four 16-byte accesses per input (capped at the vector's size)."""
        block = min(4096, max(256, next_pow2(shape.get("N", 4096))))
        return KernelConfig(BLOCK=block, PROGRAMS_PER_SM=0, num_warps=min(8, block // 32),
                            num_stages=1)

    def known_good_configs(self, shape: Mapping[str, int], dtype: str) -> list[KernelConfig]:
        ctx = ProblemContext(shape, dtype)
        space = self.space()
        configs = [self.default_config(shape, dtype)]
        for block in (8192, 4096, 2048, 1024):
            for warps in (4, 8, 16):
                configs.append(KernelConfig(BLOCK=block, PROGRAMS_PER_SM=0, num_warps=warps,
                                            num_stages=1))
        for per_sm in (4, 8):
            for block in (4096, 8192):
                configs.append(KernelConfig(BLOCK=block, PROGRAMS_PER_SM=per_sm, num_warps=8,
                                            num_stages=2))
        return [c for c in dict.fromkeys(configs) if space.violation(c, ctx) is None]

    def make_inputs(
        self, shape: Mapping[str, int], dtype: str, device: str, seed: int
    ) -> dict[str, Any]:
        gen = torch.Generator(device=device).manual_seed(seed)
        n, dt = shape["N"], torch_dtype(dtype)
        a = torch.randn(n, generator=gen, device=device, dtype=torch.float32).to(dt)
        b = torch.randn(n, generator=gen, device=device, dtype=torch.float32).to(dt)
        return {"a": a, "b": b, "out": torch.empty(n, device=device, dtype=dt)}

    def compile_shape(self, shape: Mapping[str, int], dtype: str) -> dict[str, int]:
        """Nothing about N is a constexpr: a short vector with N's divisibility by 16 (and
        N == 1 kept) compiles the same binary."""
        return {"N": shrunk_dim(shape["N"], 16)}

    def launch(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        vector_add(inputs["a"], inputs["b"], inputs["out"], config)

    def compile(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        compile_vector_add(inputs["a"], inputs["b"], inputs["out"], config)

    def reference(self, inputs: dict[str, Any]) -> torch.Tensor:
        return inputs["a"].float() + inputs["b"].float()

    def tolerance(self, dtype: str) -> Tolerance:
        # One rounding of the exact sum to the dtype: at most u = 2**-11 (fp16), 2**-8 (bf16),
        # 2**-24 (fp32) of the element; rtol is 4u. atol (x the largest |sum|) is 2u, room
        # only for sums that cancel to near nothing.
        return {"float16": Tolerance(1e-3, 2e-3), "bfloat16": Tolerance(8e-3, 1.6e-2),
                "float32": Tolerance(1.2e-7, 2.4e-7)}[dtype]

    def flops(self, shape: Mapping[str, int]) -> float:
        return float(shape["N"])

    def bytes(self, shape: Mapping[str, int], dtype: str) -> float:
        return float(3 * element_bytes(dtype) * shape["N"])  # read a and b, write out

    def torch_baseline(self, inputs: dict[str, Any]) -> None:
        torch.add(inputs["a"], inputs["b"], out=inputs["out"])

    def baseline(self, inputs: dict[str, Any]) -> torch.Tensor:
        """The same sum by torch.add into the same output."""
        return torch.add(inputs["a"], inputs["b"], out=inputs["out"])

    def prior(self, config: KernelConfig, ctx: ProblemContext) -> float | None:
        """The log of ``estimated_seconds``: a streaming model, for ranking only."""
        return math.log(estimated_seconds(config, ctx))


KERNEL = VectorAddKernel()
