"""How far a trial's timing lands from the same config's re-timing, from a service's store:
the noise the search's pick works against (``bench/noisy_replay_study.py`` models it).

    python3 -m bench.finalist_noise STORE.db --out bench/results/.../finalist_noise.md

Every trial with a re-timed p50 (the finalists, re-timed in interleaved rounds at the end of
their search) against its own trial p50, per task, and over all: the mean and the standard
deviation of log(trial / re-timed), the largest |difference|. Reads the SQLite store alone.
"""

from __future__ import annotations

import argparse
import gzip
import json
import math
import shutil
import sqlite3
import statistics
import sys
import tempfile
from pathlib import Path

from bench.report import command_text, write_report


def rows(db: str) -> list[tuple[str, str, float, float]]:
    """(kernel and shape, config, trial p50, re-timed p50) of every re-timed trial. ``db``:
    a SQLite file, or one gzipped (``.gz``: unpacked to a temporary file first)."""
    if db.endswith(".gz"):
        with tempfile.TemporaryDirectory() as tmp:
            plain = Path(tmp) / "store.db"
            with gzip.open(db, "rb") as src, open(plain, "wb") as dst:
                shutil.copyfileobj(src, dst)
            return rows(str(plain))
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        found = con.execute(
            "select j.kernel, k.shape, t.config_key, t.p50_ms, t.retimed_p50_ms from trials t "
            "join tasks k on k.id = t.task_id join jobs j on j.id = k.job_id "
            "where t.retimed_p50_ms is not null and t.p50_ms is not null "
            "order by t.task_id, t.number").fetchall()
    finally:
        con.close()
    out = []
    for kernel, shape, key, p50, retimed in found:
        dims = ",".join(f"{k}={v}" for k, v in json.loads(shape).items())
        out.append((f"{kernel} {dims}", str(key), float(p50), float(retimed)))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("store", help="a tuner SQLite store (e.g. bench.tuning_time --save's), "
                    "or one gzipped")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    found = rows(args.store)
    if not found:
        print("no re-timed trials in the store", file=sys.stderr)
        return 1
    by_problem: dict[str, list[float]] = {}
    for problem, _key, p50, retimed in found:
        by_problem.setdefault(problem, []).append(math.log(p50 / retimed))
    every = [d for ds in by_problem.values() for d in ds]
    lines = ["# A trial's timing against its re-timing (the finalists)", "",
             f"Command: `{command_text('finalist_noise', argv)}`", "",
             "log(trial p50 / re-timed p50) of each finalist, in %.", "",
             "| problem | finalists | mean | sd | largest |",
             "|---|---|---|---|---|"]
    for problem, ds in by_problem.items():
        lines.append(f"| {problem} | {len(ds)} | {100 * statistics.mean(ds):+.2f} | "
                     f"{100 * statistics.pstdev(ds):.2f} | "
                     f"{100 * max(ds, key=abs):+.2f} |")
    lines.append(f"| all | {len(every)} | {100 * statistics.mean(every):+.2f} | "
                 f"{100 * statistics.pstdev(every):.2f} | {100 * max(every, key=abs):+.2f} |")
    return write_report(lines, args.out)


if __name__ == "__main__":
    raise SystemExit(main())
