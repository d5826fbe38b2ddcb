"""Issue 5: how close each strategy gets to the optimum of exhaustively measured H200 tables.

    python3 -m bench.search_quality --out bench/results/search_quality.md [--seeds 5]

For every replay table under tests/data/replay (recorded on an H200 through the pipeline), each
strategy runs the product's search loop (tuner.search.run_search on the ReplayBackend) with a
48-trial budget; the ratio best-found / table optimum is read after 16, 32 and 48 trials. Two
settings: cold (the strategy alone) and warm (the product's default: the kernel's known-good
configs tried first). Score: (random - strategy) / (random - 1) on median ratios, so random
search is 0 and the optimum 1.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from search_spaces import get_kernel
from tuner.backends.replay import ReplayBackend, load_table
from tuner.search import SearchOptions, run_search

BUDGETS = (16, 32, 48)
STRATEGIES = ("tpe", "gp", "random")


def best_after(trials: list, n: int) -> float:
    ok = [m.p50_ms for m in trials[:n] if m.ok and m.p50_ms]
    return min(ok) if ok else float("inf")


def run(tables: list[Path], seeds: int, warm: bool) -> dict[str, dict[int, list[float]]]:
    kernel = get_kernel("matmul")
    ratios: dict[str, dict[int, list[float]]] = {s: {b: [] for b in BUDGETS} for s in STRATEGIES}
    for path in tables:
        table = load_table(path)
        start = kernel.known_good_configs(table.shape, table.dtype) if warm else []
        for strategy in STRATEGIES:
            for seed in range(seeds):
                result = run_search(kernel, table.shape, table.dtype, ReplayBackend(table),
                                    SearchOptions(trials=max(BUDGETS), seed=seed,
                                                  strategy=strategy, warm_start=start,
                                                  retime_rounds=0))
                for b in BUDGETS:
                    ratios[strategy][b].append(best_after(result.trials, b) / table.best_ms)
    return ratios


def section(title: str, ratios: dict[str, dict[int, list[float]]]) -> list[str]:
    rand = {b: statistics.median(ratios["random"][b]) for b in BUDGETS}
    lines = [f"### {title}", "", "| strategy | " + " | ".join(
        f"median @{b} | worst @{b} | score @{b}" for b in BUDGETS) + " |",
        "|---|" + "---|" * (3 * len(BUDGETS))]
    for s in STRATEGIES:
        cells = []
        for b in BUDGETS:
            med = statistics.median(ratios[s][b])
            score = (rand[b] - med) / (rand[b] - 1) if rand[b] > 1 else float("nan")
            cells.append(f"{med:.3f} | {max(ratios[s][b]):.3f} | {score:.2f}")
        lines.append(f"| {s} | " + " | ".join(cells) + " |")
    return lines + [""]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--tables", default="tests/data/replay")
    args = ap.parse_args()
    tables = sorted(Path(args.tables).glob("*.json"))
    t0 = time.monotonic()
    lines = ["# Search quality on H200 replay tables", "",
             f"Command: `python3 -m bench.search_quality --out {args.out} --seeds {args.seeds}`",
             "", f"{len(tables)} tables: " + ", ".join(p.stem for p in tables), "",
             "Ratio = best found / the table's optimum (1.000 = found the best), median and "
             f"worst over tables x {args.seeds} seeds.", ""]
    lines += section("cold: the strategy alone", run(tables, args.seeds, warm=False))
    lines += section("warm: known-good configs first (the product's default)",
                     run(tables, args.seeds, warm=True))
    lines.append(f"CPU time: {time.monotonic() - t0:.0f} s")
    text = "\n".join(lines) + "\n"
    if args.out:
        Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
