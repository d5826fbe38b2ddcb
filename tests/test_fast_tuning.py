"""Tuning in few trials (issue 13): the "no expected gain" stop on the recorded H200 tables, the
known-good configs the prior ranks best, and seeding a shape from the nearest stored shapes."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import pytest

from db import repo
from db.engine import init_db
from search_spaces import get_kernel
from tuner.backends.replay import ReplayBackend, load_table
from tuner.config import KernelConfig
from tuner.measurement import Measurement, Outcome
from tuner.search import (
    DEFAULT_STOP_BAND,
    DEFAULT_STOP_CHANCE,
    KNOWN_GOOD_FIRST,
    SearchOptions,
    known_good_first,
    run_search,
)
from tuner.space import Param, ProblemContext, SearchSpace
from tuner.strategies.model_based import ModelStrategy
from tuner.worker import warm_start_configs

REPLAY = Path(__file__).resolve().parent / "data" / "replay"
#: the matmul tables: the 8 the cost model was checked on and the 6 held out
TABLES = sorted([*REPLAY.glob("matmul_*.json"), *(REPLAY / "holdout").glob("matmul_*.json")])
#: 777x1234x4321: even the full 48 trials end 7% off its optimum (the optimum's tile shape is
#: ranked ~110th by the prior and nothing measured points there), so "stopped before reaching the
#: band" cannot be told from "never reaches it"; the rule may cost it only a little
UNREACHED = "matmul_777x1234x4321_float16_h200"


def _search(path: Path, **options: Any) -> tuple[Any, Any]:
    table = load_table(path)
    kernel = get_kernel(table.kernel)
    backend = ReplayBackend(table)
    start = known_good_first(kernel, table.shape, table.dtype, backend.restrict(kernel.space()))
    result = run_search(kernel, table.shape, table.dtype, backend,
                        SearchOptions(**{"trials": 48, "seed": 0, "warm_start": start,
                                         "retime_rounds": 0, **options}))
    return table, result


@pytest.fixture(scope="module")
def stopped() -> dict[str, tuple[Any, Any]]:
    """Every matmul table searched as a worker searches it: the known-good configs the prior
    ranks best first, the default stop rule, 48 trials as the cap, seed 0."""
    return {p.stem: _search(p, stop_chance=DEFAULT_STOP_CHANCE) for p in TABLES}


def test_the_stop_rule_never_ends_a_search_outside_the_band(stopped):
    assert len(stopped) == 14
    for name, (table, result) in stopped.items():
        ratio = result.best.p50_ms / table.best_ms
        if name == UNREACHED:
            continue
        if result.stop_reason == "no expected gain":
            assert ratio <= 1 + DEFAULT_STOP_BAND, (name, len(result.trials), ratio)
        else:
            assert result.stop_reason == "budget" and len(result.trials) == 48, name
    table, result = stopped[UNREACHED]
    _table, full = _search(REPLAY / f"{UNREACHED}.json")
    assert full.best.p50_ms > table.best_ms * (1 + DEFAULT_STOP_BAND)
    assert result.best.p50_ms <= full.best.p50_ms * 1.05


def test_the_stop_rule_ends_most_searches_early(stopped):
    used = {name: len(result.trials) for name, (_t, result) in stopped.items()}
    ruled = [n for n, (_t, r) in stopped.items() if r.stop_reason == "no expected gain"]
    assert len(ruled) >= 12, used
    assert statistics.median(used.values()) <= 24, used
    # a replayed table: the full-budget search measures every one of its 48 trials
    table, full = _search(TABLES[0])
    assert full.stop_reason == "budget" and len(full.trials) == 48
    assert used[TABLES[0].stem] < 48


def test_no_stop_before_the_minimum_or_while_the_best_still_improves():
    path = REPLAY / "matmul_4096x4096x4096_bfloat16_h200.json"
    _table, result = _search(path, stop_chance=0.999, stop_min_trials=10, stop_quiet=4)
    assert result.stop_reason == "no expected gain" and len(result.trials) >= 10
    best, best_at = float("inf"), 0
    for number, m in enumerate(result.trials, 1):  # improvements beyond the 1% noise margin
        if m.ok and m.p50_ms is not None and m.p50_ms < best * (1 - 0.01):
            best, best_at = m.p50_ms, number
    assert len(result.trials) - best_at >= 4


def test_samplers_without_a_model_never_stop_by_the_rule():
    path = REPLAY / "matmul_2048x2048x2048_bfloat16_h200.json"
    _table, result = _search(path, strategy="tpe", trials=20, stop_chance=0.999)
    assert result.stop_reason == "budget" and len(result.trials) == 20


def _tiny_space() -> SearchSpace:
    return SearchSpace((Param("BLOCK_X", (16, 32, 64, 128)), Param("num_warps", (2, 4, 8))))


def _ok(config: KernelConfig, ms: float) -> Measurement:
    return Measurement(config, Outcome.OK, p20_ms=ms, p50_ms=ms, p80_ms=ms)


def test_improvement_chance_falls_as_the_model_learns_and_is_zero_when_nothing_is_left():
    space = _tiny_space()
    ctx = ProblemContext({"N": 1024}, "float16")
    strategy = ModelStrategy(space, ctx, seed=0, budget=12)
    configs = space.feasible(ctx)
    # a smooth landscape: time grows with the distance from BLOCK_X=64, 4 warps
    times = {c: 1.0 + 0.3 * abs(space.encode(c)[0] - 2) + 0.2 * abs(space.encode(c)[1] - 1)
             for c in configs}
    best = min(times.values())
    chances = []
    for config in sorted(configs, key=lambda c: -times[c])[:-1]:  # all but the best, worst first
        strategy.tell(config, _ok(config, times[config]))
        seen = min(times[c] for c in configs if strategy.tried[strategy.index[c]])
        chances.append(strategy.improvement_chance(seen, 0.02))
    assert all(c is not None and 0.0 <= c <= 1.0 for c in chances)
    last = configs[min(range(len(configs)), key=lambda i: times[configs[i]])]
    strategy.tell(last, _ok(last, best))
    assert strategy.improvement_chance(best, 0.02) == 0.0


def test_known_good_first_takes_the_priors_best_ranked_known_good_configs():
    kernel = get_kernel("matmul")
    table = load_table(REPLAY / "matmul_1000x3000x500_float16_h200.json")
    space = ReplayBackend(table).restrict(kernel.space())
    ctx = ProblemContext(table.shape, table.dtype)
    picks = known_good_first(kernel, table.shape, table.dtype, space)
    candidates = [c for c in dict.fromkeys([*kernel.known_good_configs(table.shape, table.dtype),
                                            kernel.default_config(table.shape, table.dtype)])
                  if space.contains(c) and space.violation(c, ctx) is None]
    assert len(candidates) > KNOWN_GOOD_FIRST == len(picks)
    score = {c: kernel.prior(c, ctx) for c in candidates}
    assert [score[c] for c in picks] == sorted(score.values())[:KNOWN_GOOD_FIRST]


def test_a_new_shape_is_seeded_with_the_nearest_stored_shapes_bests(tmp_path):
    """A sweep over M: the stored bests of the three nearest M (log2 distance) come first,
    nearest first, then the known-good configs the prior ranks best."""
    factory = init_db(f"sqlite:///{tmp_path / 'seed.db'}")
    kernel = get_kernel("matmul")
    table = load_table(REPLAY / "matmul_4096x4096x4096_float16_h200.json")
    backend = ReplayBackend(table)
    space = backend.restrict(kernel.space())
    shape = {"M": 512, "N": 4096, "K": 4096}
    ok = space.feasible(ProblemContext(shape, "float16"))[::50]  # five distinct configs
    stored = {m: ok[i] for i, m in enumerate((16, 64, 256, 1024, 4096))}
    with factory() as s:
        repo.upsert_device(s, backend.fingerprint.to_dict())
        for m, config in stored.items():
            repo.store_best(s, device_key=backend.fingerprint.key, kernel="matmul",
                            kernel_version=kernel.version, dtype="float16",
                            shape={"M": m, "N": 4096, "K": 4096},
                            triton_version=backend.fingerprint.triton_version or "",
                            config=config.to_dict(), p20_ms=1.0, p50_ms=1.0, p80_ms=1.0,
                            tflops=None, gbps=None, torch_version=None, cuda_version=None,
                            task_id=None)
        s.commit()
        warm = warm_start_configs(s, kernel, backend.fingerprint.key, "float16", shape, space)
    # 512 is 1 octave from 256 and 1024, 3 from 64 (and 4096), 5 from 16
    assert warm[:2] in ([stored[256], stored[1024]], [stored[1024], stored[256]])
    assert warm[2] in (stored[64], stored[4096]) and stored[16] not in warm[:3]
    assert warm[3:] == [c for c in known_good_first(kernel, shape, "float16", space)
                        if c not in warm[:3]]
