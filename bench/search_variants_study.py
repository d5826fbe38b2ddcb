"""Changes to the model strategy's asks, tried on the recorded tables before any GPU run.

The service's search stops 5-8% off a 96-trial search on two held-out problems in every run
(issue 33; ``results/tuning_time_33i/``), and on the recorded development tables the warm
search of ``matmul_777x1234x4321`` ends 7.3% off its table's optimum even at 48 trials.
Settings:

- ``none``: ``ModelStrategy`` without the program spread (``program_spread`` 0), as it was
  before the spread went into the product;
- ``program:L:K``: ``ModelStrategy.program_spread = L``, ``program_free = K``: ``ask``'s score
  adds ``L * log(1 + max(n - K, 0))``, n the configs measured with the same program (every
  parameter but the launch options): the 777 search spent 48 trials on 11 tiles, 13 of them on
  one tile's launch variants, and never tried the table's two best tiles. The product's
  default is ``program:0.2:1``;
- ``neighbour:K`` (patched in for the study only, without the spread): every K-th ask (after
  the startup picks) takes the untried config one ordinal step from the best measured one in
  one parameter, the model's most promising such.

Each setting runs the product's search loop (``bench.search_quality.stop_run``: the replay
backend, the default stop rule, a 48-trial cap, ``--batch`` configs asked before any is told,
as the service keeps in flight) over the matmul and softmax tables under
``tests/data/replay``, cold and warm (the known-good configs first, as a worker starts), and
reports the runs that ended within ``--band`` of their table's optimum and the trials they
used; and, without the stop rule, cold 48-trial searches of the matmul tables (5 seeds, the
fixed budget of ``tests/test_strategies.py``'s quality check): the runs within the band after
16, 32 and 48 trials.

    python3 -m bench.search_variants_study --seeds 10 --band 0.01 \\
        --out bench/results/search_variants_study.md
"""

from __future__ import annotations

import argparse
import glob
import statistics
import time
from pathlib import Path
from typing import Any

from bench.report import command_text

TABLES = ("tests/data/replay/holdout/*.json", "tests/data/replay/*.json",
          "tests/data/replay/nongemm/softmax_*.json")
#: the fixed-budget searches' tables and seeds
FIXED_TABLES = ("tests/data/replay/holdout/*.json", "tests/data/replay/*.json")
FIXED_SEEDS = 5
FIXED_AT = (16, 32, 48)
SETTINGS = ("none", "program:0.1:0", "program:0.05:0", "program:0.1:1", "program:0.15:1",
            "program:0.2:1", "program:0.3:1", "program:0.1:2", "program:0.2:2", "neighbour:4")
BAND = 0.02


def patch(setting: str) -> None:
    """Set or patch ``ModelStrategy`` for ``setting``."""
    import numpy as np

    from tuner.strategies.model_based import ModelStrategy

    kind, _, value = setting.partition(":")
    if kind in ("none", "neighbour"):
        ModelStrategy.program_spread = 0.0
    if kind == "program":
        weight, _, free = value.partition(":")
        ModelStrategy.program_spread = float(weight)
        ModelStrategy.program_free = int(free or 0)
    elif kind == "neighbour":
        every = int(value)
        plain_ask = ModelStrategy.ask

        def ask(self: Any) -> Any:
            self._asks = getattr(self, "_asks", 0) + 1
            if not self._queue and self.obs_i and self._asks % every == 0:
                est = np.where(np.isfinite(self.est), self.est, 0.0)
                values = np.array(self.obs_r) + est[self.obs_i]
                best = self.obs_i[int(np.argmin(values))]
                near = (np.abs(self.coords - self.coords[best]).sum(axis=1) == 1) & self._free()
                if near.any():
                    pred, _ = self._predict()
                    return self._mark(self.configs[int(np.argmin(np.where(near, pred, np.inf)))])
            return plain_ask(self)

        ModelStrategy.ask = ask  # type: ignore[method-assign]
    elif kind != "none":
        raise SystemExit(f"unknown setting {setting!r}")


def fixed_run(path: str, seed: int) -> list[float]:
    """A cold search of ``path``'s table without the stop rule: best / optimum after each
    of ``FIXED_AT`` trials."""
    from search_spaces import get_kernel
    from tuner.backends.replay import ReplayBackend, load_table
    from tuner.search import SearchOptions, run_search

    table = load_table(path)
    kernel = get_kernel(table.kernel)
    result = run_search(kernel, table.shape, table.dtype, ReplayBackend(table),
                        SearchOptions(trials=max(FIXED_AT), seed=seed, retime_rounds=0))
    return [min(m.p50_ms for m in result.trials[:n] if m.ok) / table.best_ms for n in FIXED_AT]


def run_setting(job: tuple[str, list[str], int, float, int]) -> tuple[list[str], str]:
    """One setting's rows of the stop-rule table and its row of the fixed-budget table (in a
    fresh process: the patch stays there)."""
    setting, paths, seeds, band, batch = job
    from bench.search_quality import stop_run

    patch(setting)
    fixed = [fixed_run(p, seed) for pattern in FIXED_TABLES for p in sorted(glob.glob(pattern))
             for seed in range(FIXED_SEEDS)]
    cells = [f"{sum(r[k] <= 1 + band for r in fixed)} of {len(fixed)} "
             f"(worst {max(r[k] for r in fixed):.3f})" for k in range(len(FIXED_AT))]
    fixed_row = f"| {setting} | {' | '.join(cells)} |"
    rows = []
    for warm in (False, True):
        ratios: list[float] = []
        trials: list[int] = []
        off: set[str] = set()
        for path in paths:
            for seed in range(seeds):
                _, _, used, ratio, _ = stop_run((path, seed, warm, 48, batch))
                ratios.append(ratio)
                trials.append(used)
                if ratio > 1 + band:
                    off.add(Path(path).stem)
        within = sum(r <= 1 + band for r in ratios)
        rows.append(f"| {setting} | {'warm' if warm else 'cold'} | {within} of {len(ratios)} | "
                    f"{max(ratios):.3f} | {statistics.mean(trials):.1f} | "
                    f"{statistics.median(trials):.0f} | {', '.join(sorted(off)) or '-'} |")
    return rows, fixed_row


def main(argv: list[str] | None = None) -> int:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--band", type=float, default=BAND,
                    help="a run is within when its best is within this fraction of the optimum")
    ap.add_argument("--batch", type=int, default=4,
                    help="configs asked before any is told (the service's TUNER_SEARCH_IN_FLIGHT)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    paths = sorted(p for pattern in TABLES for p in glob.glob(pattern))
    t0 = time.monotonic()
    # a fresh process per setting: a patch must not stay for the next one
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn"),
                             max_tasks_per_child=1) as pool:
        results = list(pool.map(run_setting, [(s, paths, args.seeds, args.band, args.batch)
                                              for s in args.settings.split(",")]))
    lines = ["# The model strategy's asks: variants on the recorded tables", "",
             f"Command: `{command_text('search_variants_study', argv)}` (CPU, "
             f"{time.strftime('%Y-%m-%d')}, {time.monotonic() - t0:.0f} s)", "",
             f"{len(paths)} tables, {args.seeds} seeds each; the default stop rule, a 48-trial "
             f"cap, {args.batch} configs asked before any is told. within: runs that ended within "
             f"{args.band:.0%} of the table's optimum.", "",
             "| setting | start | within | worst best/opt | trials mean | trials median | "
             "tables with a run off |", "|---|---|---|---|---|---|---|"]
    for rows, _ in results:
        lines += rows
    n_fixed = sum(len(glob.glob(pattern)) for pattern in FIXED_TABLES)
    lines += ["", f"Without the stop rule: cold searches of the {n_fixed} matmul tables, "
              f"{FIXED_SEEDS} seeds each, 48 trials; the runs within {args.band:.0%} of the "
              f"optimum after n trials.", "",
              "| setting | " + " | ".join(f"after {n}" for n in FIXED_AT) + " |",
              "|---|" + "---|" * len(FIXED_AT)]
    lines += [row for _, row in results]
    text = "\n".join(lines) + "\n"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
