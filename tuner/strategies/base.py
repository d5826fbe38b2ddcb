"""The Strategy contract: propose configs, learn from their measurements.

A strategy is driven by the search loop (``tuner.search``), which owns the budget, pruning,
deduplication and warm start. ``ask`` proposes a config of the space (it may be infeasible or
already tried: the loop tells the strategy so without spending budget). ``tell`` is called exactly
once for each asked config and may also be called for configs the strategy never proposed
(warm-start configs, resumed trials): a strategy must learn from those too. Strategies are
reproducible: the same seed and the same tells give the same asks.

A strategy may be given the kernel's ``prior`` (``tuner.kernel.HasPrior``): an estimated log run
time of a config on the problem, used only to rank configs, or None where the kernel has no
model. Strategies know nothing of a kernel's parameters but what the space and the prior say.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar, TypeAlias

from tuner.config import KernelConfig
from tuner.measurement import Measurement
from tuner.space import ProblemContext, SearchSpace

#: a kernel's prior: estimated log run time of a config on a problem (lower ranks first), or None
#: where it has no estimate
Prior: TypeAlias = Callable[[KernelConfig, ProblemContext], "float | None"]


class Strategy(ABC):
    name: ClassVar[str]
    #: whether ``ask`` can return every feasible config in turn (exhaustive): no fallback needed
    systematic: ClassVar[bool] = False

    def __init__(self, space: SearchSpace, ctx: ProblemContext, seed: int, budget: int,
                 prior: Prior | None = None) -> None:
        self.space, self.ctx, self.seed, self.budget = space, ctx, seed, budget
        self.prior = prior
        self._worst_ok = -math.inf

    @abstractmethod
    def ask(self) -> KernelConfig | None:
        """The next config to try, or None when the strategy has nothing left to propose."""

    @abstractmethod
    def tell(self, config: KernelConfig, measurement: Measurement) -> None:
        """Learn the measurement of ``config`` (asked or not)."""

    def upcoming(self, n: int) -> list[KernelConfig]:
        """Up to ``n`` configs the strategy expects to ask next, most likely first, without
        asking them: the search loop has them compiled ahead. [] where it cannot tell."""
        return []

    def improvement_chance(self, best_ms: float, band: float) -> float | None:
        """The strategy's belief that some untried config runs faster than ``best_ms * (1 -
        band)``: the search loop's "no expected gain" stop (``SearchOptions.stop_chance``).
        None: the strategy has no model to say (samplers, exhaustive); the rule never fires."""
        return None

    def objective(self, measurement: Measurement) -> float:
        """log(ms) for a verified run; a failure scores worse than every success seen so far,
        so that samplers steer away from the region it came from."""
        if measurement.ok and measurement.p50_ms:
            value = math.log(measurement.p50_ms)
            self._worst_ok = max(self._worst_ok, value)
            return value
        base = self._worst_ok if self._worst_ok > -math.inf else 0.0
        return base + math.log(2.0)
