"""Tuning one kernel over a sweep of shapes as one job on one backend.

    python3 -m tuner.app.sweep moe_gemm --shape N=14336,K=4096,E=8,TOPK=2 --dtype bfloat16 \\
        --sweep M=1,2,4,8,16,24,32,48,64,96,128,256,512,1024,1536,2048,3072,4096 [--json]

A token-count sweep (vLLM tunes its fused-MoE configs for 18 of them) as ``tuner tune`` once per
shape pays the GPU child's and the compile pool's start (~7 s on an H200) every time. Here the job
has one task per shape, run one after another in this process on one backend: the child and the
pool are started once and moved to each next shape (``ProcessBackend.retarget``). The shapes run
in increasing order of the swept dimension, each storing its best before the next starts, so each
shape's search starts from the stored bests of its nearest neighbours (``warm_start_configs``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tuner.errors import InvalidRequest, TunerError
from tuner.job_spec import JobSpec
from tuner.kernel import TunableKernel
from tuner.timing import DEFAULT_TIMING, TIMING_METHODS

#: the CLI's lease owner for the tasks it runs in its own process (as ``tuner tune``)
SWEEP_WORKER = "cli"


def parse_sweep(text: str) -> tuple[str, list[int]]:
    """``M=1,2,4`` -> ("M", [1, 2, 4]): the swept dimension and its values, increasing."""
    name, sep, values = text.partition("=")
    try:
        parsed = sorted({int(v) for v in values.split(",") if v.strip()})
    except ValueError:
        parsed = []
    if not sep or not name.strip() or not parsed:
        raise InvalidRequest(f"--sweep {text!r}: expected DIM=V1,V2,... (e.g. M=1,2,4,8)",
                             field="sweep")
    return name.strip(), parsed


def sweep_shapes(base: Mapping[str, int], dim: str, values: Sequence[int]) -> list[dict[str, int]]:
    """One shape per value of ``dim`` (the other dimensions from ``base``), in increasing order."""
    return [{**base, dim: v} for v in sorted(set(values))]


@dataclass
class SweepResult:
    job_id: str
    #: each task's outcome (``tuner.app.worker.TaskOutcome``) and wall seconds, in the sweep's
    #: order
    outcomes: list[tuple[dict[str, int], Any, float]] = field(default_factory=list)
    wall_s: float = 0.0
    #: backends opened (1 unless one died and was replaced) and the GPU children they started
    backends_opened: int = 0
    child_pids: list[int] = field(default_factory=list)


def run_sweep(factory: Any, kernel: TunableKernel, shapes: Sequence[dict[str, int]], dtype: str,
              *, backend_kind: str, trials: int, seconds: float | None = None,
              strategy: str = "auto", seed: int = 0, compile_workers: int | None = None,
              on_task: Callable[[dict[str, int], Any, float], None] | None = None,
              timing: str = DEFAULT_TIMING) -> SweepResult:
    """Create one job with a task per shape and run its tasks in order on one backend (a fresh
    one only after a task left it dead). Each task stores its best before the next starts.
    ``timing``: how its configs are timed (``tuner/timing.py``)."""
    from db import repo
    from tuner.app.worker import execute_task
    from tuner.backends import open_backend

    started = time.monotonic()
    with factory() as session:
        job = repo.create_job(session, JobSpec(
            kernel=kernel.name, kernel_version=kernel.version, dtype=dtype, shapes=shapes,
            budget_trials=trials, budget_seconds=seconds, strategy=strategy, force=True,
            seed=seed, backend=backend_kind, device_key=None, timing=timing))
        tasks = [(t.id, dict(t.shape)) for t in job.tasks]
        result = SweepResult(job_id=job.id)
        session.commit()
    backend: Any = None
    try:
        for task_id, shape in tasks:
            t0 = time.monotonic()
            with factory() as session:
                repo.start_task_locally(session, task_id, worker_id=SWEEP_WORKER)
                session.commit()
            if backend is None:
                backend = _open(open_backend, backend_kind, kernel, shape, dtype, seed,
                                compile_workers, result)
            outcome = execute_task(factory, task_id, backend_kind=backend_kind,
                                   worker_id=SWEEP_WORKER, backend=backend)
            if outcome.result is None or not backend.healthy:
                backend.close()  # it may be dead: the next shape gets a fresh one
                backend = None
            wall = time.monotonic() - t0
            result.outcomes.append((shape, outcome, wall))
            if on_task is not None:
                on_task(shape, outcome, wall)
    finally:
        if backend is not None:
            backend.close()
    result.wall_s = time.monotonic() - started
    return result


def _open(open_backend: Any, kind: str, kernel: TunableKernel, shape: dict[str, int],
          dtype: str, seed: int, compile_workers: int | None, result: SweepResult) -> Any:
    from tuner.backends.process import ProcessBackend

    backend = open_backend(kind, kernel, shape, dtype, seed=seed,
                           compile_workers=compile_workers)
    result.backends_opened += 1
    if isinstance(backend, ProcessBackend):  # the GPU children it started
        result.child_pids += list(backend.child_pids)
    return backend


def _parser() -> argparse.ArgumentParser:
    from tuner.strategies import strategy_names

    ap = argparse.ArgumentParser(prog="python3 -m tuner.app.sweep",
                                 description="tune one kernel over a sweep of shapes as one job")
    ap.add_argument("kernel")
    ap.add_argument("--sweep", required=True, help="DIM=V1,V2,... e.g. M=1,2,4,8")
    ap.add_argument("--shape", default="", help="the other dimensions, e.g. N=14336,K=4096,E=8")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--trials", type=int, default=48, help="trial cap per shape (default 48)")
    ap.add_argument("--seconds", type=float, default=None, help="time budget per shape")
    ap.add_argument("--strategy", default="auto", choices=strategy_names())
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", default="auto", choices=("auto", "cuda", "interpret"))
    ap.add_argument("--timing", default=DEFAULT_TIMING, choices=TIMING_METHODS,
                    help="how configs are timed (default: eager-flushed)")
    ap.add_argument("--compile-workers", type=int, default=None)
    ap.add_argument("--db", default=None, help="database URL (default: TUNER_DATABASE_URL)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    from search_spaces import get_kernel
    from tuner.app.tune_report import check_interpreter_timing, summary_of
    from tuner.backends import resolve_backend_kind
    from tuner.dtypes import check_dtype
    from tuner.settings import Settings
    from tuner.shapes import parse_shape, validate_shape

    args = _parser().parse_args(argv)
    try:
        kernel = get_kernel(args.kernel)
        dim, values = parse_sweep(args.sweep)
        base = parse_shape(args.shape) if args.shape else {}
        shapes = [validate_shape(kernel.dims, s) for s in sweep_shapes(base, dim, values)]
        backend = resolve_backend_kind(args.backend)
        check_dtype(kernel, args.dtype, backend)
        if backend == "interpret":
            check_interpreter_timing(args.timing)
    except TunerError as exc:
        print(f"tuner.app.sweep: {exc}", file=sys.stderr)
        return 2
    from db.engine import init_db

    settings = Settings()
    if args.db:
        settings.database_url = args.db
    factory = init_db(settings.resolved_database_url, bounds=settings.database_bounds)

    def report(shape: dict[str, int], outcome: Any, wall: float) -> None:
        if not args.json:
            best = outcome.result.best if outcome.result else None
            ms = f"{best.p50_ms:.4f} ms" if best and best.p50_ms else outcome.error
            trials = len(outcome.result.trials) if outcome.result else 0
            print(f"{dim}={shape[dim]}: {outcome.status}, {trials} trials, {ms}, {wall:.1f} s",
                  flush=True)

    result = run_sweep(factory, kernel, shapes, args.dtype, backend_kind=backend,
                       trials=args.trials, seconds=args.seconds, strategy=args.strategy,
                       seed=args.seed, compile_workers=args.compile_workers, on_task=report,
                       timing=args.timing)
    summaries = [summary_of(kernel, shape, args.dtype, backend, outcome, wall)
                 for shape, outcome, wall in result.outcomes]
    if args.json:
        print(json.dumps({"job_id": result.job_id, "kernel": kernel.name, "dtype": args.dtype,
                          "sweep": dim, "shapes": len(shapes), "wall_s": round(result.wall_s, 3),
                          "backends_opened": result.backends_opened, "tasks": summaries}))
    else:
        print(f"job {result.job_id}: {len(shapes)} shapes in {result.wall_s:.1f} s")
    return 0 if all(s["best_config"] for s in summaries) else 1


if __name__ == "__main__":
    sys.exit(main())
