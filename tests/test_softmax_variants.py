"""The softmax variants for long rows, under Triton's CPU interpreter: pipelined column loops
(num_stages > 1: whole blocks unmasked, the last partial block masked), the cache hints
(EVICT), a persistent grid (PROGRAMS_PER_SM programs an SM striding over the rows; the
interpreter stands in 4 SMs, so a few rows make it loop), and one block of many warps holding a
whole row; on tiny odd shapes (one row, one element, widths that are not a power of two or
not a whole number of blocks, large magnitudes). Every variant computes the same maths, so
their outputs are bit-equal. Then what the space makes of them: constraints, known-good
configs and the prior's ranking on 8192 x 50257 bf16 (issue 14)."""

import math

import pytest
import torch

from search_spaces import get_kernel
from search_spaces.softmax_prior import L2_BYTES, estimated_seconds
from search_spaces.vector_add import INTERPRETER_SMS
from tuner.config import KernelConfig
from tuner.search import known_good_first
from tuner.space import ProblemContext

K = get_kernel("softmax")


def cfg(block, rows=1, split=1, warps=4, stages=1, evict=0, per_sm=0):
    return KernelConfig(BLOCK_N=block, ROWS=rows, SPLIT=split, PROGRAMS_PER_SM=per_sm,
                        EVICT=evict, num_warps=warps, num_stages=stages)


def run(config, inputs):
    inputs["out"].fill_(float("nan"))  # every element must be written
    K.launch(config, inputs)
    return inputs["out"].clone()


VARIANTS = [
    cfg(64, stages=3, evict=1),                       # pipelined two passes, hints
    cfg(64, stages=4, evict=0),                       # pipelined, no hints
    cfg(64, stages=2, evict=1, per_sm=1),             # persistent: 4 programs stride rows
    cfg(64, rows=2, stages=3, evict=1, per_sm=1),     # persistent, 2 rows a program
    cfg(128, rows=4, warps=2, per_sm=2),              # one block, persistent, 4 rows
    cfg(512, warps=32),                               # one block of 32 warps
    cfg(64, split=4, stages=3, evict=1),              # split rows, pipelined chunks
]
SHAPES = [{"M": 1, "N": 1}, {"M": 1, "N": 129}, {"M": 13, "N": 300}, {"M": 9, "N": 64},
          {"M": 6, "N": 200}]


@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s.values())))
@pytest.mark.parametrize("config", VARIANTS, ids=lambda c: c.key())
def test_variants_match_torch(shape, dtype, config):
    inputs = K.make_inputs(shape, dtype, "cpu", seed=3)
    out = run(config, inputs)
    tol = K.tolerance(dtype)
    torch.testing.assert_close(out.float(), K.reference(inputs), atol=tol.atol, rtol=tol.rtol)


@pytest.mark.parametrize("shape", [{"M": 13, "N": 300}, {"M": 2, "N": 1000}],
                         ids=lambda s: "x".join(map(str, s.values())))
def test_the_variants_of_whole_rows_are_bit_equal(shape):
    """Pipelining, cache hints, a persistent grid and rows per program change where and when
    a row is computed, not what: a persistent program that took another's row, skipped one or
    mixed two would differ."""
    inputs = K.make_inputs(shape, "float32", "cpu", seed=11)
    plain = run(cfg(64), inputs)
    assert torch.isfinite(plain).all()
    for config in (cfg(64, stages=3, evict=1), cfg(64, stages=2, per_sm=1),
                   cfg(64, rows=2, stages=4, evict=1, per_sm=2), cfg(64, rows=4, per_sm=1)):
        assert torch.equal(run(config, inputs), plain), config


def test_a_persistent_grid_takes_more_rows_than_programs():
    # 4 stand-in SMs x 1 program: 4 programs for 11 rows of 2 each (6 row groups)
    assert INTERPRETER_SMS * 1 < 6
    inputs = K.make_inputs({"M": 11, "N": 70}, "float16", "cpu", seed=5)
    out = run(cfg(64, rows=2, stages=2, evict=1, per_sm=1), inputs)
    tol = K.tolerance("float16")
    torch.testing.assert_close(out.float(), K.reference(inputs), atol=tol.atol, rtol=tol.rtol)
    assert torch.allclose(out.float().sum(dim=1), torch.ones(11), atol=2e-3)


@pytest.mark.parametrize("config", [cfg(64, stages=3, evict=1), cfg(64, warps=2, stages=2),
                                    cfg(1024), cfg(1024, warps=32),
                                    cfg(64, stages=2, per_sm=1),
                                    cfg(128, split=4, stages=1, evict=1), cfg(128, split=4)],
                         ids=["pipelined", "two-pass", "one-pass", "one-block-32w", "persistent",
                              "split-evict", "split"])
@pytest.mark.parametrize("dtype,scale", [("float32", 1e4), ("float16", 6e4)])
def test_variants_survive_large_magnitudes(config, dtype, scale):
    # exp of the raw values would overflow; the scaled max's rounding must cancel (it is
    # ~1e-3 of an exponent at these magnitudes, far over the fp32 and fp16 tolerances)
    inputs = K.make_inputs({"M": 3, "N": 700}, dtype, "cpu", seed=2)
    x = inputs["x"].float()
    inputs["x"] = (x / x.abs().amax(dim=1, keepdim=True) * scale).to(inputs["x"].dtype)
    out = run(config, inputs)
    assert torch.isfinite(out).all()
    tol = K.tolerance(dtype)
    torch.testing.assert_close(out.float(), K.reference(inputs), atol=tol.atol, rtol=tol.rtol)


def test_a_row_of_one_distinct_maximum_and_equal_values():
    # a one-hot row (the max far above the rest) and a constant row (all equal: 1/N each)
    x = torch.full((2, 300), -1e4)
    x[0, 217] = 0.0
    x[1] = 3.0
    out = torch.empty_like(x)
    inputs = {"x": x, "out": out}
    for config in (cfg(64, stages=3, evict=1), cfg(512, warps=32), cfg(64, per_sm=1)):
        got = run(config, inputs)
        assert got[0, 217] == 1.0 and got[0].sum() == 1.0
        torch.testing.assert_close(got[1], torch.full((300,), 1 / 300), atol=0, rtol=1e-6)


def test_configs_from_before_the_new_parameters_still_run():
    inputs = K.make_inputs({"M": 3, "N": 200}, "float16", "cpu", seed=8)
    old = KernelConfig(BLOCK_N=64, ROWS=1, num_warps=4, num_stages=2)  # no SPLIT/EVICT/...
    tol = K.tolerance("float16")
    torch.testing.assert_close(run(old, inputs).float(), K.reference(inputs), atol=tol.atol,
                               rtol=tol.rtol)


def test_the_space_keeps_the_new_parameters_where_they_change_something():
    space = K.space()
    short = ProblemContext({"M": 4096, "N": 1000}, "float16")
    assert "EVICT only steers" in space.violation(cfg(1024, evict=1), short)
    assert space.violation(cfg(1024), short) is None
    assert "only pipelines a column loop" in space.violation(cfg(1024, stages=3), short)
    assert space.violation(cfg(256, stages=3, evict=1), short) is None
    few = ProblemContext({"M": 64, "N": 50257}, "bfloat16")
    assert "persistent grid would be the plain one" in space.violation(
        cfg(4096, stages=3, per_sm=1), few)
    vocab = ProblemContext({"M": 8192, "N": 50257}, "bfloat16")
    assert space.violation(cfg(4096, stages=3, per_sm=1), vocab) is None
    assert space.violation(cfg(65536, warps=32), vocab) is None  # one block: 64 a thread
    assert "over 64" in space.violation(cfg(65536, warps=16), vocab)
    assert "PROGRAMS_PER_SM=0" in space.violation(
        cfg(4096, split=4, stages=3, per_sm=1), ProblemContext({"M": 16, "N": 131072},
                                                               "float16"))
    wide = ProblemContext({"M": 64, "N": 262144}, "float32")
    assert "shared memory" in space.violation(cfg(65536, warps=32, stages=4), wide)
    assert space.violation(cfg(16384, warps=16, stages=3), wide) is None  # 128 KB


def test_known_good_configs_give_a_short_search_every_long_row_variant():
    """A 16-trial search of 8192 x 50257 bf16 first tries the known-good configs its prior
    ranks best: among them pipelined two passes, both EVICT values, and one block of 32
    warps holding the row."""
    shape = {"M": 8192, "N": 50257}
    configs = K.known_good_configs(shape, "bfloat16")
    assert any(c["PROGRAMS_PER_SM"] for c in configs)
    first = known_good_first(K, shape, "bfloat16")
    assert len(first) == 5
    assert any(c["num_stages"] > 1 and c["BLOCK_N"] < 50257 for c in first)
    assert {c["EVICT"] for c in first if c["BLOCK_N"] < 50257} == {0, 1}
    assert any(c["BLOCK_N"] >= 50257 and c["num_warps"] == 32 for c in first)


def test_the_prior_prefers_loads_in_flight_and_rows_that_fit_in_l2():
    vocab = ProblemContext({"M": 8192, "N": 50257}, "bfloat16")

    def ms(config):
        return estimated_seconds(config, vocab) * 1e3

    # a pipelined column loop keeps blocks in flight that an unpipelined one waits for
    assert ms(cfg(4096, warps=8, stages=3, evict=1)) < ms(cfg(4096, warps=8, evict=1))
    # 4,096-column blocks on 4 warps, 3 in flight: ~5 programs an SM (registers), 66 MB of
    # rows in flight, more than L2 keeps; two programs an SM (still 48 KB in flight each SM)
    # keep them there for the second read
    assert 5 * 132 * 50257 * 2 > L2_BYTES * 2
    capped = cfg(4096, stages=4, evict=1, per_sm=2)
    assert ms(capped) < ms(cfg(4096, stages=4, evict=1))
    # ... but not when capping leaves too little in flight (2,048 columns, 24 KB an SM)
    assert ms(cfg(2048, stages=4, evict=1, per_sm=2)) > ms(cfg(2048, stages=4, evict=1))
    # the model's every estimate stays above the problem's bandwidth floor (two bytes moved
    # an element of x and out: 1.65 GB at 4.27 TB/s)
    floor = 2 * 8192 * 50257 * 2 / 4.27e12 * 1e3
    assert all(ms(c) > floor for c in known_good_first(K, vocab.shape, "bfloat16"))
    assert math.isfinite(ms(cfg(65536, warps=32)))


def sync_cfg(block, split, warps=8, stages=1, evict=0):
    return KernelConfig({**cfg(block, split=split, warps=warps, stages=stages, evict=evict),
                         "SYNC": 1})


def test_one_launch_split_rows_need_a_split_and_a_grid_resident_at_once():
    """SYNC's programs wait for their row's others: only split rows have others, and every
    program of the grid must be able to run at once (one an SM), or the wait never ends."""
    space = K.space()
    long = ProblemContext({"M": 16, "N": 131072}, "float16")
    assert space.violation(sync_cfg(16384, 8), long) is None  # 128 programs on 132 SMs
    assert "SPLIT > 1" in space.violation(sync_cfg(16384, 1, warps=32), long)
    assert "M * SPLIT = 256 programs resident at once" in space.violation(
        sync_cfg(8192, 16), long)
    small_gpu = ProblemContext({"M": 16, "N": 131072}, "float16", sm_count=108)
    assert "at most one an SM (108)" in space.violation(sync_cfg(16384, 8), small_gpu)
    # a one-block chunk is read once (held in registers across the wait): no cache hints;
    # a chunk of several blocks is read again and may have them
    assert "EVICT only steers" in space.violation(sync_cfg(16384, 8, evict=1), long)
    assert space.violation(sync_cfg(4096, 8, warps=4, stages=3, evict=1), long) is None
    old = cfg(16384, split=8, warps=8, evict=1)  # a stored config from before SYNC
    assert space.violation(old, long) is None


@pytest.mark.parametrize("shape", [{"M": 3, "N": 5000}, {"M": 1, "N": 2049}],
                         ids=lambda s: "x".join(map(str, s.values())))
@pytest.mark.parametrize("config", [sync_cfg(2048, 2, warps=4),
                                    sync_cfg(512, 4, warps=4, stages=3, evict=1)],
                         ids=lambda c: c.key())
def test_one_launch_configs_give_the_two_launch_result_on_the_interpreter(shape, config):
    """The interpreter runs programs one after another, so no program could pass SYNC's
    wait: there a SYNC config runs the same chunks and combine in the two launches, and a
    search on the CPU that picks one still gets the right softmax."""
    inputs = K.make_inputs(shape, "float16", "cpu", seed=5)
    got = run(config, inputs)
    two = run(KernelConfig({**config, "SYNC": 0}), inputs)
    assert torch.equal(got, two)
    tol = K.tolerance("float16")
    torch.testing.assert_close(got.float(), K.reference(inputs), atol=tol.atol, rtol=tol.rtol)


def test_the_prior_ranks_one_launch_above_two_for_few_long_rows():
    """16 x 131072: one launch without the second read of a one-block chunk is priced under
    the same split in two launches; the known-good configs hold both."""
    long = ProblemContext({"M": 16, "N": 131072}, "float16")
    one = sync_cfg(16384, 8, warps=16)
    two = cfg(16384, split=8, warps=16, evict=1)
    assert K.prior(one, long) < K.prior(two, long)
    configs = K.known_good_configs({"M": 16, "N": 131072}, "float16")
    assert {c.get("SYNC", 0) for c in configs if c["SPLIT"] == 8} == {0, 1}
    assert all(c["SPLIT"] * 16 <= 132 for c in configs if c.get("SYNC"))
