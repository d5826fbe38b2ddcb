"""Why a search stopped when it did: the ``model`` strategy replayed over measured trials (CPU).

    python3 -m bench.model_diagnostics trace --db sqlite-file --task 1 \\
        --shape M=777,N=1234,K=4321 --dtype float16
    python3 -m bench.model_diagnostics prior bench/results/variant_tables_h200/*.json

``trace`` tells a stored task's trials (a ``tuner`` database, in trial order) to a fresh
``model`` strategy on the H200's limits (132 SMs, 227 KB of shared memory, sm_90) and prints,
after each, the stop rule's ``improvement_chance`` (of a 2% gain), the model's
``prediction_sigma``, and the untried config that chance rests on. ``prior`` compares matmul's
cost-model prior with the measured times of replay tables (their feasible configs), per table
and ALIGN value: Spearman rank correlation, and the RMS of the log-time residual (its median
removed), over all and over the fastest 20%.
"""

from __future__ import annotations

import argparse
import json
import math
import sqlite3
import sys
from collections.abc import Callable, Sequence

H200 = {"smem": 232448, "sms": 132, "capability": 90}


def trace(db: str, task: int, shape: dict[str, int], dtype: str, band: float = 0.02,
          log: Callable[[str], None] = print) -> None:
    from search_spaces import get_kernel
    from tuner.config import KernelConfig
    from tuner.measurement import Measurement, Outcome
    from tuner.space import ProblemContext
    from tuner.strategies.model_based import ModelStrategy

    kernel = get_kernel("matmul")
    ctx = ProblemContext(shape, dtype, H200["smem"], H200["sms"], H200["capability"])
    model = ModelStrategy(kernel.space(), ctx, 0, 48, kernel.prior)
    log(f"{len(model.configs)} feasible configs; trial, best ms, chance of a {band:.0%} gain, "
        "sigma, the untried config it rests on (predicted ms, support)")
    rows = sqlite3.connect(db).execute(
        "select number, config, p50_ms from trials where task_id = ? order by number", (task,))
    best = math.inf
    for number, text, ms in rows:
        config = KernelConfig(json.loads(text))
        model.tell(config, Measurement(config, Outcome.OK, p20_ms=ms, p50_ms=ms, p80_ms=ms)
                   if ms else Measurement.failure(config, Outcome.COMPILE_ERROR, "failed"))
        best = min(best, ms or math.inf)
        chance, i = model.most_promising(best, band)
        if i is None:
            log(f"{number:3d} {best:.4f} {chance:.3f} nothing untried")
            continue
        pred, support = model._predict()
        log(f"{number:3d} {best:.4f} {chance:.3f} {model.prediction_sigma():.3f} "
            f"{model.configs[i].key()} ({math.exp(pred[i]):.4f}, {support[i]:.2f})")


def prior_fit(paths: Sequence[str], log: Callable[[str], None] = print) -> None:
    import numpy as np
    from scipy.stats import spearmanr

    from search_spaces import get_kernel
    from tuner.config import KernelConfig
    from tuner.space import ProblemContext

    kernel = get_kernel("matmul")
    space = kernel.space()
    log("| table | ALIGN | configs | Spearman | residual RMS | fastest 20% RMS |")
    log("| --- | --- | --- | --- | --- | --- |")
    for path in paths:
        with open(path) as f:
            table = json.load(f)
        ctx = ProblemContext(table["shape"], table["dtype"], H200["smem"], H200["sms"],
                             H200["capability"])
        groups: dict[int, list[tuple[float, float]]] = {}
        for r in table["results"]:
            config = KernelConfig(r["config"])
            if "ms" not in r or space.violation(config, ctx):
                continue
            est = kernel.prior(config, ctx)
            if est is not None and math.isfinite(est):
                groups.setdefault(config.get("ALIGN", 0), []).append((est, math.log(r["ms"])))
        for align, pairs in sorted(groups.items()):
            p, m = (np.array(v) for v in zip(*pairs, strict=True))
            res = m - p - np.median(m - p)
            fast = m <= np.quantile(m, 0.2)
            log(f"| {path.rsplit('/', 1)[-1]} | {align} | {len(pairs)} | "
                f"{spearmanr(p, m).correlation:.2f} | {np.sqrt((res ** 2).mean()):.2f} | "
                f"{np.sqrt((res[fast] ** 2).mean()):.2f} |")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    sub = ap.add_subparsers(dest="command", required=True)
    t = sub.add_parser("trace")
    t.add_argument("--db", required=True, help="a tuner SQLite database file")
    t.add_argument("--task", type=int, required=True)
    t.add_argument("--shape", required=True, help="M=..,N=..,K=..")
    t.add_argument("--dtype", required=True)
    p = sub.add_parser("prior")
    p.add_argument("tables", nargs="+")
    args = ap.parse_args(argv)
    if args.command == "trace":
        shape = {k: int(v) for k, v in (part.split("=") for part in args.shape.split(","))}
        trace(args.db, args.task, shape, args.dtype)
    else:
        prior_fit(args.tables)
    return 0


if __name__ == "__main__":
    sys.exit(main())
