"""Issue 29's evidence: does the config a search picks depend on how configs are timed?

For each problem (a decode-like MoE GEMM at one token, ``moe_gemm`` M=1 of Mixtral's
8 experts x 14336 x 4096 bf16, and a 16x4096x4096 fp16 GEMM), two tuning jobs run through the
real worker path (``tuner.app.worker.execute_task`` in this process, a SQLite file, one measuring
child and compile pool shared by the problem's jobs, as ``tuner.app.sweep`` shares them): one timed
``eager-flushed`` (eager launches, L2 flushed before each: the default), one ``cuda-graph``
(launches replayed in a CUDA graph, no flush: how serving engines run decode steps). Each
stores its best under its own method (``timing`` is part of a best's identity).

Then, in the same child, the two stored winners, the kernel's default config and torch are
timed every way (``eager-flushed``, ``cuda-graph``, ``eager-hot``), interleaved: every round
times each method once (its order rotating), each method a re-timing of all of them
(``ProcessBackend.retime``, one round each); the table gives each one's median over the rounds
per method, and how the two winners compare under each method. The GPU's state (nvidia-smi:
clocks, power, temperature) is recorded before and after each problem, and NVML's SM clock
and power with the timings.

Usage (on the GPU machine; about 5 minutes on an H100)::

    python3 -m bench.timing_methods --out $OUT/timing_methods.md

On the CPU (the plumbing only: the interpreter times wall time and cannot replay graphs)::

    TRITON_INTERPRET=1 python3 -m bench.timing_methods --backend interpret \\
        --tuned eager-flushed,eager-hot \\
        --compared eager-flushed,eager-hot --problem matmul:M=16,N=16,K=16:float16 \\
        --trials 2 --rounds 1 --out /tmp/timing_methods.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: (kernel, shape, dtype) of each problem
PROBLEMS: list[tuple[str, dict[str, int], str]] = [
    ("moe_gemm", {"M": 1, "N": 14336, "K": 4096, "E": 8, "TOPK": 2}, "bfloat16"),
    ("matmul", {"M": 16, "N": 4096, "K": 4096}, "float16"),
]
TUNED = ("eager-flushed", "cuda-graph")
COMPARED = ("eager-flushed", "cuda-graph", "eager-hot")
#: what a worker of the CLI is called in the tasks it runs (as ``tuner tune``)
WORKER = "cli"


@dataclass
class Tuned:
    """One tuning job of a problem: its method, outcome, stored best and wall time."""

    method: str
    status: str
    trials: int
    stored_config: dict[str, int] | None
    stored_ms: float | None
    stored_timing: str | None
    note: str | None
    wall_s: float


@dataclass
class Compared:
    """A problem's comparison: per entry label, per method, each round's p50 (ms)."""

    labels: list[str]
    configs: dict[str, dict[str, int]]
    times: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    #: per method, NVML's SM clock (MHz) and power (W) read with its timings
    sm_mhz: dict[str, list[float]] = field(default_factory=dict)
    power_w: dict[str, list[float]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def median(self, label: str, method: str) -> float | None:
        values = self.times.get(label, {}).get(method, [])
        return statistics.median(values) if values else None


def parse_problem(text: str) -> tuple[str, dict[str, int], str]:
    """``KERNEL:DIM=V,...:DTYPE`` -> (kernel, shape, dtype)."""
    from tuner.shapes import parse_shape

    kernel, sep, rest = text.partition(":")
    dims, sep2, dtype = rest.rpartition(":")
    if not (sep and sep2 and kernel and dims and dtype):
        raise SystemExit(f"--problem {text!r}: expected KERNEL:DIM=V,...:DTYPE")
    return kernel, parse_shape(dims), dtype


#: what ``gpu_state`` asks nvidia-smi, then the throttle reasons under their new and old names
GPU_FIELDS = "index,name,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu"
REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")


def _smi(fields: str) -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def gpu_state() -> str:
    """nvidia-smi's view of the GPUs now: clocks (SM, its maximum, memory), power and its
    limit, temperature, and the active clock throttle reasons (a bitmask)."""
    state = _smi(GPU_FIELDS)
    if state is None:
        return "unknown (nvidia-smi did not answer)"
    reasons = next((r for r in map(_smi, REASON_FIELDS) if r is not None), "?")
    return f"{state}; throttle reasons {reasons}"


def tune(factory: Any, backend: Any, kernel: Any, shape: dict[str, int], dtype: str,
         method: str, trials: int, backend_kind: str) -> Tuned:
    """One job timed ``method``, run by ``execute_task`` on the shared ``backend``."""
    from db import repo
    from tuner.app.worker import execute_task

    with factory() as session:
        job = repo.create_job(session, kernel=kernel.name, kernel_version=kernel.version,
                              dtype=dtype, shapes=[shape], budget_trials=trials,
                              budget_seconds=None, strategy="auto", force=True, seed=0,
                              backend=backend_kind, device_key=None, timing=method)
        task_id = int(job.tasks[0].id)
        repo.start_task_locally(session, task_id, worker_id=WORKER)
        session.commit()
    started = time.monotonic()
    outcome = execute_task(factory, task_id, backend_kind=backend_kind, worker_id=WORKER,
                           backend=backend)
    wall = time.monotonic() - started
    with factory() as session:
        task = repo.get_task(session, task_id)
        best = repo.get_best(session, device_key=backend.fingerprint.key, kernel=kernel.name,
                             dtype=dtype, shape_key=task.shape_key,
                             kernel_version=kernel.version, timing=task.timing or method)
        return Tuned(method=method, status=outcome.status, trials=task.trials_done,
                     stored_config=dict(best.config) if best else None,
                     stored_ms=best.p50_ms if best else None,
                     stored_timing=best.timing if best else None,
                     note=outcome.note or outcome.error, wall_s=wall)


def compare(backend: Any, kernel: Any, shape: dict[str, int], dtype: str,
            tuned: list[Tuned], methods: list[str], rounds: int) -> Compared:
    """The winners, the default and torch timed every way in ``backend``'s child, the
    methods interleaved (each round times each method once, its order rotating)."""
    from tuner.config import KernelConfig

    configs: dict[str, dict[str, int]] = {}
    for t in tuned:
        if t.stored_config is not None:
            configs[f"tuned {t.method}"] = t.stored_config
    configs["default"] = kernel.default_config(shape, dtype).to_dict()
    entries: list[tuple[str, KernelConfig]] = []
    for label, config in configs.items():
        if all(config != c.to_dict() for _, c in entries):  # one winner for two: timed once
            entries.append((label, KernelConfig(config)))
    result = Compared(labels=[label for label, _ in entries] + ["torch"], configs=configs)
    for r in range(rounds):
        for method in methods[r % len(methods):] + methods[:r % len(methods)]:
            backend.use_timing(method)
            timed = backend.retime([c for _, c in entries], 1, baseline=True)
            if not timed:
                result.failures.append(f"round {r + 1}, {method}: the re-timing failed")
                continue
            for (label, _), m in zip([*entries, ("torch", None)], timed, strict=False):
                if m.ok and m.p50_ms is not None:
                    result.times.setdefault(label, {}).setdefault(method, []).append(m.p50_ms)
                gpu = m.extra.get("gpu") or {}
                if isinstance(gpu.get("sm_mhz"), int | float):
                    result.sm_mhz.setdefault(method, []).append(float(gpu["sm_mhz"]))
                if isinstance(gpu.get("power_w"), int | float):
                    result.power_w.setdefault(method, []).append(float(gpu["power_w"]))
    return result


def _same_as(compared: Compared, label: str) -> str:
    """The labels whose config is ``label``'s (a winner shared by both methods)."""
    config = compared.configs.get(label)
    return " = ".join(k for k, c in compared.configs.items() if c == config) or label


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1e3:.2f} us" if value < 1 else f"{value:.4f} ms"


def _pct(a: float | None, b: float | None) -> str:
    """How much slower ``b`` is than ``a`` (negative: faster)."""
    if a is None or b is None or not a:
        return "-"
    return f"{100 * (b / a - 1):+.1f}%"


def report(problem: dict[str, Any]) -> list[str]:
    """The markdown of one problem: its two tuning jobs, then the comparison table."""
    compared: Compared = problem["compared"]
    methods: list[str] = problem["methods"]
    lines = [f"### {problem['kernel']} {problem['shape']} {problem['dtype']}", "",
             f"GPU before: `{problem['gpu_before']}`", "",
             "| tuned with | status | trials | stored best (its method) | stored ms | wall |",
             "|---|---|---|---|---|---|"]
    for t in problem["tuned"]:
        config = ",".join(f"{k}={v}" for k, v in (t.stored_config or {}).items())
        lines.append(f"| {t.method} | {t.status} | {t.trials} | `{config}` ({t.stored_timing}) "
                     f"| {_ms(t.stored_ms)} | {t.wall_s:.1f} s |")
    lines += ["", "Timed in one process, interleaved: the median p50 of "
              f"{problem['rounds']} rounds per method.", "",
              "| config | " + " | ".join(methods) + " |",
              "|---|" + "---|" * len(methods)]
    for label in compared.labels:
        cells = [_ms(compared.median(label, m)) for m in methods]
        lines.append(f"| {_same_as(compared, label) if label != 'torch' else 'torch'} | "
                     + " | ".join(cells) + " |")
    winners = [f"tuned {t.method}" for t in problem["tuned"] if t.stored_config is not None]
    if len(winners) == 2:
        first, second = winners
        if compared.configs[first] == compared.configs[second]:
            lines += ["", "Both methods stored the same config."]
        else:
            label = first if first in compared.labels else second
            other = second if label == first else first
            cells = [_pct(compared.median(label, m), compared.median(other, m))
                     for m in methods]
            lines += ["", f"| {other} vs {label} | " + " | ".join(methods) + " |",
                      "|---|" + "---|" * len(methods),
                      "| slower (+) or faster (-) | " + " | ".join(cells) + " |"]
    clocks = [f"{m}: SM {statistics.median(compared.sm_mhz[m]):.0f} MHz, "
              f"{statistics.median(compared.power_w.get(m, [0.0])):.0f} W"
              for m in methods if compared.sm_mhz.get(m)]
    if clocks:
        lines += ["", "NVML with the timings (medians): " + "; ".join(clocks) + "."]
    lines += ["", f"GPU after: `{problem['gpu_after']}`"]
    lines += [f"- {f}" for f in compared.failures]
    return lines + [""]


def _git_commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10, cwd=Path(__file__).resolve().parents[1])
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD"], timeout=10,
                               cwd=Path(__file__).resolve().parents[1]).returncode
        return out.stdout.strip() + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.TimeoutExpired):
        return "?"


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python3 -m bench.timing_methods",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="the markdown table's file")
    ap.add_argument("--json", default=None, help="also write every number here")
    ap.add_argument("--problem", action="append", default=None, metavar="KERNEL:DIMS:DTYPE",
                    help="instead of the default two, e.g. matmul:M=16,N=4096,K=4096:float16")
    ap.add_argument("--tuned", default=",".join(TUNED), help="the methods tuned with")
    ap.add_argument("--compared", default=",".join(COMPARED),
                    help="the methods the winners are timed with")
    ap.add_argument("--trials", type=int, default=40, help="trials per tuning job")
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the "
                    "comparison")
    ap.add_argument("--backend", default="cuda", choices=("cuda", "interpret"))
    ap.add_argument("--db", default=None, help="a SQLite file (default: a temporary one)")
    return ap


def main(argv: list[str] | None = None) -> int:
    from db.engine import init_db
    from search_spaces import get_kernel
    from tuner.backends import open_backend
    from tuner.timing import check_timing

    args = _parser().parse_args(argv)
    tuned_methods = [check_timing(m.strip(), "--tuned") for m in args.tuned.split(",")]
    methods = [check_timing(m.strip(), "--compared") for m in args.compared.split(",")]
    problems = [parse_problem(p) for p in args.problem] if args.problem else PROBLEMS
    folder = Path(tempfile.mkdtemp(prefix="timing_methods_"))
    factory = init_db(f"sqlite:///{args.db or folder / 'tuner.db'}")
    started = time.monotonic()
    done: list[dict[str, Any]] = []
    fingerprint: Any = None
    for name, shape, dtype in problems:
        kernel = get_kernel(name)
        before = gpu_state() if args.backend == "cuda" else "the CPU interpreter"
        backend = open_backend(args.backend, kernel, shape, dtype)
        fingerprint = backend.fingerprint
        try:
            tuned = [tune(factory, backend, kernel, shape, dtype, m, args.trials, args.backend)
                     for m in tuned_methods]
            print(f"{name} {shape}: " + "; ".join(
                f"{t.method}: {t.status}, {t.trials} trials, {t.wall_s:.0f} s"
                for t in tuned), file=sys.stderr, flush=True)
            compared = compare(backend, kernel, shape, dtype, tuned, methods, args.rounds)
        finally:
            backend.close()
        after = gpu_state() if args.backend == "cuda" else "the CPU interpreter"
        done.append({"kernel": name, "shape": shape, "dtype": dtype, "tuned": tuned,
                     "compared": compared, "methods": methods, "rounds": args.rounds,
                     "gpu_before": before, "gpu_after": after})
    wall = time.monotonic() - started
    device = (f"{fingerprint.name}, Triton {fingerprint.triton_version}, torch "
              f"{fingerprint.torch_version}" if fingerprint is not None else "?")
    lines = ["# Timing methods: does the winner depend on how configs are timed?", "",
             f"{device}; git {_git_commit()}; {args.trials} trials per job; "
             f"{wall:.0f} s in all (`python3 -m bench.timing_methods`).", "",
             "eager-flushed: eager launches, L2 flushed before each (the default); cuda-graph: "
             "launches replayed in a CUDA graph, no flush; eager-hot: eager, no flush. Each "
             "job stores its best under its own method; the stored winners are then timed "
             "every way in one child.", ""]
    for problem in done:
        lines += report(problem)
    Path(args.out).write_text("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps([{
            **{k: v for k, v in p.items() if k not in ("tuned", "compared")},
            "tuned": [t.__dict__ for t in p["tuned"]],
            "compared": p["compared"].__dict__} for p in done], indent=1))
    print(f"wrote {args.out} ({wall:.0f} s)", file=sys.stderr)
    return 0 if all(t.status == "succeeded" for p in done for t in p["tuned"]) else 1


if __name__ == "__main__":
    sys.exit(main())
