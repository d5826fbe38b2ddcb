"""Kernels written the way users write them, one per pattern ``triton.autotune`` users rely on,
adapted with ``tuner.Kernel`` / ``tuner.autotune`` (tests/test_user_kernel_patterns.py).

Each is a real Triton kernel (run on the interpreter in the tests); measuring child processes
import them by reference (``tests.user_kernels:NAME``).
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Mapping
from typing import Any

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

import tuner
from tuner.config import KernelConfig
from tuner.kernel import DEFAULT_TOLERANCES, Dim, Tolerance
from tuner.space import Param, SearchSpace


def _gen(device: str, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def _named(kernel: Any, ref: str) -> Any:
    kernel.ref = f"tests.user_kernels:{ref}"
    return kernel


# -- config-dependent inputs: tokens sorted and padded to the tuned BLOCK_T (as MoE does) -----

@triton.autotune(configs=[triton.Config({"BLOCK_T": b}, num_warps=4) for b in (2, 4, 8)],
                 key=["T", "D"])
@triton.jit
def padded_scale_kernel(x_ptr, ids_ptr, w_ptr, out_ptr, T, D, num_padded,
                        BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
    """out[ids[p]] = x[ids[p]] * w[p] for the padded positions p of this block (ids == T pad)."""
    p = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    tok = tl.load(ids_ptr + p, mask=p < num_padded, other=T)
    w = tl.load(w_ptr + p, mask=p < num_padded, other=0.0)
    d = tl.arange(0, BLOCK_D)
    mask = (tok[:, None] < T) & (d[None, :] < D)
    x = tl.load(x_ptr + tok[:, None] * D + d[None, :], mask=mask, other=0.0)
    tl.store(out_ptr + tok[:, None] * D + d[None, :], x * w[:, None], mask=mask)


def padded_inputs(shape: Mapping[str, int], dtype: str, device: str,
                  seed: int) -> dict[str, Any]:
    g = _gen(device, seed)
    T, D = shape["T"], shape["D"]
    x = torch.randn(T, D, generator=g, device=device).to(getattr(torch, dtype))
    weights = torch.rand(T, generator=g, device=device) + 0.5  # not a kernel argument
    order = torch.randperm(T, generator=g, device=device)  # nor this
    return {"x_ptr": x, "out_ptr": torch.empty_like(x), "T": T, "D": D,
            "BLOCK_D": triton.next_power_of_2(D), "weights": weights, "order": order}


def pad_to_block(config: KernelConfig, inputs: Mapping[str, Any]) -> dict[str, Any]:
    """The token ids in ``order``, padded with T to a multiple of the config's BLOCK_T."""
    order, weights, T = inputs["order"], inputs["weights"], inputs["T"]
    padded = triton.cdiv(T, config["BLOCK_T"]) * config["BLOCK_T"]
    ids = torch.full((padded,), T, dtype=torch.int32, device=order.device)
    ids[:T] = order.to(torch.int32)
    w = torch.zeros(padded, device=order.device)
    w[:T] = weights[order]
    return {"ids_ptr": ids, "w_ptr": w, "num_padded": padded}


PADDED = _named(tuner.Kernel(
    padded_scale_kernel, name="padded_scale", make_inputs=padded_inputs, prepare=pad_to_block,
    grid=lambda m: (triton.cdiv(m["num_padded"], m["BLOCK_T"]),),
    reference=lambda a: (a["x_ptr"].float() * a["weights"][:, None]).to(a["x_ptr"].dtype),
    dtypes=("float32",)), "PADDED")


# -- pre_hook: a TMA kernel whose configs set its tensor descriptors' block shapes ---------------

def set_block_shapes(nargs: dict[str, Any]) -> None:
    block = [nargs["BLOCK_M"], nargs["BLOCK_N"]]
    nargs["x_desc"].block_shape = block
    nargs["out_desc"].block_shape = block


TMA_CONFIGS = [triton.Config({"BLOCK_M": m, "BLOCK_N": 16}, num_warps=4, pre_hook=set_block_shapes)
               for m in (2, 4)]


@triton.jit
def tma_double(x_desc, out_desc, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    pm, pn = tl.program_id(0), tl.program_id(1)
    x = x_desc.load([pm * BLOCK_M, pn * BLOCK_N])
    out_desc.store([pm * BLOCK_M, pn * BLOCK_N], x * 2)


tma_double_served = tuner.autotune(configs=TMA_CONFIGS, key=["M", "N"],
                                   name="tma_double")(tma_double)


def tma_grid(m: Mapping[str, Any]) -> tuple[int, int]:
    return triton.cdiv(m["M"], m["BLOCK_M"]), triton.cdiv(m["N"], m["BLOCK_N"])


def tma_inputs(shape: Mapping[str, int], dtype: str, device: str,
               seed: int) -> dict[str, Any]:
    x = torch.randn(shape["M"], shape["N"], generator=_gen(device, seed), device=device)
    x = x.to(getattr(torch, dtype))
    out = torch.empty_like(x)
    # block shapes are placeholders: each config's pre_hook sets its own
    return {"x_desc": TensorDescriptor.from_tensor(x, [1, 1]),
            "out_desc": TensorDescriptor.from_tensor(out, [1, 1]),
            "M": shape["M"], "N": shape["N"]}


TMA = _named(tuner.Kernel(
    tma_double_served, grid=tma_grid, make_inputs=tma_inputs, outputs=["out_desc"],
    reference=lambda a: a["x_desc"].base * 2, dtypes=("float32",)), "TMA")


# -- triton.heuristics under triton.autotune, empty-kwargs configs, do_not_specialize,
#    reset_to_zero on an accumulated output, two outputs ------------------------------------------

@triton.autotune(configs=[triton.Config({}, num_warps=w) for w in (1, 2, 4)], key=["N"],
                 reset_to_zero=["total_ptr"])
@triton.heuristics({"BLOCK": lambda a: triton.next_power_of_2(a["N"]) // 2})
@triton.jit(do_not_specialize=["N"])
def square_and_total(x_ptr, sq_ptr, total_ptr, N, BLOCK: tl.constexpr):
    """sq = x * x, and total += sum(x * x) (atomically, so the total must start at zero)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < N, other=0.0)
    tl.store(sq_ptr + offs, x * x, mask=offs < N)
    tl.atomic_add(total_ptr, tl.sum(x * x, axis=0))


def square_inputs(shape: Mapping[str, int], dtype: str, device: str,
                  seed: int) -> dict[str, Any]:
    x = torch.randn(shape["N"], generator=_gen(device, seed), device=device)
    return {"x_ptr": x, "sq_ptr": torch.empty_like(x),
            "total_ptr": torch.empty(1, device=device), "N": shape["N"]}


SQUARE = _named(tuner.Kernel(
    square_and_total, name="square_and_total", make_inputs=square_inputs,
    grid=lambda m: (triton.cdiv(m["N"], triton.next_power_of_2(m["N"]) // 2),),
    outputs=["sq_ptr", "total_ptr"], dtypes=("float32",),
    reference=lambda a: (a["x_ptr"] ** 2, (a["x_ptr"] ** 2).sum().reshape(1))), "SQUARE")


# -- restore_value: a kernel that updates its input in place --------------------------------

@triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (4, 8)], key=["N"],
                 restore_value=["x_ptr"])
@triton.jit
def add_one_in_place(x_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < N)
    tl.store(x_ptr + offs, x + 1, mask=offs < N)


IN_PLACE = _named(tuner.Kernel(
    add_one_in_place, name="add_one_in_place", outputs=["x_ptr"], dtypes=("float32",),
    make_inputs=lambda s, d, dev, seed: {
        "x_ptr": torch.randn(s["N"], generator=_gen(dev, seed), device=dev), "N": s["N"]},
    grid=lambda m: (triton.cdiv(m["N"], m["BLOCK"]),),
    reference=lambda a: a["x_ptr"] + 1), "IN_PLACE")


# -- prune_configs_by: the kernel rules out blocks wider than the row --------------------------

def blocks_within_row(configs: list[Any], nargs: dict[str, Any], **_: Any) -> list[Any]:
    return [c for c in configs if c.kwargs["BLOCK"] <= max(8, nargs["N"])]


@triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (8, 16, 32, 64)], key=["N"],
                 prune_configs_by={"early_config_prune": blocks_within_row})
@triton.jit
def negate(x_ptr, out_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, -tl.load(x_ptr + offs, mask=offs < N), mask=offs < N)


def vector_inputs(shape: Mapping[str, int], dtype: str, device: str,
                  seed: int) -> dict[str, Any]:
    x = torch.randn(shape["N"], generator=_gen(device, seed), device=device)
    return {"x_ptr": x.to(getattr(torch, dtype)), "out_ptr": torch.empty_like(x).to(
        getattr(torch, dtype)), "N": shape["N"]}


NEGATE = _named(tuner.Kernel(
    negate, name="negate", make_inputs=vector_inputs, dtypes=("float32",),
    grid=lambda m: (triton.cdiv(m["N"], m["BLOCK"]),), reference=lambda a: -a["x_ptr"]),
    "NEGATE")


# -- keys of any type and a named dtype: a bool flag, a string mode, a float32 side buffer -----

KEYED_CONFIGS = [triton.Config({"BLOCK": b}, num_warps=4) for b in (8, 16)]


@tuner.autotune(configs=KEYED_CONFIGS, key=["N", "DOUBLE", "MODE"], name="keyed",
                dtype_arg="x_ptr")
@triton.jit
def keyed(scale_ptr, x_ptr, out_ptr, N, DOUBLE: tl.constexpr, MODE: tl.constexpr,
          BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < N).to(tl.float32) * tl.load(scale_ptr)
    if DOUBLE:
        x = x * 2
    if MODE == "plus":
        x = x + 1
    tl.store(out_ptr + offs, x.to(out_ptr.dtype.element_ty), mask=offs < N)


def keyed_launch(x: torch.Tensor, double: bool, mode: str) -> torch.Tensor:
    """The user's launcher: a float32 scale buffer comes first, the data is ``x``'s dtype."""
    out = torch.empty_like(x)
    scale = torch.ones(1, dtype=torch.float32)
    keyed[lambda m: (triton.cdiv(x.numel(), m["BLOCK"]),)](
        scale, x, out, x.numel(), DOUBLE=double, MODE=mode)
    return out


# -- problem dimensions beyond the kernel's arguments (batch and heads only set the grid) ------

@tuner.autotune(configs=[triton.Config({"BLOCK_S": b}) for b in (4, 8)], key=["S"],
                name="rows_scaled",
                problem=lambda a: {"B": a["x_ptr"].shape[0], "H": a["x_ptr"].shape[1],
                                   "S": a["S"]})
@triton.jit
def rows_scaled(x_ptr, out_ptr, ROWS, S, BLOCK_S: tl.constexpr):
    """ROWS = batch x heads programs, each over S elements."""
    row = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK_S + tl.arange(0, BLOCK_S)
    x = tl.load(x_ptr + row * S + offs, mask=offs < S)
    tl.store(out_ptr + row * S + offs, x * 3, mask=offs < S)


def rows_grid(m: Mapping[str, Any]) -> tuple[int, int]:
    return m["ROWS"], triton.cdiv(m["S"], m["BLOCK_S"])


def rows_inputs(shape: Mapping[str, int], dtype: str, device: str,
                seed: int) -> dict[str, Any]:
    x = torch.randn(shape["B"], shape["H"], shape["S"], generator=_gen(device, seed),
                    device=device).to(getattr(torch, dtype))
    return {"x_ptr": x, "out_ptr": torch.empty_like(x), "ROWS": shape["B"] * shape["H"],
            "S": shape["S"]}


ROWS = _named(tuner.Kernel(
    rows_scaled, grid=rows_grid, make_inputs=rows_inputs, reference=lambda a: a["x_ptr"] * 3,
    dims=[Dim("B", 1, 64), Dim("H", 1, 64), Dim("S", 1, 1 << 16)], dtypes=("float32",)),
    "ROWS")


# -- no reference: a kernel whose every config writes NaN past the first row (a tutorial bug) --

@triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (8, 16)], key=["R", "N"])
@triton.jit
def first_row_only(x_ptr, out_ptr, R, N, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * N + offs, mask=offs < N)
    bad = tl.where(row > 0, float("nan"), 0.0)  # the bug: rows after the first are NaN
    tl.store(out_ptr + row * N + offs, x + bad, mask=offs < N)


def rows_2d(shape: Mapping[str, int], dtype: str, device: str, seed: int) -> dict[str, Any]:
    x = torch.randn(shape["R"], shape["N"], generator=_gen(device, seed), device=device)
    return {"x_ptr": x, "out_ptr": torch.empty_like(x), "R": shape["R"], "N": shape["N"]}


NAN_ROWS = _named(tuner.Kernel(first_row_only, name="nan_rows", make_inputs=rows_2d,
                               grid=lambda m: (m["R"],), dtypes=("float32",)), "NAN_ROWS")


@triton.autotune(configs=[triton.Config({"BLOCK": b}) for b in (8, 16)], key=["R", "N"])
@triton.jit
def block_dependent(x_ptr, out_ptr, R, N, BLOCK: tl.constexpr):
    """A bug only some configs have: the result depends on BLOCK."""
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * N + offs, mask=offs < N)
    tl.store(out_ptr + row * N + offs, x * BLOCK, mask=offs < N)


DISAGREEING = _named(tuner.Kernel(block_dependent, name="disagreeing", make_inputs=rows_2d,
                                  grid=lambda m: (m["R"],), dtypes=("float32",)),
                     "DISAGREEING")


# -- a user's list longer than the search's budget -----------------------------------------------

LONG_LIST = [triton.Config({"BLOCK": b}, num_warps=w) for b in (8, 16, 32) for w in (1, 2)]


@triton.autotune(configs=LONG_LIST, key=["N"])
@triton.jit
def copy_kernel(x_ptr, out_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < N), mask=offs < N)


LISTED = _named(tuner.Kernel(
    copy_kernel, name="listed_copy", make_inputs=vector_inputs, dtypes=("float32",),
    grid=lambda m: (triton.cdiv(m["N"], m["BLOCK"]),), reference=lambda a: a["x_ptr"]),
    "LISTED")

#: the same kernel declaring 512 MiB of traffic (over the 256 MiB a compile-pool process may
#: build in full; a declaration, not what its inputs hold)
HUGE = _named(tuner.Kernel(
    copy_kernel, name="huge_copy", make_inputs=vector_inputs, dtypes=("float32",),
    grid=lambda m: (triton.cdiv(m["N"], m["BLOCK"]),), reference=lambda a: a["x_ptr"],
    bytes=lambda s, dtype: float(1 << 29)), "HUGE")


# -- a plugin written against the protocol's required members alone --------------------------

class RawProtocolKernel:
    """No ``compile``, ``prior``, ``known_good_configs``, ``description`` or
    ``interpreter_unsupported_dtypes``: the optional members get their defaults."""

    name = "raw_negate"
    #: a hash of what it runs (the kernel's and this class's source)
    version = hashlib.sha256(inspect.getsource(negate.fn.fn).encode()).hexdigest()[:12]
    dims = (Dim("N", 1, 1 << 20),)
    dtypes = ("float32",)

    def space(self) -> SearchSpace:
        return SearchSpace((Param.pow2("BLOCK", 8, 32), Param.ints("num_warps", (1, 2))))

    def default_config(self, shape: Mapping[str, int], dtype: str) -> KernelConfig:
        return KernelConfig(BLOCK=8, num_warps=1)

    def make_inputs(self, shape: Mapping[str, int], dtype: str, device: str,
                    seed: int) -> dict[str, Any]:
        inputs = vector_inputs(shape, dtype, device, seed)
        return {"x": inputs["x_ptr"], "out": inputs["out_ptr"]}

    def launch(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        n = inputs["x"].numel()
        negate.fn[(triton.cdiv(n, config["BLOCK"]),)](
            inputs["x"], inputs["out"], n, BLOCK=config["BLOCK"], num_warps=config.num_warps)

    def reference(self, inputs: dict[str, Any]) -> Any:
        return -inputs["x"]

    def tolerance(self, dtype: str) -> Tolerance:
        return DEFAULT_TOLERANCES["float32"]

    def flops(self, shape: Mapping[str, int]) -> float:
        return 0.0

    def bytes(self, shape: Mapping[str, int], dtype: str) -> float:
        return 8.0 * shape["N"]


RAW = RawProtocolKernel()


# -- adapted by its launcher: the library's own function says how it launches the kernel -----

def copy(x: torch.Tensor) -> torch.Tensor:
    """A library's launcher: allocates the output, derives the grid, launches."""
    out = torch.empty_like(x)
    n = x.numel()
    copy_kernel[lambda m: (triton.cdiv(n, m["BLOCK"]),)](x, out, n)
    return out


BY_CALL = _named(tuner.Kernel(
    copy_kernel, name="copy_by_call", call=lambda a: copy(a["x"]), outputs=["out_ptr"],
    call_inputs=lambda s, dtype, dev, seed: {
        "x": torch.randn(s["N"], generator=_gen(dev, seed), device=dev)},
    reference=lambda a: a["x"], dtypes=("float32",)), "BY_CALL")
