"""matmul's ALIGN=1 under Triton's CPU interpreter: unaligned operands copied into zero-padded
aligned buffers (``search_spaces.matmul.stage``) before every variant, on odd shapes; what it
copies and what it leaves alone; the constraint that keeps it to problems where it copies
something; the cost model's account of the copies."""

import pytest
import torch

from search_spaces import get_kernel
from search_spaces import matmul as mm
from search_spaces.gemm import prior as cost_model
from tuner.config import KernelConfig
from tuner.kernel import output_check_of
from tuner.space import ProblemContext
from tuner.verification import compare


def config(name: str, split_k: int = 1, align: int = 1, **tile: int) -> KernelConfig:
    base = {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_M": 2, "num_warps": 4,
            "num_stages": 2, **tile}
    return KernelConfig({**base, "VARIANT": mm.VARIANTS.index(name), "SPLIT_K": split_k,
                         "ALIGN": align})


#: K not a multiple of 16 (A's rows and B's K padded); N odd with K aligned (B's rows alone);
#: both; M = 1 and K = 1
SHAPES = [{"M": 17, "N": 40, "K": 65}, {"M": 33, "N": 37, "K": 48},
          {"M": 50, "N": 33, "K": 41}, {"M": 1, "N": 9, "K": 1}]
CASES = [pytest.param(config(name, split), shape, dtype,
                      id=f"{name}{split}-{'x'.join(map(str, shape.values()))}-{dtype}")
         for name, split in (("tiled", 1), ("persistent", 1), ("tma_persistent", 1),
                             ("split_k", 2), ("stream_k", 1))
         for shape in SHAPES for dtype in ("float16", "float32")
         if name != "tma_persistent" or dtype == "float16"]


def run(cfg: KernelConfig, shape: dict[str, int], dtype: str) -> tuple:
    k = get_kernel("matmul")
    inputs = k.make_inputs(shape, dtype, "cpu", seed=3)
    inputs["out"].fill_(float("nan"))  # every element must be written
    mm.matmul(inputs["a"], inputs["b"], inputs["out"], cfg, sms=3)
    return k, inputs


@pytest.mark.parametrize(("cfg", "shape", "dtype"), CASES)
def test_every_variant_staged_matches_the_reference(cfg, shape, dtype):
    k, inputs = run(cfg, shape, dtype)
    result = compare(inputs["out"], k.reference(inputs), k.tolerance(dtype), dtype,
                     output_check_of(k))
    assert isinstance(result, float), result


def test_staged_and_unstaged_tiled_agree_to_rounding():
    """The zero padding adds nothing: the staged tiled kernel equals the unstaged one up to
    fp32 summation order (K steps split differently at the padded edge)."""
    shape = {"M": 30, "N": 45, "K": 77}
    staged = run(config("tiled"), shape, "float32")[1]["out"].clone()
    plain = run(config("tiled", align=0), shape, "float32")[1]["out"]
    torch.testing.assert_close(staged, plain, atol=1e-5, rtol=1e-5)


def test_stage_pads_k_with_zeros_and_aligns_rows():
    a = torch.randn(5, 21, dtype=torch.float16)
    b = torch.randn(21, 13, dtype=torch.float16)
    out = torch.empty(5, 13, dtype=torch.float16)
    a2, b2, out2, pre, post = mm.stage(a, b, out, config("tiled"))
    assert len(pre) == 1 and post == []  # one launch copies both; C is written in place
    assert out2 is out
    for kernel, grid, args, kwargs in pre:
        kernel[grid](*args, **kwargs)
    assert a2.shape == (5, 32) and a2.stride(0) == 32
    assert b2.shape == (32, 13) and b2.stride(0) == 16
    assert torch.equal(a2[:, :21], a) and not a2[:, 21:].any()
    assert torch.equal(b2[:21], b) and not b2[21:].any()


def test_stage_copies_only_what_is_unaligned():
    """K a multiple of 16 with an odd N: B alone is staged (its rows), A stays as given; a
    descriptor-storing variant also writes C through an aligned buffer, copied back after."""
    a = torch.randn(7, 32, dtype=torch.float16)
    b = torch.randn(32, 9, dtype=torch.float16)
    out = torch.empty(7, 9, dtype=torch.float16)
    a2, b2, out2, pre, post = mm.stage(a, b, out, config("tiled"))
    assert a2 is a and len(pre) == 1 and b2.stride(0) == 16 and out2 is out and post == []
    _, _, out3, pre, post = mm.stage(a, b, out, config("tma_persistent"))
    assert out3 is not out and out3.stride(0) == 16 and len(post) == 1
    assert mm.stage(a, b, out, config("tiled", align=0))[3:] == ([], [])


def test_the_constraint_keeps_align_to_problems_it_copies_for():
    space = get_kernel("matmul").space()
    aligned = ProblemContext({"M": 64, "N": 64, "K": 64}, "float16")
    assert "copy nothing" in space.violation(config("tiled", BLOCK_K=64), aligned)
    assert space.violation(config("tiled", align=0, BLOCK_K=64), aligned) is None
    for shape, dtype in (({"M": 64, "N": 64, "K": 65}, "float16"),
                         ({"M": 64, "N": 60, "K": 64}, "float16"),
                         ({"M": 64, "N": 64, "K": 36}, "float32")):
        assert space.violation(config("tiled"), ProblemContext(shape, dtype)) is None
    # fp32 N = 60 has 240-byte rows: aligned, and K = 64: nothing to copy
    assert space.violation(config("tiled"),
                           ProblemContext({"M": 64, "N": 60, "K": 64}, "float32"))


def test_tma_on_unaligned_rows_only_with_align():
    space = get_kernel("matmul").space()
    ctx = ProblemContext({"M": 777, "N": 1234, "K": 4321}, "float16")
    tma = config("tma_persistent", BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_stages=4)
    assert space.violation(tma, ctx) is None
    assert "16-byte aligned rows" in space.violation(KernelConfig({**tma, "ALIGN": 0}), ctx)


def test_known_good_configs_lead_with_staged_tiles_where_rows_are_unaligned():
    k = get_kernel("matmul")
    odd = k.known_good_configs({"M": 777, "N": 1234, "K": 4321}, "float16")
    assert odd[0]["ALIGN"] == 1 and odd[0]["VARIANT"] == mm.TMA_PERSISTENT
    even = k.known_good_configs({"M": 4096, "N": 4096, "K": 4096}, "float16")
    assert all(c["ALIGN"] == 0 for c in even)
    fp32 = k.known_good_configs({"M": 777, "N": 1234, "K": 4321}, "float32")
    assert all(c["VARIANT"] != mm.TMA_PERSISTENT for c in fp32 if c["ALIGN"])


def test_the_cost_model_charges_the_copies_and_credits_aligned_loads():
    """Where rows are unaligned (2-byte loads, no async copies) the staged tile ranks ahead of
    the same tile unstaged; where only a few bytes are unaligned at a tiny K the copies are
    most of the work and the unstaged tile ranks ahead."""
    odd = ProblemContext({"M": 777, "N": 1234, "K": 4321}, "float16")
    tile = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_stages=4)
    staged, plain = config("tiled", **tile), config("tiled", align=0, **tile)
    assert cost_model.estimate(staged, odd) < cost_model.estimate(plain, odd)
    tiny_k = ProblemContext({"M": 4096, "N": 4096, "K": 17}, "float16")
    small = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=32, num_stages=2)
    assert (cost_model.estimate(config("tiled", **small), tiny_k)
            > cost_model.estimate(config("tiled", align=0, **small), tiny_k))


def test_the_align_probe_smoke_runs_every_staged_kernel_right():
    """bench/align_probe.py --smoke: every kernel the GPU probe times (unstaged, staged whole,
    the copies alone, the GEMM on staged operands) runs and verifies on the interpreter."""
    from bench import align_probe

    assert align_probe.main(["--smoke"]) == 0
