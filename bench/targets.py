"""Issues 13 and 14 on the GPU: every kernel family tuned by the product, against torch.

For each problem, the real CLI tunes it (``tuner tune KERNEL --shape ... --json``, a fresh
database, so nothing stored steers it) and reports its re-timed best beside the kernel's
``baseline`` (torch: cuBLAS, cuDNN, SDPA, ...) timed interleaved with the finalists in the same
measuring child. Per problem: the chosen config, tuned and torch ms, the ratio (torch time /
tuned time: above 1 the tuned kernel is faster), TFLOP/s or TB/s against the peaks measured here
in the same session (copy bandwidth, cuBLAS's best GEMM), the wall time to tune, the target and
by how much it was met or missed; for a kernel with a ``VARIANT`` parameter, every variant's
best trial.

Usage (on the GPU machine)::

    python3 -m bench.targets --only matmul --out bench/results/targets_gemm_h200.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Problem:
    kernel: str
    shape: str  # NAME=VALUE,...
    dtype: str
    #: "x_torch": torch time / tuned time >= target; "bandwidth": achieved bytes/s over the
    #: measured copy bandwidth >= target
    goal: str
    target: float
    issue: int
    note: str = ""


PROBLEMS = [
    Problem("matmul", "M=4096,N=4096,K=4096", "float16", "x_torch", 0.95, 13),
    Problem("matmul", "M=8192,N=8192,K=8192", "bfloat16", "x_torch", 0.95, 13),
    Problem("matmul", "M=4096,N=14336,K=4096", "bfloat16", "x_torch", 0.95, 13),
    Problem("matmul", "M=3072,N=3072,K=3072", "bfloat16", "x_torch", 0.95, 13),
    Problem("matmul", "M=16,N=14336,K=4096", "bfloat16", "x_torch", 1.0, 13),
    Problem("matmul", "M=64,N=8192,K=8192", "float16", "x_torch", 1.0, 13),
    Problem("matmul", "M=777,N=1234,K=4321", "float16", "x_torch", 1.0, 13),
    Problem("matmul", "M=1500,N=3001,K=999", "float16", "x_torch", 1.0, 13,
            "unaligned K and N: the issue's 1.2x on unaligned shapes, to keep"),
    Problem("matmul", "M=8192,N=50257,K=768", "bfloat16", "x_torch", 1.0, 13,
            "GPT-2's logits (vocabulary 50257: B's and C's rows unaligned)"),
    Problem("matmul_epilogue_gelu", "M=4096,N=4096,K=4096", "bfloat16", "x_torch", 1.15, 13,
            "torch: addmm (bias) then gelu(tanh)"),
    Problem("moe_gemm", "M=4096,N=14336,K=4096,E=8,TOPK=2", "bfloat16", "x_torch", 1.0, 13,
            "top-2 routing; torch: a loop of per-expert matmuls"),
    Problem("moe_gemm_variants", "M=4096,N=14336,K=4096,E=8,TOPK=2", "bfloat16", "x_torch", 1.0,
            13, "moe_gemm with VARIANT (tiled, persistent, TMA persistent); torch: as above"),
    Problem("vector_add", "N=268435456", "float16", "bandwidth", 0.90, 14),
    Problem("add_layernorm", "M=32768,N=4096", "float16", "x_torch", 1.8, 14),
    Problem("softmax", "M=8192,N=50257", "bfloat16", "x_torch", 1.2, 14),
    Problem("softmax", "M=16,N=131072", "float16", "bandwidth", 0.5, 14,
            "target: 50% of the bandwidth floor"),
    Problem("flash_attention_causal", "B=4,H=32,S=4096,D=128", "bfloat16", "x_torch", 0.85, 14,
            "torch: SDPA (flash backend)"),
    Problem("flash_attention", "B=16,H=16,S=1024,D=64", "float16", "x_torch", 0.85, 14,
            "torch: SDPA"),
    Problem("conv2d", "N=100,C=3,H=224,W=224,K=96,R=11,S=11,STRIDE=4,PAD1=3,DIL=1",
            "float32", "x_torch", 1.0, 14,
            "AlexNet conv1 (PAD1=3: padding 2); torch: cuDNN without TF32"),
    Problem("conv2d_nhwc", "N=100,C=3,H=224,W=224,K=96,R=11,S=11,STRIDE=4,PAD1=3,DIL=1",
            "float16", "x_torch", 1.0, 14, "torch: cuDNN channels-last"),
]


def parse_shape(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in (kv.split("=") for kv in text.split(","))}


def achieved(problem: Problem, ms: float | None, flops: float, nbytes: float
             ) -> tuple[float | None, float | None]:
    """TFLOP/s and TB/s at ``ms`` (None without a time or where the kernel reports 0)."""
    if not ms:
        return None, None
    tflops = flops / (ms * 1e-3) / 1e12 if flops else None
    tbs = nbytes / (ms * 1e-3) / 1e12 if nbytes else None
    return tflops, tbs


def score(problem: Problem, tuned_ms: float | None, torch_ms: float | None,
          tbs: float | None, copy_tbs: float | None) -> tuple[float | None, bool | None]:
    """The problem's figure of merit and whether it meets the target."""
    if problem.goal == "x_torch":
        value = torch_ms / tuned_ms if tuned_ms and torch_ms else None
    else:
        value = tbs / copy_tbs if tbs and copy_tbs else None
    return value, (None if value is None else value >= problem.target)


def variant_bests(trials: list[dict[str, Any]]) -> dict[str, float]:
    """The best ok trial time per ``VARIANT`` value (empty when the space has none)."""
    best: dict[str, float] = {}
    for t in trials:
        variant = t["config"].get("VARIANT")
        if variant is None or t["outcome"] != "ok" or not t["ms"]:
            continue
        key = str(variant)
        best[key] = min(best.get(key, float("inf")), t["ms"])
    return best


def measure_peaks() -> tuple[float | None, float | None]:
    """Copy bandwidth (TB/s, read + write, 1 GiB) and cuBLAS's best bf16 GEMM TFLOP/s here,
    each the median of 3 timings with the settled protocol's 100 ms warm-up."""
    import torch
    import triton.testing

    size = 1 << 30
    src = torch.empty(size, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    copy = statistics.median(
        2 * size / (triton.testing.do_bench(lambda: dst.copy_(src), warmup=100, rep=200) * 1e-3)
        / 1e12 for _ in range(3))
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    gemm = statistics.median(
        2 * 8192**3 / (triton.testing.do_bench(lambda: a @ b, warmup=100, rep=200) * 1e-3)
        / 1e12 for _ in range(3))
    return copy, gemm


def measure_launch_us() -> float:
    """One launch of a one-program Triton kernel that stores a single value, timed as the
    measuring child times a config (``tuner.gpu_timer.do_bench``: L2 flushed, the host ahead
    of the GPU), in microseconds: the least any single-launch kernel can read, the practical
    floor under a bandwidth floor of a few microseconds."""
    import torch
    import triton
    import triton.language as tl

    from tuner.gpu_timer import do_bench

    @triton.jit
    def _one_store(ptr):
        tl.store(ptr, 1)

    flag = torch.zeros(1, dtype=torch.int32, device="cuda")
    return statistics.median(
        1e3 * do_bench(lambda: _one_store[(1,)](flag), warmup=25, rep=100)[1]
        for _ in range(3))


def tune(problem: Problem, trials: int | None) -> dict[str, Any]:
    """One ``tuner tune`` run in a fresh database; its summary, wall time and trials."""
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/t.db"
        cmd = [sys.executable, "-m", "tuner.app.cli", "--db", url, "tune", problem.kernel,
               "--shape", problem.shape, "--dtype", problem.dtype, "--backend", "cuda",
               "--json", "--no-progress"]
        if trials:
            cmd += ["--trials", str(trials)]
        t0 = time.monotonic()
        out = subprocess.run(cmd, capture_output=True, text=True, check=False)
        wall = time.monotonic() - t0
        if out.returncode != 0 or not out.stdout.strip():
            return {"error": (out.stderr or out.stdout)[-600:], "wall_s": wall, "cmd": cmd}
        summary = json.loads(out.stdout.strip().splitlines()[-1])
        return {"summary": summary, "wall_s": wall, "cmd": cmd,
                "trials": trial_rows(url, summary.get("job_id"))}


def trial_rows(url: str, job_id: str | None) -> list[dict[str, Any]]:
    if not job_id:
        return []
    from db import repo
    from db.engine import make_engine, make_session_factory

    factory = make_session_factory(make_engine(url))
    with factory() as session:
        job = repo.get_job(session, job_id)
        rows = [t for task in job.tasks for t in repo.trials_for_task(session, task.id)]
        return [{"config": dict(t.config), "outcome": t.outcome, "ms": t.p50_ms} for t in rows]


def _fmt(v: Any, spec: str = ".4f") -> str:
    return "-" if v is None else format(v, spec)


def row(problem: Problem, res: dict[str, Any], copy_tbs: float | None) -> str:
    """One markdown table row for a problem's run."""
    head = f"| {problem.kernel} | {problem.shape} | {problem.dtype} |"
    if "error" in res:
        return head + f" failed: {res['error'][-200:]!r} |" + " |" * 9
    s = res["summary"]
    from search_spaces import get_kernel

    kernel = get_kernel(problem.kernel)
    shape = parse_shape(problem.shape)
    tflops, tbs = achieved(problem, s.get("best_ms"), kernel.flops(shape),
                           kernel.bytes(shape, problem.dtype))
    value, met = score(problem, s.get("best_ms"), s.get("baseline_ms"), tbs, copy_tbs)
    goal = (f">= {problem.target:.2f}x torch" if problem.goal == "x_torch"
            else f">= {problem.target:.0%} of copy bandwidth")
    result = "-" if value is None else (
        f"{value:.3f} ({'met' if met else f'missed by {problem.target - value:.3f}'})")
    variants = variant_bests(res.get("trials", []))
    config = ",".join(f"{k}={v}" for k, v in sorted((s.get("best_config") or {}).items()))
    return (head + f" `{config}` | {_fmt(s.get('best_ms'))} ({s.get('best_measured')}) | "
            f"{_fmt(s.get('baseline_ms'))} | {_fmt(tflops, '.1f')} | {_fmt(tbs, '.2f')} | "
            f"{goal} | {result} | {s.get('trials')} | {res['wall_s']:.1f} | "
            + (", ".join(f"{k}: {v:.4f}" for k, v in sorted(variants.items())) or "-") + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated kernel names or issue "
                        "numbers (13, 14); default: every problem")
    parser.add_argument("--shape", default="", help="only problems whose shape contains this "
                        "text (e.g. M=3072)")
    parser.add_argument("--trials", type=int, default=None, help="trial cap (default: the "
                        "CLI's)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    wanted = {w.strip() for w in args.only.split(",") if w.strip()}
    problems = [p for p in PROBLEMS if (not wanted or p.kernel in wanted
                                        or str(p.issue) in wanted) and args.shape in p.shape]
    import torch
    import triton

    copy_tbs, gemm_tflops = measure_peaks()
    launch_us = measure_launch_us()
    torch.cuda.empty_cache()
    lines = ["# Kernel families tuned by the product against torch (H200)", "",
             f"Command: `python3 -m bench.targets {' '.join(sys.argv[1:])}`", "",
             f"{torch.cuda.get_device_name(0)}, Triton {triton.__version__}, torch "
             f"{torch.__version__}, {time.strftime('%Y-%m-%d')}, timing protocol "
             f"{os.environ.get('TUNER_TIMING_PROTOCOL', 'settled')}. Peaks measured here "
             f"first: copy {_fmt(copy_tbs, '.2f')} TB/s (read + write), cuBLAS bf16 8192^3 "
             f"{_fmt(gemm_tflops, '.0f')} TFLOP/s; one launch of a one-program kernel "
             f"{launch_us:.2f} us (the measuring child's timer).", "",
             "Each problem: `tuner tune KERNEL --shape S --dtype D --backend cuda --json` in a "
             "fresh database; tuned ms is the re-timed best, torch ms the kernel's baseline "
             "timed interleaved with the finalists in the same child; result = torch time / "
             "tuned time (or achieved TB/s / copy TB/s).", "",
             "| kernel | shape | dtype | chosen config | tuned ms | torch ms | TFLOP/s | TB/s | "
             "target | result | trials | wall s to tune | best per variant (ms) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    results = []
    for problem in problems:
        res = tune(problem, args.trials)
        results.append({"problem": problem.__dict__, **{k: v for k, v in res.items()
                                                         if k != "cmd"}})
        lines.append(row(problem, res, copy_tbs))
        print(lines[-1], flush=True)
    notes = [f"- {p.kernel} {p.shape}: {p.note}" for p in problems if p.note]
    text = "\n".join(lines + ["", *notes]) + "\n"
    Path(args.out).write_text(text)
    Path(args.out).with_suffix(".json").write_text(json.dumps(
        {"copy_tbs": copy_tbs, "gemm_tflops": gemm_tflops, "launch_us": launch_us,
         "results": results}, indent=1,
        default=str))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
