"""The worker's roofline stop (``TUNER_ROOFLINE_STOP``) against a 1% quality band, on the
recorded development tables, before any GPU run.

The last setting, "memory-bound only", is the worker's rule from the eighteenth session: a
compute floor (cuBLAS's measured speed, which tuned kernels pass) stops nothing.
(The eighteenth session also added the first two tables of a memory-bound kernel near its floor,
add_layernorm 16384x8192 fp16 and vector_add 2^25 fp16, recorded for this study:
``results/tuning_time_33k/``.)

The service's add_layernorm 32768x4096 stopped "near roofline" after 4 trials 1.2% off a
96-trial search in every H200 run (issue 33; ``results/tuning_time_33j/``): the rule stops
once the best reaches ``roofline_stop`` of the floor, so it may keep a config up to
``1 - roofline_stop`` off the best. This runs the product's search loop as the worker runs it
(``bench.search_quality.stop_run``'s settings: the replay backend, warm, the default "no
expected gain" rule, four in flight, a 48-trial cap) with the worker's roofline stop added:
the floor from ``tuner.roofline`` with the H200's measured peaks (copy 4.24 TB/s, 16-bit
matmul 675 TFLOP/s: ``bench/NOTES.md``, the targets runs), the model stop's minimum of trials
before a compute floor may stop it, a confirming re-timing. Tables: the matmul, softmax,
add_layernorm and vector_add tables under ``tests/data/replay`` (the built-in kernels there).

    python3 -m bench.roofline_stop_study --seeds 10 --out bench/results/roofline_stop_study.md
"""

from __future__ import annotations

import argparse
import glob
import statistics
import time
from pathlib import Path

from bench.report import command_text, write_report

TABLES = ("tests/data/replay/holdout/*.json", "tests/data/replay/*.json",
          "tests/data/replay/nongemm/softmax_*.json",
          "tests/data/replay/nongemm/add_layernorm_*.json",
          "tests/data/replay/nongemm/vector_add_*.json")
#: the H200's measured ceilings (bench/NOTES.md: the targets runs' peaks)
COPY_GBPS = 4240.0
MATMUL_TFLOPS = 675.0
SETTINGS: tuple[tuple[float, bool], ...] = (
    (0.0, False), (0.95, False), (0.97, False), (0.98, False), (0.99, False), (0.95, True))
BAND = 0.01


def run(path: str, seed: int, stop: float,
        memory_only: bool = False) -> tuple[int, float, str, float | None]:
    """One warm search of ``path``'s table: (trials, best / optimum, stop reason, optimum /
    floor). ``memory_only``: the roofline stop only where the floor is the copy bandwidth's."""
    from search_spaces import get_kernel
    from tuner.backends.replay import ReplayBackend, load_table
    from tuner.roofline import roofline
    from tuner.search import (
        DEFAULT_STOP_CHANCE,
        DEFAULT_STOP_MIN_TRIALS,
        SearchOptions,
        known_good_first,
        run_search,
    )

    table = load_table(path)
    kernel = get_kernel(table.kernel)
    backend = ReplayBackend(table)
    roof = roofline(kernel, table.shape, table.dtype, COPY_GBPS, MATMUL_TFLOPS)
    start = known_good_first(kernel, table.shape, table.dtype, backend.restrict(kernel.space()))
    if memory_only and roof is not None and roof.bound != "memory":
        stop = 0.0
    options = SearchOptions(trials=48, seed=seed, warm_start=start, retime_rounds=0,
                            stop_chance=DEFAULT_STOP_CHANCE, batch_size=4,
                            floor_ms=roof.floor_ms if roof and stop else None,
                            roofline_stop=stop or None,
                            roofline_min_trials=(DEFAULT_STOP_MIN_TRIALS
                                                 if roof and roof.bound == "compute" else 0))
    result = run_search(kernel, table.shape, table.dtype, backend, options)
    best = min(m.p50_ms for m in result.trials if m.ok and m.p50_ms is not None)
    return (len(result.trials), best / table.best_ms, result.stop_reason,
            roof.floor_ms / table.best_ms if roof else None)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    paths = sorted(p for pattern in TABLES for p in glob.glob(pattern))
    t0 = time.monotonic()
    lines = ["# The roofline stop against a 1% band, on the recorded tables", "",
             f"Command: `{command_text('roofline_stop_study', argv)}` (CPU, "
             f"{time.strftime('%Y-%m-%d')})", "",
             f"{len(paths)} tables, {args.seeds} seeds each, warm, the default stop rule, four "
             f"in flight, a 48-trial cap; the floor at {COPY_GBPS / 1000:.2f} TB/s and "
             f"{MATMUL_TFLOPS:.0f} TFLOP/s. within: runs that ended within {BAND:.0%} of the "
             "table's optimum. roofline stop 0: off.", "",
             "| roofline stop | within | worst best/opt | trials mean | stopped near the roofline "
             "| of those, outside the band | tables with a run off |",
             "|---|---|---|---|---|---|---|"]
    reach: dict[str, float | None] = {}
    for stop, memory_only in SETTINGS:
        rows = []
        for path in paths:
            for seed in range(args.seeds):
                used, ratio, reason, opt_of_floor = run(path, seed, stop, memory_only)
                rows.append((Path(path).stem, used, ratio, reason))
                reach[Path(path).stem] = opt_of_floor
        roofed = [r for r in rows if r[3] == "near roofline"]
        off = sorted({r[0] for r in rows if r[2] > 1 + BAND})
        label = f"{stop:g}" + (" (memory-bound only)" if memory_only else "")
        lines.append(f"| {label} | {sum(r[2] <= 1 + BAND for r in rows)} of {len(rows)} | "
                     f"{max(r[2] for r in rows):.3f} | "
                     f"{statistics.mean(r[1] for r in rows):.1f} | {len(roofed)} | "
                     f"{sum(r[2] > 1 + BAND for r in roofed)} | {', '.join(off) or '-'} |")
    lines += ["", "Each table's optimum against its floor (1.00: at the roofline; under 1: the "
              "optimum beats the measured peak, a GEMM faster than cuBLAS):", "",
              "| table | optimum / floor |", "|---|---|"]
    lines += [f"| {name} | {'-' if v is None else f'{1 / v:.3f}'} |"
              for name, v in sorted(reach.items())]
    lines += ["", f"({time.monotonic() - t0:.0f} s)"]
    return write_report(lines, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
