"""The fused-epilogue GEMMs (``search_spaces/matmul_epilogue.py``) under Triton's CPU
interpreter: every activation with and without the residual on odd shapes, the torch baseline,
the registered names, and a tune through the CLI."""

from __future__ import annotations

import pytest
import torch

from search_spaces import get_kernel, kernel_names
from search_spaces.matmul_epilogue import KERNELS, MatmulEpilogueKernel
from tests.support_kernels import tune_on_interpreter
from tuner.config import KernelConfig
from tuner.errors import UnknownKernel
from tuner.kernel import load_ref
from tuner.verification import compare

NAMES = sorted(KERNELS)
#: BLOCK_N=32 < N=37 (two column tiles, the second masked), BLOCK_K=32 > K (masked K loop)
SMALL = KernelConfig(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=1, num_warps=4, num_stages=2)
SHAPES = [{"M": 5, "N": 37, "K": 19}, {"M": 1, "N": 37, "K": 1}, {"M": 17, "N": 3, "K": 40}]


def shape_id(shape: dict[str, int]) -> str:
    return "x".join(map(str, shape.values()))


def check(kernel: MatmulEpilogueKernel, got: torch.Tensor, inputs: dict, dtype: str) -> None:
    """``got`` passes the check every measured config passes (tuner/verification.py)."""
    result = compare(got, kernel.reference(inputs), kernel.tolerance(dtype), dtype,
                     kernel.output_check)
    assert isinstance(result, float), result


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", SHAPES, ids=shape_id)
@pytest.mark.parametrize("name", NAMES)
def test_every_epilogue_matches_the_reference_on_odd_shapes(name, shape, dtype):
    k = get_kernel(name)
    inputs = k.make_inputs(shape, dtype, "cpu", seed=1)
    inputs["out"].fill_(float("nan"))  # every element must be written
    k.launch(SMALL, inputs)
    check(k, inputs["out"], inputs, dtype)


def test_each_variant_computes_its_own_epilogue():
    """A variant's output passes only its own reference: the activation and the residual are
    really applied (a kernel that skipped either would match another variant's)."""
    shape, dtype = {"M": 5, "N": 37, "K": 19}, "float32"
    outputs = {}
    for name in NAMES:
        k = KERNELS[name]
        inputs = k.make_inputs(shape, dtype, "cpu", seed=2)
        k.launch(SMALL, inputs)
        outputs[name] = (inputs["out"], inputs)
    for name, (out, _) in outputs.items():
        for other, (_, inputs) in outputs.items():
            k = KERNELS[other]
            result = compare(out, k.reference(inputs), k.tolerance(dtype), dtype)
            assert isinstance(result, float) == (name == other), (name, other, result)


def test_the_default_config_runs_on_an_odd_shape():
    k = KERNELS["matmul_epilogue_gelu_residual"]
    shape, dtype = {"M": 5, "N": 37, "K": 19}, "float16"
    inputs = k.make_inputs(shape, dtype, "cpu", seed=3)
    inputs["out"].fill_(float("nan"))
    k.launch(k.default_config(shape, dtype), inputs)
    check(k, inputs["out"], inputs, dtype)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("name", NAMES)
def test_the_torch_baseline_matches_the_reference(name, dtype):
    k = KERNELS[name]
    inputs = k.make_inputs({"M": 5, "N": 37, "K": 19}, dtype, "cpu", seed=4)
    got = k.baseline(inputs)
    assert got.dtype == getattr(torch, dtype)  # computed in the inputs' dtype, like a user's
    check(k, got, inputs, dtype)


def test_inputs_hold_a_bias_and_a_residual_only_where_the_variant_adds_one():
    shape = {"M": 5, "N": 37, "K": 19}
    plain = KERNELS["matmul_epilogue_relu"].make_inputs(shape, "float16", "cpu", seed=5)
    fused = KERNELS["matmul_epilogue_relu_residual"].make_inputs(shape, "float16", "cpu", 5)
    assert plain["bias"].shape == (37,) and "residual" not in plain
    assert fused["residual"].shape == (5, 37) and plain["_outputs"] == ("out",)
    assert float(fused["residual"].abs().sum()) > 0


def test_every_variant_is_registered_under_its_name_and_ref():
    assert {n for n in kernel_names() if n.startswith("matmul_epilogue")} == set(NAMES)
    assert len(NAMES) == 8
    for name in NAMES:
        k = get_kernel(name)
        assert k.name == name and load_ref(k.ref) is k
    assert KERNELS["matmul_epilogue_silu_residual"].description.startswith(
        "C = silu(A @ B + bias) + residual")


def test_an_unknown_epilogue_is_refused_naming_the_field():
    with pytest.raises(UnknownKernel) as caught:
        get_kernel("matmul_epilogue_tanh")
    assert caught.value.field == "kernel" and "matmul_epilogue_gelu" in str(caught.value)
    with pytest.raises(ValueError, match="act must be one of none, relu, gelu, silu"):
        MatmulEpilogueKernel("tanh", residual=False)


def test_a_tune_on_the_interpreter_stores_a_verified_best(tmp_path):
    name, db = "matmul_epilogue_gelu_residual", f"sqlite:///{tmp_path / 'cli.db'}"
    summary, rows = tune_on_interpreter(name, "M=5,N=37,K=19", db)
    assert rows[0]["shape"] == {"M": 5, "N": 37, "K": 19}
    assert KERNELS[name].space().contains(KernelConfig(summary["best_config"]))


def test_the_version_follows_matmul_s_code_too(monkeypatch):
    """The epilogue kernels run matmul's K loop and tile order (``tile_dot``,
    ``grouped_tile``) and search its space: a change there is a change of this kernel, and its
    stored configs must stop counting as exact. A comment there is none."""
    import inspect

    import search_spaces.matmul as matmul_module
    from search_spaces.matmul_epilogue import MatmulEpilogueKernel

    before = MatmulEpilogueKernel("gelu", residual=False).version
    real = inspect.getsource

    def edited(tail: str) -> str:
        monkeypatch.setattr(inspect, "getsource", lambda obj: real(obj) + (
            tail if obj is matmul_module.tile_dot.fn else ""))
        return MatmulEpilogueKernel("gelu", residual=False).version  # a version is computed once

    assert edited("    # a comment\n") == before
    assert edited("    acc = acc + 0\n") != before


def test_the_fast_activation_is_for_16_bit_outputs_on_nvidia_gpus_only():
    """FAST_ACT (tanh by inline PTX) is never asked of the interpreter, nor of fp32 outputs,
    whose rounding is finer than the approximation's error."""
    from search_spaces import matmul_epilogue as me

    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        assert me.fast_activation(torch.empty((2, 2), dtype=dtype)) is False
    a, b = torch.empty((8, 16), dtype=torch.float16), torch.empty((16, 8), dtype=torch.float16)
    out = torch.empty((8, 8), dtype=torch.float16)
    config = KernelConfig(VARIANT=2, BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=1,
                          num_warps=4, num_stages=2)
    _, meta = me._launch_meta(a, b, None, out, "gelu", config)
    assert meta["FAST_ACT"] == 0 and meta["TMA_STORE"] == me.TMA_STORE_DEFAULT
    _, meta = me._launch_meta(a, b, None, out, "gelu", config, fast_act=True, tma_store=True)
    assert meta["FAST_ACT"] == 1 and meta["TMA_STORE"] == 1


def test_a_descriptor_store_needs_row_major_output_and_residual():
    from search_spaces import matmul_epilogue as me

    a, b = torch.empty((8, 16), dtype=torch.float16), torch.empty((16, 8), dtype=torch.float16)
    out = torch.empty((8, 8), dtype=torch.float16)
    config = KernelConfig(VARIANT=2, BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=1,
                          num_warps=4, num_stages=2)
    column_major = torch.empty((8, 8), dtype=torch.float16).t()
    with pytest.raises(ValueError, match="row-major"):
        me._launch_meta(a, b, column_major, out, "gelu", config, tma_store=True)
    with pytest.raises(ValueError, match="row-major"):
        me._launch_meta(a, b, None, column_major, "gelu", config, tma_store=True)
    # pointer stores take any strides
    me._launch_meta(a, b, column_major, column_major, "gelu", config, tma_store=False)


@pytest.mark.parametrize("tma_store", [False, True])
@pytest.mark.parametrize("name", ["matmul_epilogue_gelu_residual", "matmul_epilogue_silu"])
def test_tma_persistent_is_right_with_either_store(name, tma_store):
    """The tma_persistent build stores by C's descriptor (and loads the residual by its own)
    or by pointers: both are right at the edges (the interpreter emulates descriptors)."""
    from search_spaces import matmul_epilogue as me

    k = KERNELS[name]
    config = KernelConfig(VARIANT=2, BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_M=1,
                          num_warps=4, num_stages=2)
    inputs = k.make_inputs({"M": 20, "N": 40, "K": 24}, "float16", "cpu", seed=3)
    inputs["out"].fill_(float("nan"))
    me.matmul_epilogue(inputs["a"], inputs["b"], inputs["bias"], inputs.get("residual"),
                       inputs["out"], k.act, config, tma_store=tma_store)
    check(k, inputs["out"], inputs, "float16")
