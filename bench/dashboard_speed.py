"""How fast the dashboard's pages answer with 10,000 trials in the database (issue 6: each page
under 200 ms on this machine).

    python3 -m bench.dashboard_speed --out bench/results/dashboard_speed.md

Seeds a fresh SQLite file with 10,000 trials whose configs and times come from a real H200 replay
table (tests/data/replay), in 31 jobs: one with a single 5,000-trial shape (the job page's worst
case) and 30 of three shapes each, plus 120 stored best configs on a calibrated device. Then it
starts ``uvicorn api.app:app`` on that file and times each page over real HTTP: 3 warm-up
requests, then the median and p90 of 20.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "tests/data/replay/matmul_4096x4096x4096_float16_h200.json"
GPU = "cuda:NVIDIA H200:sm90"
FAILURES = ("compile_error", "out_of_resources", "wrong_result", "crash", "timeout")


def seed(url: str, trials: int = 10_000, big: int = 5_000) -> dict[str, str]:
    from db import repo
    from db.engine import init_db
    from db.models import Job, Task, Trial
    from search_spaces import get_kernel
    from tuner.backends.replay import load_table
    from tuner.shapes import shape_key

    rng = random.Random(0)
    table = load_table(TABLE)
    measured = list(table.results.items())
    kernel = get_kernel("matmul")
    factory = init_db(url)
    ids: dict[str, str] = {}
    with factory() as session:
        repo.upsert_device(session, {"key": GPU, "kind": "cuda", "name": "NVIDIA H200",
                                     "sm_count": 132, "triton_version": "3.6.0"})
        repo.set_calibration(session, GPU, copy_gbps=4218.9, matmul_tflops=712.4)
        small_jobs, per_task = 30, (trials - big) // 90
        plan = [(1, big)] + [(3, per_task)] * small_jobs
        for j, (shapes, n) in enumerate(plan):
            job = Job(id=uuid.uuid4().hex, kernel="matmul", kernel_version=kernel.version,
                      dtype="float16", status="succeeded", budget_trials=n,
                      request_key=uuid.uuid4().hex)
            session.add(job)
            ids.setdefault("big" if j == 0 else "small", job.id)
            for s in range(shapes):
                shape = {"M": 256 * (j + 1), "N": 1024 * (s + 1), "K": 4096}
                task = Task(job=job, shape=shape, shape_key=shape_key(shape),
                            status="succeeded", trials_done=n, device_key=GPU)
                session.add(task)
                session.flush()
                best = None
                rows = []
                for number in range(1, n + 1):
                    config, result = measured[rng.randrange(len(measured))]
                    ok = isinstance(result, float) and rng.random() > 0.05
                    ms = result * rng.uniform(0.98, 1.02) if ok else None
                    outcome = "ok" if ok else rng.choice(FAILURES)
                    rows.append(Trial(
                        task_id=task.id, number=number, config=config.to_dict(),
                        config_key=config.key(), outcome=outcome, p20_ms=ms, p50_ms=ms,
                        p80_ms=ms, compile_s=0.4,
                        error=None if ok else f"{outcome}: a reason of some length " * 3))
                    if ms is not None and (best is None or ms < best[0]):
                        best = (ms, config.to_dict())
                session.add_all(rows)
                if best:
                    task.best_ms, task.best_config = best
        for i in range(120):
            shape = {"M": 16 * (i + 1), "N": 4096, "K": 4096}
            config, result = measured[i]
            ms = result if isinstance(result, float) else 1.0
            repo.store_best(session, device_key=GPU, kernel="matmul",
                            kernel_version=kernel.version, dtype="float16", shape=shape,
                            triton_version="3.6.0", config=config.to_dict(), p20_ms=ms,
                            p50_ms=ms, p80_ms=ms, tflops=kernel.flops(shape) / ms / 1e9,
                            gbps=kernel.bytes(shape, "float16") / ms / 1e6,
                            torch_version=None, cuda_version=None, task_id=None)
        session.commit()
    return ids


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--requests", type=int, default=20)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="dashboard-speed-"))
    url = f"sqlite:///{tmp / 'tuner.db'}"
    t0 = time.monotonic()
    ids = seed(url)
    seeded = time.monotonic() - t0
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "TUNER_DATABASE_URL": url, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "api.app:app", "--port",
                             str(port), "--log-level", "warning"], env=env, cwd=ROOT)
    base = f"http://127.0.0.1:{port}"
    pages = {"overview": "/", "jobs": "/jobs", "job (5,000 trials)": f"/jobs/{ids['big']}",
             "job (3 x 55 trials)": f"/jobs/{ids['small']}", "configs (120)": "/configs",
             "configs filtered": "/configs?dtype=float16&shape=1600x",
             "kernel": "/kernels/matmul", "roofline (120 points)": "/roofline",
             "progress event": "/events/jobs?active=1&once=1"}
    rows = []
    try:
        with httpx.Client(base_url=base, timeout=30) as client:
            for _ in range(200):
                try:
                    if client.get("/readyz").status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.2)
            for name, path in pages.items():
                times = []
                for i in range(3 + args.requests):
                    t = time.perf_counter()
                    r = client.get(path)
                    elapsed = (time.perf_counter() - t) * 1000
                    assert r.status_code == 200, (path, r.status_code, r.text[:300])
                    if i >= 3:
                        times.append(elapsed)
                times.sort()
                rows.append((name, path, statistics.median(times),
                             times[int(0.9 * (len(times) - 1))], len(r.content)))
                print(f"{name}: median {rows[-1][2]:.1f} ms, p90 {rows[-1][3]:.1f} ms, "
                      f"{rows[-1][4] / 1024:.0f} KiB", flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    lines = ["# Dashboard page times with 10,000 trials in the database", "",
             f"Command: `python3 -m bench.dashboard_speed {' '.join(sys.argv[1:])}` "
             f"({time.strftime('%Y-%m-%d')}, this repository's CPU machine: "
             f"{os.cpu_count()} cores; SQLite; seeding took {seeded:.0f} s)", "",
             "Real HTTP to `uvicorn api.app:app` on localhost; 3 warm-up requests, then "
             f"{args.requests} timed, one at a time. Target: each page under 200 ms.", "",
             "| page | path | median ms | p90 ms | size KiB |", "|---|---|---|---|---|"]
    lines += [f"| {n} | `{p.replace(ids['big'], '<id>').replace(ids['small'], '<id>')}` | "
              f"{m:.1f} | {p90:.1f} | {size / 1024:.0f} |" for n, p, m, p90, size in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
