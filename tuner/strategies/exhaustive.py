"""Exhaustive: every feasible config once, in the space's order (the reference for the others)."""

from __future__ import annotations

from collections.abc import Iterator

from tuner.config import KernelConfig
from tuner.measurement import Measurement
from tuner.space import ProblemContext, SearchSpace
from tuner.strategies.base import Prior, Strategy


class ExhaustiveStrategy(Strategy):
    name = "exhaustive"
    systematic = True

    def __init__(self, space: SearchSpace, ctx: ProblemContext, seed: int, budget: int,
                 prior: Prior | None = None) -> None:
        super().__init__(space, ctx, seed, budget, prior)
        self._iter: Iterator[KernelConfig] = iter(space.feasible(ctx))

    def ask(self) -> KernelConfig | None:
        return next(self._iter, None)

    def tell(self, config: KernelConfig, measurement: Measurement) -> None:
        pass
