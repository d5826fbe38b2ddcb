"""Strategies backed by an Optuna sampler, through the ask/tell interface.

Every parameter is given to Optuna as the *index* of its value: powers of two and other ordered
parameters become integers, so neighbouring values are neighbours to the sampler (a categorical
encoding would throw that order away). Categorical parameters stay categorical.
"""

from __future__ import annotations

import logging
import random
from collections import defaultdict
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

from tuner.config import KernelConfig
from tuner.measurement import Measurement, Outcome
from tuner.space import ProblemContext, SearchSpace
from tuner.strategies.base import Prior, Strategy

optuna.logging.set_verbosity(logging.WARNING)

#: proposals outside a restricted space in a row before a seeded random config of it is returned
MAX_OUTSIDE_PROPOSALS = 25


class OptunaStrategy(Strategy):
    name = "optuna"

    def __init__(self, space: SearchSpace, ctx: ProblemContext, seed: int, budget: int,
                 prior: Prior | None = None) -> None:
        super().__init__(space, ctx, seed, budget, prior)
        self.study = optuna.create_study(direction="minimize", sampler=self.make_sampler())
        self._pending: dict[KernelConfig, list[optuna.trial.Trial]] = defaultdict(list)
        self._distributions = {p.name: self._distribution(p.name) for p in space.params}
        self._rng = random.Random(seed)

    def make_sampler(self) -> optuna.samplers.BaseSampler:
        raise NotImplementedError

    def _distribution(self, name: str) -> BaseDistribution:
        p = self.space.param(name)
        if p.kind == "categorical":
            return CategoricalDistribution(list(p.values))
        return IntDistribution(0, len(p.values) - 1)

    def _encode(self, config: KernelConfig) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for p in self.space.params:
            out[p.name] = config[p.name] if p.kind == "categorical" else p.index(config[p.name])
        return out

    def ask(self) -> KernelConfig | None:
        # A sampler sees the product of the parameters' values; a restricted space (a replay
        # table) holds only some of them. A proposal outside it is told as pruned (the sampler
        # learns to avoid the region) and asked again, so that every config returned is inside.
        for _ in range(MAX_OUTSIDE_PROPOSALS):
            trial = self.study.ask(self._distributions)
            values = {}
            for p in self.space.params:
                raw = trial.params[p.name]
                values[p.name] = int(raw) if p.kind == "categorical" else p.values[int(raw)]
            config = KernelConfig(values)
            if self.space.contains(config):
                self._pending[config].append(trial)
                return config
            self.study.tell(trial, self.objective(
                Measurement.failure(config, Outcome.PRUNED, "outside the space")))
        return self._rng.choice(list(self.space)) if self.space.size() else None

    def tell(self, config: KernelConfig, measurement: Measurement) -> None:
        value = self.objective(measurement)
        pending = self._pending.get(config)
        if pending:
            self.study.tell(pending.pop(0), value)
            return
        self.study.add_trial(optuna.trial.create_trial(
            params=self._encode(config), distributions=self._distributions, value=value))


class TPEStrategy(OptunaStrategy):
    """Multivariate TPE over the ordinal encoding: it models how parameters interact (tile sizes
    with stages and warps), which the default independent TPE cannot."""

    name = "tpe"

    def make_sampler(self) -> optuna.samplers.BaseSampler:
        return optuna.samplers.TPESampler(
            seed=self.seed, multivariate=True, group=False, constant_liar=True,
            n_startup_trials=max(4, min(10, self.budget // 5)), n_ei_candidates=64,
        )


class RandomStrategy(OptunaStrategy):
    name = "random"

    def make_sampler(self) -> optuna.samplers.BaseSampler:
        return optuna.samplers.RandomSampler(seed=self.seed)


class GPStrategy(OptunaStrategy):
    """Gaussian-process Bayesian optimisation (Optuna's GPSampler) over the ordinal encoding."""

    name = "gp"

    def make_sampler(self) -> optuna.samplers.BaseSampler:
        return optuna.samplers.GPSampler(seed=self.seed,
                                         n_startup_trials=max(4, min(10, self.budget // 5)))
