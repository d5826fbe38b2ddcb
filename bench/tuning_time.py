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
job as the client sees it (polled every ``POLL_S``, 0.02 s; 0.1 s before the sixteenth
session, which added 0.05 s to each wall on average). The worker keeps its GPU child and
compile pool from one job to the next (``TUNER_WORKER_KEEP_SECONDS``), so only the first
job pays their start: its row says so.

Issue 33 (``--service`` without ``--problem``: ``HELD_OUT``, 14 problems of 7 kernel families;
13 have no recorded table the search was developed on, softmax 8192x50257 bf16 has one, of the
405-config softmax space of 2026-11-23: see ``HELD_OUT``): how long the service takes to
be ready (its worker's log line ``ready_s=...``: the measuring child and compile pool, the
calibration), on a fresh store and again restarted on the same store (``--restart``: the
calibration reused); each shape's time, POST to finished, with where it went (the task's
``phases``: queued, setup, compile wait, compile in the child, verifying, measuring,
re-timing, storing, the search loop itself; the rest is the client's polling and HTTP; beside
them the child's own seconds timing the trials); ``--moe-sweep-service``:
the 18 token counts as one job of the running service (default budget). ``--save DIR`` keeps
the rows and the database, so that ``--references-for DIR`` (a later call: a 96-trial search
per problem costs minutes) adds the quality column: each problem re-tuned with
``--reference-trials`` and every early stop off, its re-timing timing the fast job's stored
best beside its own finalists in the same child. ``TUNING_TIME_CACHE_DIR``: the services'
Triton cache (default: a fresh one in the temporary folder), so that a later call's references
find the binaries the first call compiled.
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
from collections.abc import Callable, Iterable, Mapping, Sequence
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
#: issue 33's problems: 14 of 7 families. 13 are held out (no recorded table in
#: tests/data/replay); softmax 8192x50257 bf16 is not: tests/data/replay/nongemm has its table,
#: recorded on 2026-11-23 over the softmax space of then (405 configs; 88,704 now), among
#: the tables the stop rule's settings were chosen on
HELD_OUT: tuple[str, ...] = (
    "matmul:M=8192,N=8192,K=8192:bfloat16",
    "matmul:M=2048,N=5120,K=1536:float16",
    "matmul:M=16,N=14336,K=4096:bfloat16",
    "matmul:M=1500,N=3001,K=999:float16",
    "matmul_epilogue_gelu:M=4096,N=4096,K=4096:bfloat16",
    "moe_gemm:M=512,N=14336,K=4096,E=8,TOPK=2:bfloat16",
    "softmax:M=8192,N=50257:bfloat16",
    "softmax:M=4096,N=4096:float16",
    "add_layernorm:M=32768,N=4096:float16",
    "add_layernorm:M=4096,N=8192:bfloat16",
    "flash_attention:B=16,H=16,S=1024,D=64:float16",
    "flash_attention_causal:B=4,H=32,S=2048,D=128:bfloat16",
    "vector_add:N=67108864:float32",
    "conv2d_nhwc:N=32,C=64,H=56,W=56,K=64,R=3,S=3,STRIDE=1,PAD1=2,DIL=1:float16",
)
#: the issue's targets (13; 33: a shape <= 5 s median, <= 10 s max, within 1% of the
#: reference; the sweep <= 60 s; a worker ready <= 5 s)
TARGET_SHAPE_S = 10.0
TARGET_SWEEP_S = 120.0
TARGET_BAND = 0.02
TARGET_MEDIAN_S_33 = 5.0
TARGET_MAX_S_33 = 10.0
TARGET_BAND_33 = 0.01
TARGET_SWEEP_S_33 = 60.0
TARGET_READY_S_33 = 5.0
#: the phases' columns, in the order a task meets them (``tuner.phases``)
PHASE_COLUMNS = ("queued", "setup", "compile_wait", "compile_child", "verifying", "measuring",
                 "retiming", "storing", "search")


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
        if os.environ.get("TUNING_TIME_CACHE_DIR"):  # a Triton cache kept across calls
            env["TRITON_CACHE_DIR"] = os.environ["TUNING_TIME_CACHE_DIR"]
        cmd = [sys.executable, "-m", "tuner.app.cli", "--db", db, "serve", "--host", "127.0.0.1",
               "--port", str(self.port), "--backend", backend, "--workers", "1",
               "--api-workers", "1"]
        self.log_path = Path(tmp) / f"{name}.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 - closed in stop
        t0, started_at = time.monotonic(), time.time()
        self.process = subprocess.Popen(cmd, env=env, stdout=self._log,
                                        stderr=subprocess.STDOUT)
        try:
            self._wait_ready(t0 + 300)
        except BaseException:
            self.stop()
            raise
        #: seconds from the command to an idle worker
        self.start_s = time.monotonic() - t0
        #: the worker's own account of its start (its "ready_s=..." log line), and when it
        #: was ready, its compile pool warm and it started, counted from the command (the
        #: log's times); a GPU worker's pool may be warm after its ready line: waited for
        text = self._wait_log(POOL_WARM, time.monotonic() + (60 if backend == "cuda" else 0))
        self.ready = {**ready_line(text), **ready_after(text, started_at)}

    def _wait_log(self, needle: str, deadline: float) -> str:
        """The log once it holds ``needle``, or as it is at ``deadline``."""
        while True:
            text = self.log_path.read_text()
            if needle in text or time.monotonic() >= deadline:
                return text
            time.sleep(0.1)

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


#: the line a compile pool logs once every process of it is ready
POOL_WARM = "compile pool warm: "


def ready_after(log: str, started_at: float) -> dict[str, float]:
    """From the service's log: seconds from ``started_at`` (the command's ``time.time()``)
    to the worker's ready line (its logging time, local, to the millisecond), and to the
    workers' start as ``serve`` counts it ("started 0.37 s after this command"), and to the
    line its compile pool logs once every process of it is ready ("compile pool warm")."""
    import datetime
    import re

    out: dict[str, float] = {}
    stamp = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) \S+ [\w.]+: "
    for key, line in (("worker_ready_after_command", r"worker .* ready_s="),
                      ("pool_warm_after_command", POOL_WARM)):
        found = re.search(stamp + line, log, re.MULTILINE)
        if found:
            when = datetime.datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S").timestamp()
            out[key] = when + int(found.group(2)) / 1e3 - started_at
    spawned = re.search(r"started ([\d.]+) s after this command", log)
    if spawned:
        out["workers_started_after_command"] = float(spawned.group(1))
    return out


def ready_line(log: str) -> dict[str, Any]:
    """The worker's start from its log line ``... ready_s=4.10 child_and_pool_s=3.20
    calibration_s=0.01 calibration=reused``: the seconds by step and how it calibrated."""
    import re

    found = re.search(r"ready_s=([\d.]+)((?: \w+_s=[\d.]+)*) calibration=(\w+)", log)
    if not found:
        return {}
    steps = dict(re.findall(r"(\w+)_s=([\d.]+)", found.group(2)))
    return {"ready_s": float(found.group(1)), "calibrated": found.group(3),
            **{k: float(v) for k, v in steps.items()}}


def _run_job(client: Any, problem: Problem, trials: int, backend: str,
             force: bool = False) -> tuple[dict[str, Any], float]:
    t0 = time.monotonic()
    created = client.submit_job(problem.kernel, [problem.shape], problem.dtype,
                                trials=trials, backend=backend, force=force)
    job = client.wait(created["id"], timeout=900, poll=POLL_S)
    return job, time.monotonic() - t0


#: the client's poll of its job (s): the wall's resolution
POLL_S = 0.02


#: a reference search: no early stop of any kind, the trial budget alone
REFERENCE_ENV = {"TUNER_STOP_CHANCE": "0", "TUNER_ROOFLINE_STOP": "0", "TUNER_PATIENCE": "0"}


def _job_row(problem: Problem, job: Mapping[str, Any], wall: float,
             tables: Sequence[Any]) -> dict[str, Any]:
    task = job["tasks"][0]
    summary = {"status": job["status"], "trials": task["trials_done"],
               "stop_reason": task.get("stop_reason") or task["status"],
               "best_ms": task["best_ms"], "best_config": task["best_config"]}
    return {**problem_row(problem, summary, wall, find_table(tables, problem)),
            "spec": f"{problem.kernel}:{problem.shape_text}:{problem.dtype}",
            "phases": task.get("phases") or {}, "device": task.get("device")}


def service_report(problems: Sequence[Problem], tables: Sequence[Any], trials: int | None,
                   tmp: str, *, backend: str = "cuda", moe_sweep: bool = False,
                   restart: bool = False) -> dict[str, Any]:
    """Issue 33's measurement through one running ``tuner serve`` on a fresh store (see the
    module's docstring): its start, each problem as a job (default budget unless
    ``trials``), the MoE sweep as one job, then (``restart``) the service started again on
    the same store. Returns the report ``markdown_service`` prints."""
    from tuner.client import TunerClient

    db = f"sqlite:///{Path(tmp) / 'service.db'}"
    report: dict[str, Any] = {"db": str(Path(tmp) / "service.db"), "rows": [], "sweep": None}
    service = _Service(tmp, db, backend, "service")
    report["start"] = {"wall_s": service.start_s, **service.ready}
    print(json.dumps({"start": report["start"]}), flush=True)
    try:
        with TunerClient(service.url) as client:
            for problem in problems:
                job, wall = _run_job(client, problem, trials or 48, backend)
                report["rows"].append(_job_row(problem, job, wall, tables))
                print(json.dumps(report["rows"][-1]), flush=True)
            if moe_sweep:
                report["sweep"] = _sweep_job(client, trials or 48, backend)
                print(json.dumps({k: v for k, v in report["sweep"].items() if k != "tasks"}),
                      flush=True)
    finally:
        service.stop()
    report["device"] = next((r["device"] for r in report["rows"] if r.get("device")), None)
    if restart:
        again = _Service(tmp, db, backend, "restart")
        report["restart"] = {"wall_s": again.start_s, **again.ready}
        again.stop()
        print(json.dumps({"restart": report["restart"]}), flush=True)
    return report


def _sweep_job(client: Any, trials: int, backend: str) -> dict[str, Any]:
    """The 18 token counts of one MoE layer as one job of the running service: wall from the
    POST to the finished job, and each shape's trials, best and phases."""
    base = dict(item.split("=") for item in MOE_LAYER.split(","))
    shapes = [{"M": m, **{k: int(v) for k, v in base.items()}} for m in MOE_TOKENS]
    t0 = time.monotonic()
    created = client.submit_job("moe_gemm", shapes, MOE_DTYPE, trials=trials, backend=backend)
    job = client.wait(created["id"], timeout=900, poll=POLL_S)
    wall = time.monotonic() - t0
    tasks = [{"shape": t["shape"], "trials": t["trials_done"], "best_ms": t["best_ms"],
              "best_config": t["best_config"], "stop_reason": t.get("stop_reason"),
              "phases": t.get("phases") or {}, "status": t["status"]} for t in job["tasks"]]
    return {"wall_s": wall, "status": job["status"], "shapes": len(tasks),
            "trials": sum(int(t["trials"] or 0) for t in tasks), "tasks": tasks}


def add_references(report: dict[str, Any], tmp: str, reference_trials: int,
                   backend: str = "cuda",
                   after_each: Callable[[], None] | None = None) -> None:
    """Re-tune each of the report's problems on its store with ``reference_trials`` and every
    early stop off (a forced job): its re-timing times the fast job's stored best (the
    incumbent) beside its own finalists in the same child, so ``vs_reference`` (incumbent /
    the better of the two) says how close the fast job came to what a long search finds."""
    from tuner.client import TunerClient

    db = f"sqlite:///{report['db']}"
    service = _Service(tmp, db, backend, "reference", REFERENCE_ENV)
    report["reference_start"] = {"wall_s": service.start_s, **service.ready}
    try:
        with TunerClient(service.url) as client:
            for row in report["rows"]:
                job, wall = _run_job(client, parse_problem(row["spec"]), reference_trials,
                                     backend, True)
                task = job["tasks"][0]
                best, incumbent = task.get("best_ms"), task.get("incumbent_ms")
                row.update(reference_trials=task["trials_done"], reference_ms=best,
                           incumbent_ms=incumbent, reference_wall_s=wall,
                           reference_config=task.get("best_config"))
                if best and incumbent:
                    # the same config timed twice differs by the noise alone (a softmax at
                    # 1.010 on an H200): a search that found the reference's config came as close
                    same = task.get("best_config") == row.get("best_config")
                    row["vs_reference"] = 1.0 if same else incumbent / min(best, incumbent)
                    row["reference_same_config"] = same
                print(json.dumps({"reference": row}), flush=True)
                if after_each is not None:  # kept as it goes: a long call may be cut off
                    after_each()
    finally:
        service.stop()


def service_rows(problems: Sequence[Problem], tables: Sequence[Any], trials: int | None,
                 tmp: str, backend: str = "cuda", reference_trials: int = 0
                 ) -> tuple[list[dict[str, Any]], str | None, float | None]:
    """Each problem as a job of one running ``tuner serve``, and with ``reference_trials``
    each re-tuned as ``add_references`` does: (rows, device, seconds the service took to
    start)."""
    report = service_report(problems, tables, trials, tmp, backend=backend)
    if reference_trials:
        add_references(report, tmp, reference_trials, backend)
    return report["rows"], report["device"], report["start"]["wall_s"]


def _phase_cells(phases: Mapping[str, Any], wall: float | None) -> list[str]:
    cells = [_fmt(phases.get(p), ".2f") for p in PHASE_COLUMNS]
    other = (wall - float(phases.get("queued", 0.0)) - float(phases["total"])
             if wall is not None and "total" in phases else None)
    return [*cells, _fmt(other, ".2f"), str(int(phases.get("compiled_ahead", 0))),
            str(int(phases.get("reused_compiles", 0))),
            _fmt(phases.get("compile_ahead_cpu"), ".1f"),
            "/".join(str(int(phases.get(f"warmups_{k}", 0))) for k in ("long", "short", "redone")),
            _fmt(phases.get("timing_child"), ".2f"),
            _fmt(phases.get("compile_wait_queued", 0.0 if "compile_wait" in phases else None),
                 ".2f")]


PHASE_HEADER = ("queued | setup | compile wait | compile (child) | verifying | measuring | "
                "re-timing | "
                "storing | search loop | other (HTTP, polling) | compiled ahead | reused | "
                "pool CPU s | warm-ups long/short/redone | timing (child) s | "
                "compile wait, queued s")


def _start_text(name: str, start: Mapping[str, Any] | None) -> str:
    if not start:
        return f"- {name}: not measured"
    apart = ("wall_s", "ready_s", "worker_ready_after_command", "workers_started_after_command",
             "pool_warm_after_command")
    steps = ", ".join(f"{k.replace('_', ' ')} {v:.2f} s" for k, v in start.items()
                      if k not in apart and isinstance(v, (int, float)))
    worker = start.get("worker_ready_after_command")
    if worker is None:  # an older report: only /healthz's view
        met = "met" if start["wall_s"] <= TARGET_READY_S_33 else "missed"
        head = (f"**{start['wall_s']:.1f} s** from the command to an idle worker ({met} the "
                f"{TARGET_READY_S_33:.0f} s target)")
    else:
        pool = start.get("pool_warm_after_command")
        both = max(worker, pool) if pool is not None else worker
        met = "met" if both <= TARGET_READY_S_33 else "missed"
        warm = ("" if pool is None else f", its compile pool warm **{pool:.1f} s** after it "
                "(the target counts the later of the two)")
        head = (f"the worker ready to measure **{worker:.1f} s** after the command (its log "
                f"line's time){warm} ({met} the {TARGET_READY_S_33:.0f} s target); its process "
                f"started {_fmt(start.get('workers_started_after_command'), '.2f')} s after it; "
                f"/healthz showed it idle after {start['wall_s']:.1f} s (the API up too)")
    return (f"- {name}: {head}; the worker's own count from its process start: "
            f"{_fmt(start.get('ready_s'), '.2f')} s ({steps}; the calibration "
            f"{start.get('calibrated', '-')})")


def markdown_service(report: Mapping[str, Any], command: str, gpu_state: str = "") -> str:
    """Issue 33's table: the start, each shape with where its time went, the sweep."""
    rows = report["rows"]
    lines = ["# Tuning time through the service, from a cold start (issue 33)", "",
             f"Command: `{command}` ({time.strftime('%Y-%m-%d')}; device: "
             f"{report.get('device') or '-'}; a fresh SQLite store and an empty Triton cache "
             "at the first start)", ""]
    if gpu_state:
        lines += [f"GPU state: {gpu_state}", ""]
    lines += ["## Start", "", _start_text("fresh store", report.get("start")),
              _start_text("restarted on the same store", report.get("restart")), ""]
    if rows:
        lines += ["## Each shape, POST to finished job (default budget)", "",
                  "| problem | wall s | trials | stopped | best ms | vs reference | "
                  + PHASE_HEADER + " |", "|---" * (7 + PHASE_HEADER.count("|")) + "|"]
        for r in rows:
            same = ", same config" if r.get("reference_same_config") else ""
            ref = (f"{r['vs_reference']:.3f} ({r.get('reference_trials')}{same})"
                   if r.get("vs_reference") is not None else "-")
            lines.append(f"| {r['problem']} | {r['wall_s']:.1f} | {r.get('trials', '-')} | "
                         f"{r.get('stop') or r.get('status')} | {_fmt(r.get('best_ms'), '.4f')}"
                         f" | {ref} | " + " | ".join(_phase_cells(r.get("phases") or {},
                                                                   r["wall_s"])) + " |")
        walls = [r["wall_s"] for r in rows]
        refs = [r["vs_reference"] for r in rows if r.get("vs_reference") is not None]
        families = {r["problem"].split()[0].replace("_causal", "") for r in rows}
        median, worst = statistics.median(walls), max(walls)
        lines += ["", f"{len(rows)} problems, {len(families)} kernel families. Wall: median "
                  f"**{median:.1f} s** ({'met' if median <= TARGET_MEDIAN_S_33 else 'missed'} "
                  f"<= {TARGET_MEDIAN_S_33:.0f} s), max **{worst:.1f} s** "
                  f"({'met' if worst <= TARGET_MAX_S_33 else 'missed'} <= "
                  f"{TARGET_MAX_S_33:.0f} s)."]
        if refs:
            within = sum(1 for q in refs if q <= 1 + TARGET_BAND_33)
            lines.append(f"Quality: {within} of {len(refs)} within {TARGET_BAND_33:.0%} of a "
                         f"{rows[0].get('reference_trials')}-trial search with the early stops "
                         f"off (worst {max(refs):.3f}; the fast job's best and the reference's "
                         "re-timed side by side in one child).")
        else:
            lines.append("Quality: no reference run in this table.")
        lines.append("")
    sweep = report.get("sweep")
    if sweep:
        wall = sweep["wall_s"]
        lines += [f"## moe_gemm {MOE_LAYER} {MOE_DTYPE}: {len(MOE_TOKENS)} token counts as one "
                  "job of the running service", "",
                  f"POST to finished job: **{wall:.1f} s** "
                  f"({'met' if wall <= TARGET_SWEEP_S_33 else 'missed'} the "
                  f"{TARGET_SWEEP_S_33:.0f} s target), {sweep['trials']} trials, status "
                  f"{sweep['status']}.", "",
                  "| M | trials | stopped | best ms | " + PHASE_HEADER + " |",
                  "|---" * (5 + PHASE_HEADER.count("|")) + "|"]
        for t in sweep["tasks"]:
            lines.append(f"| {t['shape']['M']} | {t['trials']} | {t.get('stop_reason')} | "
                         f"{_fmt(t.get('best_ms'), '.4f')} | "
                         + " | ".join(_phase_cells(t.get("phases") or {}, None)) + " |")
        lines.append("")
    return "\n".join(lines) + "\n"


def _env(cache_root: str | None, name: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    if cache_root is not None:
        env["TRITON_CACHE_DIR"] = str(Path(cache_root) / name)
    return env


def gpu_state() -> str:
    """The GPU's name, clocks, power and temperature now (nvidia-smi), or why not."""
    query = "name,clocks.sm,clocks.max.sm,power.draw,power.limit,temperature.gpu,utilization.gpu"
    try:
        out = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                             capture_output=True, text=True, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"not read ({exc})"
    return f"{query}: " + out.stdout.strip().replace("\n", "; ")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True, help="markdown file")
    ap.add_argument("--problem", action="append", help="KERNEL:DIM=V,...:DTYPE (repeatable; "
                    "default: the issue's four matmul problems; with --service, HELD_OUT)")
    ap.add_argument("--table", action="append", default=[],
                    help="a folder of replay tables (repeatable)")
    ap.add_argument("--trials", type=int, default=None, help="trial cap (default: the CLI's)")
    ap.add_argument("--moe-sweep", action="store_true", help="also the 18-token MoE sweep "
                    "(tuner.app.sweep, its own process)")
    ap.add_argument("--sweep-trials", type=int, default=SWEEP_TRIALS,
                    help=f"trial cap per shape of the sweep (default {SWEEP_TRIALS}; 0: the "
                         "CLI's)")
    ap.add_argument("--no-problems", action="store_true", help="only the sweep")
    ap.add_argument("--cold-cache", action="store_true", help="an empty Triton cache each")
    ap.add_argument("--service", action="store_true", help="the problems as jobs of one "
                    "running tuner serve (its worker keeps its child across jobs)")
    ap.add_argument("--moe-sweep-service", action="store_true", help="with --service: the "
                    "18-token MoE sweep as one job of the running service (default budget)")
    ap.add_argument("--restart", action="store_true", help="with --service: start the "
                    "service again on the same store and record its start")
    ap.add_argument("--save", help="with --service: keep the report (report.json) and the "
                    "store (service.db) in this folder, for --references-for")
    ap.add_argument("--references-for", help="a folder --save wrote: add each problem's "
                    "reference search (--reference-trials, default 96) and rewrite --out")
    ap.add_argument("--reference-trials", type=int, default=0, help="with --service or "
                    "--references-for: re-tune each problem with this many trials and no early "
                    "stop, timing the fast job's best beside it (0: no reference)")
    ap.add_argument("--backend", default="cuda", help="with --service: the worker's backend "
                    "(interpret: a smoke run on a machine without a GPU)")
    args = ap.parse_args(argv)
    command = "python3 -m bench.tuning_time " + " ".join(argv)
    if args.references_for:
        return _references_main(args, command)
    if args.service:
        return _service_main(args, command)
    problems = [] if args.no_problems else [parse_problem(p) for p in
                                            (args.problem or PROBLEMS)]
    tables = load_tables(args.table) if args.table else []
    rows, sweep, device = [], None, None
    with tempfile.TemporaryDirectory(prefix="tuning-time-") as tmp:
        cache = tmp if args.cold_cache else None
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
    text = markdown(rows, sweep, command, device, args.cold_cache)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)
    return 0


def copy_sqlite(src: str | Path, dst: str | Path) -> None:
    """``src``'s database into ``dst`` through SQLite's backup: with what its write-ahead log
    holds (a copy of the main file alone lost the last jobs a stopped service had not
    checkpointed, and with them the incumbents the references time)."""
    import sqlite3

    Path(dst).unlink(missing_ok=True)
    source, target = sqlite3.connect(str(src)), sqlite3.connect(str(dst))
    try:
        source.backup(target)
    finally:
        target.close()
        source.close()


def _service_main(args: argparse.Namespace, command: str) -> int:
    import shutil

    problems = [parse_problem(p) for p in (args.problem or HELD_OUT)]
    tables = load_tables(args.table) if args.table else []
    before = gpu_state()
    with tempfile.TemporaryDirectory(prefix="tuning-time-") as tmp:
        report = service_report(problems, tables, args.trials, tmp, backend=args.backend,
                                moe_sweep=args.moe_sweep_service, restart=args.restart)
        if args.reference_trials:
            add_references(report, tmp, args.reference_trials, args.backend)
        report["gpu_state"] = f"before: {before}; after: {gpu_state()}"
        report["command"] = command
        if args.save:
            save = Path(args.save)
            save.mkdir(parents=True, exist_ok=True)
            copy_sqlite(report["db"], save / "service.db")
            for log in Path(tmp).glob("*.log"):  # the services' own logs
                shutil.copy(log, save / log.name)
            report["db"] = str(save / "service.db")
            (save / "report.json").write_text(json.dumps(report, indent=1))
    text = markdown_service(report, command, report["gpu_state"])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)
    return 0


def _references_main(args: argparse.Namespace, command: str) -> int:
    """A later call: the saved report's problems re-tuned as references on its saved store."""
    folder = Path(args.references_for)
    report = json.loads((folder / "report.json").read_text())
    report["db"] = str(folder / "service.db")
    before = gpu_state()
    report["gpu_state"] += f"; references: before: {before}"

    def save() -> None:
        (folder / "report.json").write_text(json.dumps(report, indent=1))

    with tempfile.TemporaryDirectory(prefix="tuning-time-") as tmp:
        add_references(report, tmp, args.reference_trials or 96, after_each=save)
    report["gpu_state"] += f"; after: {gpu_state()}"
    save()
    text = markdown_service(report, f"{report['command']}, then `{command}`",
                            report["gpu_state"])
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
