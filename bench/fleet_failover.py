"""The PostgreSQL fleet on two GPUs: two workers as two "machines" on one PostgreSQL, through
the dispatcher (procrastinate by default; ``--dispatch embedded`` for the home-made queue in
the same run), one SIGKILLed mid-task.

Each worker is a separate ``tuner worker`` process with its own GPU (``CUDA_VISIBLE_DEVICES``)
and its own host name (a UTS namespace, ``unshare --uts``, where the machine allows it: its
worker id starts with that name). Jobs are submitted over HTTP to the API (uvicorn, in this
process). Measured, per dispatcher:

1. pick-up after submission: both workers idle, one job posted; seconds from the 202 to the
   task's ``started_at`` (and to the first observation of it running), over ``--pickups``
   jobs, one at a time;
2. spread: ``--jobs`` jobs posted at once: which worker ran each task, wall time;
3. kill: one long job; when its worker has stored ``--kill-after`` trials, that worker's
   process group is SIGKILLed (a machine dying); seconds until the other worker holds the
   task, then until it is done. Checked: every task ran to ``succeeded``, every trial
   number once, the trials stored before the kill kept, the killed task's attempts 1 and
   requeues 1.

The PostgreSQL server: ``--db`` (a server URL), else one started here from the ``pgserver``
package's binaries (a wheel, installed on a machine without one).

Usage (on a 2-GPU machine)::

    python3 -m bench.fleet_failover --out OUT/fleet_failover.md
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent


def start_postgres(tmp: Path) -> tuple[str, Any]:
    """A PostgreSQL server for this run: the ``pgserver`` package's (bundled binaries)."""
    import pgserver  # type: ignore[import-not-found]

    server = pgserver.get_server(tmp / "pgdata", cleanup_mode="stop")
    return server.get_uri(), server


def database(server_url: str, name: str) -> str:
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    url = make_url(server_url.replace("postgresql://", "postgresql+psycopg://", 1))
    admin = create_engine(url.set(database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return url.set(database=name).render_as_string(hide_password=False)


def unshare_works() -> bool:
    return shutil.which("unshare") is not None and subprocess.run(
        ["unshare", "--uts", "true"], capture_output=True).returncode == 0


def start_worker(host: str, gpu: int, env: dict[str, str], log: Path,
                 backend: str) -> subprocess.Popen[Any]:
    """``tuner worker`` on GPU ``gpu`` as machine ``host`` (own process group)."""
    command = [sys.executable, "-m", "tuner.app.cli", "worker", "--backend", backend]
    if unshare_works():
        inner = " ".join(f"'{c}'" for c in command)
        command = ["unshare", "--uts", "sh", "-c", f"hostname {host} && exec {inner}"]
    return subprocess.Popen(command, cwd=ROOT, env={**env, "CUDA_VISIBLE_DEVICES": str(gpu)},
                            stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


class Fleet:
    def __init__(self, url: str, dispatch: str, tmp: Path, stalled_after_s: float,
                 backend: str, scale: float) -> None:
        from api.app import create_app
        from db.engine import init_db
        from tuner.settings import Settings

        self.url, self.dispatch, self.tmp = url, dispatch, tmp
        self.backend, self.scale = backend, scale
        self.env = {**os.environ, "TUNER_DATABASE_URL": url, "TUNER_DISPATCH": dispatch,
                    "TUNER_STALLED_AFTER_S": str(stalled_after_s),
                    "PYTHONPATH": os.pathsep.join(
                        p for p in (os.environ.get("PYTHONPATH"), str(ROOT)) if p)}
        self.factory = init_db(url)
        settings = Settings(database_url=url, dispatch=dispatch,
                            stalled_after_s=stalled_after_s)
        import uvicorn

        from tests.support_processes import free_port

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1",
                                                    port=self.port, log_level="warning"))
        threading.Thread(target=self.server.run, daemon=True).start()
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=60)
        until(lambda: self._up(), 120, "the API answers")
        self.workers: dict[str, subprocess.Popen[Any]] = {}

    def _up(self) -> bool:
        try:
            return self.http.get("/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    def start(self, host: str, gpu: int) -> None:
        self.workers[host] = start_worker(host, gpu, self.env,
                                          self.tmp / f"{self.dispatch}-{host}.log",
                                          self.backend)

    def registered(self) -> list[str]:
        from db import repo

        with self.factory() as session:
            return [w.id for w in repo.list_workers(session, seen_within_s=30)
                    if w.status in ("idle", "busy")]

    def submit(self, shape: dict[str, int], trials: int) -> tuple[str, float]:
        shape = {k: max(16, int(v * self.scale)) for k, v in shape.items()}
        body = {"kernel": "matmul", "dtype": "float16", "shapes": [shape], "force": True,
                "backend": self.backend, "budget": {"trials": trials}}
        response = self.http.post("/api/v1/jobs", json=body)
        response.raise_for_status()
        return response.json()["id"], time.monotonic()

    def task(self, job_id: str) -> Any:
        from db import repo

        with self.factory() as session:
            return repo.get_job(session, job_id).tasks[0]

    def trials(self, task_id: int) -> list[int]:
        from db import repo

        with self.factory() as session:
            return [t.number for t in repo.trials_for_task(session, task_id)]

    def stop(self) -> None:
        for proc in self.workers.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.workers.values():
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        self.server.should_exit = True


def until(condition: Any, seconds: float, what: str, step: float = 0.02) -> Any:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if value := condition():
            return value
        time.sleep(step)
    raise TimeoutError(f"not within {seconds:.0f} s: {what}")


def run(fleet: Fleet, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"dispatch": fleet.dispatch}
    fleet.start("gpu-node-a", 0)
    fleet.start("gpu-node-b", 1)
    until(lambda: len(fleet.registered()) >= 2, 300, "both workers idle", 0.2)
    out["workers"] = sorted(fleet.registered())
    # 1. pick-up after submission, workers idle
    pickups, seen = [], []
    for i in range(args.pickups):
        job_id, posted = fleet.submit({"M": 512 + 64 * i, "N": 512, "K": 512}, 4)
        until(lambda j=job_id: fleet.task(j).status != "queued", 60, "picked up", 0.005)
        seen.append(time.monotonic() - posted)
        task = until(lambda j=job_id: (t := fleet.task(j)).status == "succeeded" and t, 300,
                     "done", 0.1)
        job_created = fleet.http.get(f"/api/v1/jobs/{job_id}").json()["created_at"]
        from datetime import datetime

        started = task.started_at
        created = datetime.fromisoformat(job_created.replace("Z", "+00:00"))
        if started.tzinfo is None:
            started = started.replace(tzinfo=created.tzinfo)
        pickups.append((started - created).total_seconds())
    out["pickup_s"] = pickups
    out["pickup_seen_s"] = seen
    # 2. spread
    t0 = time.monotonic()
    jobs = [fleet.submit({"M": 1024 * (1 + i), "N": 2048, "K": 1024}, args.trials)[0]
            for i in range(args.jobs)]  # distinct shapes: identical jobs would be one
    tasks = until(lambda: (ts := [fleet.task(j) for j in jobs]) and all(
        t.status in ("succeeded", "failed") for t in ts) and ts, 600, "spread jobs done", 0.5)
    out["spread_wall_s"] = time.monotonic() - t0
    out["spread"] = [{"task": t.id, "status": t.status, "device": t.device_key,
                      "trials": t.trials_done, "attempts": t.attempts} for t in tasks]
    out["spread_owners"] = _owners(fleet, [t.id for t in tasks])
    # 3. kill the worker holding a long task
    job_id, _ = fleet.submit({"M": 4096, "N": 4096, "K": 4096}, args.kill_trials)
    task = until(lambda: (t := fleet.task(job_id)).status == "running" and t.lease_owner and t,
                 120, "the long task started", 0.05)
    victim = next(h for h in fleet.workers if task.lease_owner.startswith(h)) \
        if unshare_works() else None
    until(lambda: len(fleet.trials(task.id)) >= args.kill_after, 300, "trials stored", 0.05)
    if victim is None:  # no UTS namespaces: find the holder by pid in the worker rows
        victim = _holder_by_pid(fleet, task.lease_owner)
    os.killpg(fleet.workers[victim].pid, signal.SIGKILL)
    killed_at = time.monotonic()
    fleet.workers[victim].wait(30)
    kept = fleet.trials(task.id)
    owner = task.lease_owner
    until(lambda: (t := fleet.task(job_id)).lease_owner not in (None, owner)
          and t.status == "running", 600, "another worker took the task", 0.02)
    out["takeover_s"] = time.monotonic() - killed_at
    done = until(lambda: (t := fleet.task(job_id)).status in ("succeeded", "failed") and t,
                 900, "the killed task finished", 0.2)
    out["kill_to_done_s"] = time.monotonic() - killed_at
    numbers = fleet.trials(task.id)
    out["kill"] = {"victim": victim, "trials_before_kill": len(kept),
                   "kept": numbers[:len(kept)] == kept, "trials": len(numbers),
                   "unique": len(numbers) == len(set(numbers)), "status": done.status,
                   "attempts": done.attempts, "requeues": done.requeues}
    # every task of the run: done, once
    from db import repo

    with fleet.factory() as session:
        counts = repo.count_tasks_by_status(session)
    out["task_statuses"] = counts
    return out


def _owners(fleet: Fleet, task_ids: list[int]) -> dict[str, int]:
    """Tasks claimed per worker, from each worker's log ("claimed task N"): the tables keep
    no history of owners."""
    owners: dict[str, int] = {}
    for host in fleet.workers:
        log = (fleet.tmp / f"{fleet.dispatch}-{host}.log").read_text(errors="replace")
        owners[host] = sum(f"claimed task {t}\n" in log for t in task_ids)
    return owners


def _holder_by_pid(fleet: Fleet, worker_id: str) -> str:
    from db import repo

    with fleet.factory() as session:
        row = next(w for w in repo.list_workers(session) if w.id == worker_id)
    return next(h for h, p in fleet.workers.items() if p.pid == row.pid)


def markdown(results: list[dict[str, Any]], gpu: str, args: argparse.Namespace) -> str:
    lines = ["# The fleet on one PostgreSQL: two workers, two GPUs, one SIGKILLed\n",
             f"`python3 -m bench.fleet_failover {' '.join(sys.argv[1:])}`\n", "GPUs:\n",
             "```", gpu.strip(), "```\n",
             "| | " + " | ".join(r["dispatch"] for r in results) + " |",
             "|---|" + "---|" * len(results)]

    def row(name: str, f: Any) -> None:
        lines.append(f"| {name} | " + " | ".join(f(r) for r in results) + " |")

    row("workers (host-worker id)", lambda r: ", ".join(r["workers"]))
    row(f"pick-up after submission, median of {args.pickups} (s, started_at - created_at)",
        lambda r: f"{statistics.median(r['pickup_s']):.3f} (max {max(r['pickup_s']):.3f})")
    row("pick-up seen by polling from the 202 (s, median)",
        lambda r: f"{statistics.median(r['pickup_seen_s']):.3f}")
    row(f"{args.jobs} jobs at once: wall (s)", lambda r: f"{r['spread_wall_s']:.1f}")
    row("... tasks claimed per worker (from their logs)",
        lambda r: ", ".join(f"{h}: {n}" for h, n in r["spread_owners"].items()))
    row("... tasks, statuses", lambda r: f"{len({t['task'] for t in r['spread']})}, " + ", ".join(
        sorted({t['status'] for t in r['spread']})))
    row("kill: trials stored before the SIGKILL", lambda r: str(r["kill"]["trials_before_kill"]))
    row("kill -> the other worker holds the task (s)", lambda r: f"{r['takeover_s']:.1f}")
    row("kill -> the task is done (s)", lambda r: f"{r['kill_to_done_s']:.1f}")
    row("killed task: status, attempts, requeues",
        lambda r: f"{r['kill']['status']}, {r['kill']['attempts']}, {r['kill']['requeues']}")
    row("killed task: trials before the kill kept / every number once",
        lambda r: f"{r['kill']['kept']} / {r['kill']['unique']} ({r['kill']['trials']} trials)")
    row("every task of the run by status", lambda r: json.dumps(r["task_statuses"]))
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", help="a PostgreSQL server URL (default: start one)")
    parser.add_argument("--dispatch", nargs="+", default=["procrastinate", "embedded"])
    parser.add_argument("--pickups", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=6)
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--kill-trials", type=int, default=80)
    parser.add_argument("--kill-after", type=int, default=8)
    parser.add_argument("--stalled-after", type=float, default=15.0)
    parser.add_argument("--backend", default="cuda", help="interpret: a dry run on a CPU")
    parser.add_argument("--scale", type=float, default=1.0,
                        help="multiplies every shape (a dry run on the interpreter: 1/128)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="fleet-"))
    server = None
    if args.db:
        server_url = args.db
    else:
        server_url, server = start_postgres(tmp)
    gpu = "no GPU (a dry run)" if not shutil.which("nvidia-smi") else subprocess.run(
        ["nvidia-smi", "--query-gpu=index,name,clocks.sm,clocks.max.sm,power.draw,power.limit,"
         "temperature.gpu", "--format=csv"], capture_output=True, text=True).stdout
    results = []
    for dispatch in args.dispatch:
        fleet = Fleet(database(server_url, f"fleet_{dispatch}"), dispatch, tmp,
                      args.stalled_after, args.backend, args.scale)
        try:
            results.append(run(fleet, args))
        finally:
            fleet.stop()
        print(json.dumps(results[-1], default=str), flush=True)
    Path(args.out).write_text(markdown(results, gpu, args))
    Path(args.out).with_suffix(".json").write_text(json.dumps(results, indent=1, default=str))
    for log in sorted(tmp.glob("*.log")):
        shutil.copy(log, Path(args.out).parent / log.name)
    print(Path(args.out).read_text())
    del server


if __name__ == "__main__":
    main()
