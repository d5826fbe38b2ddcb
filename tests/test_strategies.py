"""The strategy contract, for every registered strategy, on a recorded H200 table."""

from __future__ import annotations

from pathlib import Path

import pytest

from search_spaces import get_kernel
from tuner.backends.replay import ReplayBackend, load_table
from tuner.search import SearchOptions, run_search
from tuner.space import ProblemContext
from tuner.strategies import STRATEGIES, make_strategy

TABLE = Path(__file__).resolve().parent / "data/replay/matmul_1000x3000x500_float16_h200.json"


@pytest.fixture(scope="module")
def table():
    return load_table(TABLE)


def search(table, strategy: str, seed: int, trials: int = 12):
    return run_search(get_kernel("matmul"), table.shape, table.dtype, ReplayBackend(table),
                      SearchOptions(trials=trials, seed=seed, strategy=strategy,
                                    retime_rounds=0))


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_strategy_respects_the_budget(table, name):
    assert len(search(table, name, seed=0).trials) == 12


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_strategy_is_reproducible_under_a_seed(table, name):
    first = [m.config for m in search(table, name, seed=7).trials]
    again = [m.config for m in search(table, name, seed=7).trials]
    assert first == again


@pytest.mark.parametrize("name", sorted(STRATEGIES))
def test_strategy_proposes_only_configs_inside_the_space(table, name):
    kernel = get_kernel("matmul")
    space = ReplayBackend(table).restrict(kernel.space())
    strategy = make_strategy(name, space, ProblemContext(table.shape, table.dtype), 0, 20)
    for _ in range(20):
        config = strategy.ask()
        if config is None:
            break
        assert space.param("BLOCK_M").values and all(
            config[p.name] in p.values for p in space.params)
        strategy.tell(config, ReplayBackend(table).measure([config])[0])


def test_different_seeds_explore_differently(table):
    a = [m.config for m in search(table, "random", seed=1).trials]
    b = [m.config for m in search(table, "random", seed=2).trials]
    assert a != b


def test_default_strategy_with_warm_start_gets_close_on_an_odd_shape(table):
    kernel = get_kernel("matmul")
    result = run_search(kernel, table.shape, table.dtype, ReplayBackend(table),
                        SearchOptions(trials=48, seed=0, warm_start=kernel.known_good_configs(
                            table.shape, table.dtype)))
    assert result.best is not None and result.best.p50_ms <= table.best_ms * 1.10
