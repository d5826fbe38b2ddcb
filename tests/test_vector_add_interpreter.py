"""vector_add is right under Triton's CPU interpreter: one element, odd lengths (a masked last
block), the persistent grid's stride loop, every dtype; its space's constraints and prior;
verification rejects wrong sums."""

import math

import pytest
import torch

from search_spaces import get_kernel
from search_spaces.vector_add import INTERPRETER_SMS, _launch_meta, vector_add
from tests.support_kernels import Damaged, assert_known_good_configs_valid, verify
from tuner.config import KernelConfig
from tuner.space import ProblemContext
from tuner.verification import compare

K = get_kernel("vector_add")
CONFIGS = [
    KernelConfig(BLOCK=256, PROGRAMS_PER_SM=0, num_warps=2, num_stages=1),  # one per block
    # 4 programs per interpreter SM, 16 programs over up to 40 blocks: the stride loop
    KernelConfig(BLOCK=256, PROGRAMS_PER_SM=4, num_warps=4, num_stages=2),
    KernelConfig(BLOCK=1024, PROGRAMS_PER_SM=1, num_warps=8, num_stages=3),
]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("n", [1, 257, 256 * 16 * 2 + 37])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.key())
def test_vector_add_matches_torch(n, dtype, config):
    inputs = K.make_inputs({"N": n}, dtype, "cpu", seed=1)
    inputs["out"].fill_(float("nan"))  # every element must be written
    K.launch(config, inputs)
    got, ref = inputs["out"], K.reference(inputs)
    assert isinstance(compare(got.float(), ref, K.tolerance(dtype), dtype), float)
    if dtype != "bfloat16":  # the interpreter rounds fp32 -> bf16 toward zero, not to nearest
        # one rounding of an exact sum: the dtype's own a + b, bit for bit
        assert torch.equal(got, ref.to(got.dtype))


def test_the_persistent_grid_is_smaller_than_the_blocks_and_strides_over_them():
    n = 256 * 4 * INTERPRETER_SMS * 3 + 5  # 3 blocks per program and a partial one
    inputs = K.make_inputs({"N": n}, "float32", "cpu", seed=2)
    config = KernelConfig(BLOCK=256, PROGRAMS_PER_SM=4, num_warps=4, num_stages=2)
    grid, meta = _launch_meta(inputs["a"], config)
    assert grid == (4 * INTERPRETER_SMS,) and meta["PERSISTENT"] == 1
    vector_add(inputs["a"], inputs["b"], inputs["out"], config)
    torch.testing.assert_close(inputs["out"], inputs["a"] + inputs["b"], rtol=0, atol=0)


def test_large_magnitudes_round_like_torch():
    inputs = K.make_inputs({"N": 300}, "float16", "cpu", seed=3)
    inputs["a"] *= 3e4  # sums beyond fp16's range overflow to inf, as torch's do
    inputs["b"] *= 3e4
    K.launch(CONFIGS[0], inputs)
    assert torch.equal(inputs["out"], inputs["a"] + inputs["b"])


def test_mismatched_tensors_are_refused():
    a = torch.ones(8)
    with pytest.raises(ValueError):
        vector_add(a, torch.ones(9), torch.empty(8), CONFIGS[0])
    with pytest.raises(ValueError):
        vector_add(a, a, torch.empty(16)[::2], CONFIGS[0])


def _first_element_off(out):
    out[0] += 0.25 * float(out.abs().max())


def _small_half_zeroed(out):
    out[out.abs() < out.abs().median()] = 0


def _biased(out):
    out += 2.0 ** -10 * 4.0  # 2 ulps of fp16 at |x| ~ 4 on every element


@pytest.mark.parametrize("damage", [_first_element_off, _small_half_zeroed, _biased])
def test_verification_rejects_wrong_sums(damage):
    shape, dtype = {"N": 1000}, "float16"
    inputs = K.make_inputs(shape, dtype, "cpu", 4)
    assert verify(Damaged(K, damage), CONFIGS[0], shape, dtype, inputs) is not None
    assert verify(K, CONFIGS[0], shape, dtype, K.make_inputs(shape, dtype, "cpu", 4)) is None


def test_space_rejects_redundant_and_spilling_configs():
    space = K.space()
    small = ProblemContext({"N": 300}, "float16")
    assert "wider than N=300" in space.violation(
        KernelConfig(BLOCK=1024, PROGRAMS_PER_SM=0, num_warps=4, num_stages=1), small)
    assert "persistent grid would be the plain one" in space.violation(
        KernelConfig(BLOCK=256, PROGRAMS_PER_SM=1, num_warps=4, num_stages=1), small)
    big = ProblemContext({"N": 1 << 28}, "float16")
    assert "num_stages only" in space.violation(
        KernelConfig(BLOCK=4096, PROGRAMS_PER_SM=0, num_warps=8, num_stages=2), big)
    assert "over 32" in space.violation(
        KernelConfig(BLOCK=8192, PROGRAMS_PER_SM=0, num_warps=4, num_stages=1), big)
    assert "no element" in space.violation(
        KernelConfig(BLOCK=256, PROGRAMS_PER_SM=0, num_warps=16, num_stages=1), big)
    assert space.violation(
        KernelConfig(BLOCK=4096, PROGRAMS_PER_SM=4, num_warps=8, num_stages=2), big) is None
    assert_known_good_configs_valid(K, [{"N": 1}, {"N": 1 << 28}, {"N": 777},
                                        {"N": (1 << 31) - 1}])


def test_prior_prefers_enough_bytes_in_flight_and_is_finite():
    ctx = ProblemContext({"N": 1 << 28}, "float16")
    tiny = KernelConfig(BLOCK=256, PROGRAMS_PER_SM=0, num_warps=8, num_stages=1)
    good = KernelConfig(BLOCK=4096, PROGRAMS_PER_SM=0, num_warps=8, num_stages=1)
    assert K.prior(good, ctx) < K.prior(tiny, ctx)
    floor = math.log(K.bytes(ctx.shape, "float16") / 4.27e12)
    assert floor <= K.prior(good, ctx) < floor + math.log(1.5)
    for config in K.space().feasible(ProblemContext({"N": 7}, "float32")):
        assert math.isfinite(K.prior(config, ProblemContext({"N": 7}, "float32")))


def test_compile_shape_keeps_divisibility():
    assert K.compile_shape({"N": 1 << 28}, "float16") == {"N": 16}
    assert K.compile_shape({"N": 1}, "float16") == {"N": 1}
    assert K.compile_shape({"N": 1001}, "float16")["N"] % 16 == 1001 % 16
