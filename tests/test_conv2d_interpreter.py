"""conv2d as an implicit GEMM (``search_spaces/conv2d.py``) under Triton's CPU interpreter: both
layouts and dtypes on odd problems (odd images, padding wider than the filter, strides 2 and 3,
dilation 2, one image, one channel, a reduction of 363 taps), the checks that reject wrong
convolutions, the torch baseline, the shapes that have no output, the compile shape's
specialisation, and a tune through the CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from search_spaces import get_kernel
from search_spaces.conv2d import KERNELS, NCHW, NHWC, Conv2dKernel, Geometry, _args
from tuner.backends.child import ChildState, _verify
from tuner.config import KernelConfig
from tuner.kernel import load_ref
from tuner.space import ProblemContext
from tuner.verification import compare

ROOT = Path(__file__).resolve().parents[1]
LAYOUTS = [NCHW, NHWC]


def problem(N=2, C=3, H=9, W=13, K=5, R=3, S=3, STRIDE=1, PAD=1, DIL=1) -> dict[str, int]:
    """A shape in torch's terms (``PAD`` the padding itself; the dimension is PAD1)."""
    return {"N": N, "C": C, "H": H, "W": W, "K": K, "R": R, "S": S, "STRIDE": STRIDE,
            "PAD1": PAD + 1, "DIL": DIL}


PROBLEMS = {
    "odd-image": problem(H=9, W=13),
    "pad-4-over-3x3-stride-2": problem(N=1, C=2, H=7, W=6, K=17, PAD=4, STRIDE=2),
    "dilation-2-stride-3-one-image-one-channel": problem(N=1, C=1, H=11, W=10, K=3, R=3, S=2,
                                                         STRIDE=3, PAD=2, DIL=2),
    "11x11-stride-4-pad-2-C3": problem(N=1, C=3, H=23, W=19, K=20, R=11, S=11, STRIDE=4, PAD=2),
    "1x1-no-padding": problem(N=3, C=20, H=5, W=3, K=9, R=1, S=1, PAD=0),
}
#: BLOCK_N=16 < K=17/20 (a masked second column tile), BLOCK_K=16 over 363 taps (a masked tail
#: slice); BLOCK_M=16 below every problem's pixel count
SMALL = KernelConfig(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16, GROUP_M=1, GATHER_KM=0, num_warps=4,
                     num_stages=2)
#: fewer, larger tiles: the 363-tap reduction in three slices (the checks' tests)
WIDE = KernelConfig(BLOCK_M=32, BLOCK_N=32, BLOCK_K=128, GROUP_M=1, GATHER_KM=1, num_warps=4,
                    num_stages=2)


def check(kernel: Conv2dKernel, got: torch.Tensor, inputs: dict[str, Any], dtype: str) -> None:
    """``got`` passes the check every measured config passes (tuner/verification.py)."""
    result = compare(got, kernel.reference(inputs), kernel.tolerance(dtype), dtype,
                     kernel.output_check)
    assert isinstance(result, float), result


@pytest.mark.parametrize("gather", [0, 1], ids=["gather-mk", "gather-km"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("which", PROBLEMS)
@pytest.mark.parametrize("kernel", LAYOUTS, ids=lambda k: k.name)
def test_both_layouts_match_torch_on_odd_problems(kernel, which, dtype, gather):
    shape = PROBLEMS[which]
    inputs = kernel.make_inputs(shape, dtype, "cpu", seed=1)
    inputs["out"].fill_(float("nan"))  # every element must be written
    kernel.launch(KernelConfig({**SMALL, "GATHER_KM": gather}), inputs)
    g = Geometry.of(shape)
    assert inputs["out"].shape == (g.N, g.K, g.P, g.Q)
    check(kernel, inputs["out"], inputs, dtype)
    # the reference is torch's conv2d with torch's own padding argument
    x, w = inputs["x"].double(), inputs["w"].double()
    torch_out = torch.nn.functional.conv2d(x, w, stride=g.stride, padding=g.pad, dilation=g.dil)
    assert torch.allclose(kernel.reference(inputs), torch_out.float())


def test_the_default_and_a_large_tile_config_run_on_an_odd_problem():
    shape, dtype = PROBLEMS["11x11-stride-4-pad-2-C3"], "float16"
    big = KernelConfig(BLOCK_M=64, BLOCK_N=32, BLOCK_K=128, GROUP_M=8, GATHER_KM=1,
                       num_warps=4, num_stages=2)
    for kernel, config in ((NHWC, NHWC.default_config(shape, dtype)), (NCHW, big)):
        inputs = kernel.make_inputs(shape, dtype, "cpu", seed=2)
        inputs["out"].fill_(float("nan"))
        kernel.launch(config, inputs)
        check(kernel, inputs["out"], inputs, dtype)


def test_nhwc_tensors_are_channels_last_and_nchw_ones_contiguous():
    shape = PROBLEMS["odd-image"]
    cl = NHWC.make_inputs(shape, "float16", "cpu", seed=3)
    plain = NCHW.make_inputs(shape, "float16", "cpu", seed=3)
    for name in ("x", "w", "out"):
        assert cl[name].is_contiguous(memory_format=torch.channels_last), name
        assert not cl[name].is_contiguous(), name
        assert plain[name].is_contiguous(), name
    assert torch.equal(cl["x"], plain["x"]) and torch.equal(cl["w"], plain["w"])  # same values


def test_the_nchw_kernel_follows_any_strides_of_input_and_output():
    """The gather and the store go by the tensors' strides: NCHW's kernel on channels-last
    input and output (its filter contiguous) is still right."""
    shape, dtype = PROBLEMS["pad-4-over-3x3-stride-2"], "float32"
    inputs = NCHW.make_inputs(shape, dtype, "cpu", seed=4)
    inputs["x"] = inputs["x"].contiguous(memory_format=torch.channels_last)
    inputs["out"] = inputs["out"].contiguous(memory_format=torch.channels_last)
    inputs["out"].fill_(float("nan"))
    NCHW.launch(SMALL, inputs)
    check(NCHW, inputs["out"], inputs, dtype)


# -- verification rejects wrong convolutions -----------------------------------------------------

class _Broken:
    """The kernel with a bug injected around its launch (``bug(inputs)`` before it, or
    ``after(inputs)`` on its outputs)."""

    def __init__(self, kernel: Conv2dKernel, before: Any = None, after: Any = None) -> None:
        self.kernel, self.before, self.after = kernel, before, after

    def __getattr__(self, name: str) -> Any:
        return getattr(self.kernel, name)

    def launch(self, config: KernelConfig, inputs: dict[str, Any]) -> None:
        run = dict(inputs)
        if self.before:
            self.before(run)
        self.kernel.launch(config, run)
        if self.after:
            self.after(inputs["out"])


def _flip_filter(inputs: dict[str, Any]) -> None:  # convolution instead of correlation
    inputs["w"] = inputs["w"].flip(2, 3).contiguous(memory_format=torch.channels_last)


def _drop_last_tap(inputs: dict[str, Any]) -> None:  # the reduction's masked tail lost
    w = inputs["w"].clone()
    w[:, -1, -1, -1] = 0
    inputs["w"] = w


def _filter_read_as_nchw(inputs: dict[str, Any]) -> None:  # the layouts' orders mixed up
    w = inputs["w"]
    inputs["w"] = w.permute(0, 2, 3, 1).contiguous().reshape(w.shape)


def _zero_small(out: torch.Tensor) -> None:
    out[out.abs() < out.abs().float().median().to(out.dtype)] = 0


def _bias(out: torch.Tensor) -> None:  # 3 ulps of fp16 at the output's scale, everywhere
    out += 3 * 2.0 ** -10 * 2.0 ** float(torch.floor(torch.log2(out.abs().float().max())))


BUGS = {
    "flipped filter": {"before": _flip_filter},
    "last tap dropped": {"before": _drop_last_tap},
    "channels-last filter read in NCHW order": {"before": _filter_read_as_nchw},
    "smaller half zeroed": {"after": _zero_small},
    "3-ulp bias": {"after": _bias},
}


@pytest.mark.parametrize("bug", BUGS)
def test_verification_rejects_a_wrong_convolution(bug):
    shape, dtype = PROBLEMS["11x11-stride-4-pad-2-C3"], "float16"
    state = ChildState("interpret")
    state.kernel, state.shape, state.dtype = _Broken(NHWC, **BUGS[bug]), shape, dtype
    inputs = NHWC.make_inputs(shape, dtype, "cpu", seed=5)
    assert isinstance(_verify(state, WIDE, inputs), str)
    state.kernel = NHWC  # the same inputs, launched right, pass
    assert _verify(state, WIDE, inputs) is None


def test_fp32_is_checked_far_below_tf32_error():
    """fp32 runs IEEE products: its check rejects an output computed with TF32 inputs
    (10-bit mantissas) that fp16's check would pass."""
    shape = PROBLEMS["11x11-stride-4-pad-2-C3"]
    inputs = NCHW.make_inputs(shape, "float32", "cpu", seed=6)
    ref = NCHW.reference(inputs)
    g = Geometry.of(shape)

    def tf32(t: torch.Tensor) -> torch.Tensor:  # round to 10 mantissa bits, to nearest
        bits = t.contiguous().view(torch.int32)
        return ((bits + 0x1000) & ~0x1FFF).view(torch.float32)

    rough = torch.nn.functional.conv2d(tf32(inputs["x"]).double(), tf32(inputs["w"]).double(),
                                       stride=g.stride, padding=g.pad, dilation=g.dil).float()
    assert isinstance(compare(rough, ref, NCHW.tolerance("float32"), "float32"), str)
    assert isinstance(compare(rough, ref, NCHW.tolerance("float16"), "float16"), float)


# -- the baseline, the geometry, the space -------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("kernel", LAYOUTS, ids=lambda k: k.name)
def test_the_torch_baseline_matches_the_reference_in_the_inputs_layout(kernel, dtype):
    inputs = kernel.make_inputs(PROBLEMS["pad-4-over-3x3-stride-2"], dtype, "cpu", seed=7)
    before = torch.backends.cudnn.allow_tf32
    got = kernel.baseline(inputs)
    assert torch.backends.cudnn.allow_tf32 == before  # restored
    assert got.dtype == getattr(torch, dtype)
    if kernel is NHWC:
        assert got.is_contiguous(memory_format=torch.channels_last)
    check(kernel, got, inputs, dtype)


@pytest.mark.parametrize("shape", [
    problem(H=2, R=5, PAD=1),  # 2 + 2 < 5
    problem(W=3, S=3, DIL=3, PAD=1),  # 3 + 2 < 7
])
def test_a_problem_without_output_is_refused_saying_why(shape):
    with pytest.raises(ValueError, match="no output: the padded"):
        NCHW.make_inputs(shape, "float16", "cpu", seed=0)
    assert Geometry.of(shape).problem() is not None
    assert NCHW.prior(NCHW.default_config(problem(), "float16"),
                      ProblemContext(shape, "float16")) is None


def test_geometry_flops_and_bytes_of_alexnet_conv1():
    shape = problem(N=100, C=3, H=224, W=224, K=96, R=11, S=11, STRIDE=4, PAD=2)
    g = Geometry.of(shape)
    assert (g.P, g.Q, g.M, g.K_RED) == (55, 55, 100 * 55 * 55, 363)
    assert NHWC.flops(shape) == 2.0 * 100 * 96 * 55 * 55 * 363
    assert NHWC.bytes(shape, "float16") == 2.0 * (100 * 3 * 224 * 224 + 96 * 363
                                                  + 100 * 96 * 55 * 55)
    assert NCHW.bytes(shape, "float32") == 2 * NHWC.bytes(shape, "float16")


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_the_space_runs_the_known_good_configs_and_prunes_what_cannot_run(dtype):
    alexnet = problem(N=100, C=3, H=224, W=224, K=96, R=11, S=11, STRIDE=4, PAD=2)
    space, ctx = NHWC.space(), ProblemContext(alexnet, dtype)
    for config in [*NHWC.known_good_configs(alexnet, dtype),
                   NHWC.default_config(alexnet, dtype)]:
        assert space.violation(config, ctx) is None, config
    feasible = space.feasible(ctx)
    assert 100 < len(feasible) < space.size()
    priors = {NHWC.prior(c, ctx) for c in feasible}
    if dtype == "float32":  # CUDA-core products: the tensor-core GEMM model does not apply
        assert priors == {None}
    else:  # the prior ranks (it is not flat), the 128 x 128 tiles with 8 warps first
        assert len(priors) > 10
        best = min(feasible, key=lambda c: NHWC.prior(c, ctx))
        assert (best["BLOCK_M"], best["BLOCK_N"], best["num_warps"]) == (128, 128, 8)
    base = dict(BLOCK_M=128, BLOCK_N=64, BLOCK_K=32, GROUP_M=8, GATHER_KM=0, num_warps=4,
                num_stages=1)
    assert space.violation(KernelConfig(base), ctx) is None  # 64 acc, 32 gathered a thread
    for spills in ({"BLOCK_N": 128}, {"BLOCK_K": 64}):  # 128 acc; 64 gathered: ptxas spills
        assert "registers" in (space.violation(KernelConfig({**base, **spills}), ctx) or "")
    too_wide = KernelConfig({**base, "BLOCK_M": 64, "BLOCK_N": 256, "num_warps": 8})
    assert "output channels" in (space.violation(too_wide, ctx) or "")  # 96 need 128
    tiny = problem(N=1, C=1, H=3, W=3, K=2, R=1, S=1, PAD=0)  # 9 pixels, 1 tap
    assert space.violation(NHWC.default_config(tiny, dtype), ProblemContext(tiny, dtype)) is None


# -- compile shape -------------------------------------------------------------------------------

def _int_args(kernel: Conv2dKernel, shape: dict[str, int]) -> list[int]:
    """Every integer the kernel is launched with for ``shape`` (on meta tensors: no memory)."""
    g = Geometry.of(shape)
    fmt = torch.channels_last if kernel.channels_last else torch.contiguous_format
    x = torch.empty((g.N, g.C, g.H, g.W), device="meta").contiguous(memory_format=fmt)
    w = torch.empty((g.K, g.C, g.R, g.S), device="meta").contiguous(memory_format=fmt)
    out = torch.empty((g.N, g.K, g.P, g.Q), device="meta").contiguous(memory_format=fmt)
    return [a for a in _args(x, w, out, g, kernel.channels_last) if isinstance(a, int)]


LARGE = {
    "alexnet-conv1": problem(N=512, C=3, H=224, W=224, K=96, R=11, S=11, STRIDE=4, PAD=2),
    "vit-patch-16": problem(N=256, C=3, H=224, W=224, K=768, R=16, S=16, STRIDE=16, PAD=0),
    "resnet-3x3-stride-2": problem(N=256, C=64, H=113, W=112, K=128, STRIDE=2, PAD=1),
    "dilated-odd": problem(N=97, C=33, H=301, W=257, K=65, R=5, S=3, STRIDE=3, PAD=7, DIL=3),
    "one-image-one-row": problem(N=1, C=256, H=1, W=16001, K=256, R=1, S=9, PAD=4),
}


@pytest.mark.parametrize("which", LARGE)
@pytest.mark.parametrize("kernel", LAYOUTS, ids=lambda k: k.name)
def test_the_compile_shape_is_small_and_specialises_alike(kernel, which):
    """Triton specialises integer arguments on ==1 and divisibility by 16: every one the kernel
    gets (sizes, strides, the pixel count) agrees between the problem and its compile shape,
    as does every dimension (the compile pool's own test asks that of each)."""
    shape = LARGE[which]
    small = kernel.compile_shape(shape, "float16")
    assert small.keys() == shape.keys() and Geometry.of(small).problem() is None
    for dim, size in shape.items():
        assert (small[dim] == 1) == (size == 1) and small[dim] % 16 == size % 16, dim
    for big, little in zip(_int_args(kernel, shape), _int_args(kernel, small), strict=True):
        assert (big == 1) == (little == 1) and (big % 16 == 0) == (little % 16 == 0)
    assert kernel.bytes(small, "float16") < min(16 << 20, kernel.bytes(shape, "float16"))


def test_a_large_problem_s_config_runs_right_on_its_compile_shape():
    shape = problem(N=256, C=4, H=243, W=243, K=16, R=3, S=3, PAD=1)  # > 256 MB of fp16
    small = NHWC.compile_shape(shape, "float16")
    inputs = NHWC.make_inputs(small, "float16", "cpu", seed=8)
    inputs["out"].fill_(float("nan"))
    NHWC.launch(NHWC.default_config(shape, "float16"), inputs)
    check(NHWC, inputs["out"], inputs, "float16")


# -- registration and the CLI --------------------------------------------------------------------

def test_both_layouts_are_registered_under_their_names_and_refs():
    assert set(KERNELS) == {"conv2d", "conv2d_nhwc"}
    for name, kernel in KERNELS.items():
        assert get_kernel(name) is kernel and load_ref(kernel.ref) is kernel
    assert NCHW.version != NHWC.version  # one module, two spaces (NCHW's PADDED and NSPLIT)
    assert "NHWC" in NHWC.description and "PAD1 = padding + 1" in NCHW.description
    with pytest.raises(ValueError, match="layout must be one of nchw, nhwc"):
        Conv2dKernel("nchwc")


def tuner(*args: str, db: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "tuner.app.cli", "--db", db, *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)


def test_a_tune_on_the_interpreter_stores_a_verified_best(tmp_path):
    db = f"sqlite:///{tmp_path / 'cli.db'}"
    text = "N=1,C=3,H=9,W=7,K=5,R=3,S=3,STRIDE=2,PAD1=2,DIL=1"
    tuned = tuner("tune", "conv2d_nhwc", "--shape", text, "--dtype", "float16", "--trials", "3",
                  "--backend", "interpret", "--json", db=db)
    assert tuned.returncode == 0, tuned.stderr
    summary = json.loads(tuned.stdout)
    assert summary["device"] == "interpret:cpu" and summary["stored"] is True
    assert summary["best_ms"] > 0 and summary["trials"] == 3
    rows = json.loads(tuner("configs", "--kernel", "conv2d_nhwc", "--json", db=db).stdout)
    assert len(rows) == 1 and rows[0]["shape"]["PAD1"] == 2
    assert NHWC.space().contains(KernelConfig(summary["best_config"]))
