"""conv2d's ``PADDED=1`` gather (``search_spaces/conv2d.py``: ``_conv2d_padded_kernel``) under
Triton's CPU interpreter: it matches torch on odd problems (odd images, padding wider than the
filter, strides and dilation, a 363-tap reduction with a tail, one pixel), with NSPLIT column
tiles, in both layouts' reduction orders; the reduction's tail and the rows past the last pixel
read nothing that changes an output (a non-finite input reaches only the windows holding it);
the padding kernel writes torch's pad with a zero channel; the packed filter is kept per filter
tensor and repacked when the tensor changes; the checks reject a wrong padded launch; the
space's constraints; compiling gets the launch's operands without making them, and the padded
launch's integers specialise alike on a problem and its compile shape."""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch

from search_spaces import conv2d as conv2d_module
from search_spaces.conv2d import (
    _PACKED,
    MAX_IMAGE,
    NCHW,
    NHWC,
    RED_ALIGN,
    Conv2dKernel,
    Geometry,
    _padded_args,
    packed_filter,
    tap_offsets,
)
from tests.test_conv2d_interpreter import LARGE, PROBLEMS, check, problem
from tuner.backends.child import ChildState, _verify
from tuner.config import KernelConfig
from tuner.space import ProblemContext

LAYOUTS = [NCHW, NHWC]
ODD = {
    **PROBLEMS,
    "one-pixel": problem(N=1, C=1, H=1, W=1, K=1, R=1, S=1, PAD=0),
    "one-pixel-padded-3x3": problem(N=2, C=2, H=1, W=1, K=3, R=3, S=3, PAD=1),
    "pad-5-over-2x2-stride-3": problem(N=3, C=3, H=4, W=5, K=7, R=2, S=2, STRIDE=3, PAD=5),
}


def padded(block_n: int = 16, nsplit: int = 1, gather: int = 0, block_m: int = 16,
           block_k: int = 16) -> KernelConfig:
    return KernelConfig(BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=1,
                        GATHER_KM=gather, num_warps=4, num_stages=2, PADDED=1, NSPLIT=nsplit)


def run(kernel: Conv2dKernel, shape: dict[str, int], config: KernelConfig, dtype: str,
        seed: int = 1) -> dict[str, Any]:
    inputs = kernel.make_inputs(shape, dtype, "cpu", seed=seed)
    inputs["out"].fill_(float("nan"))  # every element must be written
    kernel.launch(config, inputs)
    return inputs


@pytest.mark.parametrize("gather", [0, 1], ids=["gather-mk", "gather-km"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("which", ODD)
@pytest.mark.parametrize("kernel", LAYOUTS, ids=lambda k: k.name)
def test_the_padded_gather_matches_torch_on_odd_problems(kernel, which, dtype, gather):
    """BLOCK_M=16 leaves rows past M in the last pixel tile (all but dilation-2's 16 pixels),
    BLOCK_N=16 a masked column tile where K is 17 or 20, BLOCK_K=16 a tail in every reduction
    (20 taps, 27, 363, 18, 12, 1 for one-pixel)."""
    shape = ODD[which]
    inputs = run(kernel, shape, padded(gather=gather), dtype)
    g = Geometry.of(shape)
    assert inputs["out"].shape == (g.N, g.K, g.P, g.Q)
    check(kernel, inputs["out"], inputs, dtype)


@pytest.mark.parametrize("nsplit", [2, 3])
@pytest.mark.parametrize("which", ["11x11-stride-4-pad-2-C3", "pad-4-over-3x3-stride-2"])
def test_nsplit_column_tiles_cover_every_output_channel(which, nsplit):
    """K = 20 and 17 in tiles of 16, 2 or 3 of them a program: the last tile partly or wholly
    past K (its stores masked, its filter columns read as 0)."""
    shape = ODD[which]
    for kernel in LAYOUTS:
        inputs = run(kernel, shape, padded(nsplit=nsplit), "float32")
        check(kernel, inputs["out"], inputs, "float32")


def test_nsplit_equals_one_tile_per_split_exactly():
    """NSPLIT=3 tiles of 16 over 48 channels (one program per pixel tile) gives the NSPLIT=1
    result bit for bit: the same products summed in the same order."""
    shape = problem(N=2, C=3, H=11, W=9, K=48, R=5, S=3, STRIDE=2, PAD=2)
    one = run(NCHW, shape, padded(nsplit=1), "float32")["out"]
    three = run(NCHW, shape, padded(nsplit=3), "float32")["out"]
    assert torch.equal(one, three)


def test_a_non_finite_input_reaches_only_the_windows_that_hold_it():
    """The reduction's tail taps read the zero channel, not a pixel of the window: an inf at
    a window's origin (its first tap, channel 0) gives that window's output +-inf, as torch
    does, not NaN (a tail tap that read the origin again, times its zero weight, would add
    0 * inf), and every output whose window does not hold it stays finite and right."""
    shape = PROBLEMS["11x11-stride-4-pad-2-C3"]  # 363 taps: a tail of 5 in slices of 16
    assert Geometry.of(shape).K_RED % 16
    for kernel in LAYOUTS:
        inputs = kernel.make_inputs(shape, "float32", "cpu", seed=9)
        # padded (8, 12): the origin of output (2, 3)'s window (stride 4)
        inputs["x"][0, 0, 6, 10] = float("inf")
        inputs["out"].fill_(float("nan"))
        kernel.launch(padded(), inputs)
        ref, got = kernel.reference(inputs), inputs["out"]
        hit = ~torch.isfinite(ref)
        assert 0 < int(hit.sum()) < hit.numel() // 2  # some windows hold it, most do not
        assert not torch.isnan(ref).any() and torch.equal(got[hit], ref[hit])  # +-inf each
        torch.testing.assert_close(got[~hit], ref[~hit], rtol=1e-5,
                                   atol=1e-4 * float(ref[~hit].abs().max()))


def test_the_packed_filter_is_kept_per_tensor_and_repacked_when_it_changes():
    shape = problem(N=1, C=2, H=6, W=7, K=5, R=3, S=2, PAD=1)
    inputs = NCHW.make_inputs(shape, "float32", "cpu", seed=10)
    w = inputs["w"]
    first = packed_filter(w, False)
    assert first.shape == (RED_ALIGN, 5) and first.is_contiguous()
    assert torch.equal(first[:12], w.reshape(5, 12).t()) and not first[12:].any()
    assert packed_filter(w, False) is first  # kept
    assert packed_filter(w, True) is not first  # the other order is another packing
    NCHW.launch(padded(), inputs)
    check(NCHW, inputs["out"], inputs, "float32")
    w.mul_(-2.0)  # in place: the version counter moves, the launch follows the new weights
    assert not torch.equal(packed_filter(w, False), first)
    inputs["out"].fill_(float("nan"))
    NCHW.launch(padded(), inputs)
    check(NCHW, inputs["out"], inputs, "float32")
    key = id(w)
    assert key in _PACKED
    del inputs, w
    gc.collect()
    assert key not in _PACKED  # dropped with its tensor


def test_tap_offsets_follow_the_layout_s_reduction_order_then_point_at_the_zero_channel():
    strides = (100, 10, 1)  # channel, row, column
    nchw = tap_offsets(2, 2, 3, 1, strides, channels_last=False)
    assert nchw[:12] == [0, 1, 2, 10, 11, 12, 100, 101, 102, 110, 111, 112]
    nhwc = tap_offsets(2, 2, 3, 2, strides, channels_last=True)  # dilation 2
    assert nhwc[:12] == [0, 100, 2, 102, 4, 104, 20, 120, 22, 122, 24, 124]
    for taps in (nchw, nhwc):
        assert len(taps) == RED_ALIGN and set(taps[12:]) == {200}  # channel C = 2


@pytest.mark.parametrize("pad", [0, 1, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_padded_input_is_torch_s_pad_with_a_zero_channel_in_one_contiguous_tensor(pad, dtype):
    for shape in ((2, 3, 9, 13), (1, 1, 1, 1), (3, 2, 5, 300)):  # 300 + 8 columns: two chunks
        x = torch.randn(shape).to(dtype)
        for layout in (x, x.contiguous(memory_format=torch.channels_last)):
            got = conv2d_module.padded_input(layout, pad)
            assert got.is_contiguous()
            assert torch.equal(got, torch.nn.functional.pad(x, (pad, pad, pad, pad, 0, 1)))


def test_compiling_gets_the_launch_s_operands_without_making_them():
    """The compile pool's operands (empty tensors: nothing launched) have the launch's shapes,
    dtypes and strides, and every integer is the same: the same binary."""
    shape = PROBLEMS["pad-4-over-3x3-stride-2"]
    inputs = NCHW.make_inputs(shape, "float16", "cpu", seed=12)
    g = Geometry.of(shape)
    made = _padded_args(inputs["x"], inputs["w"], inputs["out"], g, False)
    empty = _padded_args(inputs["x"], inputs["w"], inputs["out"], g, False, compiling=True)
    for a, b in zip(made, empty, strict=True):
        if isinstance(a, torch.Tensor):
            assert (a.shape, a.dtype, a.stride()) == (b.shape, b.dtype, b.stride())
        else:
            assert a == b


def _zero_last_tap_row(inputs: dict[str, Any]) -> None:
    w = inputs["w"].clone()
    w[:, -1, -1, -1] = 0
    inputs["w"] = w


def _shifted_taps(monkeypatch: pytest.MonkeyPatch) -> None:
    real = conv2d_module.tap_offsets

    def off_by_one(*args: Any, **kwargs: Any) -> list[int]:
        taps = real(*args, **kwargs)
        return [taps[0], *taps[2:], taps[-1]]  # one tap skipped

    monkeypatch.setattr(conv2d_module, "tap_offsets", off_by_one)
    conv2d_module._TAPS.clear()


def test_verification_rejects_a_wrong_padded_launch(monkeypatch):
    shape, dtype = PROBLEMS["11x11-stride-4-pad-2-C3"], "float32"
    state = ChildState("interpret")
    state.kernel, state.shape, state.dtype = NCHW, shape, dtype
    config = padded(block_m=32, block_n=32, block_k=128, gather=1)
    inputs = NCHW.make_inputs(shape, dtype, "cpu", seed=11)
    assert _verify(state, config, inputs) is None
    dropped = dict(inputs)
    _zero_last_tap_row(dropped)  # the filter's last tap lost (as if the tail were not read)

    class LastTapLost:
        def __getattr__(self, name: str) -> Any:
            return getattr(NCHW, name)

        def launch(self, config: KernelConfig, run_inputs: dict[str, Any]) -> None:
            NCHW.launch(config, {**run_inputs, "w": dropped["w"]})

    state.kernel = LastTapLost()
    assert isinstance(_verify(state, config, inputs), str)
    state.kernel = NCHW
    _shifted_taps(monkeypatch)
    try:
        assert isinstance(_verify(state, config, inputs), str)
    finally:
        conv2d_module._TAPS.clear()


# -- the space -----------------------------------------------------------------------------------

ALEXNET = problem(N=100, C=3, H=224, W=224, K=96, R=11, S=11, STRIDE=4, PAD=2)


def test_only_nchw_s_space_has_the_padded_parameters():
    assert {"PADDED", "NSPLIT"} <= set(NCHW.space().names)
    assert NHWC.space().names == ("BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", "GATHER_KM",
                                  "num_warps", "num_stages")
    for dtype in ("float32", "float16"):
        assert NCHW.default_config(ALEXNET, dtype)["PADDED"] == 0
        assert all("PADDED" not in c for c in NHWC.known_good_configs(ALEXNET, dtype))


def test_alexnet_fp32_tries_the_padded_tiles_first_and_all_known_good_configs_run():
    from tuner.search import known_good_first

    space, ctx = NCHW.space(), ProblemContext(ALEXNET, "float32")
    known = NCHW.known_good_configs(ALEXNET, "float32")
    for config in [*known, NCHW.default_config(ALEXNET, "float32")]:
        assert space.violation(config, ctx) is None, config
    first = known_good_first(NCHW, ALEXNET, "float32", space, ctx)
    assert len(first) == 5 and all(c["PADDED"] == 1 for c in first)
    assert first[0]["BLOCK_N"] * first[0]["NSPLIT"] == 96  # all channels from one gather
    assert any(c["PADDED"] == 0 for c in known)  # the masked gather stays in reach


def test_the_space_s_padded_constraints():
    space, ctx = NCHW.space(), ProblemContext(ALEXNET, "float32")
    base = dict(BLOCK_M=64, BLOCK_N=32, BLOCK_K=16, GROUP_M=8, GATHER_KM=1, num_warps=4,
                num_stages=3, PADDED=1, NSPLIT=3)
    assert space.violation(KernelConfig(base), ctx) is None
    assert "needs PADDED=1" in (space.violation(KernelConfig({**base, "PADDED": 0}), ctx) or "")
    # a fourth tile of 32 would start at channel 96 of 96
    assert "past the 96" in (space.violation(KernelConfig({**base, "NSPLIT": 4}), ctx) or "")
    # 4 warps: 64 x 128 accumulators = 64 a thread; 128 x 128: 128, which spills
    wide = KernelConfig({**base, "BLOCK_M": 128, "BLOCK_N": 32, "NSPLIT": 4})
    big = problem(N=100, C=3, H=224, W=224, K=128, R=11, S=11, STRIDE=4, PAD=2)
    assert "registers" in (space.violation(wide, ProblemContext(big, "float32")) or "")
    # a padded input past 2**31 elements: the masked gather only
    huge = problem(N=4096, C=3, H=400, W=400, K=96, R=11, S=11, STRIDE=4, PAD=2)
    assert Geometry.of(huge).padded_elements > MAX_IMAGE
    assert "int32" in (space.violation(KernelConfig(base), ProblemContext(huge, "float32"))
                       or "")
    assert space.violation(KernelConfig({**base, "PADDED": 0, "NSPLIT": 1}),
                           ProblemContext(huge, "float32")) is None
    with pytest.raises(ValueError, match="int32"):
        conv2d_module._kernel_and_args(
            torch.empty(4096, 3, 400, 400, device="meta"),
            torch.empty(96, 3, 11, 11, device="meta"),
            torch.empty(1, device="meta"), 4, 2, 1, KernelConfig(base), False)


# -- compile shape -------------------------------------------------------------------------------

def _padded_int_args(kernel: Conv2dKernel, shape: dict[str, int]) -> list[int]:
    """Every integer the padded kernel is launched with for ``shape`` (meta tensors)."""
    g = Geometry.of(shape)
    fmt = torch.channels_last if kernel.channels_last else torch.contiguous_format
    x = torch.empty((g.N, g.C, g.H, g.W), device="meta").contiguous(memory_format=fmt)
    w = torch.empty((g.K, g.C, g.R, g.S), device="meta").contiguous(memory_format=fmt)
    out = torch.empty((g.N, g.K, g.P, g.Q), device="meta").contiguous(memory_format=fmt)
    args = _padded_args(x, w, out, g, kernel.channels_last, compiling=True)  # what compile gets
    return [a for a in args if isinstance(a, int)]


@pytest.mark.parametrize("which", LARGE)
def test_the_padded_launch_specialises_alike_on_the_compile_shape(which):
    shape = LARGE[which]
    small = NCHW.compile_shape(shape, "float32")
    big_args, small_args = _padded_int_args(NCHW, shape), _padded_int_args(NCHW, small)
    assert len(big_args) == len(small_args) == 12
    for big, little in zip(big_args, small_args, strict=True):
        assert (big == 1) == (little == 1) and (big % 16 == 0) == (little % 16 == 0)
