"""Several GPUs under one ``tuner serve``: are they all used, and how much faster is the queue?

Starts ``tuner serve`` with ``CUDA_VISIBLE_DEVICES`` set as a cluster scheduler sets it (the whole
list, e.g. ``0,1``) and N workers, submits the same four single-shape matmul jobs over HTTP, and
samples ``nvidia-smi`` every half second until every job has finished. Each run gets a fresh
SQLite file and a fresh Triton cache, so no run reuses another's compiles or stored bests.

Writes a markdown table: per run the wall time from the first submission to the last job's end,
and per GPU the fraction of samples in which it was busy (utilisation > 0) and the processes seen
on it; then the workers the service reported (``/healthz``) and which worker ran each task.

With ``--kill-check``, also: a ``tuner worker`` for the LAST visible GPU is SIGKILLed while it
measures, and the table says on which GPU its processes ran and how long its measuring and
compiling children outlived it (until no process of it is alive or listed by ``nvidia-smi``).

Usage (on a machine with at least two GPUs)::

    python3 -m bench.multi_gpu --workers 2 1 --visible 0,1 --out bench/results/multi_gpu_h200.md
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

#: the four jobs: one matmul shape each (fp16), the same budget
SHAPES = [
    {"M": 4096, "N": 4096, "K": 4096},
    {"M": 2048, "N": 8192, "K": 2048},
    {"M": 512, "N": 6144, "K": 2048},
    {"M": 1000, "N": 3000, "K": 4000},
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class GpuSampler(threading.Thread):
    """Samples per-GPU utilisation, SM clock, power and the compute processes on each GPU."""

    def __init__(self, interval_s: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.interval_s = interval_s
        self.samples: list[dict[str, dict[str, float]]] = []
        self.pids: dict[str, set[int]] = {}
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.wait(self.interval_s):
            gpus = _query(["nvidia-smi", "--query-gpu=uuid,index,utilization.gpu,clocks.sm,"
                           "power.draw,memory.used", "--format=csv,noheader,nounits"])
            sample = {}
            for row in gpus:
                uuid, index, util, sm, power, mem = row
                sample[uuid] = {"index": float(index), "util": _num(util), "sm": _num(sm),
                                "power": _num(power), "mem": _num(mem)}
            self.samples.append(sample)
            apps = _query(["nvidia-smi", "--query-compute-apps=gpu_uuid,pid",
                           "--format=csv,noheader,nounits"])
            for uuid, pid in apps:
                self.pids.setdefault(uuid, set()).add(int(pid))

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=5)

    def summary(self) -> list[dict[str, Any]]:
        uuids = sorted({u for s in self.samples for u in s},
                       key=lambda u: self.samples[-1].get(u, {}).get("index", 0))
        out = []
        for uuid in uuids:
            rows = [s[uuid] for s in self.samples if uuid in s]
            busy = [r for r in rows if r["util"] > 0]
            out.append({
                "uuid": uuid, "index": int(rows[0]["index"]) if rows else -1,
                "busy_fraction": len(busy) / len(rows) if rows else 0.0,
                "mean_util": sum(r["util"] for r in rows) / len(rows) if rows else 0.0,
                "max_sm_mhz": max((r["sm"] for r in rows), default=0.0),
                "max_power_w": max((r["power"] for r in rows), default=0.0),
                "processes": len(self.pids.get(uuid, ())),
            })
        return out


def _num(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 0.0


def _query(cmd: list[str]) -> list[list[str]]:
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [[c.strip() for c in line.split(",")] for line in out.splitlines() if line.strip()]


def wait_ready(base: str, workers: int, timeout_s: float = 600) -> dict[str, Any]:
    """Until /healthz lists ``workers`` live workers (or, on a service that does not list its
    workers, a live device)."""
    deadline = time.monotonic() + timeout_s
    health: dict[str, Any] = {}
    while time.monotonic() < deadline:
        try:
            health = httpx.get(f"{base}/healthz", timeout=5).json()
        except httpx.HTTPError:
            time.sleep(1)
            continue
        report = health.get("workers") or {}
        listed = report.get("workers")
        if isinstance(listed, list):
            live = [w for w in listed if w.get("status") in ("idle", "busy")]
            if len(live) >= workers:
                return health
        elif any(d.get("alive") for d in report.get("devices", [])):
            return health
        time.sleep(1)
    raise TimeoutError(f"the service did not report {workers} live worker(s): {health}")


def run(workers: int, visible: str, trials: int, port: int, workdir: Path) -> dict[str, Any]:
    db = workdir / f"w{workers}.db"
    cache = workdir / f"triton-cache-w{workers}"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": visible, "TRITON_CACHE_DIR": str(cache),
           "TUNER_DATABASE_URL": f"sqlite:///{db}"}
    log = (workdir / f"serve-w{workers}.log").open("w")
    cmd = [sys.executable, "-m", "tuner.app.cli", "serve", "--port", str(port),
           "--backend", "cuda",
           "--workers", str(workers)]
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    sampler = GpuSampler()
    try:
        health = wait_ready(base, workers)
        sampler.start()
        started = time.monotonic()
        ids = []
        for shape in SHAPES:
            body = {"kernel": "matmul", "dtype": "float16", "shapes": [shape],
                    "budget": {"trials": trials}, "force": True}
            reply = httpx.post(f"{base}/api/v1/jobs", json=body, timeout=30)
            reply.raise_for_status()
            ids.append(reply.json()["id"])
        owners: dict[int, str] = {}
        jobs: list[dict[str, Any]] = []
        while True:
            jobs = [httpx.get(f"{base}/api/v1/jobs/{i}", timeout=30).json() for i in ids]
            running = httpx.get(f"{base}/healthz", timeout=30).json().get("workers") or {}
            for task in running.get("running", []):
                owners[int(task["task_id"])] = str(task.get("worker"))
            if all(j["status"] in ("succeeded", "failed", "cancelled") for j in jobs):
                break
            time.sleep(0.5)
        wall = time.monotonic() - started
        sampler.stop()
        final_health = httpx.get(f"{base}/healthz", timeout=30).json()
    finally:
        sampler.stop()
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=120)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
    return {"workers": workers, "visible": visible, "wall_s": wall, "gpus": sampler.summary(),
            "jobs": jobs, "owners": owners, "health_at_start": health,
            "health_at_end": final_health}


def kill_check(visible: str, workdir: Path) -> dict[str, Any]:
    """SIGKILL a worker mid-task; how long do its children and its hold on the GPU last?"""
    from db import repo
    from db.engine import init_db
    from search_spaces import get_kernel

    url = f"sqlite:///{workdir / 'kill.db'}"
    factory = init_db(url)
    kernel = get_kernel("matmul")
    with factory() as session:
        job = repo.create_job(session, kernel="matmul", kernel_version=kernel.version,
                              dtype="float16", shapes=[{"M": 4096, "N": 4096, "K": 4096}],
                              budget_trials=500, budget_seconds=None, strategy="auto",
                              force=True, seed=0, backend="cuda", device_key=None)
        session.commit()
        task_id = job.tasks[0].id
    index = len(visible.split(",")) - 1
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": visible, "TUNER_DATABASE_URL": url,
           "TRITON_CACHE_DIR": str(workdir / "triton-cache-kill")}
    log = (workdir / "serve-kill-worker.log").open("w")
    worker = subprocess.Popen([sys.executable, "-m", "tuner.app.cli", "worker",
                               "--backend", "cuda",
                               "--device-index", str(index)], env=env, stdout=log,
                              stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 480
    trials = 0
    while time.monotonic() < deadline and trials < 3:
        time.sleep(0.5)
        with factory() as session:
            trials = repo.get_task(session, task_id).trials_done
    descendants = _descendants(worker.pid)
    gpu_index = {row[0]: row[1] for row in _query(
        ["nvidia-smi", "--query-gpu=uuid,index", "--format=csv,noheader"])}
    on_gpu = {int(pid): gpu_index.get(uuid, uuid) for uuid, pid in _query(
        ["nvidia-smi", "--query-compute-apps=gpu_uuid,pid", "--format=csv,noheader"])}
    mine = {pid: gpu for pid, gpu in on_gpu.items() if pid in descendants}
    killed = time.monotonic()
    worker.kill()
    worker.wait()
    gone_s = None
    while time.monotonic() - killed < 30:
        alive = [p for p in descendants if Path(f"/proc/{p}").exists()
                 and "zombie" not in _status(p)]
        listed = {int(pid) for _uuid, pid in _query(
            ["nvidia-smi", "--query-compute-apps=gpu_uuid,pid", "--format=csv,noheader"])}
        if not alive and not (listed & set(descendants)):
            gone_s = time.monotonic() - killed
            break
        time.sleep(0.1)
    log.close()
    return {"worker_index": index, "trials_before_kill": trials,
            "children": len(descendants), "gpu_processes": mine, "gone_s": gone_s}


def _descendants(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-e", "-o", "pid=,ppid="], capture_output=True, text=True).stdout
    children: dict[int, list[int]] = {}
    for line in out.splitlines():
        p, pp = (int(x) for x in line.split())
        children.setdefault(pp, []).append(p)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _status(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/status").read_text().split("State:")[1].split("\n")[0].lower()
    except (OSError, IndexError):
        return "zombie"


def _seconds(job: dict[str, Any]) -> str:
    from datetime import datetime

    if not job.get("started_at") or not job.get("finished_at"):
        return "-"
    took = (datetime.fromisoformat(job["finished_at"])
            - datetime.fromisoformat(job["started_at"])).total_seconds()
    return f"{took:.1f}"


def markdown(runs: list[dict[str, Any]], command: str, trials: int,
             kill: dict[str, Any] | None = None) -> str:
    lines = ["# Several GPUs under one `tuner serve`", "",
             f"Command: `{command}`", "",
             f"Four single-shape fp16 matmul jobs ({trials} trials each: "
             + ", ".join(f"{s['M']}x{s['N']}x{s['K']}" for s in SHAPES)
             + "), submitted at once; fresh database and Triton cache per run.", "",
             "| workers | CUDA_VISIBLE_DEVICES | wall s (submit to last job done) | jobs ok |",
             "| --- | --- | --- | --- |"]
    for r in runs:
        ok = sum(j["status"] == "succeeded" for j in r["jobs"])
        lines.append(f"| {r['workers']} | {r['visible']} | {r['wall_s']:.1f} | "
                     f"{ok}/{len(r['jobs'])} |")
    if len(runs) >= 2:
        by = {r["workers"]: r["wall_s"] for r in runs}
        if 1 in by and 2 in by:
            lines += ["", f"Speed-up of 2 workers over 1: {by[1] / by[2]:.2f}x"]
    for r in runs:
        lines += ["", f"## {r['workers']} worker(s): each GPU while the jobs ran", "",
                  "| GPU index | UUID | busy (util > 0) | mean util % | max SM MHz | "
                  "max power W | processes seen |",
                  "| --- | --- | --- | --- | --- | --- | --- |"]
        for g in r["gpus"]:
            lines.append(f"| {g['index']} | {g['uuid']} | {g['busy_fraction']:.0%} | "
                         f"{g['mean_util']:.0f} | {g['max_sm_mhz']:.0f} | "
                         f"{g['max_power_w']:.0f} | {g['processes']} |")
        workers = ((r["health_at_end"].get("workers") or {}).get("workers")) or []
        if workers:
            lines += ["", "Workers the service reported (`/healthz`):", "",
                      "| worker | GPU index | GPU UUID | status |", "| --- | --- | --- | --- |"]
            for w in workers:
                lines.append(f"| {w.get('id')} | {w.get('index')} | {w.get('uuid')} | "
                             f"{w.get('status')} |")
        lines += ["", "| job shape | status | best ms | trials | job s (start to end) | "
                  "worker that held it |", "| --- | --- | --- | --- | --- | --- |"]
        for job in r["jobs"]:
            for t in job["tasks"]:
                s = t["shape"]
                best = f"{t['best_ms']:.4f}" if t.get("best_ms") else "-"
                lines.append(f"| {s['M']}x{s['N']}x{s['K']} | {t['status']} | {best} | "
                             f"{t['trials_done']} | {_seconds(job)} | "
                             f"{r['owners'].get(t['id'], '?')} |")
    if kill is not None:
        gpus = sorted(set(kill["gpu_processes"].values()))
        gone = f"{kill['gone_s']:.1f} s" if kill["gone_s"] is not None else "NOT within 30 s"
        lines += ["", "## A worker SIGKILLed mid-task", "",
                  f"`tuner worker --device-index {kill['worker_index']}` with "
                  f"CUDA_VISIBLE_DEVICES={runs[0]['visible'] if runs else '?'}: "
                  f"{kill['children']} descendant processes after {kill['trials_before_kill']} "
                  f"trials; its processes on the GPU(s) with index {', '.join(gpus) or '-'} "
                  f"({len(kill['gpu_processes'])} process(es)); every descendant gone and "
                  f"off the GPU {gone} after the SIGKILL."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 1])
    parser.add_argument("--visible", default="0,1", help="CUDA_VISIBLE_DEVICES for the service")
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--out", default="-")
    parser.add_argument("--json", default=None, help="also write the raw runs here")
    parser.add_argument("--kill-check", action="store_true",
                        help="also SIGKILL a worker mid-task and time its children's end")
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="multi-gpu-"))
    runs = []
    try:
        for n in args.workers:
            runs.append(run(n, args.visible, args.trials, free_port(), workdir))
            print(f"{n} worker(s): {runs[-1]['wall_s']:.1f} s", flush=True)
    finally:
        logs = sorted(workdir.glob("serve-*.log"))
        for path in logs:
            print(f"--- {path.name} (tail) ---")
            lines = [line for line in path.read_text(errors="replace").splitlines()
                     if "HTTP/1.1" not in line]  # uvicorn's access log says nothing here
            print("\n".join(lines[-25:]))
    kill = kill_check(args.visible, workdir) if args.kill_check else None
    if kill is not None:
        print(f"kill check: {kill}", flush=True)
    command = "python3 -m bench.multi_gpu " + " ".join(sys.argv[1:])
    text = markdown(runs, command, args.trials, kill)
    if args.out == "-":
        print(text)
    else:
        Path(args.out).write_text(text)
    if args.json:
        Path(args.json).write_text(json.dumps(runs, indent=1, default=str))
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
