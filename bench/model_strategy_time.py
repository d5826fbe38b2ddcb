"""The model strategy's own time in a search loop: its kept weights against a fit from scratch.

``ModelStrategy._predict`` keeps one kernel-weight column per measurement and its last
prediction until the next measurement (3c78030); before, every prediction recomputed the
distance from every feasible config to every measured one. This runs the loop's calls (4
asks, ``upcoming``, 4 tells and the stop rule's chance a batch) for ``--batches`` batches on
one matmul problem twice, with the strategy as it is and with ``_predict`` computing from
scratch (the formula before 3c78030), on the same seeded stand-in measurements, checks that
both ask the same configs and give the same chances, and prints the seconds of each. CPU only.

Usage::

    python3 -m bench.model_strategy_time --out bench/results/model_strategy_time.md
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

SHAPE = {"M": 1500, "N": 3001, "K": 999}
DTYPE = "float16"


def _from_scratch(strategy: Any) -> tuple[np.ndarray, np.ndarray]:
    """The prediction as ``_predict`` computed it before 3c78030: every distance again."""
    if not strategy.obs_r:
        return strategy.est, np.zeros(len(strategy.est))
    x, r = np.stack(strategy.obs_x), np.array(strategy.obs_r)
    base = float(np.median(r))
    f = strategy.features[strategy.obs_i]
    clipped = np.clip(r - base, -strategy.clip, strategy.clip)
    coef = np.linalg.solve(f.T @ f + strategy.ridge * np.eye(f.shape[1]), f.T @ clipped)
    linear = base + strategy.features @ coef
    d2 = ((strategy.coords[:, None, :] - x[None, :, :]) ** 2).sum(axis=2)
    w = np.exp(-d2 / (2.0 * strategy.length_scale ** 2))
    support = w.sum(axis=1)
    corr = linear + (w @ (r - linear[strategy.obs_i])) / (strategy.prior_weight + support)
    return strategy.est + corr, support


def _run(batches: int, scratch: bool) -> tuple[float, list[Any], int]:
    """Seconds of the strategy's calls, what it asked and chanced, and its feasible count."""
    from search_spaces import get_kernel
    from tuner.measurement import Measurement, Outcome
    from tuner.space import ProblemContext
    from tuner.strategies.model_based import ModelStrategy

    kernel = get_kernel("matmul")
    strategy = ModelStrategy(kernel.space(), ProblemContext(SHAPE, DTYPE), 0, 4 * batches,
                             prior=kernel.prior)
    if scratch:
        strategy._predict = lambda: _from_scratch(strategy)  # type: ignore[method-assign]
    rng = np.random.default_rng(0)
    seen: list[Any] = []
    spent = 0.0
    for _ in range(batches):
        t0 = time.perf_counter()
        batch = [strategy.ask() for _ in range(4)]
        ahead = strategy.upcoming(15)
        spent += time.perf_counter() - t0
        for config in batch:  # stand-in timings: seeded, the same in both runs
            m = Measurement(config, Outcome.OK, p20_ms=1.0,
                            p50_ms=float(rng.uniform(0.04, 0.06)), p80_ms=1.0)
            t0 = time.perf_counter()
            strategy.tell(config, m)
            spent += time.perf_counter() - t0
        t0 = time.perf_counter()
        chance = strategy.improvement_chance(0.04, 0.01)
        spent += time.perf_counter() - t0
        seen.append(([c.key() for c in batch], [c.key() for c in ahead], chance))
    return spent, seen, len(strategy.configs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=12)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    kept_s, kept, n = _run(args.batches, scratch=False)
    scratch_s, scratch, _ = _run(args.batches, scratch=True)
    same = kept == scratch
    text = "\n".join([
        "# The model strategy's time in a search loop: kept weights against a fit from scratch",
        "", f"Command: `python3 -m bench.model_strategy_time {' '.join(sys.argv[1:])}`", "",
        f"matmul {SHAPE['M']}x{SHAPE['N']}x{SHAPE['K']} {DTYPE}: {n} feasible configs; "
        f"{args.batches} batches of 4 asks, `upcoming(15)`, 4 tells and the stop rule's "
        f"chance each, on seeded stand-in timings; {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}, numpy {np.__version__}.", "",
        "| `_predict` | strategy seconds |", "| --- | --- |",
        f"| from scratch (before 3c78030) | {scratch_s:.3f} |",
        f"| kept weights | {kept_s:.3f} |", "",
        f"Ratio {scratch_s / kept_s:.1f}x. The same asks, upcoming lists and chances in both: "
        f"**{same}**.", ""])
    Path(args.out).write_text(text)
    print(text)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
