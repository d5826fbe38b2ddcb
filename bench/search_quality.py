"""How close each strategy gets to the optimum of exhaustively recorded replay tables.

    python3 -m bench.search_quality --out bench/results/search_quality.md [--seeds 10]
        [--strategies model,tpe,...] [--slow-seeds 2] [extra_table.json ...]
    python3 -m bench.search_quality --kernel softmax --strategies tpe,gp,model,random \\
        'tests/data/replay/nongemm/softmax_*.json' [--out bench/results/...md]

Tables: every ``*.json`` under ``--tables-dir`` (default tests/data/replay, the matmul H200
tables) plus the paths and globs given as arguments; with ``--kernel``, only the tables of that
kernel (their ``"kernel"`` field). Each table is searched as its own kernel, loaded by name
through ``search_spaces.get_kernel`` (plugins included), so the ``model`` strategy ranks with that
kernel's prior (flat for a kernel without one). Each strategy runs the product's search loop
(tuner.search.run_search on the ReplayBackend, exactly as the worker does) with a 48-trial budget;
the ratio best-found / table optimum is read after 16, 32 and 48 trials (the loop asks in batches
of <= 4, so the first 16 trials of a 48-trial run are what a 16-trial run measures, up to the
strategies' budget-dependent startup length). Two settings: cold (the strategy alone) and warm
(the product's default: the kernel's known-good configs tried first; they count against the
budget). Score: (random - strategy) / (random - 1) on median ratios, so random search is 0 and the
optimum 1. CPU only; runs in parallel over processes.

    python3 -m bench.search_quality --stop-rule [--seeds 5] [--out ...md] [tables ...]

``--stop-rule``: the default strategy with the search loop's default "no expected gain" stop
(``SearchOptions.stop_chance``), the budget (48) as the cap: per table, the trials each run used
and its best / the table's optimum when it stopped, cold and warm, and the runs that stopped
more than the band (2%) off the optimum.
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

BUDGETS: tuple[int, ...] = (16, 32, 48)
#: strategies whose model fit costs seconds per ask on a CPU: fewer seeds (--slow-seeds)
SLOW = ("gp",)

Job = tuple[str, str, int, bool, tuple[int, ...]]


def best_after(trials: list, n: int) -> float:
    ok = [m.p50_ms for m in trials[:n] if m.ok and m.p50_ms]
    return min(ok) if ok else float("inf")


def one_run(job: Job) -> tuple[str, bool, str, list[float]]:
    path, strategy, seed, warm, budgets = job
    from search_spaces import get_kernel
    from tuner.backends.replay import ReplayBackend, load_table
    from tuner.search import SearchOptions, run_search

    table = load_table(path)
    kernel = get_kernel(table.kernel)
    start = kernel.known_good_configs(table.shape, table.dtype) if warm else []
    result = run_search(kernel, table.shape, table.dtype, ReplayBackend(table),
                        SearchOptions(trials=max(budgets), seed=seed, strategy=strategy,
                                      warm_start=start, retime_rounds=0))
    return strategy, warm, path, [best_after(result.trials, b) / table.best_ms for b in budgets]


StopJob = tuple[str, int, bool, int, int]
#: what the stop rule is judged by: a stopped run's best within this of the optimum
STOP_BAND = 0.02


def stop_run(job: StopJob) -> tuple[str, bool, int, float, str]:
    """One search of a table with the default stop rule: (table, warm, trials used, best /
    optimum, stop reason)."""
    path, seed, warm, cap, batch = job
    from search_spaces import get_kernel
    from tuner.backends.replay import ReplayBackend, load_table
    from tuner.search import DEFAULT_STOP_CHANCE, SearchOptions, known_good_first, run_search

    table = load_table(path)
    kernel = get_kernel(table.kernel)
    backend = ReplayBackend(table)
    # warm as a worker starts a shape nothing is stored for: the known-good configs its
    # prior ranks best (tuner.app.worker.warm_start_configs)
    start = known_good_first(kernel, table.shape, table.dtype,
                             backend.restrict(kernel.space())) if warm else []
    result = run_search(kernel, table.shape, table.dtype, backend,
                        SearchOptions(trials=cap, seed=seed, warm_start=start, retime_rounds=0,
                                      stop_chance=DEFAULT_STOP_CHANCE,
                                      batch_size=batch or None))
    used = len(result.trials)
    return path, warm, used, best_after(result.trials, used) / table.best_ms, result.stop_reason


StopRow = tuple[int, float, str]


def stop_rule_table(runs: dict[tuple[str, bool], list[StopRow]], names: list[str],
                    warm: bool, band: float = STOP_BAND) -> list[str]:
    """Per table: trials used (median, max), best / optimum (median, worst), how the runs
    stopped, and the runs the rule stopped early more than ``band`` off the optimum."""
    title = "warm (the known-good configs the prior ranks best first)" if warm else "cold"
    lines = [f"### {title}", "",
             "| table | runs | trials median | trials max | best/opt median | best/opt worst | "
             "stopped by the rule | stopped by the rule outside the band |",
             "|---|---|---|---|---|---|---|---|"]
    for path in names:
        rows = runs.get((path, warm), [])
        if not rows:
            continue
        used = [r[0] for r in rows]
        ratio = [r[1] for r in rows]
        ruled = [r for r in rows if r[2] == "no expected gain"]
        bad = [r for r in ruled if r[1] > 1 + band]
        lines.append(f"| {Path(path).stem} | {len(rows)} | {statistics.median(used):g} | "
                     f"{max(used)} | {statistics.median(ratio):.3f} | {max(ratio):.3f} | "
                     f"{len(ruled)} | {len(bad)} |")
    every = [r for (_p, w), rows in runs.items() if w == warm for r in rows]
    if every:
        within = sum(r[1] <= 1 + band for r in every)
        lines.append(f"| **all** | {len(every)} | {statistics.median(r[0] for r in every):g} | "
                     f"{max(r[0] for r in every)} | "
                     f"{statistics.median(r[1] for r in every):.3f} | "
                     f"{max(r[1] for r in every):.3f} | "
                     f"{sum(r[2] == 'no expected gain' for r in every)} | "
                     f"{sum(r[2] == 'no expected gain' and r[1] > 1 + band for r in every)} |")
        lines += ["", f"{within} of {len(every)} runs ended within {band:.0%} of the optimum."]
    return lines + [""]


def stop_rule_main(args: argparse.Namespace, argv: Sequence[str], paths: list[str]) -> str:
    from tuner.search import (
        DEFAULT_STOP_BAND,
        DEFAULT_STOP_CHANCE,
        DEFAULT_STOP_MIN_TRIALS,
        DEFAULT_STOP_QUIET,
    )

    cap = max(int(b) for b in args.budgets.split(","))
    settings = (False,) if args.cold_only else (False, True)
    jobs: list[StopJob] = [(p, seed, warm, cap, args.batch) for warm in settings for p in paths
                           for seed in range(args.seeds)]
    t0 = time.monotonic()
    runs: dict[tuple[str, bool], list[StopRow]] = {}
    with ProcessPoolExecutor(max(1, args.jobs)) as pool:
        for path, warm, used, ratio, reason in pool.map(stop_run, jobs):
            runs.setdefault((path, warm), []).append((used, ratio, reason))
    lines = ["# The \"no expected gain\" stop on replay tables", "",
             f"Command: `python3 -m bench.search_quality {' '.join(argv)}` (CPU, "
             f"{time.strftime('%Y-%m-%d')}, {time.monotonic() - t0:.0f} s)", "",
             f"Default strategy, {args.seeds} seeds, budget {cap} as the cap; the stop: at least "
             f"{DEFAULT_STOP_MIN_TRIALS} trials, no improvement for {DEFAULT_STOP_QUIET}, and the "
             f"model's chance that an untried config beats the best by over "
             f"{DEFAULT_STOP_BAND:.0%} under {DEFAULT_STOP_CHANCE:.0%}. best/opt: the best "
             "found when the run ended / the table's optimum. Configs asked before any of them "
             f"is told: {args.batch or 'the replay backend own (1)'}.", ""]
    for warm in settings:
        lines += stop_rule_table(runs, paths, warm)
    return "\n".join(lines) + "\n"


Ratios = dict[str, dict[int, list[float]]]


def section(title: str, ratios: Ratios, seeds: dict[str, int], ntables: int,
            budgets: Sequence[int] = BUDGETS) -> list[str]:
    rand = {b: statistics.median(ratios["random"][b]) for b in budgets}
    lines = [f"### {title}", "",
             "| strategy | runs | " + " | ".join(
                 f"median @{b} | worst @{b} | score @{b}" for b in budgets) + " |",
             "|---|---|" + "---|" * (3 * len(budgets))]
    for s in sorted(ratios, key=lambda s: statistics.median(ratios[s][budgets[0]])):
        cells = []
        for b in budgets:
            med = statistics.median(ratios[s][b])
            score = (rand[b] - med) / (rand[b] - 1) if rand[b] > 1 else float("nan")
            cells.append(f"{med:.3f} | {max(ratios[s][b]):.3f} | {score:.2f}")
        lines.append(f"| {s} | {ntables}x{seeds[s]} | " + " | ".join(cells) + " |")
    return lines + [""]


def per_table(title: str, rows: dict[tuple[str, str], list[list[float]]],
              names: list[str], budgets: Sequence[int] = BUDGETS) -> list[str]:
    strategies = sorted({s for s, _ in rows})
    lines = [f"#### {title}: median ratio @{budgets[0]} / @{budgets[-1]} per table", "",
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


def by_kernel(title: str, rows: dict[tuple[str, str], list[list[float]]],
              kernels: dict[str, str], budgets: Sequence[int] = BUDGETS) -> list[str]:
    """Median ratio @first / @last budget per kernel (over its tables x seeds) and strategy."""
    strategies = sorted({s for s, _ in rows})
    lines = [f"#### {title}: median ratio @{budgets[0]} / @{budgets[-1]} per kernel", "",
             "| kernel | " + " | ".join(strategies) + " |", "|---|" + "---|" * len(strategies)]
    for kernel in sorted(set(kernels.values())):
        cells = []
        for s in strategies:
            v = [x for (s2, path), runs in rows.items() if s2 == s and kernels[path] == kernel
                 for x in runs]
            cells.append(f"{statistics.median([x[0] for x in v]):.3f} / "
                         f"{statistics.median([x[-1] for x in v]):.3f}" if v else "-")
        lines.append(f"| {kernel} | " + " | ".join(cells) + " |")
    return lines + [""]


def table_paths(tables_dir: str, patterns: Iterable[str]) -> list[str]:
    """``*.json`` of ``tables_dir`` ('' for none) plus each path or glob, once each."""
    paths = [str(p) for p in sorted(Path(tables_dir).glob("*.json"))] if tables_dir else []
    for pattern in patterns:
        paths += sorted(glob.glob(pattern, recursive=True)) or [pattern]
    return list(dict.fromkeys(paths))


def describe_tables(paths: list[str]) -> list[str]:
    """One row per table: its kernel, problem, coverage, optimum and torch baseline, and what
    ``auto`` means for its kernel."""
    import json

    from search_spaces import get_kernel
    from tuner.backends.replay import load_table
    from tuner.space import ProblemContext
    from tuner.strategies import kernel_has_prior, resolve_strategy

    lines = ["| table | kernel | shape | dtype | configs with a time / in the table | whole "
             "space recorded | optimum ms | best the constraints keep | torch ms | `auto` |",
             "|---" * 10 + "|"]
    for path in paths:
        t = load_table(path)
        kernel = get_kernel(t.kernel)
        raw = json.loads(Path(path).read_text())
        cov = raw.get("coverage", {})
        if cov:
            whole = ("yes" if cov.get("complete") else f"no: {cov.get('measured')} of "
                     f"{cov.get('space')} ({cov.get('stopped') or 'cut'})")
        else:  # recorded before tables said: only the timing note tells
            timing = str(raw.get("timing", "")).lower()
            whole = ("no: the constraints' feasible configs only" if "feasible" in timing
                     else "no" if "cut" in timing else "-") + (", cut" if "cut" in timing else "")
        torch_ms = ", ".join(f"{v:.4f}" for v in t.reference_ms.values()) or "-"
        ctx = ProblemContext(t.shape, t.dtype)  # what the search loop sees on a replay table
        auto = resolve_strategy("auto", kernel_has_prior(kernel, t.shape, t.dtype, ctx))
        shape = "x".join(str(v) for v in t.shape.values())
        lines.append(f"| {Path(path).stem} | {t.kernel} | {shape} | {t.dtype} | "
                     f"{len(t.ok_times())} / {len(t.results)} | {whole} | {t.best_ms:.4f} | "
                     f"{kept_best(t, kernel.space(), ctx)} | {torch_ms} | {auto} |")
    return lines + [""]


def kept_best(table: Any, space: Any, ctx: Any) -> str:
    """The fastest config the kernel's constraints keep, as a ratio to the table's optimum: a
    search never measures a pruned config, so above 1.000 no strategy can reach the optimum
    (then the reason the optimum is pruned)."""
    kept = [v for c, v in table.results.items()
            if isinstance(v, float) and space.violation(c, ctx) is None]
    if not kept:
        return "none"
    ratio = min(kept) / table.best_ms
    if ratio <= 1.0:
        return "1.000"
    best = min((v, c) for c, v in table.results.items() if isinstance(v, float))[1]
    return f"{ratio:.3f} (optimum pruned: {space.violation(best, ctx)})"


def select_kernel(paths: list[str], kernel: str | None) -> list[str]:
    from tuner.backends.replay import load_table

    return [p for p in paths if kernel is None or load_table(p).kernel == kernel]


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    from tuner.strategies import STRATEGIES

    ap = argparse.ArgumentParser()
    ap.add_argument("tables", nargs="*", help="more replay tables: paths or globs")
    ap.add_argument("--kernel", help="only the tables of this kernel (a registered name)")
    ap.add_argument("--out", help="markdown file (default with --kernel: "
                                  "bench/results/search_quality_<kernel>.md)")
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--slow-seeds", type=int, default=2, help=f"seeds for {', '.join(SLOW)}")
    ap.add_argument("--tables-dir", default="tests/data/replay", help="'' for none")
    ap.add_argument("--strategies", default=",".join(s for s in sorted(STRATEGIES)
                                                   if not STRATEGIES[s].systematic))
    ap.add_argument("--budgets", default=",".join(map(str, BUDGETS)),
                    help="trial counts the ratio is read at; the largest is the run's budget")
    ap.add_argument("--cold-only", action="store_true", help="skip the warm-start setting")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--batch", type=int, default=0,
                    help="with --stop-rule: configs asked before any is told (the service's "
                         "search keeps up to 4 in flight; 0: the replay backend's own, 1)")
    ap.add_argument("--stop-rule", action="store_true",
                    help="the default strategy with the default stop rule: trials used and "
                         "best/optimum per table")
    return ap.parse_args(argv)


def run_jobs(jobs: list[Job], processes: int) -> Iterable[tuple[str, bool, str, list[float]]]:
    if processes <= 1:
        yield from map(one_run, jobs)
        return
    # the slow strategies' runs first, one job at a time: no process is left with a run of
    # them at the end while the others idle (a GP run on a 405-config table: ~140 s here)
    ordered = sorted(jobs, key=lambda job: job[1] not in SLOW)
    with ProcessPoolExecutor(processes) as pool:
        yield from pool.map(one_run, ordered)


def report(args: argparse.Namespace, argv: Sequence[str], paths: list[str],
           ratios: dict[bool, Ratios], rows: dict[bool, dict[tuple[str, str], list[list[float]]]],
           seeds: dict[str, int], budgets: tuple[int, ...], wall: float) -> str:
    from tuner.backends.replay import load_table
    from tuner.strategies import DEFAULT_STRATEGY, DEFAULT_STRATEGY_WITHOUT_PRIOR

    command = "python3 -m bench.search_quality " + " ".join(argv)
    what = f"{args.kernel} replay tables" if args.kernel else "replay tables"
    lines = [f"# Search quality on {what}", "",
             f"Command: `{command}` (CPU, {time.strftime('%Y-%m-%d')}, "
             f"{wall:.0f} s on {args.jobs} processes)", "",
             f"{len(paths)} tables:", ""] + describe_tables(paths) + [
             "Ratio = best found / the table's optimum (1.000 = found the best), median and "
             "worst over tables x seeds (runs). Score: 0 = random search, 1 = the optimum "
             f"(median ratios). `auto`: `{DEFAULT_STRATEGY}` for a kernel with a prior, "
             f"`{DEFAULT_STRATEGY_WITHOUT_PRIOR}` without; `model` ranks with the kernel's own "
             "prior (flat without one).", ""]
    lines += section("cold: the strategy alone", ratios[False], seeds, len(paths), budgets)
    if not args.cold_only:
        lines += section("warm: the kernel's known-good configs first (the product's default)",
                         ratios[True], seeds, len(paths), budgets)
    kernels = {p: load_table(p).kernel for p in paths}
    if len(set(kernels.values())) > 1:
        lines += by_kernel("cold", rows[False], kernels, budgets)
    lines += per_table("cold", rows[False], paths, budgets)
    if not args.cold_only:
        lines += per_table("warm", rows[True], paths, budgets)
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    budgets = tuple(sorted(int(b) for b in args.budgets.split(",")))
    paths = select_kernel(table_paths(args.tables_dir, args.tables), args.kernel)
    if not paths:
        which = f" of kernel {args.kernel}" if args.kernel else ""
        print(f"search_quality: no replay tables{which}; pass table paths or globs",
              file=sys.stderr)
        return 2
    if args.stop_rule:
        text = stop_rule_main(args, argv, paths)
        if args.out:
            Path(args.out).parent.mkdir(parents=True, exist_ok=True)
            Path(args.out).write_text(text)
        print(text)
        return 0
    strategies = args.strategies.split(",")
    if "random" not in strategies:
        strategies.append("random")
    seeds = {s: args.slow_seeds if s in SLOW else args.seeds for s in strategies}
    settings = (False,) if args.cold_only else (False, True)
    jobs: list[Job] = [(p, s, seed, warm, budgets) for warm in settings for p in paths
                       for s in strategies for seed in range(seeds[s])]
    t0 = time.monotonic()
    ratios: dict[bool, Ratios] = {w: {s: {b: [] for b in budgets} for s in strategies}
                                  for w in (False, True)}
    rows: dict[bool, dict[tuple[str, str], list[list[float]]]] = {False: {}, True: {}}
    for s, warm, path, r in run_jobs(jobs, args.jobs):
        for b, x in zip(budgets, r, strict=True):
            ratios[warm][s][b].append(x)
        rows[warm].setdefault((s, path), []).append(r)
    text = report(args, argv, paths, ratios, rows, seeds, budgets, time.monotonic() - t0)
    out = args.out or (f"bench/results/search_quality_{args.kernel}.md" if args.kernel else None)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
