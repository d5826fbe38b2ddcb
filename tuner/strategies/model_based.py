"""Strategies led by the kernel's prior (the optional hook ``tuner.kernel.HasPrior``, e.g.
matmul's analytic cost model): measure what it ranks first, then learn where it is wrong.

``model``: every feasible config gets a predicted log-time = the prior's estimate plus a
correction learned from the measurements so far: a kernel-weighted average of the residuals
(measured - estimated) of the measured configs, by distance in the ordinal encoding (so a
measurement corrects the prior around it, like a Gaussian process whose prior mean is the
prior). Each ask takes the untried config with the lowest predicted time minus a small bonus for
configs far from anything measured, plus a small charge for each config already measured of its
program (the same parameters but the launch options: ``program_spread``). The first asks are
the prior's best configs of distinct tile shapes (the ``BLOCK_*`` parameters, Triton's naming
of block sizes), so that one wrong guess of the prior costs one trial, not a run of
near-duplicates. Failures are residuals too
(Strategy.objective penalises them), so the neighbourhood of a failure is avoided. Without a
prior (None, or None for every config) every estimate is 0: the order is a seeded shuffle and
the strategy is the learned correction alone.

``model-tpe``: multivariate TPE whose startup trials are the prior's top picks (distinct tile
shapes) instead of random ones.

Neither reads anything but the space, its constraints, the ProblemContext and the prior before
measuring.
"""

from __future__ import annotations

import math
import random

import numpy as np
import optuna

from tuner.config import LAUNCH_OPTIONS, KernelConfig
from tuner.measurement import Measurement
from tuner.space import ProblemContext, SearchSpace
from tuner.strategies.base import Prior, Strategy
from tuner.strategies.optuna_based import TPEStrategy

#: parameters whose names start with this are tile (block) sizes: Triton's convention
TILE_PREFIX = "BLOCK_"


def estimates(configs: list[KernelConfig], ctx: ProblemContext,
              prior: Prior | None) -> np.ndarray:
    """The prior's log-time of each config. A config it has no estimate for (None) gets the
    median of the others', so that it is neither favoured nor shunned; no prior, or no
    estimate at all: 0.0 everywhere (flat)."""
    if prior is None:
        return np.zeros(len(configs))
    raw = [prior(c, ctx) for c in configs]
    known = [float(v) for v in raw if v is not None]
    fill = float(np.median(known)) if known else 0.0
    return np.array([fill if v is None else float(v) for v in raw], dtype=float)


def ranked_feasible(space: SearchSpace, ctx: ProblemContext, seed: int,
                    prior: Prior | None = None) -> tuple[list[KernelConfig], np.ndarray]:
    """Feasible configs, best estimate first, and their estimated log-times. Ties (and a flat
    prior) are broken by a seeded shuffle."""
    configs = space.feasible(ctx)
    random.Random(seed).shuffle(configs)
    est = estimates(configs, ctx, prior)
    order = np.argsort(est, kind="stable")
    return [configs[i] for i in order], est[order]


def diverse_top(configs: list[KernelConfig], n: int) -> list[KernelConfig]:
    """The first ``n`` configs of distinct tile shapes (their ``BLOCK_*`` values; all values
    where a config has no such parameter)."""
    picks: list[KernelConfig] = []
    seen: set[tuple[int, ...]] = set()
    for c in configs:
        key = tuple(v for k, v in c.items() if k.startswith(TILE_PREFIX)) or tuple(c.values())
        if key in seen:
            continue
        seen.add(key)
        picks.append(c)
        if len(picks) >= n:
            break
    return picks


class ModelStrategy(Strategy):
    name = "model"
    #: configs of distinct tile shapes measured first, straight from the prior
    startup = 4
    #: kernel width, in ordinal steps (a neighbour one power of two away weighs exp(-1/(2*1.0)))
    length_scale = 1.0
    #: weight of the prior belief (residual 0 before anything is measured; then their median)
    prior_weight = 0.3
    #: exploration bonus per unit of "nothing measured nearby", in log-time
    kappa = 0.05
    #: ridge penalty of the per-value correction (larger: trust the prior longer)
    ridge = 10.0
    #: residuals are clipped to +-this (log-time) for the per-value correction, so that one
    #: pathological config does not condemn every config sharing a value with it
    clip = 0.3
    #: the prediction error (log-time) believed before any is measured, and how many
    #: measured errors that belief weighs (``prediction_sigma``)
    sigma_prior = 0.25
    sigma_prior_weight = 3.0
    #: log-time added to an untried config's score per ``log(1 + n)``, n the configs measured
    #: beyond ``program_free`` that run its program (every parameter but the launch options
    #: ``num_warps``, ``num_stages``, ...): without it a search spent 13 of 48 trials on one
    #: tile's launch variants and never tried the best two tiles (the recorded 777x1234x4321
    #: table). On the 17 development tables (``bench/results/search_variants_study.md``, 10
    #: seeds) the searches with the stop rule ended within 1% of the optimum 157 -> 168 times of
    #: 170 warm (+0.5 trials on average) and 151 -> 160 cold; cold 48-trial searches without the
    #: rule 67 -> 70 of 70, but after their first 16 trials 51 -> 41: it explores earlier
    program_spread = 0.1
    #: a program's measured launch variants that cost nothing in ``ask``'s score
    program_free = 0

    def __init__(self, space: SearchSpace, ctx: ProblemContext, seed: int, budget: int,
                 prior: Prior | None = None) -> None:
        super().__init__(space, ctx, seed, budget, prior)
        self.configs, self.est = ranked_feasible(space, ctx, seed, prior)
        self.index = {c: i for i, c in enumerate(self.configs)}
        self.coords = np.array([space.encode(c) for c in self.configs], dtype=float).reshape(
            len(self.configs), len(space.params))
        # one-hot features of every parameter value: the correction learns "the prior overrates
        # num_warps=8 on this problem" from one measurement and applies it everywhere
        onehot = [np.equal.outer(self.coords[:, j], np.arange(len(p.values))).astype(float)
                  for j, p in enumerate(space.params)]
        self.features = np.concatenate(onehot, axis=1) if onehot else np.zeros((0, 0))
        #: each config's program: configs that differ only in launch options share one
        cols = [j for j, p in enumerate(space.params) if p.name not in LAUNCH_OPTIONS]
        programs = [tuple(row) for row in self.coords[:, cols]]
        ids = {key: n for n, key in enumerate(dict.fromkeys(programs))}
        self.program = np.array([ids[key] for key in programs], dtype=int)
        self.tried = np.zeros(len(self.configs), dtype=bool)
        self.obs_i: list[int] = []
        self.asked: set[KernelConfig] = set()
        self.obs_x: list[np.ndarray] = []
        self.obs_r: list[float] = []
        #: the kernel weight of every config to each measured one (a column per measurement,
        #: computed once when told), and the last ``_predict`` until the next measurement:
        #: ``ask``, ``upcoming``, ``tell`` and the stop rule predict ~10 times a batch, and over
        #: 17,836 feasible configs (matmul 1500x3001x999) recomputing every distance each time
        #: took 25 ms a call, 0.6 s a batch on an H100 host beside the compile pool (issue 33)
        self._weights = np.zeros((len(self.configs), 0))
        self._predicted: tuple[np.ndarray, np.ndarray] | None = None
        self._queue = diverse_top(self.configs, self.startup)
        #: out-of-sample errors (measured - predicted log-time) of the verified configs told
        #: once the model had a fit: what the stop rule's chance of an improvement rests on
        self.errors: list[float] = []

    def ask(self) -> KernelConfig | None:
        while self._queue:
            config = self._queue.pop(0)
            if config not in self.asked and not self.tried[self.index[config]]:
                return self._mark(config)
        score = self._score()
        if not np.isfinite(score).any():
            return None
        return self._mark(self.configs[int(np.argmin(score))])

    def _free(self) -> np.ndarray:
        """Configs neither measured nor asked."""
        free = ~self.tried
        for c in self.asked:
            free[self.index[c]] = False
        return free

    def _score(self) -> np.ndarray:
        """What ``ask`` minimises: the predicted log-time less a bonus where nothing was
        measured nearby, plus ``program_spread`` for each program's measured launch variants;
        inf for configs measured or asked."""
        free = self._free()
        if not free.any():
            return np.full(len(self.configs), np.inf)
        pred, support = self._predict()
        score = pred - self.kappa / (1.0 + support)
        if self.obs_i and self.program_spread:
            measured = np.bincount(self.program[self.obs_i], minlength=len(self.program))
            extra = np.maximum(measured[self.program] - self.program_free, 0)
            score = score + self.program_spread * np.log1p(extra)
        return np.where(free, score, np.inf)

    def upcoming(self, n: int) -> list[KernelConfig]:
        """The startup picks not asked yet, then the untried configs in the order ``ask``
        would take them if no measurement came in between."""
        picks = [c for c in self._queue
                 if c not in self.asked and not self.tried[self.index[c]]][:n]
        score = self._score()
        for c in picks:
            score[self.index[c]] = np.inf
        order = np.argsort(score, kind="stable")[:max(0, n - len(picks))]
        return picks + [self.configs[i] for i in order if np.isfinite(score[i])]

    def _mark(self, config: KernelConfig) -> KernelConfig:
        self.asked.add(config)
        return config

    def _predict(self) -> tuple[np.ndarray, np.ndarray]:
        if not self.obs_r:
            return self.est, np.zeros(len(self.est))
        if self._predicted is not None:
            return self._predicted
        r = np.array(self.obs_r)
        base = float(np.median(r))
        # a ridge regression of the residuals on the one-hot parameter values ...
        f = self.features[self.obs_i]
        clipped = np.clip(r - base, -self.clip, self.clip)
        coef = np.linalg.solve(f.T @ f + self.ridge * np.eye(f.shape[1]), f.T @ clipped)
        linear = base + self.features @ coef
        # ... and a kernel-weighted average of what it leaves, around each measured config
        w = self._weights[:, :len(self.obs_r)]
        support = w.sum(axis=1)
        left = r - linear[self.obs_i]
        corr = linear + (w @ left) / (self.prior_weight + support)
        self._predicted = self.est + corr, support
        return self._predicted

    def _observe(self, i: int, residual: float) -> None:
        """Add config ``i``'s measurement: its residual, and its kernel weight to every
        config (a column of ``_weights``; the array grows by doubling)."""
        x = self.coords[i]
        self.obs_x.append(x)
        self.obs_i.append(i)
        self.obs_r.append(residual)
        n = len(self.obs_r)
        if n > self._weights.shape[1]:
            grown = np.zeros((len(self.configs), max(8, 2 * self._weights.shape[1])))
            grown[:, :n - 1] = self._weights[:, :n - 1]
            self._weights = grown
        d2 = ((self.coords - x[None, :]) ** 2).sum(axis=1)
        self._weights[:, n - 1] = np.exp(-d2 / (2.0 * self.length_scale ** 2))
        self._predicted = None

    def tell(self, config: KernelConfig, measurement: Measurement) -> None:
        value = self.objective(measurement)
        self.asked.discard(config)
        i = self.index.get(config)
        if i is None:  # pruned or outside the feasible list: nothing to learn about the prior
            return
        if self.tried[i]:
            return
        self.tried[i] = True
        if measurement.ok and len(self.obs_r) >= 2:  # the fit before this config was known
            pred, support = self._predict()
            self.errors.append((value - float(pred[i])) / self._spread(float(support[i])))
        self._observe(i, value - (self.est[i] if math.isfinite(self.est[i]) else 0.0))


    def _spread(self, support: float) -> float:
        """How much of the model's prediction error remains at a config with this much
        measured ``support`` nearby (1 far from every measurement, less near them)."""
        return math.sqrt(self.prior_weight / (self.prior_weight + support))

    def prediction_sigma(self) -> float:
        """How far (log-time, one standard deviation) a measurement lands from the model's
        prediction: the RMS of its out-of-sample errors so far, shrunk towards
        ``sigma_prior`` while there are few."""
        n = len(self.errors)
        sq = 2.0 * sum(min(e, 0.0) ** 2 for e in self.errors)
        return math.sqrt((self.sigma_prior_weight * self.sigma_prior ** 2 + sq)
                         / (self.sigma_prior_weight + n))

    def improvement_chance(self, best_ms: float, band: float) -> float | None:
        """The chance, as the model sees it, that the most promising untried config beats
        ``best_ms`` by more than ``band``: a normal around its predicted log-time with the
        model's measured prediction error (``prediction_sigma``). 0.0 when nothing is left."""
        return self.most_promising(best_ms, band)[0]

    def most_promising(self, best_ms: float, band: float) -> tuple[float, int | None]:
        """``improvement_chance`` and the index (into ``configs``) of the untried config it
        rests on; (0.0, None) when nothing is left. A config asked and not measured yet
        counts as untried: a search that stops with configs in flight drops them."""
        free = ~self.tried
        if not free.any() or best_ms <= 0:
            return 0.0, None
        pred, support = self._predict()
        target = math.log(best_ms) + math.log1p(-band)
        spread = self.prediction_sigma() * np.sqrt(
            self.prior_weight / (self.prior_weight + support))
        z = np.where(free, (target - pred) / spread, -np.inf)
        i = int(np.argmax(z))
        return 0.5 * (1.0 + math.erf(float(z[i]) / math.sqrt(2.0))), i


class ModelTPEStrategy(TPEStrategy):
    """TPE (multivariate, ordinal) whose startup trials are the prior's top picks."""

    name = "model-tpe"

    def __init__(self, space: SearchSpace, ctx: ProblemContext, seed: int, budget: int,
                 prior: Prior | None = None) -> None:
        super().__init__(space, ctx, seed, budget, prior)
        configs, _ = ranked_feasible(space, ctx, seed, prior)
        for config in diverse_top(configs, self._startup()):
            self.study.enqueue_trial(self._encode(config))

    def _startup(self) -> int:
        return max(4, min(10, self.budget // 5))

    def make_sampler(self) -> optuna.samplers.BaseSampler:
        return optuna.samplers.TPESampler(
            seed=self.seed, multivariate=True, group=False, constant_liar=True,
            n_startup_trials=self._startup(), n_ei_candidates=64,
        )
