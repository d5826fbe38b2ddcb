"""Re-timing the finalists entry by entry or interleaved run by run: which picks better?

The last step of every search re-times its finalists (and the stored best) side by side, and
the pick is the lowest median of the rounds. Entry by entry, each round timed one config for
20 ms, then the next: on the H200's compute-bound shapes the rounds' medians spread 2-11%
(``tuning_time_33k``'s store: 8192^3 6-11%, 1500x3001x999 2.2-2.4%) because the clock moves
under the power limiter between one config's 20 ms and the next's. Interleaved
(``tuner.gpu_timer.do_bench_interleaved``), each timed run of one config is followed by one
of the next, so a drift moves all of them alike. The issue's quality check (a fast job's best
within 1% of a 96-trial search's, both re-timed side by side) rests on the same re-timing.

The product re-times entry by entry unless ``TUNER_RETIME_INTERLEAVED=1``
(``TimingOptions.retime_interleaved``, which this probe's first run on an H200 decided:
``results/retime_pairing_h200/``); the probe asks for each method itself.

For each problem of a service's store (``bench.tuning_time --save``'s ``service.db``), its
re-timed finalists are re-timed ``--repeats`` times with the product's own
``tuner.backends.child.retime`` (its defaults: at most 5 rounds, at least 3, stopping once
``separated``), the two methods alternating. Per problem and method: the spread (sd across
repeats) of each finalist's log time ratio to the first finalist, the rounds run, and the
pick's regret: the picked config's time over the fastest's, both by the pooled median of
every round of both methods (the best estimate of each config's time this run has).

    python3 -m bench.retime_pairing_probe /tmp/tt/service.db --out $OUT/retime_pairing.md
"""

from __future__ import annotations

import argparse
import json
import math
import sqlite3
import statistics
import sys
from typing import Any

from bench.report import command_text, write_report

METHODS = (("entry by entry", False), ("interleaved", True))


def finalists(db: str) -> list[tuple[str, dict[str, int], str, list[dict[str, Any]]]]:
    """(kernel, shape, dtype, configs) per task of the store: the configs its search re-timed
    (the finalists and the stored best it met), fastest re-timed first."""
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        found = con.execute(
            "select k.id, j.kernel, k.shape, j.dtype, t.config, t.retimed_p50_ms from trials t "
            "join tasks k on k.id = t.task_id join jobs j on j.id = k.job_id "
            "where t.retimed_p50_ms is not null order by k.id, t.retimed_p50_ms").fetchall()
    finally:
        con.close()
    by_task: dict[int, tuple[str, dict[str, int], str, list[dict[str, Any]]]] = {}
    for task, kernel, shape, dtype, config, _ms in found:
        entry = by_task.setdefault(task, (kernel, json.loads(shape), dtype, []))
        entry[3].append(json.loads(config))
    return [e for e in by_task.values() if len(e[3]) >= 2]


def regret(picks: list[int], pooled: list[float]) -> tuple[float, float]:
    """The mean and the largest of picked / fastest, by the pooled medians."""
    best = min(pooled)
    ratios = [pooled[i] / best for i in picks]
    return statistics.mean(ratios), max(ratios)


def probe(kernel_name: str, shape: dict[str, int], dtype: str,
          configs: list[dict[str, Any]], repeats: int) -> list[str]:
    from search_spaces import get_kernel
    from tuner.backends.base import TimingOptions
    from tuner.backends.child import ChildState, retime
    from tuner.config import KernelConfig

    state = ChildState("cuda")
    state.kernel, state.shape, state.dtype = get_kernel(kernel_name), shape, dtype
    chosen = [KernelConfig(c) for c in configs]
    timing = TimingOptions()
    rounds: dict[bool, list[list[list[float]]]] = {flag: [] for _, flag in METHODS}
    for r in range(repeats):  # alternating, the first method swapped every repeat
        order = METHODS if r % 2 == 0 else METHODS[::-1]
        for _name, flag in order:
            out = retime(state, chosen, 5, timing, interleave=flag)
            # each measurement's p50 is its rounds' median; p20/p80 kept as the spread
            rounds[flag].append([[m.p20_ms or 0.0, m.p50_ms or 0.0, m.p80_ms or 0.0,
                                  float(m.extra.get("rounds", 0))] for m in out])
    pooled = [statistics.median(rep[i][1] for flag in rounds for rep in rounds[flag])
              for i in range(len(chosen))]
    dims = ",".join(f"{k}={v}" for k, v in shape.items())
    lines = [f"## {kernel_name} {dims} {dtype}", "",
             f"{len(chosen)} configs; pooled medians (ms): "
             + ", ".join(f"{p:.4f}" for p in pooled)
             + f"; the fastest by them: `{chosen[pooled.index(min(pooled))].key()}`.", "",
             "| method | rounds (mean) | round spread p20-p80 (mean) | sd of log ratio to the "
             "first, % | picks the fastest | regret mean | regret max |",
             "|---|---|---|---|---|---|---|"]
    fastest = pooled.index(min(pooled))
    for name, flag in METHODS:
        reps = rounds[flag]
        sds = []
        for i in range(1, len(chosen)):
            logs = [math.log(rep[i][1] / rep[0][1]) for rep in reps]
            sds.append(100 * statistics.pstdev(logs))
        picks = [min(range(len(chosen)), key=lambda i, rep=rep: rep[i][1]) for rep in reps]
        mean_regret, max_regret = regret(picks, pooled)
        spread = statistics.mean((rep[i][2] - rep[i][0]) / rep[i][1]
                                 for rep in reps for i in range(len(chosen)))
        lines.append(
            f"| {name} | {statistics.mean(rep[0][3] for rep in reps):.1f} | {spread:.2%} | "
            + ", ".join(f"{sd:.2f}" for sd in sds)
            + f" | {sum(p == fastest for p in picks)} of {len(picks)} | {mean_regret:.4f} | "
            f"{max_regret:.4f} |")
    return lines + [""]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store", help="a tuner SQLite store with re-timed finalists")
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    import torch
    import triton

    from bench.tuning_time import gpu_state

    problems = finalists(args.store)
    if not problems:
        print("no task with two or more re-timed configs in the store", file=sys.stderr)
        return 1
    lines = ["# Re-timing the finalists entry by entry or interleaved", "",
             f"Command: `{command_text('retime_pairing_probe', argv)}`", "",
             f"{torch.cuda.get_device_name(0)}, Triton {triton.__version__}, torch "
             f"{torch.__version__}; {args.repeats} re-timings per method and problem, the "
             "methods alternating; each the product's `child.retime` (eager-flushed, at most "
             "5 rounds of 20 ms per config, at least 3).", "", f"GPU state before: {gpu_state()}",
             ""]
    for kernel, shape, dtype, configs in problems:
        lines += probe(kernel, shape, dtype, configs, args.repeats)
        print("\n".join(lines[-6:]), flush=True)
    lines.append(f"GPU state after: {gpu_state()}")
    return write_report(lines, args.out)


if __name__ == "__main__":
    sys.exit(main())
