"""The softmax kernel is right under Triton's CPU interpreter: one-pass and online two-pass,
rows per program, split rows (several programs a row, partials combined by a second kernel),
odd widths (rows that start at unaligned addresses), one element, large magnitudes, every
dtype; split rows give the single-program results and are deterministic; verification
rejects wrong outputs; the space's constraints and the prior's preference for splitting."""

import math

import pytest
import torch

from search_spaces import get_kernel
from search_spaces.softmax import MIN_SPLIT_CHUNK, softmax, split_chunk
from tuner.backends.child import ChildState, _verify
from tuner.config import KernelConfig
from tuner.space import ProblemContext

K = get_kernel("softmax")


def cfg(block, rows=1, split=1, warps=4, stages=1, evict=0, per_sm=0):
    return KernelConfig(BLOCK_N=block, ROWS=rows, SPLIT=split, PROGRAMS_PER_SM=per_sm,
                        EVICT=evict, num_warps=warps, num_stages=stages)


CONFIGS = [
    cfg(64, warps=2, stages=2),           # 2 passes over 3 blocks
    cfg(128, rows=2, stages=1),           # one block, 2 rows/program
    cfg(256, rows=4, warps=1, stages=3),  # one block, M % 4 != 0
    cfg(64, split=4),                     # split rows: chunks of 32 (N=129: 48), one block
    cfg(64, split=2, warps=2, stages=2),  # split rows: chunks of 64-80 in blocks of 64
]
SHAPES = [{"M": 1, "N": 1}, {"M": 5, "N": 100}, {"M": 3, "N": 129}, {"M": 1, "N": 40}]


def run(config, inputs):
    inputs["out"].fill_(float("nan"))  # every element must be written
    K.launch(config, inputs)
    return inputs["out"].clone()


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s.values())))
@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.key())
def test_softmax_matches_torch(shape, dtype, config):
    inputs = K.make_inputs(shape, dtype, "cpu", seed=1)
    out = run(config, inputs)
    tol = K.tolerance(dtype)
    torch.testing.assert_close(out.float(), K.reference(inputs), atol=tol.atol, rtol=tol.rtol)


@pytest.mark.parametrize("n", [3, 40, 257])
def test_split_rows_equal_whole_rows_and_are_deterministic(n):
    inputs = K.make_inputs({"M": 3, "N": n}, "float32", "cpu", seed=7)
    whole = run(cfg(512), inputs)
    for split in (2, 8):
        first = run(cfg(64, split=split), inputs)
        # the same maths in another order: within a few fp32 roundings of the whole row's
        torch.testing.assert_close(first, whole, atol=0, rtol=4e-7)
        assert torch.equal(run(cfg(64, split=split), inputs), first)  # run to run: bit-equal


def test_the_split_chunks_cover_the_row_in_aligned_pieces():
    assert split_chunk(131072, 64) == 2048 and split_chunk(50257, 4) == 12576
    assert split_chunk(40, 4) == 16  # 3 chunks cover 40 columns: the 4th is empty
    assert split_chunk(1000, 1) == 1000
    for n, split in ((50257, 32), (131072, 3), (7, 2)):
        chunk = split_chunk(n, split)
        assert chunk % 16 == 0 and (split - 1) * chunk < n + chunk and split * chunk >= n


def test_mismatched_tensors_are_refused():
    x = torch.randn(4, 32)
    with pytest.raises(ValueError):
        softmax(x, torch.empty(4, 64)[:, :32], cfg(64))  # another row stride
    with pytest.raises(ValueError):
        softmax(x, torch.empty(32, 4).t(), cfg(64))


class _Broken:
    """softmax whose launch then damages its output as a wrong kernel would."""

    def __init__(self, damage):
        self.damage = damage

    def __getattr__(self, name):
        return getattr(K, name)

    def launch(self, config, inputs):
        K.launch(config, inputs)
        self.damage(inputs["out"])


def _small_zeroed(out):
    out[out < out.median(dim=1, keepdim=True).values] = 0


def _row_biased(out):
    out[1] += 2 * 2.0 ** -10 * out[1].max()  # 2 ulps of fp16 at the row's scale


def _one_chunk_unscaled(out):
    out[:, 256:] *= 1.002  # a split's partial sum off by 0.2%


@pytest.mark.parametrize("damage", [_small_zeroed, _row_biased, _one_chunk_unscaled])
def test_verification_rejects_wrong_outputs(damage):
    shape = {"M": 3, "N": 1000}
    state = ChildState("interpret")
    state.kernel, state.shape, state.dtype = _Broken(damage), shape, "float16"
    config = cfg(256, split=4)
    assert _verify(state, config, K.make_inputs(shape, "float16", "cpu", 4)) is not None
    state.kernel = K
    assert _verify(state, config, K.make_inputs(shape, "float16", "cpu", 4)) is None


def test_softmax_space_rejects_redundant_spilling_and_pointless_split_configs():
    space = K.space()
    ctx = ProblemContext({"M": 4, "N": 100}, "float16")
    assert "wider than N=100" in space.violation(cfg(256), ctx)
    assert "more than M=4" not in (space.violation(cfg(128, rows=4, stages=2), ctx) or "")
    assert "only pipelines a column loop" in space.violation(cfg(128, stages=2), ctx)
    assert "under 1024" in space.violation(cfg(64, split=2), ctx)
    big = ProblemContext({"M": 4096, "N": 16384}, "float16")
    assert "over 64" in space.violation(cfg(16384), big)
    long = ProblemContext({"M": 16, "N": 131072}, "float16")
    assert space.violation(cfg(2048, split=64), long) is None
    assert "wider than a chunk of 2048" in space.violation(cfg(4096, split=64, warps=8), long)
    assert "ROWS=1" in space.violation(cfg(2048, rows=2, split=64), long)
    assert "under 1024" in space.violation(
        cfg(1024, split=64), ProblemContext({"M": 16, "N": 50257}, "float16"))
    for shape in ({"M": 1, "N": 1}, {"M": 4096, "N": 50257}, {"M": 64, "N": 512},
                  {"M": 16, "N": 131072}, {"M": 8192, "N": 50257}):
        ctx = ProblemContext(shape, "float16")
        configs = K.known_good_configs(shape, "float16")
        assert K.default_config(shape, "float16") in configs
        for config in configs:
            assert space.contains(config), config
            assert space.violation(config, ctx) is None, (shape, config)
            if config["SPLIT"] > 1:
                assert math.ceil(shape["N"] / config["SPLIT"]) >= MIN_SPLIT_CHUNK
    splits = {c["SPLIT"] for c in K.known_good_configs({"M": 16, "N": 131072}, "float16")}
    assert {1, 8, 64} <= splits


def test_the_prior_learns_when_to_split():
    few_long = ProblemContext({"M": 16, "N": 131072}, "float16")
    many_long = ProblemContext({"M": 8192, "N": 50257}, "bfloat16")

    def best(ctx):
        return min(K.space().feasible(ctx), key=lambda c: K.prior(c, ctx))

    assert best(few_long)["SPLIT"] >= 8
    assert best(many_long)["SPLIT"] == 1
    one_prog_a_row = cfg(16384, warps=16, stages=2)
    split = cfg(2048, split=64, warps=4)
    assert K.prior(split, few_long) < K.prior(one_prog_a_row, few_long) - math.log(3)
    tiny = ProblemContext({"M": 7, "N": 7}, "float32")
    assert all(math.isfinite(K.prior(c, tiny)) for c in K.space().feasible(tiny))
