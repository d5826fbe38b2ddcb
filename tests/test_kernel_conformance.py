"""The conformance suite: every registered kernel, built-in or plugin, meets the TunableKernel
contract. Parametrised over the registry itself (with the example plugins installed), so a new
kernel is covered the moment it is registered; kernels run on Triton's CPU interpreter."""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import search_spaces
from tests.plugins import all_kernel_names, registered
from tuner.backends.child import ChildState, _verify
from tuner.config import KernelConfig
from tuner.kernel import TunableKernel, load_ref, missing_members
from tuner.space import ProblemContext

KNOWN_DTYPES = {"float16", "bfloat16", "float32", "float8_e4m3fn"}


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "name" in metafunc.fixturenames:
        metafunc.parametrize("name", all_kernel_names())


@pytest.fixture(autouse=True)
def plugins() -> Iterator[None]:
    with registered():
        yield


@pytest.fixture
def kernel(name: str) -> Any:
    return search_spaces.get_kernel(name)


def small_shape(kernel: Any) -> dict[str, int]:
    """Odd and small (7 per dimension, within the dimension's bounds): masks get exercised."""
    return {d.name: min(d.hi, max(d.lo, 7)) for d in kernel.dims}


def checkable_dtype(kernel: Any) -> str:
    """A dtype the interpreter computes right (never bf16 tl.dot)."""
    ok = [d for d in ("float32", "float16") if d in kernel.dtypes
          and d not in kernel.interpreter_unsupported_dtypes]
    assert ok, f"{kernel.name}: no dtype the interpreter can check"
    return ok[0]


def tensors(inputs: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {k: v for k, v in inputs.items()
            if isinstance(v, torch.Tensor) and not k.startswith("_")}


def test_has_every_protocol_member_and_its_ref_imports_it(kernel):
    assert isinstance(kernel, TunableKernel)
    assert missing_members(kernel) == []
    assert load_ref(kernel.ref) is kernel  # what a measuring child process imports


def test_version_is_a_stable_source_hash(kernel):
    assert re.fullmatch(r"[0-9a-f]{12}", kernel.version)
    assert kernel.version == search_spaces.get_kernel(kernel.name).version


def test_dims_and_dtypes_are_well_formed(kernel):
    names = [d.name for d in kernel.dims]
    assert names and len(set(names)) == len(names)
    assert all(1 <= d.lo <= d.hi for d in kernel.dims)
    assert kernel.dtypes and set(kernel.dtypes) <= KNOWN_DTYPES
    assert set(kernel.interpreter_unsupported_dtypes) <= set(kernel.dtypes)


def test_default_and_known_good_configs_are_in_the_space(kernel):
    shape, dtype = small_shape(kernel), checkable_dtype(kernel)
    space = kernel.space()
    assert space.size() > 0
    default = kernel.default_config(shape, dtype)
    assert space.contains(default)
    assert all(space.contains(c) for c in kernel.known_good_configs(shape, dtype))
    assert KernelConfig.from_json(default.to_json()) == default
    triton_config = default.to_triton()
    assert triton_config.num_warps == default.num_warps


def test_inputs_are_random_seeded_and_never_zeros(kernel):
    shape, dtype = small_shape(kernel), checkable_dtype(kernel)
    a = kernel.make_inputs(shape, dtype, "cpu", 1)
    again = kernel.make_inputs(shape, dtype, "cpu", 1)
    other = kernel.make_inputs(shape, dtype, "cpu", 2)
    outputs = set(a.get("_outputs") or ("out",))
    assert outputs <= set(a)
    data = {k: v for k, v in tensors(a).items() if k not in outputs and k != "out"}
    assert data, "no input tensors"
    for key, value in data.items():
        assert bool((value != 0).any()), f"{key} is all zeros"
        assert torch.equal(value, again[key]), f"{key} differs for the same seed"
    assert any(not torch.equal(v, other[k]) for k, v in data.items()), "the seed changes nothing"


def test_the_default_config_matches_the_reference_on_an_odd_shape(kernel):
    shape, dtype = small_shape(kernel), checkable_dtype(kernel)
    state = ChildState("interpret")
    state.kernel, state.shape, state.dtype = kernel, shape, dtype
    inputs = kernel.make_inputs(shape, dtype, "cpu", 3)
    assert _verify(state, kernel.default_config(shape, dtype), inputs) is None


class _Zeroing:
    """The kernel, but its launch zeroes every output afterwards (a broken config)."""

    def __init__(self, kernel: Any) -> None:
        self.kernel = kernel

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kernel, name)

    def launch(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        self.kernel.launch(config, inputs)
        for name in inputs.get("_outputs") or ("out",):
            inputs[name].zero_()


def test_verification_rejects_a_launch_that_zeroes_the_output(kernel):
    shape, dtype = small_shape(kernel), checkable_dtype(kernel)
    state = ChildState("interpret")
    state.kernel, state.shape, state.dtype = _Zeroing(kernel), shape, dtype
    inputs = kernel.make_inputs(shape, dtype, "cpu", 4)
    assert _verify(state, kernel.default_config(shape, dtype), inputs) is not None


def test_roofline_inputs_and_prior_are_finite(kernel):
    shape, dtype = small_shape(kernel), checkable_dtype(kernel)
    assert kernel.flops(shape) >= 0 and kernel.bytes(shape, dtype) >= 0
    ctx = ProblemContext(shape, dtype)
    prior = kernel.prior(kernel.default_config(shape, dtype), ctx)
    assert prior is None or math.isfinite(prior)
    assert kernel.tolerance(dtype).atol >= 0 and kernel.tolerance(dtype).rtol >= 0
