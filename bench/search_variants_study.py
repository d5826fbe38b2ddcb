"""Two changes to the model strategy's asks, tried on the recorded tables before any GPU run.

The service's search stops 5-8% off a 96-trial search on two held-out problems in every run
(issue 33; ``results/tuning_time_33i/``), and on the recorded development tables the warm
search of ``matmul_777x1234x4321`` ends 7.3% off its table's optimum even at 48 trials. Two
candidate changes, each a variant of ``ModelStrategy`` patched in for the study only (neither
is in the product):

- ``neighbour:K``: every K-th ask (after the startup picks) takes the untried config one
  ordinal step from the best measured one in one parameter, the model's most promising such;
- ``tile:L``: ``ask``'s score adds ``L * log(1 + n)``, n the configs measured with the same
  program (every parameter but ``num_warps`` and ``num_stages``): the 777 search spent 48
  trials on 11 tiles, 13 of them on one tile's launch variants, and never tried the table's
  two best tiles.

Each setting runs the product's search loop (``bench.search_quality.stop_run``: the replay
backend, the default stop rule, a 48-trial cap, four configs asked before any is told, as the
service keeps in flight) over the matmul and softmax tables under ``tests/data/replay``, cold
and warm (the known-good configs first, as a worker starts), and reports the runs that ended
within 2% of their table's optimum and the trials they used.

    python3 -m bench.search_variants_study --seeds 10 --out bench/results/search_variants_study.md
"""

from __future__ import annotations

import argparse
import glob
import statistics
import sys
import time
from pathlib import Path
from typing import Any

TABLES = ("tests/data/replay/holdout/*.json", "tests/data/replay/*.json",
          "tests/data/replay/nongemm/softmax_*.json")
SETTINGS = ("none", "neighbour:4", "neighbour:2", "tile:0.03", "tile:0.05", "tile:0.1")
#: launch options: configs that differ only in these run the same program
LAUNCH = ("num_warps", "num_stages")
BAND = 0.02


def patch(setting: str) -> None:
    """Patch ``ModelStrategy`` for ``setting`` (``none``: as it is)."""
    import numpy as np

    from tuner.strategies.model_based import ModelStrategy

    kind, _, value = setting.partition(":")
    if kind == "neighbour":
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
    elif kind == "tile":
        weight = float(value)
        plain_score = ModelStrategy._score

        def score(self: Any) -> Any:
            out = plain_score(self)
            if not self.obs_i:
                return out
            if not hasattr(self, "_tile"):
                cols = [j for j, p in enumerate(self.space.params) if p.name not in LAUNCH]
                keys = [tuple(r) for r in self.coords[:, cols]]
                ids = {k: n for n, k in enumerate(dict.fromkeys(keys))}
                self._tile = np.array([ids[k] for k in keys])
            counts = np.bincount(self._tile[self.obs_i], minlength=int(self._tile.max()) + 1)
            return out + weight * np.log1p(counts[self._tile])

        ModelStrategy._score = score  # type: ignore[method-assign]
    elif kind != "none":
        raise SystemExit(f"unknown setting {setting!r}")


def run_setting(job: tuple[str, list[str], int]) -> list[str]:
    """One setting's rows (in a fresh process: the patch stays there)."""
    setting, paths, seeds = job
    from bench.search_quality import stop_run

    patch(setting)
    rows = []
    for warm in (False, True):
        ratios: list[float] = []
        trials: list[int] = []
        off: set[str] = set()
        for path in paths:
            for seed in range(seeds):
                _, _, used, ratio, _ = stop_run((path, seed, warm, 48, 4))
                ratios.append(ratio)
                trials.append(used)
                if ratio > 1 + BAND:
                    off.add(Path(path).stem)
        within = sum(r <= 1 + BAND for r in ratios)
        rows.append(f"| {setting} | {'warm' if warm else 'cold'} | {within} of {len(ratios)} | "
                    f"{max(ratios):.3f} | {statistics.mean(trials):.1f} | "
                    f"{statistics.median(trials):.0f} | {', '.join(sorted(off)) or '-'} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--settings", default=",".join(SETTINGS))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    paths = sorted(p for pattern in TABLES for p in glob.glob(pattern))
    t0 = time.monotonic()
    # a fresh process per setting: a patch must not stay for the next one
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn"),
                             max_tasks_per_child=1) as pool:
        results = list(pool.map(run_setting, [(s, paths, args.seeds)
                                              for s in args.settings.split(",")]))
    lines = ["# The model strategy's asks: two variants on the recorded tables", "",
             f"Command: `python3 -m bench.search_variants_study "
             f"{' '.join(argv if argv is not None else sys.argv[1:])}` (CPU, "
             f"{time.strftime('%Y-%m-%d')}, {time.monotonic() - t0:.0f} s)", "",
             f"{len(paths)} tables, {args.seeds} seeds each; the default stop rule, a 48-trial "
             f"cap, four configs asked before any is told. within: runs that ended within "
             f"{BAND:.0%} of the table's optimum.", "",
             "| setting | start | within | worst best/opt | trials mean | trials median | "
             "tables with a run off |", "|---|---|---|---|---|---|---|"]
    for rows in results:
        lines += rows
    text = "\n".join(lines) + "\n"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
