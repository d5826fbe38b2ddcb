"""The GEMM family's host helpers: matmul's variant numbering and parameters, the device's SM
count, TMA availability, whether a tile fits (shared memory, accumulator registers), matmul's
constraints and the tiled kernel's space, known-good configs and default.

matmul launches with them; matmul_epilogue, conv2d and moe_gemm share them (their kernels
call the family's device code in ``search_spaces/matmul.py``), and the family's prior
(``prior.py``) reads the variant numbering and ALIGN's padding unit from here. Moved here from
``search_spaces/matmul.py`` unchanged: a kernel's version hashes each function's syntax tree
and the constants it reads by name, not the module it lives in (``tuner/code_hash.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch
import triton
import triton.language as tl

from tuner.config import KernelConfig
from tuner.dtypes import next_pow2
from tuner.host_compile import device_on_gpu, gpu_capability, gpu_sm_count, on_gpu
from tuner.space import Param, ProblemContext, SearchSpace

#: The VARIANT parameter's values. Config values are ints (KernelConfig, the store, the API),
#: so the algorithm is a categorical int; these are its names, by value.
VARIANTS = ("tiled", "persistent", "tma_persistent", "split_k", "stream_k")
TILED, PERSISTENT, TMA_PERSISTENT, SPLIT_K_VARIANT, STREAM_K = range(len(VARIANTS))
#: SPLIT_K's values: 1 for every variant but split_k, which takes one of the others
SPLIT_KS = (1, 2, 4, 8, 16)
#: matmul's BLOCK_N values: the tiled space's powers of two and 192 (128 + 64), a width only
#: tma_persistent's split tiles take (``second_block``; ``split_tile_constraint``)
BLOCK_NS = (32, 64, 128, 192, 256)
#: NUM_SMS of the persistent variants on the CPU interpreter: few, so that each program walks
#: several tiles in the tests
INTERPRETER_SMS = 3
#: whether this Triton builds device-side tensor descriptors (TMA loads on sm_90+; 3.6 and 3.9
#: do, and the CPU interpreter runs them)
HAS_TENSOR_DESCRIPTORS = hasattr(tl, "make_tensor_descriptor") and hasattr(triton,
                                                                            "set_allocator")


#: ALIGN's values: 0 runs the variant on the operands as given; 1 first copies the operands
#: that would load slowly into zero-padded buffers with aligned rows (``stage``)
ALIGNS = (0, 1)
#: ALIGN's padding unit, elements: K and the buffers' row strides become multiples of 16, the
#: divisibility Triton specialises integer arguments on, so every operand load is a 16-byte
#: vector (cp.async or TMA) and the K mask keeps that width
ALIGN_ELEMS = 16


def variant_of(config: Mapping[str, int]) -> int:
    """The config's VARIANT; a config from before variants existed is the tiled kernel."""
    return int(config.get("VARIANT", TILED))


def align_of(config: Mapping[str, int]) -> int:
    """The config's ALIGN; a config from before it existed runs on the operands as given."""
    return int(config.get("ALIGN", 0))


def round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def staging_needed(shape: Mapping[str, int], elem_bytes: int) -> bool:
    """Whether ALIGN=1 copies anything on a problem with row-major, freshly allocated
    operands: K not a multiple of ALIGN_ELEMS (A's rows, and B's rows in K, are padded with
    zeros), or B's and C's rows not 16-byte aligned (N * element size)."""
    return shape["K"] % ALIGN_ELEMS != 0 or (shape["N"] * elem_bytes) % 16 != 0


def even_k(K: int, block_k: int) -> bool:
    """Whether every K step is whole (the ``EVEN_K`` constexpr: no K mask in the loop). The
    compile shape keeps K mod 256, so it compiles the binary the real problem runs."""
    return K % block_k == 0


def num_sms(device: torch.device) -> int:
    """Programs of the persistent variants: the device's SM count (a small constant on the
    CPU interpreter; the GPU's where host tensors stand in for its, ``tuner.host_compile``)."""
    if not device_on_gpu(device):
        return INTERPRETER_SMS
    return gpu_sm_count(device)


def output_tiles(config: Mapping[str, int], shape: Mapping[str, int]) -> int:
    """How many BLOCK_M x BLOCK_N tiles cover the M x N output."""
    return triton.cdiv(shape["M"], config["BLOCK_M"]) * triton.cdiv(shape["N"], config["BLOCK_N"])


def second_block(block: int) -> int:
    """tma_persistent's ``SPLIT_N`` of a BLOCK_N: 0 for a power of two, else the size of the
    tile side's second power-of-two block (192 = 128 + 64 gives 64)."""
    first = 1 << (block.bit_length() - 1)
    rest = block - first
    if rest & (rest - 1):
        raise ValueError(f"a tile side of {block} is not a power of two or a sum of two")
    return rest


def set_tma_allocator(device: torch.device) -> None:
    """Device-side descriptors live in global scratch memory the launch asks Triton's
    allocator for (none is needed on the interpreter, nor to compile)."""
    if device.type == "cuda":
        def alloc(size: int, alignment: int, stream: int | None) -> torch.Tensor:
            return torch.empty(size, device=device, dtype=torch.int8)

        triton.set_allocator(alloc)


def stream_k_tma(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> bool:
    """Whether stream_k loads A and B and stores C by tensor descriptors (TMA): on sm_90+
    with this Triton's descriptors, 16-bit inputs, row-major A, B and C with 16-byte aligned
    rows and bases (what the cost model assumes from the problem: ``stream_k_tma_problem``);
    elsewhere it uses the pointer loads and stores of the persistent kernel."""
    return (_descriptors_for(a, b)
            and all(_aligned_rows(t) for t in (a, b, out))
            and a.element_size() == out.element_size())


def _descriptors_for(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether this Triton and device run descriptor (TMA) loads of these inputs, their rows
    aside: sm_90+ on CUDA, 16-bit inputs of one dtype."""
    return (HAS_TENSOR_DESCRIPTORS and on_gpu(a)
            and a.dtype in (torch.float16, torch.bfloat16) and b.dtype == a.dtype
            and gpu_capability(a.device) >= (9, 0))


def _aligned_rows(t: torch.Tensor) -> bool:
    """Row-major with 16-byte aligned rows and base: every row loads in 16-byte vectors."""
    return (t.stride(1) == 1 and (t.stride(0) * t.element_size()) % 16 == 0
            and t.data_ptr() % 16 == 0)


def tma_unavailable(ctx: ProblemContext) -> str | None:
    """Why the problem cannot use tensor-descriptor (TMA) loads, row alignment aside (None
    when it can): this Triton's descriptors, sm_90+, 16-bit inputs (fp32's TF32 wgmma wants B
    K-major; ours is N-major). The TMA variants of matmul and moe_gemm share it."""
    if not HAS_TENSOR_DESCRIPTORS:
        return f"Triton {triton.__version__} has no tl.make_tensor_descriptor"
    if ctx.capability < 90:
        return f"TMA needs compute capability 9.0 or newer (the device has {ctx.capability})"
    if ctx.dtype not in ("float16", "bfloat16"):
        return f"tma_persistent is for 16-bit inputs, not {ctx.dtype}"
    return None


def rows_aligned(ctx: ProblemContext, config: Mapping[str, int] | None = None) -> bool:
    """Whether A's and B's rows are 16-byte aligned as the kernel sees them: always with
    ALIGN=1 (its buffers' rows are), else from K and N (contiguous fresh inputs)."""
    if config is not None and align_of(config):
        return True
    e = ctx.elem_bytes
    return (ctx.shape["K"] * e) % 16 == 0 and (ctx.shape["N"] * e) % 16 == 0


def stream_k_tma_problem(ctx: ProblemContext, config: Mapping[str, int] | None = None) -> bool:
    """``stream_k_tma`` from the problem alone (contiguous fresh inputs, as the tuner makes;
    ALIGN=1 stages them into aligned rows)."""
    return tma_unavailable(ctx) is None and rows_aligned(ctx, config)


#: stream_k's fp32 partial tiles (two slots a program) and per-tile int32 counters, by
#: (device, stream): allocated on the first launch that needs them (grown when a larger
#: config comes), never per launch; the counters are zeroed once here and set back to 0 by
#: each tile's finishing program, so a launch leaves them as it found them. One buffer a
#: stream: launches on a stream run one after another.
_STREAM_K_BUFFERS: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]] = {}


def stream_k_buffers(device: torch.device, sms: int, block_m: int,
                     block_n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(workspace, counters) for a stream_k launch of ``sms`` programs with this tile: at
    least 2 * sms * block_m * block_n fp32 and 2 * sms int32 (the stream-K tiles are fewer
    than two waves)."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), int(stream))
    need_ws, need_cnt = 2 * sms * block_m * block_n, 2 * sms
    ws, cnt = _STREAM_K_BUFFERS.get(key, (None, None))
    if ws is None or ws.numel() < need_ws:
        ws = torch.empty(need_ws, device=device, dtype=torch.float32)
    if cnt is None or cnt.numel() < need_cnt:
        cnt = torch.zeros(need_cnt, device=device, dtype=torch.int32)
    _STREAM_K_BUFFERS[key] = (ws, cnt)
    return ws, cnt


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
    bm, bn = config["BLOCK_M"], config["BLOCK_N"]
    if variant_of(config) == TMA_PERSISTENT or (variant_of(config) == STREAM_K
                                                 and stream_k_tma_problem(ctx, config)):
        # the descriptor store stages the output tile in shared memory besides the pipeline
        stage_c = bm * bn * ctx.elem_bytes
        ctx = replace(ctx, smem_limit=ctx.smem_limit - stage_c)
        if ctx.smem_limit <= 0:
            return f"the output tile alone needs {stage_c} B of shared memory"
    return tile_shared_memory(config["num_stages"], bm, bn, config["BLOCK_K"], ctx)


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


#: the split-K workspace's cap (SPLIT_K x M x N fp32): beyond it the round trip costs more
#: than the parallelism gains, and its int32 offsets stay below 2**31
MAX_WORKSPACE_BYTES = 1 << 30


def _variant_params(config: KernelConfig, ctx: ProblemContext) -> str | None:
    """SPLIT_K is 1 unless VARIANT is split_k, and more than 1 when it is."""
    # SPLIT_K only means something to split_k: elsewhere every value but 1 would be a
    # duplicate of the same kernel; split_k with 1 is the tiled kernel plus a copy.
    variant, split = variant_of(config), int(config.get("SPLIT_K", 1))
    if variant != SPLIT_K_VARIANT and split != 1:
        return f"SPLIT_K={split} is only used by VARIANT=split_k ({SPLIT_K_VARIANT})"
    if variant == SPLIT_K_VARIANT and split == 1:
        return "VARIANT=split_k needs SPLIT_K > 1 (with 1 it is the tiled kernel)"
    return None


def _split_k(config: KernelConfig, ctx: ProblemContext) -> str | None:
    """split_k gives every split at least one K step, and its fp32 workspace stays under
    MAX_WORKSPACE_BYTES."""
    if variant_of(config) != SPLIT_K_VARIANT:
        return None
    split = int(config["SPLIT_K"])
    k_tiles = -(-ctx.shape["K"] // config["BLOCK_K"])
    per_split = -(-k_tiles // split)
    if (split - 1) * per_split >= k_tiles:
        # an empty split: the same K partition as a smaller SPLIT_K, plus idle programs
        return f"SPLIT_K={split} leaves a split without a K step ({k_tiles} steps)"
    workspace = split * ctx.shape["M"] * ctx.shape["N"] * 4
    if workspace > MAX_WORKSPACE_BYTES:
        return f"the split-K workspace would take {workspace} B (cap {MAX_WORKSPACE_BYTES})"
    return None


def persistent_constraint(config: KernelConfig, ctx: ProblemContext) -> str | None:
    """Why a persistent variant cannot run or repeats the tiled kernel (None otherwise):
    tma_persistent needs tensor descriptors in this Triton, sm_90+, 16-bit inputs and 16-byte
    aligned rows; persistent with no more tiles than SMs is the tiled kernel."""
    variant = variant_of(config)
    if variant == PERSISTENT:
        tiles = output_tiles(config, ctx.shape)
        if tiles <= ctx.sm_count:
            # one tile per program: the tiled kernel with a loop around it
            return f"{tiles} tiles fit on {ctx.sm_count} SMs: persistent is the tiled kernel"
    if variant != TMA_PERSISTENT:
        return None
    if why := tma_unavailable(ctx):
        return why
    e = ctx.elem_bytes
    for dim, row in (("K", ctx.shape["K"] * e), ("N", ctx.shape["N"] * e)):
        if row % 16 and not align_of(config):
            return (f"TMA needs 16-byte aligned rows ({dim} x {e} B = {row} B; ALIGN=1 "
                    "copies them into aligned ones)")
    return None


def align_constraint(config: KernelConfig, ctx: ProblemContext) -> str | None:
    """ALIGN=1 only where it copies something (``staging_needed``): elsewhere it is the same
    kernel as ALIGN=0."""
    if align_of(config) and not staging_needed(ctx.shape, ctx.elem_bytes):
        return (f"K={ctx.shape['K']} is a multiple of {ALIGN_ELEMS} and B's rows are 16-byte "
                "aligned: ALIGN=1 would copy nothing")
    return None


def split_tile_constraint(config: KernelConfig, ctx: ProblemContext) -> str | None:
    """A BLOCK_N that is not a power of two (192) only for tma_persistent, whose kernel splits
    the tile's columns into two power-of-two blocks; the other kernels' tiles are one
    ``tl.arange`` wide."""
    bn = config["BLOCK_N"]
    if bn & (bn - 1) and variant_of(config) != TMA_PERSISTENT:
        return (f"BLOCK_N={bn} is not a power of two: only VARIANT=tma_persistent "
                f"({TMA_PERSISTENT}) splits such a tile")
    return None


def stream_k_plan(tiles: int, k_tiles: int, sms: int) -> tuple[int, int]:
    """stream_k's schedule, as its kernel computes it: (full, per). Tiles ``0 .. full - 1``
    are data-parallel (whole K, ``full // sms`` a program); the rest (one wave plus the tail:
    "DP + two-tile SK") are ``(tiles - full) * k_tiles`` K steps cut into runs of ``per``
    (at least one tile's steps, so no tile meets more than two runs)."""
    full = max(tiles // sms - 1, 0) * sms
    return full, max(-(-(tiles - full) * k_tiles // sms), k_tiles)


def stream_k_constraint(config: KernelConfig, ctx: ProblemContext) -> str | None:
    """stream_k only where it differs from the persistent kernel: a tail wave (tiles not a
    multiple of the SMs), at least one full wave (with fewer tiles split_k balances the SMs),
    and more than one K step to split."""
    if variant_of(config) != STREAM_K:
        return None
    tiles, sms = output_tiles(config, ctx.shape), ctx.sm_count
    if tiles < sms:
        return f"{tiles} tiles do not fill {sms} SMs: stream_k needs a full wave"
    if tiles % sms == 0:
        return f"{tiles} tiles are whole waves of {sms} SMs: stream_k is the persistent kernel"
    if ctx.shape["K"] <= config["BLOCK_K"]:
        return "one K step: stream_k has nothing to split (the persistent kernel)"
    return None


# The Triton matmul tutorial's CUDA configs (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, warps, stages),
# plus two for skinny (decode-like) problems: the tiled kernel.
_KNOWN_GOOD = [
    (128, 256, 64, 8, 8, 3), (64, 256, 32, 8, 4, 4), (128, 128, 32, 8, 4, 4),
    (128, 64, 32, 8, 4, 4), (64, 128, 32, 8, 4, 4), (128, 32, 32, 8, 4, 4),
    (64, 32, 32, 8, 2, 5), (32, 64, 32, 8, 2, 5),
    (16, 64, 128, 1, 4, 4), (16, 128, 64, 1, 4, 4),
]
_PARAMS = ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")
def tiled_space() -> SearchSpace:
    """The tiled kernel's space (matmul's before variants; matmul_epilogue runs on it)."""
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


def tiled_known_good() -> list[KernelConfig]:
    """The tiled kernel's known-good configs (in tiled_space)."""
    return [KernelConfig(dict(zip(_PARAMS, c, strict=True))) for c in _KNOWN_GOOD]


def tiled_default(shape: Mapping[str, int]) -> KernelConfig:
    """A tiled config that runs on every shape and dtype, on any GPU with >= 100 KB of smem."""
    block_m = 16 if shape.get("M", 128) <= 16 else 64
    return KernelConfig(BLOCK_M=block_m, BLOCK_N=64, BLOCK_K=32, GROUP_M=8, num_warps=4,
                        num_stages=3)


