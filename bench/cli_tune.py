"""Issue 2 on the GPU: ``tuner tune matmul`` end to end, against torch.matmul in the same run.

    python3 bench/cli_tune.py --out bench/results/cli_tune_h200.md [--trials 48]

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

SHAPES = [("M=4096,N=4096,K=4096", "float16"), ("M=16,N=14336,K=4096", "bfloat16")]


def run_cli(shape: str, dtype: str, trials: int, db: str) -> tuple[list[str], dict, float]:
    cmd = [sys.executable, "-m", "tuner.cli", "--db", db, "tune", "matmul", "--shape", shape,
           "--dtype", dtype, "--trials", str(trials), "--backend", "cuda", "--json"]
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.monotonic() - t0
    if out.returncode != 0:
        print(out.stderr[-4000:], file=sys.stderr)
    return cmd, json.loads(out.stdout.strip().splitlines()[-1]), wall


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
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--trials", type=int, default=48)
    ap.add_argument("--db", default="sqlite:////tmp/tuner-bench.db")
    args = ap.parse_args()
    rows = []
    for shape, dtype in SHAPES:
        cmd, summary, wall = run_cli(shape, dtype, args.trials, args.db)
        rows.append((shape, dtype, cmd, summary, wall))
        print(json.dumps(summary), flush=True)
    lines = ["# `tuner tune matmul` on the GPU, against torch.matmul in the same run", "",
             f"Command: `python3 bench/cli_tune.py --out {args.out} --trials {args.trials}`",
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
