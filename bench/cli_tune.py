"""Issue 2 on the GPU: ``tuner tune matmul`` end to end, against torch.matmul in the same run.

    python3 -m bench.cli_tune --out bench/results/cli_tune_h200.md [--trials 48]

Runs the real CLI (a subprocess, as a user would) for each shape, then times torch.matmul
(cuBLAS) on the same shape with the same timer (do_bench, L2 flushed, median), and writes a
markdown table with the commands, best configs, ms, TFLOP/s and the jobs' wall times.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parents[1]
SHAPES = [("M=4096,N=4096,K=4096", "float16"), ("M=16,N=14336,K=4096", "bfloat16")]


def bench_args(trials: int, db: str) -> argparse.Namespace:
    """The options of a benchmark of ``tuner tune``: ``--out`` (its markdown table),
    ``--trials`` a shape and ``--db``."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--trials", type=int, default=trials)
    ap.add_argument("--db", default=db)
    return ap.parse_args()


class CliRun(NamedTuple):
    cmd: list[str]
    returncode: int
    #: the command's JSON summary; None where it printed none
    summary: dict[str, Any] | None
    wall_s: float


def run_cli(kernel: str, shape: str, dtype: str, trials: int, db: str) -> CliRun:
    """``tuner tune KERNEL --json`` on the GPU as a user runs it (a subprocess, from the
    checkout's root); the tail of its stderr is printed where it failed."""
    cmd = [sys.executable, "-m", "tuner.app.cli", "--db", db, "tune", kernel, "--shape", shape,
           "--dtype", dtype, "--trials", str(trials), "--backend", "cuda", "--json"]
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
    wall = time.monotonic() - t0
    if out.returncode != 0:
        print(out.stderr[-4000:], file=sys.stderr)
    lines = out.stdout.strip().splitlines()
    return CliRun(cmd, out.returncode, json.loads(lines[-1]) if lines else None, wall)


def torch_ms(shape: str, dtype: str) -> float:
    import torch
    import triton.testing

    dims = dict(part.split("=") for part in shape.split(","))
    m, n, k = int(dims["M"]), int(dims["N"]), int(dims["K"])
    dt = getattr(torch, dtype)
    a = torch.randn(m, k, device="cuda", dtype=dt)
    b = torch.randn(k, n, device="cuda", dtype=dt)
    q = triton.testing.do_bench(lambda: torch.matmul(a, b), warmup=25, rep=100,
                                quantiles=[0.2, 0.5, 0.8])
    return float(q[1])


def main() -> None:
    args = bench_args(trials=48, db="sqlite:////tmp/tuner-bench.db")
    rows = []
    for shape, dtype in SHAPES:
        cmd, _rc, summary, wall = run_cli("matmul", shape, dtype, args.trials, args.db)
        if summary is None:
            raise SystemExit(f"no summary from {' '.join(cmd)}")
        rows.append((shape, dtype, cmd, summary, wall))
        print(json.dumps(summary), flush=True)
    lines = ["# `tuner tune matmul` on the GPU, against torch.matmul in the same run", "",
             f"Command: `python3 -m bench.cli_tune --out {args.out} --trials {args.trials}`",
             "", "| shape | dtype | best config | tuned ms | TFLOP/s | torch.matmul ms | "
             "torch TFLOP/s | tuned / torch time | trials (outcomes) | job wall s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for shape, dtype, _cmd, s, wall in rows:
        ref = torch_ms(shape, dtype)
        flops = s["tflops"] * s["best_ms"] if s.get("tflops") else None
        ref_tflops = flops / ref if flops else float("nan")
        best_ms = s.get("best_ms") or float("nan")
        lines.append(
            f"| {shape} | {dtype} | `{json.dumps(s.get('best_config'))}` | {best_ms:.4f} | "
            f"{(s.get('tflops') or float('nan')):.1f} | {ref:.4f} | {ref_tflops:.1f} | "
            f"{best_ms / ref:.2f}x | {s['trials']} ({s['outcomes']}, {s['pruned']} pruned) | "
            f"{wall:.1f} |")
    lines += ["", "Device: " + str(rows[0][3].get("device")), "",
              "Each CLI command:", ""] + [f"    {' '.join(r[2])}" for r in rows]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    os.environ.pop("TRITON_INTERPRET", None)
    main()
