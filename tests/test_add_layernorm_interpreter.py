"""add_layernorm is right under Triton's CPU interpreter: one pass and two passes, several
rows per program, one row, N=1, a row length that is not a power of two, constant rows (y is
the bias exactly), rows far from zero, every dtype; both outputs are checked and verification
rejects a wrong one; the space's constraints and prior."""

import math

import pytest
import torch

from search_spaces import get_kernel
from search_spaces.add_layernorm import add_layernorm
from tests.support_kernels import Damaged, assert_known_good_configs_valid, verify
from tuner.config import KernelConfig
from tuner.space import ProblemContext
from tuner.verification import compare

K = get_kernel("add_layernorm")
CONFIGS = [
    KernelConfig(BLOCK_N=64, ROWS=1, num_warps=2, num_stages=2),   # two passes over 3 blocks
    KernelConfig(BLOCK_N=128, ROWS=2, num_warps=4, num_stages=1),  # one block, 2 rows/program
    KernelConfig(BLOCK_N=256, ROWS=4, num_warps=1, num_stages=3),  # one block, M % 4 != 0
]
SHAPES = [{"M": 1, "N": 1}, {"M": 5, "N": 100}, {"M": 3, "N": 129}, {"M": 1, "N": 37}]


def check(inputs, dtype):
    """Both outputs against the reference, under the kernel's own check."""
    y_ref, s_ref = K.reference(inputs)
    for name, ref in (("out", y_ref), ("residual_out", s_ref)):
        result = compare(inputs[name].float(), ref, K.tolerance(dtype), dtype, K.output_check,
                         f"{name}: ")
        assert isinstance(result, float), result


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s.values())))
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.key())
def test_add_layernorm_matches_torch(shape, dtype, config):
    inputs = K.make_inputs(shape, dtype, "cpu", seed=1)
    inputs["out"].fill_(float("nan"))  # every element of both outputs must be written
    inputs["residual_out"].fill_(float("nan"))
    K.launch(config, inputs)
    check(inputs, dtype)
    if dtype == "float32":
        s = inputs["x"] + inputs["residual"]
        assert torch.equal(inputs["residual_out"], s)  # one rounding of an exact sum
        torch.testing.assert_close(inputs["out"], torch.nn.functional.layer_norm(
            s, (shape["N"],), inputs["weight"], inputs["bias"], inputs["eps"]),
            atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("config", CONFIGS[:2], ids=lambda c: c.key())
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_constant_rows_give_the_bias_exactly(config, dtype):
    inputs = K.make_inputs({"M": 3, "N": 150}, dtype, "cpu", seed=2)
    inputs["x"][0] = 1000.0 + 1.0 / 8  # a constant row far from zero
    inputs["residual"][0] = 0.25
    inputs["x"][2] = -3.0
    inputs["residual"][2] = 0.0
    K.launch(config, inputs)
    for row in (0, 2):
        assert torch.equal(inputs["out"][row], inputs["bias"]), row
    assert torch.equal(inputs["residual_out"], inputs["x"] + inputs["residual"])
    check(inputs, dtype)


@pytest.mark.parametrize("config", CONFIGS[:2], ids=lambda c: c.key())
def test_rows_far_from_zero_keep_their_variance(config):
    # mean 1e4, std ~2: a sum of squares minus the squared mean would lose it in fp32
    inputs = K.make_inputs({"M": 4, "N": 200}, "float32", "cpu", seed=3)
    inputs["x"] += 1.0e4
    K.launch(config, inputs)
    check(inputs, "float32")


def test_one_column_rows_are_the_bias():
    # N=1: every row is constant
    inputs = K.make_inputs({"M": 6, "N": 1}, "float16", "cpu", seed=4)
    K.launch(KernelConfig(BLOCK_N=64, ROWS=4, num_warps=1, num_stages=2), inputs)
    assert torch.equal(inputs["out"], inputs["bias"].expand(6, 1))


def test_mismatched_tensors_are_refused():
    inputs = K.make_inputs({"M": 2, "N": 8}, "float32", "cpu", seed=0)
    with pytest.raises(ValueError):
        add_layernorm(inputs["x"], inputs["residual"], inputs["weight"][:4],
                      inputs["bias"], inputs["out"], inputs["residual_out"], CONFIGS[1])
    with pytest.raises(ValueError):
        add_layernorm(inputs["x"], inputs["residual"].t(), inputs["weight"], inputs["bias"],
                      inputs["out"], inputs["residual_out"], CONFIGS[1])


def _row_biased(t):
    t[1] += 4 * 2.0 ** -10 * 2  # ~2 ulps of fp16 at |y| ~ 4 on one whole row


def _small_half_zeroed(t):
    t[t.abs() < t.abs().median()] = 0


def _not_normalised(t):
    t.mul_(1.01)  # 1% too large: a wrong rstd


@pytest.mark.parametrize("output", ["out", "residual_out"])
@pytest.mark.parametrize("damage", [_row_biased, _small_half_zeroed, _not_normalised])
def test_verification_rejects_a_wrong_output(output, damage):
    shape, dtype = {"M": 4, "N": 300}, "float16"
    config = KernelConfig(BLOCK_N=512, ROWS=1, num_warps=4, num_stages=1)
    wrong = verify(Damaged(K, damage, output), config, shape, dtype,
                   K.make_inputs(shape, dtype, "cpu", 5))
    assert wrong is not None and f"output {output}" in wrong
    assert verify(K, config, shape, dtype, K.make_inputs(shape, dtype, "cpu", 5)) is None


def test_space_rejects_redundant_and_spilling_configs():
    space = K.space()
    small = ProblemContext({"M": 4, "N": 100}, "float16")
    assert "wider than N=100" in space.violation(
        KernelConfig(BLOCK_N=256, ROWS=1, num_warps=4, num_stages=1), small)
    assert "more than M=4" not in (space.violation(
        KernelConfig(BLOCK_N=128, ROWS=4, num_warps=4, num_stages=2), small) or "")
    assert "only pipelines a loop" in space.violation(
        KernelConfig(BLOCK_N=128, ROWS=1, num_warps=4, num_stages=2), small)
    big = ProblemContext({"M": 32768, "N": 4096}, "float16")
    assert "registers" in space.violation(
        KernelConfig(BLOCK_N=4096, ROWS=1, num_warps=1, num_stages=1), big)
    assert "registers" in space.violation(  # two passes of 32 columns a thread, 16 warps
        KernelConfig(BLOCK_N=16384, ROWS=1, num_warps=16, num_stages=2),
        ProblemContext({"M": 4, "N": 100_000}, "float16"))
    assert space.violation(KernelConfig(BLOCK_N=4096, ROWS=1, num_warps=2, num_stages=1),
                           big) is None  # one pass of 64 columns a thread fits
    assert_known_good_configs_valid(K, [{"M": 1, "N": 1}, {"M": 32768, "N": 4096},
                                        {"M": 64, "N": 768}, {"M": 7, "N": 100_000}])


def test_prior_is_finite_and_prefers_one_pass_with_enough_in_flight():
    ctx = ProblemContext({"M": 32768, "N": 4096}, "float16")
    one = KernelConfig(BLOCK_N=4096, ROWS=1, num_warps=8, num_stages=1)
    two = KernelConfig(BLOCK_N=1024, ROWS=1, num_warps=8, num_stages=2)
    assert K.prior(one, ctx) < K.prior(two, ctx)
    floor = math.log(K.bytes(ctx.shape, "float16") / 4.27e12)
    assert floor <= K.prior(one, ctx) < floor + math.log(1.5)
    tiny = ProblemContext({"M": 7, "N": 7}, "float32")
    assert all(math.isfinite(K.prior(c, tiny)) for c in K.space().feasible(tiny))


def test_baseline_writes_the_sum_and_returns_the_norm():
    inputs = K.make_inputs({"M": 3, "N": 40}, "float32", "cpu", seed=6)
    y = K.baseline(inputs)
    y_ref, s_ref = K.reference(inputs)
    torch.testing.assert_close(inputs["residual_out"], s_ref)
    torch.testing.assert_close(y, y_ref)
