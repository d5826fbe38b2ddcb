"""The strategy contract, for every registered strategy, on recorded H200 tables; the kernel's
prior (matmul's cost model) reaching the strategies; "auto" per kernel; and the replay-table
writer of bench/record_tables.py."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest

from search_spaces import get_kernel
from search_spaces.gemm import prior as cost_model
from tuner.backends.replay import ReplayBackend, load_table, parse_table
from tuner.config import KernelConfig
from tuner.measurement import Measurement, Outcome
from tuner.search import SearchLoop, SearchOptions, run_search
from tuner.space import Param, ProblemContext, SearchSpace
from tuner.strategies import (
    DEFAULT_STRATEGY,
    DEFAULT_STRATEGY_WITHOUT_PRIOR,
    STRATEGIES,
    kernel_has_prior,
    make_strategy,
    resolve_strategy,
    strategy_names,
)
from tuner.strategies.model_based import ModelStrategy, estimates, ranked_feasible

DATA = Path(__file__).resolve().parent / "data/replay"
TABLE = DATA / "matmul_1000x3000x500_float16_h200.json"


@pytest.fixture(scope="module")
def table():
    return load_table(TABLE)


def search(table, strategy: str, seed: int, trials: int = 12, warm: bool = False):
    kernel = get_kernel("matmul")
    start = kernel.known_good_configs(table.shape, table.dtype) if warm else []
    return run_search(kernel, table.shape, table.dtype, ReplayBackend(table),
                      SearchOptions(trials=trials, seed=seed, strategy=strategy,
                                    warm_start=start, retime_rounds=0))


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_strategy_respects_the_budget(table, name):
    assert len(search(table, name, seed=0).trials) == 12
    assert len(search(table, name, seed=0, trials=5, warm=True).trials) == 5


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_strategy_is_reproducible_under_a_seed(table, name):
    first = [m.config for m in search(table, name, seed=7).trials]
    again = [m.config for m in search(table, name, seed=7).trials]
    assert first == again
    warm = [m.config for m in search(table, name, seed=7, warm=True, trials=14).trials]
    assert warm == [m.config for m in search(table, name, seed=7, warm=True, trials=14).trials]


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_strategy_proposes_only_configs_inside_the_space(table, name):
    kernel = get_kernel("matmul")
    backend = ReplayBackend(table)
    space = backend.restrict(kernel.space())
    strategy = make_strategy(name, space, ProblemContext(table.shape, table.dtype), 0, 20)
    for _ in range(20):
        config = strategy.ask()
        if config is None:
            break
        assert space.contains(config)
        strategy.tell(config, backend.measure([config])[0])


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_strategy_learns_from_failures_and_foreign_tells(table, name):
    """tell() of configs it never asked (warm start, resume) and of failures must not break it."""
    kernel = get_kernel("matmul")
    space = ReplayBackend(table).restrict(kernel.space())
    strategy = make_strategy(name, space, ProblemContext(table.shape, table.dtype), 0, 10)
    foreign = next(iter(space))
    strategy.tell(foreign, Measurement.failure(foreign, Outcome.COMPILE_ERROR, "boom"))
    for _ in range(5):
        config = strategy.ask()
        assert config is not None and space.contains(config)
        strategy.tell(config, Measurement.failure(config, Outcome.WRONG_RESULT, "bad"))


def test_auto_is_registered():
    assert DEFAULT_STRATEGY in STRATEGIES and "auto" in strategy_names()


def test_different_seeds_explore_differently(table):
    a = [m.config for m in search(table, "random", seed=1).trials]
    b = [m.config for m in search(table, "random", seed=2).trials]
    assert a != b


def test_default_strategy_gets_close_cold_on_every_table():
    """Issue 5's targets on the recorded H200 tables, cold (no warm start): median ratio
    best-found / optimum <= 1.05 at 16 trials and <= 1.02 at 48. Measured with `model` over 5
    seeds (bench/results/search_quality_program_spread.md): median 1.009 at 16 and 1.000 at 48,
    worst 1.265 at 16 (1000x3000x500: the program spread tries more tiles early) and 1.002 at
    48; before the spread (search_quality.md) 1.121 and 1.106 (777x1234x4321)."""
    at16, at48 = [], []
    for path in sorted(DATA.glob("*.json")):
        t = load_table(path)
        for seed in range(2):
            trials = search(t, "auto", seed=seed, trials=48).trials
            best = [min(m.p50_ms for m in trials[:n] if m.ok) / t.best_ms for n in (16, 48)]
            at16.append(best[0])
            at48.append(best[1])
    assert statistics.median(at16) <= 1.05 and statistics.median(at48) <= 1.02
    assert max(at16) <= 1.30 and max(at48) <= 1.02


def test_program_spread_tries_other_programs_before_more_launch_variants():
    """Four launch variants of one tile measured at 1.0 ms and one of every other tile at
    1.05 ms: without the spread the model's next picks stay within the fast tile; with it
    (``ModelStrategy.program_spread``) the other tiles get a second look first."""
    space = SearchSpace((Param("BLOCK_M", (32, 64, 128, 256)),
                         Param("num_warps", (1, 2, 4, 8, 16, 32)),
                         Param("num_stages", (1, 2, 3, 4, 5, 6))))
    ctx = ProblemContext({"M": 1024}, "float16")

    def picks(spread: float) -> list[int]:
        strategy = ModelStrategy(space, ctx, seed=0, budget=64)
        strategy.program_spread = spread
        strategy._queue = []
        for warps in (4, 8):
            for stages in (3, 4):
                config = KernelConfig({"BLOCK_M": 128, "num_warps": warps, "num_stages": stages})
                strategy.tell(config, Measurement(config, Outcome.OK, p50_ms=1.0))
        for block in (32, 64, 256):
            config = KernelConfig({"BLOCK_M": block, "num_warps": 4, "num_stages": 3})
            strategy.tell(config, Measurement(config, Outcome.OK, p50_ms=1.05))
        return [strategy.ask()["BLOCK_M"] for _ in range(3)]

    assert picks(0.0) == [128, 128, 128]
    assert 128 not in picks(ModelStrategy.program_spread)


def test_default_strategy_with_warm_start_gets_close_on_an_odd_shape(table):
    result = search(table, "auto", seed=0, trials=48, warm=True)
    assert result.best is not None and result.best.p50_ms <= table.best_ms * 1.10


def test_cost_model_prefers_big_tiles_on_a_big_square_and_small_ones_on_a_skinny_problem():
    kernel = get_kernel("matmul")
    space = kernel.space()
    big = ProblemContext({"M": 4096, "N": 4096, "K": 4096}, "bfloat16")
    ranked, est = ranked_feasible(space, big, seed=0, prior=kernel.prior)
    assert ranked[0]["BLOCK_M"] * ranked[0]["BLOCK_N"] >= 128 * 128
    assert list(est) == sorted(est) and len(set(est)) > 100
    skinny = ProblemContext({"M": 16, "N": 4096, "K": 4096}, "float16")
    assert ranked_feasible(space, skinny, seed=0, prior=kernel.prior)[0][0]["BLOCK_M"] == 16
    # more SMs: fewer waves, never slower
    config = ranked[0]
    wide = ProblemContext(big.shape, big.dtype, big.smem_limit, sm_count=264)
    assert cost_model.estimate_s(config, wide) <= cost_model.estimate_s(config, big)


def best_estimate_by_variant(shape: dict[str, int], dtype: str) -> dict[str, float]:
    from search_spaces.matmul import VARIANTS

    ctx = ProblemContext(shape, dtype)
    best: dict[str, float] = {}
    for c in get_kernel("matmul").space().feasible(ctx):
        name = VARIANTS[c["VARIANT"]]
        best[name] = min(best.get(name, math.inf), cost_model.estimate(c, ctx))
    return best


def test_cost_model_ranks_the_matmul_variants():
    """Persistent grids beat the tiled one on a many-wave problem (no tail wave, no per-tile
    prologue), split-K wins where few output tiles meet a deep K, and loses (its workspace
    round trip and second launch) where K is short."""
    big = best_estimate_by_variant({"M": 8192, "N": 8192, "K": 8192}, "bfloat16")
    assert min(big["persistent"], big["tma_persistent"]) < big["tiled"] < big["split_k"]
    deep = best_estimate_by_variant({"M": 64, "N": 512, "K": 16384}, "float16")
    assert deep["split_k"] < min(deep["tiled"], deep["tma_persistent"])
    short = best_estimate_by_variant({"M": 256, "N": 256, "K": 64}, "float16")
    assert short["tiled"] < short["split_k"]
    # where rows are not 16-byte aligned TMA runs only on staged operands (ALIGN=1), and
    # staging ranks ahead of loading the unaligned rows as they are
    odd_ctx = ProblemContext({"M": 777, "N": 1234, "K": 4321}, "float16")
    feasible = get_kernel("matmul").space().feasible(odd_ctx)
    tma = [c for c in feasible if c["VARIANT"] == 2]
    assert tma and all(c["ALIGN"] == 1 for c in tma)
    by_align = {a: min(cost_model.estimate(c, odd_ctx) for c in feasible if c["ALIGN"] == a)
                for a in (0, 1)}
    assert by_align[1] < by_align[0]


def test_cost_model_tiled_estimates_are_those_of_configs_without_a_variant():
    """Configs recorded before variants (no VARIANT, no SPLIT_K) are the tiled kernel: the
    same estimate, and the recorded tables' model searches stay as they were."""
    ctx = ProblemContext({"M": 1000, "N": 3000, "K": 500}, "float16")
    for c in list(get_kernel("matmul").space().feasible(ctx))[::97]:
        if c["VARIANT"] == 0:
            old = KernelConfig({k: v for k, v in c.items() if k not in ("VARIANT", "SPLIT_K")})
            assert cost_model.estimate(old, ctx) == cost_model.estimate(c, ctx)
    one = KernelConfig(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, GROUP_M=8, num_warps=4,
                       num_stages=3)
    split = KernelConfig({**one, "VARIANT": 3, "SPLIT_K": 4})
    assert cost_model.estimate(split, ctx) != cost_model.estimate(one, ctx)


def test_cost_model_is_flat_where_it_does_not_apply():
    space = SearchSpace((Param.pow2("BLOCK_N", 32, 256), Param.ints("num_warps", (4, 8))))
    ctx = ProblemContext({"N": 1000}, "float16")
    assert not cost_model.applies(space.names, ctx)
    assert {cost_model.estimate(c, ctx) for c in space} == {0.0}
    strategy = make_strategy("model", space, ctx, 0, 8)
    seen = set()
    for _ in range(8):
        config = strategy.ask()
        assert config is not None and config not in seen and space.contains(config)
        seen.add(config)
        strategy.tell(config, Measurement(config, Outcome.OK, p20_ms=1.0, p50_ms=1.0,
                                          p80_ms=1.0))
    assert strategy.ask() is None


def test_record_tables_writes_a_replay_v1_table_the_backend_reads():
    from bench.record_tables import select_shapes, table_name, table_of

    ok = KernelConfig(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, GROUP_M=8, num_warps=4, num_stages=3)
    oor = KernelConfig(BLOCK_M=256, BLOCK_N=256, BLOCK_K=128, GROUP_M=8, num_warps=8,
                       num_stages=5)
    bad = KernelConfig(BLOCK_M=32, BLOCK_N=64, BLOCK_K=32, GROUP_M=1, num_warps=4, num_stages=2)
    ms = [Measurement(ok, Outcome.OK, p20_ms=0.1, p50_ms=0.11, p80_ms=0.12),
          Measurement.failure(oor, Outcome.OUT_OF_RESOURCES, "shared memory 327680 > 232448"),
          Measurement.failure(bad, Outcome.WRONG_RESULT, "max error 3.2")]

    class Fp:
        name, triton_version, torch_version = "NVIDIA H200", "3.6.0", "2.11.0"

    shape = {"M": 16, "N": 4096, "K": 4096}
    data = table_of(shape, "float16", ms, Fp(), "do_bench")
    assert data["format"] == "replay-v1" and data["device"] == "NVIDIA H200"
    assert set(data) >= {"kernel", "kernel_note", "triton_version", "torch_version", "shape",
                         "dtype", "timing", "reference_ms", "params", "results"}
    parsed = parse_table(data)
    backend = ReplayBackend(parsed)
    got = {m.config: m for m in backend.measure([ok, oor, bad])}
    assert got[ok].p50_ms == 0.11
    assert got[oor].outcome is Outcome.OUT_OF_RESOURCES
    assert got[bad].outcome.is_failure and "wrong_result" in (got[bad].error or "")
    assert table_name(shape, "float16") == "matmul_16x4096x4096_float16_h200.json"
    assert select_shapes("0,16x8x4:bfloat16")[1] == ({"M": 16, "N": 8, "K": 4}, "bfloat16")


# -- the kernel's prior and "auto" ------------------------------------------------------------

SMALL = SearchSpace((Param.pow2("BLOCK_N", 32, 256), Param.ints("ROWS", (1, 2)),
                     Param.pow2("num_warps", 4, 8)))
SMALL_CTX = ProblemContext({"M": 64, "N": 1000}, "float16")


def big_blocks_first(config: KernelConfig, ctx: ProblemContext) -> float | None:
    """A made-up prior: bigger blocks and more rows per program are faster."""
    return -math.log(config["BLOCK_N"] * config["ROWS"]) + 0.01 * config["num_warps"]


def first_asks(prior, seed: int, n: int = 3) -> list[KernelConfig]:
    strategy = make_strategy("model", SMALL, SMALL_CTX, seed, 8, prior=prior)
    asks = []
    for _ in range(n):
        config = strategy.ask()
        assert config is not None
        strategy.tell(config, Measurement(config, Outcome.OK, p20_ms=1.0, p50_ms=1.0,
                                          p80_ms=1.0))
        asks.append(config)
    return asks


def test_the_prior_given_to_make_strategy_ranks_the_model_strategys_asks():
    best = KernelConfig(BLOCK_N=256, ROWS=2, num_warps=4)
    with_prior = [first_asks(big_blocks_first, seed) for seed in range(5)]
    flat = [first_asks(None, seed) for seed in range(5)]
    # with the prior: its best first, whatever the seed, then the next-best tile (BLOCK_N=128)
    assert all(a[0] == best and a[1]["BLOCK_N"] == 128 for a in with_prior)
    # flat: a seeded shuffle, so the seeds start in different places
    assert len({a[0] for a in flat}) > 1
    # a prior with no estimate is flat: the same asks as no prior
    assert [first_asks(lambda c, ctx: None, seed) for seed in range(5)] == flat


def test_configs_without_an_estimate_rank_at_the_median_of_the_others():
    configs = list(SMALL)[:3]
    values = iter([1.0, None, 3.0])
    assert list(estimates(configs, SMALL_CTX, lambda c, ctx: next(values))) == [1.0, 2.0, 3.0]
    assert list(estimates(configs, SMALL_CTX, None)) == [0.0, 0.0, 0.0]


class SmallKernel:
    """A kernel of the SMALL space; ``with_prior`` adds ``big_blocks_first`` as its prior."""

    name = "small"

    def space(self) -> SearchSpace:
        return SMALL

    def default_config(self, shape, dtype) -> KernelConfig:
        return KernelConfig(BLOCK_N=64, ROWS=1, num_warps=4)


class SmallKernelWithPrior(SmallKernel):
    def prior(self, config: KernelConfig, ctx: ProblemContext) -> float | None:
        return big_blocks_first(config, ctx)


def small_table():
    results = [{"config": dict(c), "ms": 1.0 + 0.01 * i} for i, c in enumerate(SMALL)]
    return parse_table({"format": "replay-v1", "kernel": "small", "device": "synthetic",
                        "shape": dict(SMALL_CTX.shape), "dtype": "float16",
                        "params": list(SMALL.names), "results": results})


@pytest.mark.parametrize("seed", range(3))
def test_the_search_loop_hands_the_kernels_prior_to_the_strategy(seed):
    table = small_table()
    options = SearchOptions(trials=2, seed=seed, strategy="model", retime_rounds=0)
    led = run_search(SmallKernelWithPrior(), table.shape, table.dtype, ReplayBackend(table),
                     options)
    assert led.trials[0].config == KernelConfig(BLOCK_N=256, ROWS=2, num_warps=4)
    # a kernel written before TunableKernel.prior (no such method) still searches, flat
    old = run_search(SmallKernel(), table.shape, table.dtype, ReplayBackend(table), options)
    assert len(old.trials) == 2


def test_auto_is_the_model_for_a_kernel_with_a_prior_and_the_default_without(monkeypatch):
    assert resolve_strategy("auto", True) == DEFAULT_STRATEGY
    assert resolve_strategy("auto", False) == DEFAULT_STRATEGY_WITHOUT_PRIOR
    assert resolve_strategy("tpe", False) == "tpe"
    matmul, softmax = get_kernel("matmul"), get_kernel("softmax")
    mm_ctx = ProblemContext({"M": 64, "N": 64, "K": 64}, "float16")
    assert kernel_has_prior(matmul, mm_ctx.shape, "float16", mm_ctx)
    sm_ctx = ProblemContext({"M": 4, "N": 33}, "float32")
    assert kernel_has_prior(softmax, sm_ctx.shape, "float32", sm_ctx)  # its streaming model
    assert not kernel_has_prior(SmallKernel(), SMALL_CTX.shape, "float16", SMALL_CTX)
    # the loop resolves it per kernel: a different default without a prior reaches the
    # kernel without one only
    monkeypatch.setattr("tuner.strategies.DEFAULT_STRATEGY_WITHOUT_PRIOR", "random")
    table = small_table()
    auto = SearchOptions(trials=2, strategy="auto")
    assert SearchLoop(SmallKernel(), table.shape, table.dtype, ReplayBackend(table),
                      auto).strategy.name == "random"
    assert SearchLoop(SmallKernelWithPrior(), table.shape, table.dtype, ReplayBackend(table),
                      auto).strategy.name == DEFAULT_STRATEGY
    mm = load_table(TABLE)
    assert SearchLoop(matmul, mm.shape, mm.dtype, ReplayBackend(mm),
                      auto).strategy.name == DEFAULT_STRATEGY
    sm = parse_table({"format": "replay-v1", "kernel": "softmax", "device": "synthetic",
                      "shape": {"M": 4, "N": 33}, "dtype": "float32",
                      "params": ["BLOCK_N", "ROWS", "num_stages", "num_warps"],
                      "results": [{"config": {"BLOCK_N": 64, "ROWS": 1, "num_stages": 2,
                                              "num_warps": 4}, "ms": 0.01}]})
    assert SearchLoop(softmax, sm.shape, sm.dtype, ReplayBackend(sm),
                      auto).strategy.name == DEFAULT_STRATEGY
