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
from tuner.kernel import TunableKernel, load_ref, missing_members, output_check_of
from tuner.space import ProblemContext
from tuner.verification import compare

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


# -- the kernel's check rejects wrong outputs (issue 12) ---------------------------------------

#: small and odd; rows long enough that a bias stands out of rounding
ADVERSARIAL_SHAPE = 37


def adversarial_shape(kernel: Any) -> dict[str, int]:
    return {d.name: min(d.hi, max(d.lo, ADVERSARIAL_SHAPE if i == len(kernel.dims) - 1 else 5))
            for i, d in enumerate(kernel.dims)}


def reference_outputs(kernel: Any, dtype: str) -> list[torch.Tensor]:
    """The kernel's reference on a small odd shape, in fp32 (several outputs: each)."""
    inputs = kernel.make_inputs(adversarial_shape(kernel), dtype, "cpu", 5)
    refs = kernel.reference(inputs)
    return [r.float() for r in (refs if isinstance(refs, tuple | list) else (refs,))]


def groups(t: torch.Tensor, rowwise: bool) -> torch.Tensor:
    """A view of ``t`` as (groups, elements), as the check groups it."""
    return t.reshape(-1, t.shape[-1]) if rowwise and t.dim() > 1 else t.reshape(1, -1)


def ulps_at_scale(ref: torch.Tensor, dtype: str, rowwise: bool, ulps: float) -> torch.Tensor:
    """``ulps`` ulps of the dtype at each group's scale (its largest |value|), one per group.
    fp32 is judged in TF32's ulps: an fp32 dot goes through TF32 on a GPU, the coarsest
    arithmetic a correct fp32 kernel may use."""
    scale = groups(ref, rowwise).abs().amax(dim=1, keepdim=True)
    eps = 2.0 ** -10 if dtype == "float32" else torch.finfo(getattr(torch, dtype)).eps
    return ulps * eps * torch.exp2(torch.floor(torch.log2(scale)))


def adversaries(ref: torch.Tensor, dtype: str, rowwise: bool) -> dict[str, torch.Tensor]:
    """Wrong outputs derived from the correct one (``ref`` rounded to the dtype)."""
    good = ref.to(getattr(torch, dtype)).float()
    out = {}
    small = groups(ref, rowwise).abs()
    zeroed = groups(good.clone(), rowwise)
    zeroed[small < small.median(dim=1, keepdim=True).values] = 0.0
    out["its smaller half zeroed"] = zeroed.reshape(ref.shape)
    bias = ulps_at_scale(ref, dtype, rowwise, 3.0)
    biased = groups(good.clone(), rowwise)
    row = biased.shape[0] // 2
    biased[row] += bias[row]
    out["a bias of 3 ulps at the scale on one whole row" if rowwise
        else "a bias of 3 ulps at the scale on the whole tensor"] = biased.reshape(ref.shape)
    one = good.clone().flatten()
    one[one.numel() // 3] += 0.5 * float(ref.abs().max())
    out["one element off by half the scale"] = one.reshape(ref.shape)
    return out


def interpreter_dtypes(kernel: Any) -> list[str]:
    return [d for d in kernel.dtypes if d in ("float16", "bfloat16", "float32")
            and d not in kernel.interpreter_unsupported_dtypes]


def test_the_check_accepts_the_rounded_reference_and_rejects_adversarial_outputs(kernel):
    """For every dtype: the reference rounded to the dtype passes the kernel's own check (its
    tolerance and declared ``output_check``); zeroing the smaller half of each row, a bias of
    three ulps at the output's scale on one whole row (row-wise kernels) or the whole tensor,
    and one element off by half the scale are each rejected."""
    check = output_check_of(kernel)
    for dtype in interpreter_dtypes(kernel):
        tol = kernel.tolerance(dtype)
        for ref in reference_outputs(kernel, dtype):
            good = ref.to(getattr(torch, dtype)).float()
            result = compare(good, ref, tol, dtype, check)
            assert isinstance(result, float), f"{dtype}: the rounded reference fails: {result}"
            for what, wrong in adversaries(ref, dtype, check.rowwise).items():
                assert not torch.equal(wrong, good), what
                assert isinstance(compare(wrong, ref, tol, dtype, check), str), (
                    f"{kernel.name} {dtype}: {what} passed its check ({tol}, {check})")


def test_the_check_accepts_rounding_noise_of_one_ulp(kernel):
    """A correct output that rounded the other way on every element (one ulp off, random
    signs) passes: the check is not tighter than the dtype allows."""
    check = output_check_of(kernel)
    gen = torch.Generator().manual_seed(9)
    for dtype in interpreter_dtypes(kernel):
        for ref in reference_outputs(kernel, dtype):
            sign = torch.randint(0, 2, ref.shape, generator=gen).float() * 2 - 1
            eps = torch.finfo(getattr(torch, dtype)).eps
            noisy = (ref + sign * eps * ref.abs()).to(getattr(torch, dtype)).float()
            result = compare(noisy, ref, kernel.tolerance(dtype), dtype, check)
            assert isinstance(result, float), f"{dtype}: {result}"
