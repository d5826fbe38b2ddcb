"""The matmul kernel is right for odd shapes under Triton's CPU interpreter."""

import pytest
import torch

from search_spaces import get_kernel
from tuner.config import KernelConfig

CONFIGS = [
    KernelConfig(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=1, num_warps=4, num_stages=2),
    KernelConfig(BLOCK_M=32, BLOCK_N=64, BLOCK_K=64, GROUP_M=8, num_warps=4, num_stages=3),
    KernelConfig(BLOCK_M=64, BLOCK_N=32, BLOCK_K=128, GROUP_M=8, num_warps=8, num_stages=4),
]
SHAPES = [{"M": 1, "N": 1, "K": 1}, {"M": 17, "N": 33, "K": 65}, {"M": 100, "N": 3, "K": 257}]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s.values())))
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.key())
def test_matmul_matches_torch_on_odd_shapes(shape, dtype, config):
    k = get_kernel("matmul")
    inputs = k.make_inputs(shape, dtype, "cpu", seed=1)
    inputs["out"].fill_(float("nan"))  # every element must be written
    k.launch(config, inputs)
    ref = k.reference(inputs)
    tol = k.tolerance(dtype)
    torch.testing.assert_close(inputs["out"].float(), ref, atol=tol.atol, rtol=tol.rtol)


def test_matmul_inputs_are_random_not_zero():
    k = get_kernel("matmul")
    inputs = k.make_inputs({"M": 8, "N": 8, "K": 8}, "float16", "cpu", seed=0)
    assert inputs["a"].abs().min() >= 0 and inputs["a"].abs().sum() > 0
    assert not torch.equal(inputs["a"], k.make_inputs({"M": 8, "N": 8, "K": 8}, "float16",
                                                      "cpu", seed=1)["a"])
