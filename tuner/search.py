"""The search loop: ask a strategy, prune, measure through a backend, tell, keep the best.

The loop owns what every strategy shares: the trial budget (pruned and duplicate proposals cost
nothing), warm start (known-good and previously tuned configs are tried first), resuming from
stored trials, the time budget, early stopping and the final interleaved re-timing of the
finalists. A config only becomes the best once its output was verified against the reference.

Numbers that decide something are re-timed side by side in one process, never taken from one
trial: the finalists are re-timed interleaved together with the stored best (the incumbent,
so the worker replaces it only with a config measured faster under the same conditions), the
kernel's default (its ``default_config``, or the best of the user's list: what runs when nothing
is stored, which the worker serves unless a config beats it beyond the noise) and the
kernel's torch baseline; the roofline stop fires only once a re-timing confirmed the trial.
"""

from __future__ import annotations

import functools
import logging
import math
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field, replace

from tuner.backends.base import (
    Backend,
    CompilesAhead,
    CompilesNow,
    compile_now,
    measure_ready,
    preferred_batch,
)
from tuner.config import KernelConfig
from tuner.errors import MeasuringStopped, interrupted_by
from tuner.kernel import TunableKernel
from tuner.measurement import Measurement, Outcome
from tuner.space import DEFAULT_SMEM_LIMIT, ProblemContext, SearchSpace
from tuner.strategies import (
    kernel_has_prior,
    kernel_prior,
    make_strategy,
    resolve_strategy,
    strategy_class,
)
from tuner.strategies.base import Strategy
from tuner.strategies.model_based import estimates

log = logging.getLogger(__name__)

#: proposals in a row that were pruned or already tried before the loop picks an untried
#: feasible config at random instead (so a sampler stuck on one region cannot stall the search)
MAX_WASTED_PROPOSALS = 25
#: the "no expected gain" stop's defaults (``SearchOptions.stop_chance``), chosen on the
#: recorded H200 tables with ``bench/search_quality.py --stop-rule`` (bench/NOTES.md)
DEFAULT_STOP_CHANCE = 0.05
#: 2%, though the service's quality check is 1%: a 1% band, tried in the nineteenth session,
#: cost 0.7-1.2 trials a search on the 19 recorded tables with 0-2% timing noise and changed
#: no result there (``bench/results/noisy_replay_study.md``), but on the H200's held-out set
#: it ran 1500x3001x999 to its 48-trial cap (19 -> 48 trials, 7.7 -> 11.9 s: over the 10 s
#: target) and ended no closer (1.050 of its reference), and the other shapes as before
#: (``bench/results/stop_band_h200/``)
DEFAULT_STOP_BAND = 0.02
DEFAULT_STOP_MIN_TRIALS = 16
DEFAULT_STOP_QUIET = 6
#: the most configs a model-based search keeps in flight by default: on the recorded tables
#: one, four and eight in flight ended as close to the optimum (bench/NOTES.md, tuning time's
#: seventh pass); more than four is not measured on a GPU yet
DEFAULT_IN_FLIGHT = 4
#: how many of a kernel's known-good configs (and its default) a search tries first: those its
#: prior ranks best. All of them cost 10+ trials before the model leads; on the recorded H200
#: tables the prior's 5 best find the optimum as often in ~6 fewer trials (bench/NOTES.md)
KNOWN_GOOD_FIRST = 5


@dataclass(frozen=True)
class SearchOptions:
    trials: int = 48
    seed: int = 0
    strategy: str = "auto"
    time_budget_s: float | None = None
    #: configs asked ahead of measuring (lets a compile pool work on the next ones); None:
    #: the backend's preferred batch (its compile pool size), at most ``in_flight`` for
    #: model-based strategies, which learn less from a batch asked before any of it was
    #: measured
    batch_size: int | None = None
    #: the most configs a model-based strategy has in flight (``batch_size`` unset; the
    #: worker's ``TUNER_SEARCH_IN_FLIGHT``)
    in_flight: int = DEFAULT_IN_FLIGHT
    #: tried first, in order (stored bests of nearby shapes, then the kernel's known-good configs)
    warm_start: Sequence[KernelConfig] = ()
    #: the user's own config list (``listed_configs``): every one is measured (unless
    #: pruned) before the search extends around them, whatever ``trials`` says (the budget
    #: grows to hold them and no early stop fires before), and their best is re-timed beside
    #: the finalists, so the best found is never slower than the list's (beyond the noise)
    listed: Sequence[KernelConfig] = ()
    #: trials already measured (a resumed task); they count against the budget
    resume: Sequence[Measurement] = ()
    finalists: int = 3
    retime_rounds: int = 5
    #: stop after this many trials without an improvement beyond the noise (None: never)
    patience: int | None = None
    #: relative improvement that counts as one (at least the measured noise)
    min_improvement: float = 0.01
    #: "the model expects no gain": once ``stop_min_trials`` trials were measured and the
    #: best has not improved (beyond the noise) for ``stop_quiet`` of them, stop when the
    #: strategy's chance that an untried config beats the best by more than ``stop_band``
    #: (``Strategy.improvement_chance``) is under this; None or 0: never (``trials`` alone
    #: decides). Workers pass ``DEFAULT_STOP_CHANCE``: there ``trials`` is a cap. Strategies
    #: without a model (samplers, exhaustive) never stop this way.
    stop_chance: float | None = None
    stop_band: float = DEFAULT_STOP_BAND
    stop_min_trials: int = DEFAULT_STOP_MIN_TRIALS
    stop_quiet: int = DEFAULT_STOP_QUIET
    #: the fastest time the device's measured ceilings allow for this problem (the roofline:
    #: max(FLOPs / matmul peak, bytes / copy bandwidth)); None: unknown
    floor_ms: float | None = None
    #: stop once the best reaches this fraction of the roofline (floor_ms / best_ms), as
    #: confirmed by re-timing it (``confirm_rounds`` interleaved rounds); None: never
    roofline_stop: float | None = None
    #: trials measured before the roofline stop may end the search (the worker asks for the
    #: model stop's minimum where the floor is a compute ceiling: a vendor GEMM's measured
    #: speed, which a tuned kernel can pass)
    roofline_min_trials: int = 0
    confirm_rounds: int = 3
    #: the stored best for this identity (the worker's): re-timed beside the finalists in the
    #: same process, so that a stored best is only replaced by a config measured faster under
    #: the same conditions (``SearchResult.incumbent``)
    incumbent: KernelConfig | None = None
    #: time the kernel's ``baseline`` (torch) beside the finalists (``SearchResult.baseline``)
    baseline: bool = True
    #: the kernel's default config (``default_config``; the worker's): measured (unless a
    #: trial did) and re-timed beside the finalists (``SearchResult.default``), so that a
    #: stored best is served instead only when it beats the default under the same conditions.
    #: With a user's list (``listed``) the default is the list's fastest instead
    default: KernelConfig | None = None


@dataclass
class SearchResult:
    best: Measurement | None
    trials: list[Measurement]
    pruned: int
    stop_reason: str
    wall_s: float
    space_size: int
    feasible_size: int
    finalists: list[Measurement] = field(default_factory=list)
    #: ``SearchOptions.incumbent`` re-timed beside the finalists (``extra["measured"] ==
    #: "retimed"``; its first timing when ``retime_rounds`` is 0; a failure outcome when it no
    #: longer runs or verifies); None without one, without a verified finalist, or when
    #: re-timing failed
    incumbent: Measurement | None = None
    #: the kernel's baseline (torch) re-timed beside the finalists; None when the kernel has
    #: none, the backend cannot time it (a replay table without one) or re-timing failed
    baseline: Measurement | None = None
    #: the default (``SearchOptions.default``, or the fastest verified config of the user's
    #: list) re-timed beside the finalists (``extra["measured"] == "retimed"``; its first
    #: timing when there was no re-timing; a failure outcome when it does not run or verify);
    #: None without one (none given, or outside the space or its constraints on this
    #: problem), without a verified finalist, or when re-timing failed
    default: Measurement | None = None

    @property
    def counts(self) -> dict[str, int]:
        counts = Counter(m.outcome.value for m in self.trials)
        return dict(sorted(counts.items()))


TrialCallback = Callable[[int, Measurement], None]


class _StrategyBuild:
    """A strategy built in a thread beside the search's first batch (the warm start needs
    none): once built, it has ``backend``'s pool compile what it would ask first
    (``upcoming``) before the loop may use it, since the first batch's results come about
    when it is built (an H100: 0.7-1.5 s) and the next batch asks those. Not once the search
    ended (``close``): the backend may measure another problem by then."""

    def __init__(self, build: Callable[[], Strategy], backend: Backend) -> None:
        self._future: Future[Strategy] = Future()
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._build, args=(build, backend), name="strategy",
                         daemon=True).start()

    def _build(self, build: Callable[[], Strategy], backend: Backend) -> None:
        try:
            strategy = build()
            with self._lock:
                if not self._closed:
                    compile_now(backend, strategy.upcoming(preferred_batch(backend)))
            self._future.set_result(strategy)
        except BaseException as exc:  # noqa: BLE001 - raised where the strategy is needed
            self._future.set_exception(exc)

    def done(self) -> bool:
        return self._future.done()

    def result(self) -> Strategy:
        """The strategy (waiting for its build); its build's error, if it raised."""
        return self._future.result()

    def close(self) -> None:
        """The search ended: nothing more is handed to the backend."""
        with self._lock:
            self._closed = True


class SearchLoop:
    def __init__(self, kernel: TunableKernel, shape: Mapping[str, int], dtype: str,
                 backend: Backend,
                 options: SearchOptions, on_trial: TrialCallback | None = None,
                 should_stop: Callable[[], bool] | None = None) -> None:
        self.backend, self.options = backend, options
        self.on_trial, self.should_stop = on_trial, should_stop
        self.space: SearchSpace = backend.restrict(kernel.space())
        smem = backend.fingerprint.smem_per_block or DEFAULT_SMEM_LIMIT
        self.ctx = ProblemContext(dict(shape), dtype, smem,
                                  backend.fingerprint.sm_count or ProblemContext.sm_count,
                                  ProblemContext.capability_of(
                                      backend.fingerprint.compute_capability))
        self._warm = [c for c in dict.fromkeys([*options.warm_start, *options.listed])
                      if self.space.contains(c)]
        # the pool compiles the warm start (the first batches) while the strategy is built: a
        # matmul space's enumeration and ranking take a second or more; then the incumbent
        # and the default, measured after the search unless a trial did (their compile had
        # been the last wait of a search, 0.3-0.5 s on an H200)
        early = [*self._warm, *(c for c in (options.incumbent, options.default)
                                if c is not None and self.space.contains(c))]
        compile_now(backend, [c for c in dict.fromkeys(early)
                              if self.space.violation(c, self.ctx) is None])
        # the kernel's own prior ranks configs (kernels without the optional prior hook
        # have none: flat); "auto" is chosen by whether the kernel has one
        name = resolve_strategy(options.strategy, kernel_has_prior(kernel, shape, dtype, self.ctx))
        self._systematic = strategy_class(name).systematic  # an unknown name: raised here
        self._strategy: Strategy | None = None
        # the strategy (a matmul space's enumeration and ranking: 0.7-1.3 s) is built beside
        # the first batch where a compile pool is compiling the warm start: the GPU times
        # the warm start meanwhile, which needs no strategy
        build = functools.partial(make_strategy, name, self.space, self.ctx, options.seed,
                                  options.trials, prior=kernel_prior(kernel))
        self._building: _StrategyBuild | None = None
        if isinstance(backend, CompilesNow) and self._warm and not options.resume:
            self._building = _StrategyBuild(build, backend)
        else:
            self._strategy = build()
        self.rng = random.Random(options.seed)
        self.tried: dict[KernelConfig, Measurement] = {}
        self.trials: list[Measurement] = []
        self.pruned = 0
        self._listed = [c for c in dict.fromkeys(options.listed)
                        if self.space.contains(c) and self.space.violation(c, self.ctx) is None]
        #: the trial budget: ``trials``, or more where the user's list needs more
        self.cap = max(options.trials, len(self._listed))
        self._feasible: list[KernelConfig] | None = None
        self._exhausted = False
        self._best_at = 0
        #: configs whose trial reached the roofline, and their confirming re-timed p50 (None:
        #: the re-timing failed); each is confirmed once
        self._confirmed: dict[KernelConfig, float | None] = {}
        #: configs handed to the backend and not measured yet (``measure_ready`` hands back
        #: what it timed while the others compile on), and the asks not answered yet (a
        #: config asked again while in flight is answered once it is measured)
        self._inflight: list[KernelConfig] = []
        self._unanswered: list[tuple[KernelConfig, bool]] = []

    @property
    def strategy(self) -> Strategy:
        """The strategy (waiting for its build beside the first batch, if that still runs)."""
        if self._strategy is None:
            assert self._building is not None
            self._strategy = self._building.result()
        return self._strategy

    def _strategy_ready(self) -> bool:
        return self._strategy is not None or (self._building is not None
                                               and self._building.done())

    # -- proposals ---------------------------------------------------------------------------

    def _feasible_untried(self) -> list[KernelConfig]:
        if self._feasible is None:
            self._feasible = self.space.feasible(self.ctx)
        return [c for c in self._feasible if c not in self.tried and c not in self._inflight]

    def _propose(self) -> tuple[KernelConfig, bool] | None:
        """The next config and whether the strategy asked for it."""
        while self._warm:
            config = self._warm.pop(0)
            if config not in self.tried and config not in self._inflight and \
                    self.space.violation(config, self.ctx) is None:
                return config, False
        self._answer()  # the strategy learns what was measured before it asks
        wasted = 0
        while wasted < MAX_WASTED_PROPOSALS and not self._exhausted:
            asked = self.strategy.ask()
            if asked is None:
                self._exhausted = True
                break
            config = asked
            if not self.space.contains(config):
                reason = "outside the measured space"
            else:
                reason = self.space.violation(config, self.ctx) or ""
            if reason:
                self.pruned += 1
                self.strategy.tell(config, Measurement.failure(config, Outcome.PRUNED, reason))
            elif config in self.tried:
                self.strategy.tell(config, self.tried[config])
            else:
                return config, True
            wasted += 1
        left = self._feasible_untried()
        return (self.rng.choice(left), False) if left else None

    def _next_batch(self, room: int) -> list[tuple[KernelConfig, bool]]:
        batch: list[tuple[KernelConfig, bool]] = []
        pending: set[KernelConfig] = set(self._inflight)
        while len(batch) < room:
            proposal = self._propose()
            if proposal is None:
                break
            if proposal[0] in pending:  # asked again before measured: answered once it is
                batch.append(proposal)
                continue
            pending.add(proposal[0])
            batch.append(proposal)
        return batch

    # -- the loop ----------------------------------------------------------------------------

    def _record(self, measurement: Measurement) -> None:
        best = self.best()
        self.tried[measurement.config] = measurement
        self.trials.append(measurement)
        ms = measurement.p50_ms
        if measurement.ok and ms is not None and (
                best is None or best.p50_ms is None
                or ms < best.p50_ms * (1 - self._margin(best))):
            self._best_at = len(self.trials)
        if self.on_trial is not None:
            self.on_trial(len(self.trials), measurement)

    def _record_fresh(self, measurement: Measurement) -> None:
        if measurement.config not in self.tried:
            self._record(measurement)

    def _margin(self, best: Measurement) -> float:
        return max(self.options.min_improvement, best.noise)

    def best(self) -> Measurement | None:
        ok = [m for m in self.trials if m.ok and m.p50_ms is not None]
        return min(ok, key=lambda m: m.p50_ms or 0.0) if ok else None

    def _stop_reason(self, started: float) -> str | None:
        o = self.options
        if len(self.trials) >= self.cap:
            return "budget"
        if self._out_of_time(started):
            return "time"
        if self.should_stop is not None and self.should_stop():
            return "cancelled"
        if not self._listed_done():
            return None if self.backend.healthy else "device unhealthy"
        if o.patience and self.best() and len(self.trials) - self._best_at >= o.patience:
            return "converged"
        if self._expects_no_gain():
            return "no expected gain"
        best = (self.best() if o.floor_ms and o.roofline_stop
                and len(self.trials) >= o.roofline_min_trials else None)
        if best is not None and self._near_roofline(best):
            return "near roofline"
        if not self.backend.healthy:
            return "device unhealthy"
        return None

    def _out_of_time(self, started: float) -> bool:
        budget = self.options.time_budget_s
        return budget is not None and time.monotonic() - started >= budget

    def _listed_done(self) -> bool:
        """Whether every config of the user's list was measured."""
        return all(c in self.tried for c in self._listed)

    def improvement_chance(self) -> float | None:
        """The strategy's chance that an untried config beats the best by ``stop_band``
        (None: no best yet, or a strategy without a model)."""
        best = self.best()
        if best is None or not best.p50_ms:
            return None
        return self.strategy.improvement_chance(best.p50_ms, self.options.stop_band)

    def _expects_no_gain(self) -> bool:
        o = self.options
        if not o.stop_chance or len(self.trials) < o.stop_min_trials:
            return False
        quiet = len(self.trials) - self._best_at
        if quiet < o.stop_quiet:
            log.debug("stop rule: %d trials, %d of %d quiet since the best", len(self.trials),
                      quiet, o.stop_quiet)
            return False
        chance = self.improvement_chance()
        log.debug("stop rule: %d trials, %d quiet, improvement chance %s (stops under %g)",
                  len(self.trials), quiet, "-" if chance is None else f"{chance:.3f}",
                  o.stop_chance)
        return chance is not None and chance < o.stop_chance

    def _reaches_roofline(self, ms: float | None) -> bool:
        o = self.options
        return bool(ms) and (o.floor_ms or 0) / (ms or math.inf) >= (o.roofline_stop or math.inf)

    def _near_roofline(self, best: Measurement) -> bool:
        """Whether ``best`` reaches the roofline, as confirmed by a short interleaved re-timing
        (``confirm_rounds``; 0 trusts the trial): one lucky timing must not end a search."""
        if not self._reaches_roofline(best.p50_ms):
            return False
        if best.config not in self._confirmed:
            self._confirmed[best.config] = self._confirm(best)
        return self._reaches_roofline(self._confirmed[best.config])

    def _confirm(self, trial: Measurement) -> float | None:
        rounds = self.options.confirm_rounds
        if rounds <= 0:
            return trial.p50_ms
        retimed = self.backend.retime([trial.config], rounds)
        if not retimed or retimed[0].config != trial.config or not retimed[0].ok:
            return None
        log.info("roofline check: %s ran %.4g ms in its trial, %.4g ms re-timed",
                 trial.config.key(), trial.p50_ms or 0.0, retimed[0].p50_ms or 0.0)
        return retimed[0].p50_ms

    def run(self) -> SearchResult:
        """Search until a stop reason. A KeyboardInterrupt (Ctrl-C, or the CLI's SIGTERM)
        ends the search as ``interrupted`` with the trials measured so far, also where a
        library it landed in raised its own error instead (``interrupted_by``); its finalists
        are the fastest verified trials, not re-timed. So are those of a search ended
        ``cancelled`` (``should_stop``): between batches, or at once where the backend stopped
        the measurement in flight (``MeasuringStopped``)."""
        started = time.monotonic()
        for m in self.options.resume:
            self.strategy.tell(m.config, m)
            self.tried[m.config] = m
            self.trials.append(m)
        # a resumed search gets a patience window of its own: the run that measured the
        # resumed trials was not converged when it stopped, and its improvements were judged
        # against its own noise
        self._best_at = len(self.trials)
        incumbent = baseline = default = None
        try:
            reason = self._search(started)
            if reason == "cancelled":  # nobody waits for the re-timing (30 s on the CPU)
                finalists = self._fastest_verified()
            else:
                finalists, incumbent, baseline, default = self._retime_finalists()
        except MeasuringStopped:  # a cancel, or the time budget spent (the worker's deadline)
            reason = "time" if self._out_of_time(started) else "cancelled"
            finalists = self._fastest_verified()
        except (KeyboardInterrupt, Exception) as exc:
            if not interrupted_by(exc):  # a KeyboardInterrupt, or an error raised under one
                raise
            reason = "interrupted"
            finalists = self._fastest_verified()
        finally:
            if self._building is not None:
                self._building.close()
        return SearchResult(
            best=min(finalists, key=lambda m: m.p50_ms or 0.0) if finalists else None,
            trials=self.trials, pruned=self.pruned, stop_reason=reason,
            wall_s=time.monotonic() - started, space_size=self.space.size(),
            feasible_size=len(self._feasible) if self._feasible is not None else -1,
            finalists=finalists, incumbent=incumbent, baseline=baseline, default=default,
        )

    def _search(self, started: float) -> str:
        """Ask, measure, tell until a stop reason. Up to a batch of configs is in flight: the
        backend hands back what it could time while others still compile
        (``measure_ready``), and the freed room is asked again at once, so that the GPU times
        configs compiled ahead instead of waiting for one slow compile. The configs in
        flight when the search stops are dropped: the stop rules count them as untried
        (``Strategy.improvement_chance``), as if never asked."""
        reason = self._stop_reason(started)
        while reason is None:
            room = min(self._batch_size(), self.cap - len(self.trials)) - len(self._inflight)
            asking = time.monotonic()
            batch = self._next_batch(room) if room > 0 else []
            log.debug("asked %d configs in %.3f s (%d by the strategy), %d in flight",
                      len(batch), time.monotonic() - asking,
                      sum(asked for _c, asked in batch), len(self._inflight))
            if not batch and not self._inflight:
                return "space exhausted"
            self._inflight += [c for c, _ in dict.fromkeys(batch)
                               if c not in self.tried and c not in self._inflight]
            self._unanswered += batch
            self._compile_ahead()
            # each trial is recorded (and stored by on_trial) as soon as it is measured
            measured = measure_ready(self.backend, self._inflight,
                                     on_result=self._record_fresh)
            for m in measured:  # a backend that did not report a result as it went
                self._record_fresh(m)
            self._inflight = [c for c in self._inflight if c not in self.tried]
            if self._strategy_ready() or not self._warm:  # else: told once it is built
                self._answer()
            reason = self._stop_reason(started)
        if self._inflight:
            log.debug("stopped (%s) with %d configs in flight, dropped", reason,
                      len(self._inflight))
        return reason

    def _answer(self) -> None:
        """Tell the strategy the measurements of the asks answered by now."""
        answered = [(c, a) for c, a in self._unanswered if c in self.tried]
        self._unanswered = [(c, a) for c, a in self._unanswered if c not in self.tried]
        for config, _asked in answered:
            self.strategy.tell(config, self.tried[config])

    def _compile_ahead(self) -> None:
        """Hand a backend that compiles ahead (``prefetch``: the process backend's compile
        pool) the configs likely to be asked after this batch, most likely first: the warm
        start's next configs, then the strategy's ranking. Its pool compiles them while the
        GPU times this batch, so later batches find their binaries ready."""
        if not isinstance(self.backend, CompilesAhead):
            return
        n = preferred_batch(self.backend)
        ahead = [c for c in self._warm if c not in self.tried][:n]
        if len(ahead) < n and self._strategy_ready():  # not before it is built
            ahead += self.strategy.upcoming(n - len(ahead))
        if ahead:
            self.backend.prefetch(list(dict.fromkeys(ahead)))

    def _batch_size(self) -> int:
        if self.options.batch_size:
            return self.options.batch_size
        preferred = preferred_batch(self.backend)
        return preferred if self._systematic else max(1, min(self.options.in_flight,
                                                             preferred))

    def _fastest_verified(self) -> list[Measurement]:
        """The ``finalists`` fastest verified trials, and the user's list's fastest (re-timed
        beside them even when its trial was slower: the best found must beat it side by
        side, not across trials)."""
        ok = sorted((m for m in self.trials if m.ok), key=lambda m: m.p50_ms or 0.0)
        top = ok[: self.options.finalists]
        listed = set(self._listed)
        best_listed = next((m for m in ok if m.config in listed), None)
        if best_listed is not None and best_listed not in top:
            top.append(best_listed)
        return top

    def _incumbent_first(self) -> Measurement | None:
        """The incumbent's measurement in this search: its trial, else one taken now (which
        verifies it; not a trial: no budget, no ``on_trial``)."""
        config = self.options.incumbent
        if config is None:
            return None
        if config in self.tried:
            return self.tried[config]
        return self.backend.measure([config])[0]

    def _default_first(self) -> Measurement | None:
        """The default's measurement in this search: with a user's list, its fastest verified
        config's trial (else the default's); else the default's trial, else one taken now (as
        the incumbent's). None without a default the space allows on this problem."""
        listed = set(self._listed)
        ok = sorted((m for m in self.trials if m.ok and m.config in listed),
                    key=lambda m: m.p50_ms or 0.0)
        if ok:
            return ok[0]
        config = self.options.default
        if config is None or not self.space.contains(config) or self.space.violation(
                config, self.ctx) is not None:
            return None
        if config in self.tried:
            return self.tried[config]
        return self.backend.measure([config])[0]

    def _retime_finalists(self) -> tuple[list[Measurement], Measurement | None,
                                         Measurement | None, Measurement | None]:
        """The finalists re-timed interleaved with the incumbent, the default and the
        baseline; with them, the incumbent's, the baseline's and the default's re-timed
        measurements."""
        top = self._fastest_verified()
        if not top:
            return top, None, None, None
        incumbent = self._incumbent_first()
        default = self._default_first()
        o = self.options
        configs = [m.config for m in top]
        for m in (incumbent, default):
            if m is not None and m.ok and m.config not in configs:
                configs.append(m.config)
        if o.retime_rounds <= 0 or (len(configs) <= 1 and not o.baseline):
            return top, incumbent, None, default
        retimed = self.backend.retime(configs, o.retime_rounds, baseline=o.baseline)
        if [r.config for r in retimed[:len(configs)]] != configs or not all(
                r.ok for r in retimed[:len(configs)]):  # re-timing failed: first timings
            return (top, incumbent if incumbent is not None and not incumbent.ok else None,
                    None, default if default is not None and not default.ok else None)
        extra = retimed[len(configs):]
        baseline = extra[0] if extra and extra[0].extra.get("baseline") else None
        by_config = {m.config: m for m in top}
        finalists = [replace(r, compile_s=by_config[r.config].compile_s,
                             max_error=by_config[r.config].max_error)
                     for r in retimed[:len(top)]]

        def again(m: Measurement | None) -> Measurement | None:
            if m is None or not m.ok:
                return m
            return replace(retimed[configs.index(m.config)], compile_s=m.compile_s,
                           max_error=m.max_error)

        return finalists, again(incumbent), baseline, again(default)


def known_good_first(kernel: TunableKernel, shape: Mapping[str, int], dtype: str,
                     space: SearchSpace | None = None, ctx: ProblemContext | None = None,
                     limit: int = KNOWN_GOOD_FIRST) -> list[KernelConfig]:
    """The kernel's known-good configs and its default that ``space`` allows on this problem,
    the ``limit`` its prior ranks best (the kernel's own order without a prior): what a search
    tries after the stored bests of nearby shapes."""
    ctx = ctx or ProblemContext(dict(shape), dtype)
    space = space or kernel.space()
    configs = [c for c in dict.fromkeys([*kernel.known_good_configs(shape, dtype),
                                         kernel.default_config(shape, dtype)])
               if space.contains(c) and space.violation(c, ctx) is None]
    prior = kernel_prior(kernel)
    if prior is not None and configs:
        score = estimates(configs, ctx, prior)
        configs = [configs[i] for i in sorted(range(len(configs)), key=lambda i: score[i])]
    return configs[:limit]


def run_search(kernel: TunableKernel, shape: Mapping[str, int], dtype: str, backend: Backend,
               options: SearchOptions, on_trial: TrialCallback | None = None,
               should_stop: Callable[[], bool] | None = None) -> SearchResult:
    """Search ``kernel``'s space on ``backend`` for the fastest verified config."""
    return SearchLoop(kernel, shape, dtype, backend, options, on_trial, should_stop).run()
