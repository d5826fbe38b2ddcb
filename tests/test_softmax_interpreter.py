"""The softmax kernel is right under Triton's CPU interpreter: one-pass and online two-pass,
rows per program, odd widths, every dtype; its space's constraints."""

import pytest
import torch

from search_spaces import get_kernel
from tuner.config import KernelConfig
from tuner.space import ProblemContext

K = get_kernel("softmax")
CONFIGS = [
    KernelConfig(BLOCK_N=64, ROWS=1, num_warps=2, num_stages=2),   # 2 passes over 3 blocks
    KernelConfig(BLOCK_N=128, ROWS=2, num_warps=4, num_stages=1),  # one block, 2 rows/program
    KernelConfig(BLOCK_N=256, ROWS=4, num_warps=1, num_stages=3),  # one block, M % 4 != 0
]
SHAPES = [{"M": 1, "N": 1}, {"M": 5, "N": 100}, {"M": 3, "N": 129}]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s.values())))
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.key())
def test_softmax_matches_torch(shape, dtype, config):
    inputs = K.make_inputs(shape, dtype, "cpu", seed=1)
    inputs["out"].fill_(float("nan"))  # every element must be written
    K.launch(config, inputs)
    tol = K.tolerance(dtype)
    torch.testing.assert_close(inputs["out"].float(), K.reference(inputs), atol=tol.atol,
                               rtol=tol.rtol)


def test_softmax_survives_large_inputs_in_the_two_pass_path():
    # exp of the raw values would overflow fp32: the running max keeps them in range
    inputs = K.make_inputs({"M": 2, "N": 200}, "float32", "cpu", seed=0)
    inputs["x"] *= 40.0
    K.launch(KernelConfig(BLOCK_N=64, ROWS=1, num_warps=2, num_stages=2), inputs)
    assert torch.isfinite(inputs["out"]).all()
    torch.testing.assert_close(inputs["out"], K.reference(inputs), atol=1e-6, rtol=1e-4)


def test_softmax_space_rejects_redundant_and_spilling_configs():
    ctx = ProblemContext({"M": 4, "N": 100}, "float16")
    space = K.space()
    assert "wider than N=100" in space.violation(
        KernelConfig(BLOCK_N=256, ROWS=1, num_warps=4, num_stages=2), ctx)
    assert "more than M=4" not in (space.violation(
        KernelConfig(BLOCK_N=128, ROWS=4, num_warps=4, num_stages=2), ctx) or "")
    big = ProblemContext({"M": 4096, "N": 16384}, "float16")
    assert "over 64" in space.violation(
        KernelConfig(BLOCK_N=16384, ROWS=1, num_warps=4, num_stages=2), big)
    for shape in ({"M": 1, "N": 1}, {"M": 4096, "N": 50257}, {"M": 64, "N": 512}):
        ctx = ProblemContext(shape, "float16")
        for config in K.known_good_configs(shape, "float16") + [K.default_config(shape,
                                                                               "float16")]:
            assert space.contains(config), config
            assert space.violation(config, ctx) is None, (shape, config)
