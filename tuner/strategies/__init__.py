"""Search strategies, one module each, behind a name registry."""

from __future__ import annotations

from tuner.errors import InvalidRequest
from tuner.space import ProblemContext, SearchSpace
from tuner.strategies.base import Strategy
from tuner.strategies.exhaustive import ExhaustiveStrategy
from tuner.strategies.model_based import ModelStrategy, ModelTPEStrategy
from tuner.strategies.optuna_based import GPStrategy, RandomStrategy, TPEStrategy

STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (TPEStrategy, GPStrategy, RandomStrategy, ExhaustiveStrategy,
                             ModelStrategy, ModelTPEStrategy)
}
#: what ``auto`` means: chosen from bench/results/search_quality.md
DEFAULT_STRATEGY = "model"


def strategy_names() -> list[str]:
    return ["auto", *sorted(STRATEGIES)]


def make_strategy(name: str, space: SearchSpace, ctx: ProblemContext, seed: int,
                  budget: int) -> Strategy:
    cls = STRATEGIES.get(DEFAULT_STRATEGY if name == "auto" else name)
    if cls is None:
        raise InvalidRequest(f"unknown strategy {name!r}; choose one of "
                             f"{', '.join(strategy_names())}", field="strategy")
    return cls(space, ctx, seed, budget)
