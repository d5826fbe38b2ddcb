"""How many trials a stricter quick-timing rejection would skip, on recorded tables.

A trial after the first is timed quickly first (``TimingOptions.quick_rep_ms``); one whose quick
median is over ``quick_factor`` (2) x the best full median so far keeps that quick timing and
skips the full one (its 100 ms warm-up where the power is pressed). This runs the product's
search loop (``run_search``, the default strategy and stop rule, the kernel's known-good
configs first, as a worker starts a new shape) on every replay table of a built-in kernel under
``tests/data/replay`` (recorded on an H200), and counts, over the trials after each search's
first, how many were over 1.1 / 1.2 / 1.3 / 1.5 / 2 x the best recorded time before them: the
share of full timings each factor would skip if a quick timing read the recorded time. CPU
only; the recorded times stand in for quick timings (which read a config at whatever clock the
previous one left: ``bench/NOTES.md`` says why a low factor is not safe).

Usage::

    python3 -m bench.quick_reject_replay --out bench/results/quick_reject_replay.md
"""

from __future__ import annotations

import argparse
import glob
import sys
from pathlib import Path

FACTORS = (1.1, 1.2, 1.3, 1.5, 2.0)
SEEDS = (0, 1, 2)


def ratios(path: str, seed: int) -> tuple[int, list[float]] | None:
    """(trials, each later trial's recorded time / the best before it), None for a table of
    a kernel not built in."""
    from search_spaces import get_kernel
    from tuner.backends.replay import ReplayBackend, load_table
    from tuner.errors import InvalidRequest
    from tuner.search import DEFAULT_STOP_CHANCE, SearchOptions, known_good_first, run_search

    table = load_table(path)
    try:
        kernel = get_kernel(table.kernel)
    except (KeyError, InvalidRequest, ValueError):
        return None
    backend = ReplayBackend(table)
    start = known_good_first(kernel, table.shape, table.dtype, backend.restrict(kernel.space()))
    result = run_search(kernel, table.shape, table.dtype, backend,
                        SearchOptions(trials=48, seed=seed, warm_start=start, retime_rounds=0,
                                      stop_chance=DEFAULT_STOP_CHANCE))
    best: float | None = None
    out = []
    for m in result.trials:
        if not (m.ok and m.p50_ms):
            continue
        if best is not None:
            out.append(m.p50_ms / best)
        best = m.p50_ms if best is None else min(best, m.p50_ms)
    return len(result.trials), out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", default="tests/data/replay")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    lines = ["# Trials a stricter quick-timing rejection would skip (replay tables)", "",
             f"Command: `python3 -m bench.quick_reject_replay {' '.join(sys.argv[1:])}`", "",
             "Each row: one search (default strategy and stop rule, known-good configs first, "
             f"seeds {', '.join(map(str, SEEDS))}); the counts of trials after the first whose "
             "recorded time was over each factor x the best before them.", "",
             "| table | seed | trials | " + " | ".join(f"> {f:g}x" for f in FACTORS) + " |",
             "|---|---|---|" + "---|" * len(FACTORS)]
    every: list[float] = []
    skipped = []
    for path in sorted(glob.glob(f"{args.tables}/**/*.json", recursive=True)):
        for seed in SEEDS:
            got = ratios(path, seed)
            if got is None:
                skipped.append(Path(path).name)
                break
            trials, rs = got
            every += rs
            lines.append(f"| {Path(path).name} | {seed} | {trials} | "
                         + " | ".join(f"{sum(r > f for r in rs)} of {len(rs)}" for f in FACTORS)
                         + " |")
    lines += ["", f"All {len(every)} later trials: " + ", ".join(
        f"over {f:g}x {sum(r > f for r in every) / len(every):.1%}" for f in FACTORS) + ".",
        "", "Tables of kernels not built in (left out): " + (", ".join(skipped) or "none") + "."]
    text = "\n".join(lines) + "\n"
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
