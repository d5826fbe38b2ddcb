"""``tuner.testing`` catches real defects: real Triton kernels (on the CPU interpreter), each
broken in one way, fail ``check_kernel`` naming the check that catches it; correct ones pass."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from collections.abc import Callable, Mapping
from typing import Any

import pytest
import torch
import triton
import triton.language as tl

import tuner
import tuner.testing
from tests import user_kernels
from tests.plugins import registered
from tests.support_processes import interpreter_env
from tuner.testing import CHECKS, check_inputs, check_kernel

CONFIGS = [triton.Config({"BLOCK": 16}, num_warps=1), triton.Config({"BLOCK": 32}, num_warps=1)]


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, N, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    x = tl.load(x_ptr + offs, mask=mask)
    y = tl.load(y_ptr + offs, mask=mask)
    tl.store(out_ptr + offs, x + y, mask=mask)


@triton.jit
def zeroing_add_kernel(x_ptr, y_ptr, out_ptr, N, BLOCK: tl.constexpr):
    """A broken add: writes zeros whatever the inputs."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(out_ptr + offs, tl.zeros([BLOCK], dtype=out_ptr.dtype.element_ty), mask=offs < N)


def grid(meta: Mapping[str, Any]) -> tuple[int, ...]:
    return (triton.cdiv(meta["N"], meta["BLOCK"]),)


def add_inputs(n: int, dtype: str, device: str, seed: int) -> dict[str, Any]:
    gen = torch.Generator(device=device).manual_seed(seed)
    x, y = (torch.randn(n, generator=gen, device=device).to(getattr(torch, dtype))
            for _ in range(2))
    return {"x_ptr": x, "y_ptr": y, "out_ptr": torch.empty_like(x), "N": n}


def seeded(shape: Mapping[str, int], dtype: str, device: str, seed: int) -> dict[str, Any]:
    return add_inputs(shape["N"], dtype, device, seed)


def seedless(shape: Mapping[str, int], dtype: str, device: str, seed: int) -> dict[str, Any]:
    return add_inputs(shape["N"], dtype, device, 0)


def one_too_many(shape: Mapping[str, int], dtype: str, device: str, seed: int) -> dict[str, Any]:
    """Arguments of the problem N+1 (consistent among themselves): served, they are looked up
    as N+1, though tuned and stored as N."""
    return add_inputs(shape["N"] + 1, dtype, device, seed)


def add_reference(args: dict[str, Any]) -> torch.Tensor:
    return args["x_ptr"] + args["y_ptr"]


def add(name: str, fn: Any = add_kernel,
        make_inputs: Callable[..., dict[str, Any]] = seeded,
        reference: Callable[[dict[str, Any]], Any] | None = add_reference) -> tuner.Kernel:
    return tuner.Kernel(fn, grid=grid, make_inputs=make_inputs, name=name, configs=CONFIGS,
                        key=["N"], dims={"N": (1, 4096)}, reference=reference,
                        flops=lambda s: float(s["N"]), bytes=lambda s, d: 12.0 * s["N"])


def failed_checks(kernel: Any) -> tuple[str, set[str]]:
    """``check_kernel``'s message, and the checks it names as failing."""
    with pytest.raises(AssertionError) as failure:
        check_kernel(kernel)
    message = str(failure.value)
    return message, set(re.findall(r"^  (check_\w+):", message, re.MULTILINE))


def test_a_correct_kernel_passes() -> None:
    check_kernel(add("good_add"))


def test_the_bias_gelu_example_passes() -> None:
    with registered():
        check_kernel(importlib.import_module("bias_gelu").KERNEL)


@pytest.mark.parametrize(("name", "shape"), [
    ("IN_PLACE", None),  # its output, restored before each launch, is its input
    ("SQUARE", None),  # a total of one element beside a long output
    ("TMA", {"M": 8, "N": 16}),  # tensor-descriptor outputs; rows of 16-byte-aligned strides
])
def test_user_kernels_of_the_autotune_patterns_pass(name: str,
                                                    shape: dict[str, int] | None) -> None:
    check_kernel(getattr(user_kernels, name), shape=shape)


def test_inputs_that_ignore_the_seed_fail_check_inputs() -> None:
    message, failed = failed_checks(add("seedless_add", make_inputs=seedless))
    assert failed == {"check_inputs"}
    assert "'seedless_add'" in message and "ignores its seed" in message


def test_a_problem_that_disagrees_with_the_shape_fails_check_problem_roundtrip() -> None:
    message, failed = failed_checks(add("off_by_one_add", make_inputs=one_too_many))
    assert failed == {"check_problem_roundtrip"}
    assert "'off_by_one_add'" in message
    assert "{'N': 7}" in message and "{'N': 8}" in message  # the shape tuned, the one served


def test_a_launch_that_writes_zeros_fails_check_default_matches_reference() -> None:
    message, failed = failed_checks(add("zeroing_add", fn=zeroing_add_kernel))
    assert failed == {"check_default_matches_reference"}
    assert "'zeroing_add'" in message and "fails verification" in message


def test_without_a_reference_a_launch_that_writes_zeros_fails_every_check_it_breaks() -> None:
    """Its configs agree with each other (zeros), so only the zeroing and the output-check
    checks can tell; both are reported together."""
    kernel = add("unreferenced_zeroing_add", fn=zeroing_add_kernel, reference=None)
    message, failed = failed_checks(kernel)
    assert failed == {"check_zeroing_is_rejected", "check_rejects_wrong_outputs"}
    assert "passes verification" in message and "is all zeros" in message


def test_one_check_alone_raises_naming_the_kernel_and_the_check() -> None:
    with pytest.raises(AssertionError, match=r"'seedless_add'[\s\S]*check_inputs: seeds 1 and 2"):
        check_inputs(add("seedless_add", make_inputs=seedless))


def test_an_object_without_the_protocol_fails_naming_what_it_lacks() -> None:
    lacks = r"check_members: missing required member\(s\) \['name', 'dims'"
    with pytest.raises(AssertionError, match=lacks):
        check_kernel(object())


def test_checks_lists_every_check_function_once_by_its_name() -> None:
    names = [name for name, _ in CHECKS]
    assert len(set(names)) == len(names) and "check_problem_roundtrip" in names
    assert all(getattr(tuner.testing, name) is check for name, check in CHECKS)


def test_it_sits_in_the_engine_core_below_the_registry_db_and_api() -> None:
    """Plugin authors' tests import it without the service (or the built-in kernels)."""
    code = ("import sys, tuner.testing; print(sorted({m.split('.')[0] for m in sys.modules} "
            "& {'api', 'db', 'search_spaces'}))")
    done = subprocess.run([sys.executable, "-c", code], env=interpreter_env(),
                          capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
