"""Search strategies, one module each, behind a name registry.

``auto`` is chosen per kernel: ``DEFAULT_STRATEGY`` for a kernel with a prior (its own estimate
of a config's run time, the optional hook ``tuner.kernel.HasPrior``),
``DEFAULT_STRATEGY_WITHOUT_PRIOR`` for one without. A kernel has a prior when its ``prior``
gives a value for its default config.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tuner.errors import InvalidRequest
from tuner.kernel import prior_hook
from tuner.space import ProblemContext, SearchSpace
from tuner.strategies.base import Prior, Strategy
from tuner.strategies.exhaustive import ExhaustiveStrategy
from tuner.strategies.model_based import ModelStrategy, ModelTPEStrategy
from tuner.strategies.optuna_based import GPStrategy, RandomStrategy, TPEStrategy

STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (TPEStrategy, GPStrategy, RandomStrategy, ExhaustiveStrategy,
                             ModelStrategy, ModelTPEStrategy)
}
#: what ``auto`` means for a kernel with a prior: chosen from bench/results/search_quality.md
#: (matmul's cost model: median best/optimum 1.000 at 16 and 48 trials on 14 H200 tables)
DEFAULT_STRATEGY = "model"
#: what ``auto`` means for a kernel without one. On 9 exhaustive H200 tables of softmax, rmsnorm
#: and bias_gelu (tests/data/replay/nongemm, bench/results/search_quality_nongemm.md), cold,
#: 5 seeds, median best/optimum at 16 / 48 trials: model with a flat prior 1.004 / 1.000, TPE
#: 1.014 / 1.000, random 1.029 / 1.011; GP on 3 of the tables, 1 seed: 1.019 / 1.000.
DEFAULT_STRATEGY_WITHOUT_PRIOR = "model"

__all__ = ["DEFAULT_STRATEGY", "DEFAULT_STRATEGY_WITHOUT_PRIOR", "STRATEGIES", "Prior",
           "Strategy", "kernel_has_prior", "kernel_prior", "make_strategy", "resolve_strategy",
           "strategy_names"]


def strategy_names() -> list[str]:
    return ["auto", *sorted(STRATEGIES)]


def resolve_strategy(name: str, has_prior: bool) -> str:
    """The strategy ``name`` stands for: ``auto`` by whether the kernel has a prior."""
    if name != "auto":
        return name
    return DEFAULT_STRATEGY if has_prior else DEFAULT_STRATEGY_WITHOUT_PRIOR


def kernel_prior(kernel: Any) -> Prior | None:
    """The kernel's ``prior`` method (the optional hook ``tuner.kernel.HasPrior``), or None for
    kernels written without one."""
    return prior_hook(kernel)


def kernel_has_prior(kernel: Any, shape: Mapping[str, int], dtype: str,
                     ctx: ProblemContext) -> bool:
    """Whether the kernel's prior gives an estimate for its default config on this problem."""
    prior = kernel_prior(kernel)
    if prior is None:
        return False
    return prior(kernel.default_config(shape, dtype), ctx) is not None


def strategy_class(name: str) -> type[Strategy]:
    """The class of a strategy by its name (``auto`` taken as with a prior); an unknown name
    raises InvalidRequest naming the field."""
    cls = STRATEGIES.get(resolve_strategy(name, True))
    if cls is None:
        raise InvalidRequest(f"unknown strategy {name!r}; choose one of "
                             f"{', '.join(strategy_names())}", field="strategy")
    return cls


def make_strategy(name: str, space: SearchSpace, ctx: ProblemContext, seed: int,
                  budget: int, prior: Prior | None = None) -> Strategy:
    """A strategy by name, given the kernel's prior (None: flat). ``auto`` is resolved here by
    whether a prior is given; a caller that holds the kernel resolves it first with
    ``resolve_strategy(name, kernel_has_prior(...))`` (the search loop does)."""
    return strategy_class(resolve_strategy(name, prior is not None))(space, ctx, seed, budget,
                                                                    prior=prior)
