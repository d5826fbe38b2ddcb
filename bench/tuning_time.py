"""Issue 13, "tuning in seconds": the wall time of ``tuner tune`` per problem, and of a MoE
token-count sweep (GPU).

    python3 -m bench.tuning_time --out bench/results/tuning_time_h200.md \\
        [--table tests/data/replay --table tests/data/replay/holdout] [--moe-sweep] \\
        [--cold-cache] [--trials 48] [--problem matmul:M=4096,N=4096,K=4096:float16 ...]

Each problem runs the real CLI (``tuner tune KERNEL --shape ... --dtype ... --backend cuda
--json``, a subprocess, as a user runs it) once, in a fresh database (no stored best to start
from), and records the whole command's wall seconds, the trials it ran, why it stopped and its
best. With ``--table DIR`` (exhaustively recorded replay tables, ``tests/data/replay``), a problem
whose table is there also gets best / optimum: the recorded time of the config the run chose over
the table's best (both from the same recording: a like-for-like ratio), beside the run's re-timed
best over the table's optimum (two processes: only indicative). ``--moe-sweep`` runs
``python3 -m tuner.app.sweep`` over 18 token counts of one MoE layer (moe_gemm, Mixtral-8x7B's
first GEMM: E=8 experts, N=14336, K=4096, top-2, bf16) as one job in a fresh database, at most
``--sweep-trials`` (16) trials a shape, and records its total wall time and each shape's trials
and best. ``--cold-cache`` gives every command an empty
Triton cache (TRITON_CACHE_DIR), so that compiles are counted as a first run pays them.

``--service`` measures the problems as a user of the running service sees them instead: one
``tuner serve`` (fresh SQLite database, one worker on the GPU, an empty Triton cache), each
problem POSTed as a job in turn and waited for; the wall time is from the POST to the finished
job as the client sees it (polled every 0.1 s). The worker keeps its GPU child and compile pool
from one job to the next (``TUNER_WORKER_KEEP_SECONDS``), so only the first job pays their
start: its row says so.
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
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: (kernel, shape, dtype): the issue's problems
PROBLEMS: tuple[str, ...] = (
    "matmul:M=4096,N=4096,K=4096:float16",
    "matmul:M=8192,N=8192,K=8192:bfloat16",
    "matmul:M=16,N=14336,K=4096:bfloat16",
    "matmul:M=777,N=1234,K=4321:float16",
)
#: vLLM's token counts for tuning fused-MoE configs (benchmark_moe.py's default batch sizes)
MOE_TOKENS: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 1536,
                               2048, 3072, 4096)
#: one MoE layer: Mixtral-8x7B's experts (8, top-2), N=14336, K=4096, bf16
MOE_LAYER = "N=14336,K=4096,E=8,TOPK=2"
MOE_DTYPE = "bfloat16"
#: trial cap per shape of the sweep: 18 shapes in 2 minutes leave ~6 s a shape, and each shape
#: after the first starts from its neighbours' stored bests (moe_gemm has no cost-model prior,
#: so the "no expected gain" stop learns from measurements alone and fires later than on matmul)
SWEEP_TRIALS = 16
#: the issue's targets
TARGET_SHAPE_S = 10.0
TARGET_SWEEP_S = 120.0
TARGET_BAND = 0.02


@dataclass(frozen=True)
class Problem:
    kernel: str
    shape: dict[str, int]
    dtype: str

    @property
    def shape_text(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.shape.items())


def parse_problem(text: str) -> Problem:
    """``matmul:M=4096,N=4096,K=4096:float16`` -> Problem."""
    parts = text.split(":")
    if len(parts) != 3:
        raise ValueError(f"problem {text!r}: expected KERNEL:DIM=V,...:DTYPE")
    kernel, shape, dtype = parts
    dims = {}
    for item in shape.split(","):
        name, _, value = item.partition("=")
        dims[name.strip()] = int(value)
    return Problem(kernel.strip(), dims, dtype.strip())


def tune_command(problem: Problem, db_url: str, trials: int | None) -> list[str]:
    cmd = [sys.executable, "-m", "tuner.app.cli", "--db", db_url, "tune", problem.kernel,
           "--shape",
           problem.shape_text, "--dtype", problem.dtype, "--backend", "cuda", "--json",
           "--no-progress"]
    return cmd + (["--trials", str(trials)] if trials else [])


def sweep_command(db_url: str, trials: int | None,
                  tokens: Sequence[int] = MOE_TOKENS) -> list[str]:
    cmd = [sys.executable, "-m", "tuner.app.sweep", "moe_gemm", "--shape", MOE_LAYER, "--dtype",
           MOE_DTYPE, "--sweep", "M=" + ",".join(map(str, tokens)), "--backend", "cuda",
           "--db", db_url, "--json"]
    return cmd + (["--trials", str(trials)] if trials else [])


def find_table(tables: Iterable[Any], problem: Problem) -> Any | None:
    """The recorded table of exactly this kernel, shape and dtype, if one is given."""
    for table in tables:
        if (table.kernel == problem.kernel and table.shape == problem.shape
                and table.dtype == problem.dtype):
            return table
    return None


def load_tables(dirs: Sequence[str]) -> list[Any]:
    from tuner.backends.replay import load_table

    return [load_table(p) for d in dirs for p in sorted(Path(d).glob("*.json"))]


def problem_row(problem: Problem, summary: Mapping[str, Any] | None, wall: float,
                table: Any | None) -> dict[str, Any]:
    """One row of the table: what the run did, and against the table where there is one."""
    row: dict[str, Any] = {"problem": f"{problem.kernel} {problem.shape_text} {problem.dtype}",
                           "wall_s": wall}
    if not summary:
        return {**row, "status": "no output"}
    row.update(status=summary.get("status"), trials=summary.get("trials"),
               stop=summary.get("stop_reason"), best_ms=summary.get("best_ms"),
               best_config=summary.get("best_config"), cli_wall_s=summary.get("wall_s"))
    if table is not None and summary.get("best_config"):
        from search_spaces import get_kernel
        from tuner.backends.replay import with_added_params
        from tuner.config import KernelConfig

        # the table's configs as the kernel's space names them now (matmul's VARIANT=0 and
        # SPLIT_K=1: the tiled kernel it recorded); a config of another variant has no
        # recorded time
        named = with_added_params(table, get_kernel(problem.kernel).space())
        chosen = KernelConfig(summary["best_config"])
        recorded = table.results.get(chosen, named.results.get(chosen))
        row["table_ratio"] = (recorded / table.best_ms if isinstance(recorded, float)
                              else None)
        row["retimed_ratio"] = (summary["best_ms"] / table.best_ms
                                if summary.get("best_ms") else None)
    return row


def sweep_row(output: Mapping[str, Any] | None, wall: float) -> dict[str, Any]:
    """The sweep's totals: wall, shapes, trials and the per-shape lines."""
    if not output:
        return {"wall_s": wall, "status": "no output", "tasks": []}
    tasks = list(output.get("tasks", []))
    return {"wall_s": wall, "status": "ok" if all(t.get("best_config") for t in tasks)
            else "some shapes failed", "shapes": output.get("shapes"),
            "backends_opened": output.get("backends_opened"),
            "trials": sum(int(t.get("trials") or 0) for t in tasks), "tasks": tasks}


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def markdown(rows: Sequence[Mapping[str, Any]], sweep: Mapping[str, Any] | None,
             command: str, device: str | None, cold_cache: bool, service: bool = False,
             start_s: float | None = None) -> str:
    how = ("each problem a job of one running `tuner serve` (wall: POST to finished job)"
           if service else "`tuner tune` per problem")
    cache = ("empty when the service started" if service
             else "empty for every command" if cold_cache else "as found")
    lines = [f"# Tuning time: {how}, and a MoE token-count sweep", "",
             f"Command: `{command}` ({time.strftime('%Y-%m-%d')}; device: {device or '-'}; "
             f"Triton cache: {cache})", "",
             f"Targets (issue 13): one shape within {TARGET_BAND:.0%} of its space's optimum in "
             f"<= {TARGET_SHAPE_S:.0f} s wall; {len(MOE_TOKENS)} token counts of one MoE layer "
             f"in <= {TARGET_SWEEP_S:.0f} s.", ""]
    if start_s is not None:
        lines += [f"The service took {start_s:.1f} s from its command to an idle worker (its "
                  "measuring child and compile pool started); the jobs were submitted after.",
                  ""]
    if rows:
        lines += ["| problem | wall s | trials | stopped | best ms | best config | "
                  "vs reference (incumbent / long search's best, same child) | "
                  "best/optimum (table, same recording) | re-timed best / table optimum | "
                  "target |", "|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            ratio = r.get("table_ratio")
            quality = r.get("vs_reference", ratio)
            met = r.get("wall_s", 1e9) <= TARGET_SHAPE_S and (
                quality is None or quality <= 1 + TARGET_BAND)
            config = f"`{json.dumps(r['best_config'])}`" if r.get("best_config") else "-"
            reference = (f"{_fmt(r.get('vs_reference'))} ({r.get('reference_trials')} trials, "
                         f"{_fmt(r.get('reference_ms'), '.4f')} ms)"
                         if r.get("vs_reference") is not None else "-")
            lines.append(
                f"| {r['problem']} | {r['wall_s']:.1f} | {r.get('trials', '-')} | "
                f"{r.get('stop') or r.get('status')} | {_fmt(r.get('best_ms'), '.4f')} | "
                f"{config} | {reference} | {_fmt(ratio)} | {_fmt(r.get('retimed_ratio'))} | "
                f"{'met' if met else 'missed'}{'' if quality is not None else ' (time only)'} |")
        walls = [r["wall_s"] for r in rows]
        lines += ["", f"Wall per problem: median {statistics.median(walls):.1f} s, "
                  f"max {max(walls):.1f} s. Quality: the reference column where there is one, "
                  "else the table's same-recording ratio (the tables in tests/data/replay were "
                  "recorded with the tiled kernel before its EVEN_K loop, so that ratio is "
                  "about an older kernel).", ""]
    if sweep is not None:
        lines += sweep_lines(sweep)
    return "\n".join(lines) + "\n"


def sweep_lines(sweep: Mapping[str, Any]) -> list[str]:
    wall = sweep["wall_s"]
    lines = [f"## moe_gemm {MOE_LAYER} {MOE_DTYPE}: {len(MOE_TOKENS)} token counts as one job",
             "", f"Total wall {wall:.1f} s ({'met' if wall <= TARGET_SWEEP_S else 'missed'} "
             f"the {TARGET_SWEEP_S:.0f} s target), {sweep.get('trials', 0)} trials "
             f"(cap per shape: {sweep.get('cap') or 'the CLI default'}), "
             f"{sweep.get('backends_opened', '-')} backend(s) opened, status "
             f"{sweep['status']}.", ""]
    if sweep.get("tasks"):
        lines += ["| M | wall s | trials | stopped | best ms | best config |",
                  "|---|---|---|---|---|---|"]
        for t in sweep["tasks"]:
            config = f"`{json.dumps(t['best_config'])}`" if t.get("best_config") else "-"
            lines.append(f"| {t['shape']['M']} | {_fmt(t.get('wall_s'), '.1f')} | "
                         f"{t.get('trials')} | {t.get('stop_reason')} | "
                         f"{_fmt(t.get('best_ms'), '.4f')} | {config} |")
        lines.append("")
    return lines


def run(cmd: list[str], env: dict[str, str]) -> tuple[dict[str, Any] | None, float, str]:
    """Run a command printing one JSON line; (its object or None, wall s, stderr tail)."""
    t0 = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, env=env)
    wall = time.monotonic() - t0
    lines = out.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1]) if lines else None, wall, out.stderr[-2000:]
    except json.JSONDecodeError:
        return None, wall, out.stderr[-2000:]


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Service:
    """One ``tuner serve`` on a free port over ``db`` (one worker), started and waited for
    until its worker is idle (its measuring child started: ``Worker.prestart``)."""

    def __init__(self, tmp: str, db: str, backend: str, name: str,
                 extra_env: Mapping[str, str] | None = None) -> None:
        self.port = _free_port()
        env = {**_env(tmp, "service-cache"), "TUNER_DATABASE_URL": db, **(extra_env or {})}
        cmd = [sys.executable, "-m", "tuner.app.cli", "--db", db, "serve", "--host", "127.0.0.1",
               "--port", str(self.port), "--backend", backend, "--workers", "1",
               "--api-workers", "1"]
        self.log_path = Path(tmp) / f"{name}.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop
        t0 = time.monotonic()
        self.process = subprocess.Popen(cmd, env=env, stdout=self._log,
                                        stderr=subprocess.STDOUT)
        try:
            self._wait_ready(t0 + 300)
        except BaseException:
            self.stop()
            raise
        #: seconds from the command to an idle worker
        self.start_s = time.monotonic() - t0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _wait_ready(self, deadline: float) -> None:
        import httpx

        while True:
            try:
                health = httpx.get(f"{self.url}/healthz", timeout=5).json()
                workers = ((health.get("workers") or {}).get("workers")) or []
                if any(w.get("status") == "idle" for w in workers):
                    return
            except (httpx.HTTPError, ValueError):
                pass  # not listening yet
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError("the service did not start: "
                                   + self.log_path.read_text()[-2000:])
            time.sleep(0.2)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self._log.close()


def _run_job(client: Any, problem: Problem, trials: int, backend: str,
             force: bool = False) -> tuple[dict[str, Any], float]:
    t0 = time.monotonic()
    created = client.submit_job(problem.kernel, [problem.shape], problem.dtype,
                                trials=trials, backend=backend, force=force)
    job = client.wait(created["id"], timeout=900, poll=0.1)
    return job, time.monotonic() - t0


#: a reference search: no early stop of any kind, the trial budget alone
REFERENCE_ENV = {"TUNER_STOP_CHANCE": "0", "TUNER_ROOFLINE_STOP": "0", "TUNER_PATIENCE": "0"}


def service_rows(problems: Sequence[Problem], tables: Sequence[Any], trials: int | None,
                 tmp: str, backend: str = "cuda", reference_trials: int = 0
                 ) -> tuple[list[dict[str, Any]], str | None, float | None]:
    """Each problem as a job of one running ``tuner serve`` (see the module's docstring):
    (rows, device, seconds the service took to start). With ``reference_trials``, a second
    service on the same database then runs each problem again as a forced job of that many
    trials with every early stop off: its re-timing times the fast job's stored best (the
    incumbent) beside its own finalists in the same child, so ``vs_reference`` (incumbent /
    the better of the two) says how close the fast job came to what a long search finds."""
    from tuner.client import TunerClient

    db = f"sqlite:///{Path(tmp) / 'service.db'}"
    rows: list[dict[str, Any]] = []
    device = None
    service = _Service(tmp, db, backend, "service")
    start_s = service.start_s
    try:
        with TunerClient(service.url) as client:
            for problem in problems:
                job, wall = _run_job(client, problem, trials or 48, backend)
                task = job["tasks"][0]
                device = device or task.get("device")
                summary = {"status": job["status"], "trials": task["trials_done"],
                           "stop_reason": task["status"], "best_ms": task["best_ms"],
                           "best_config": task["best_config"]}
                rows.append(problem_row(problem, summary, wall, find_table(tables, problem)))
                print(json.dumps(rows[-1]), flush=True)
    finally:
        service.stop()
    if reference_trials:
        service = _Service(tmp, db, backend, "reference", REFERENCE_ENV)
        try:
            with TunerClient(service.url) as client:
                for problem, row in zip(problems, rows, strict=True):
                    job, wall = _run_job(client, problem, reference_trials, backend, True)
                    task = job["tasks"][0]
                    best, incumbent = task.get("best_ms"), task.get("incumbent_ms")
                    row.update(reference_trials=task["trials_done"], reference_ms=best,
                               incumbent_ms=incumbent, reference_wall_s=wall)
                    if best and incumbent:
                        row["vs_reference"] = incumbent / min(best, incumbent)
                    print(json.dumps({"reference": row}), flush=True)
        finally:
            service.stop()
    return rows, device, start_s


def _env(cache_root: str | None, name: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if cache_root is not None:
        env["TRITON_CACHE_DIR"] = str(Path(cache_root) / name)
    return env


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="markdown file")
    ap.add_argument("--problem", action="append", help="KERNEL:DIM=V,...:DTYPE (repeatable; "
                    "default: the issue's four matmul problems)")
    ap.add_argument("--table", action="append", default=[],
                    help="a folder of replay tables (repeatable)")
    ap.add_argument("--trials", type=int, default=None, help="trial cap (default: the CLI's)")
    ap.add_argument("--moe-sweep", action="store_true", help="also the 18-token MoE sweep")
    ap.add_argument("--sweep-trials", type=int, default=SWEEP_TRIALS,
                    help=f"trial cap per shape of the sweep (default {SWEEP_TRIALS}; 0: the "
                         "CLI's)")
    ap.add_argument("--no-problems", action="store_true", help="only the sweep")
    ap.add_argument("--cold-cache", action="store_true", help="an empty Triton cache each")
    ap.add_argument("--service", action="store_true", help="the problems as jobs of one "
                    "running tuner serve (its worker keeps its child across jobs)")
    ap.add_argument("--reference-trials", type=int, default=0, help="with --service: then "
                    "re-tune each problem with this many trials and no early stop, timing the "
                    "fast job's best beside it (0: no reference)")
    args = ap.parse_args(argv)
    problems = [] if args.no_problems else [parse_problem(p) for p in
                                            (args.problem or PROBLEMS)]
    tables = load_tables(args.table) if args.table else []
    rows, sweep, device, start_s = [], None, None, None
    with tempfile.TemporaryDirectory(prefix="tuning-time-") as tmp:
        cache = tmp if args.cold_cache else None
        if args.service:
            rows, device, start_s = service_rows(problems, tables, args.trials, tmp,
                                                 reference_trials=args.reference_trials)
            problems = []
        for i, problem in enumerate(problems):
            db = f"sqlite:///{Path(tmp) / f'problem{i}.db'}"
            summary, wall, err = run(tune_command(problem, db, args.trials),
                                     _env(cache, f"cache{i}"))
            if summary is None:
                print(err, file=sys.stderr)
            device = device or (summary or {}).get("device")
            rows.append(problem_row(problem, summary, wall, find_table(tables, problem)))
            print(json.dumps(rows[-1]), flush=True)
        if args.moe_sweep:
            output, wall, err = run(sweep_command(f"sqlite:///{Path(tmp) / 'sweep.db'}",
                                                  args.sweep_trials or None),
                                    _env(cache, "sweep"))
            if output is None:
                print(err, file=sys.stderr)
            sweep = {**sweep_row(output, wall), "cap": args.sweep_trials or None}
            device = device or next((t.get("device") for t in sweep["tasks"]), None)
            print(json.dumps({k: v for k, v in sweep.items() if k != "tasks"}), flush=True)
    text = markdown(rows, sweep, "python3 -m bench.tuning_time " + " ".join(argv), device,
                    args.cold_cache, args.service, start_s)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
