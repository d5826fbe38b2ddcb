"""Issue 5: how close each strategy gets to the optimum of exhaustively measured H200 tables.

    python3 -m bench.search_quality --out bench/results/search_quality.md [--seeds 10]
        [--strategies model,tpe,...] [--slow-seeds 2] [extra_table.json ...]

For every replay table under tests/data/replay (recorded on an H200; plus any passed as
arguments), each strategy runs the product's search loop (tuner.search.run_search on the
ReplayBackend, exactly as the worker does) with a 48-trial budget; the ratio best-found / table
optimum is read after 16, 32 and 48 trials (the loop asks in batches of <= 4, so the first 16
trials of a 48-trial run are what a 16-trial run measures, up to the strategies' budget-dependent
startup length). Two settings: cold (the strategy alone) and warm (the product's default: the
kernel's known-good configs tried first; they count against the budget). Score:
(random - strategy) / (random - 1) on median ratios, so random search is 0 and the optimum 1.
CPU only; runs in parallel over processes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

BUDGETS = (16, 32, 48)
#: strategies whose model fit costs seconds per ask on a CPU: fewer seeds (--slow-seeds)
SLOW = ("gp",)


def best_after(trials: list, n: int) -> float:
    ok = [m.p50_ms for m in trials[:n] if m.ok and m.p50_ms]
    return min(ok) if ok else float("inf")


def one_run(job: tuple[str, str, int, bool]) -> tuple[str, bool, str, list[float]]:
    path, strategy, seed, warm = job
    from search_spaces import get_kernel
    from tuner.backends.replay import ReplayBackend, load_table
    from tuner.search import SearchOptions, run_search

    kernel = get_kernel("matmul")
    table = load_table(path)
    start = kernel.known_good_configs(table.shape, table.dtype) if warm else []
    result = run_search(kernel, table.shape, table.dtype, ReplayBackend(table),
                        SearchOptions(trials=max(BUDGETS), seed=seed, strategy=strategy,
                                      warm_start=start, retime_rounds=0))
    return strategy, warm, path, [best_after(result.trials, b) / table.best_ms for b in BUDGETS]


Ratios = dict[str, dict[int, list[float]]]


def section(title: str, ratios: Ratios, seeds: dict[str, int], ntables: int) -> list[str]:
    rand = {b: statistics.median(ratios["random"][b]) for b in BUDGETS}
    lines = [f"### {title}", "",
             "| strategy | runs | " + " | ".join(
                 f"median @{b} | worst @{b} | score @{b}" for b in BUDGETS) + " |",
             "|---|---|" + "---|" * (3 * len(BUDGETS))]
    for s in sorted(ratios, key=lambda s: statistics.median(ratios[s][16])):
        cells = []
        for b in BUDGETS:
            med = statistics.median(ratios[s][b])
            score = (rand[b] - med) / (rand[b] - 1) if rand[b] > 1 else float("nan")
            cells.append(f"{med:.3f} | {max(ratios[s][b]):.3f} | {score:.2f}")
        lines.append(f"| {s} | {ntables}x{seeds[s]} | " + " | ".join(cells) + " |")
    return lines + [""]


def per_table(title: str, rows: dict[tuple[str, str], list[list[float]]],
              names: list[str]) -> list[str]:
    strategies = sorted({s for s, _ in rows})
    lines = [f"#### {title}: median ratio @16 / @48 per table", "",
             "| table | " + " | ".join(strategies) + " |",
             "|---|" + "---|" * len(strategies)]
    for path in names:
        cells = []
        for s in strategies:
            v = rows.get((s, path), [])
            cells.append(f"{statistics.median([x[0] for x in v]):.3f} / "
                         f"{statistics.median([x[-1] for x in v]):.3f}" if v else "-")
        lines.append(f"| {Path(path).stem} | " + " | ".join(cells) + " |")
    return lines + [""]


def main() -> None:
    from tuner.strategies import DEFAULT_STRATEGY, STRATEGIES

    ap = argparse.ArgumentParser()
    ap.add_argument("tables", nargs="*", help="more replay tables (beyond --tables)")
    ap.add_argument("--out")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--slow-seeds", type=int, default=2, help=f"seeds for {', '.join(SLOW)}")
    ap.add_argument("--tables-dir", default="tests/data/replay")
    ap.add_argument("--strategies", default=",".join(s for s in sorted(STRATEGIES)
                                                   if not STRATEGIES[s].systematic))
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args()
    paths = sorted(str(p) for p in Path(args.tables_dir).glob("*.json")) + list(args.tables)
    strategies = args.strategies.split(",")
    if "random" not in strategies:
        strategies.append("random")
    seeds = {s: args.slow_seeds if s in SLOW else args.seeds for s in strategies}
    jobs = [(p, s, seed, warm) for warm in (False, True) for p in paths for s in strategies
            for seed in range(seeds[s])]
    t0 = time.monotonic()
    ratios: dict[bool, Ratios] = {w: {s: {b: [] for b in BUDGETS} for s in strategies}
                                  for w in (False, True)}
    rows: dict[bool, dict[tuple[str, str], list[list[float]]]] = {False: {}, True: {}}
    with ProcessPoolExecutor(args.jobs) as pool:
        for s, warm, path, r in pool.map(one_run, jobs, chunksize=4):
            for b, x in zip(BUDGETS, r, strict=True):
                ratios[warm][s][b].append(x)
            rows[warm].setdefault((s, path), []).append(r)
    command = "python3 -m bench.search_quality " + " ".join(sys.argv[1:])
    lines = ["# Search quality on H200 replay tables", "",
             f"Command: `{command}` (CPU, {time.strftime('%Y-%m-%d')}, "
             f"{time.monotonic() - t0:.0f} s on {args.jobs} processes)", "",
             f"{len(paths)} tables: " + ", ".join(Path(p).stem for p in paths), "",
             "Ratio = best found / the table's optimum (1.000 = found the best), median and "
             "worst over tables x seeds (runs). Score: 0 = random search, 1 = the optimum "
             f"(median ratios). Default strategy (`auto`): `{DEFAULT_STRATEGY}`.", ""]
    lines += section("cold: the strategy alone", ratios[False], seeds, len(paths))
    lines += section("warm: the kernel's known-good configs first (the product's default)",
                     ratios[True], seeds, len(paths))
    lines += per_table("cold", rows[False], paths)
    lines += per_table("warm", rows[True], paths)
    text = "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
