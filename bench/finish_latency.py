"""How late a waiting client hears that its job finished (``TunerClient.wait``, as ``tuner
wait`` and ``tuner tune`` wait).

Each job is submitted to the app (real HTTP through it, a real SQLite file, no worker: the job
stays queued), a client waits for it with the CLI's default 1 s poll, and the job is cancelled
(a terminal state, as a finish is) after a random 0.2-1.2 s; the figure is the time from the
cancel's answer to the client's return. Before ``wait_s`` (``GET /api/v1/jobs/{id}?wait_s=N``,
the sixteenth session) the client slept its poll between looks: half a poll late on average.
``--no-wait-s`` runs the same against the old client's loop (a look, then a sleep of ``poll``).

    python3 -m bench.finish_latency --out bench/results/finish_latency.md
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

JOB = {"kernel": "vector_add", "dtype": "float32", "shapes": [{"N": 1024}],
       "budget": {"trials": 2}}


def _old_wait(client: Any, job_id: str, poll: float) -> dict[str, Any]:
    """The client's loop before ``wait_s``: look, sleep ``poll``, look again."""
    while True:
        job: dict[str, Any] = client.job(job_id)
        if job["status"] in ("succeeded", "failed", "cancelled"):
            return job
        time.sleep(poll)


def measure(runs: int, poll: float, use_wait_s: bool, seed: int) -> list[float]:
    from fastapi.testclient import TestClient

    from api.app import create_app
    from tuner.client import TunerClient
    from tuner.settings import Settings

    rng = random.Random(seed)
    late: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(database_url=f"sqlite:///{Path(tmp) / 'api.db'}", data_dir=tmp)
        with TestClient(create_app(settings)) as app:
            client = TunerClient("http://testserver", timeout=30.0, transport=app._transport)
            for _ in range(runs):
                job_id = app.post("/api/v1/jobs", json={**JOB, "force": True}).json()["id"]
                cancelled: list[float] = []

                def cancel(delay: float, job_id: str = job_id,
                           cancelled: list[float] = cancelled) -> None:
                    time.sleep(delay)
                    assert app.post(f"/api/v1/jobs/{job_id}/cancel").status_code == 200
                    cancelled.append(time.monotonic())

                thread = threading.Thread(target=cancel, args=(rng.uniform(0.2, 1.2),))
                thread.start()
                if use_wait_s:
                    client.wait(job_id, timeout=60, poll=poll)
                else:
                    _old_wait(client, job_id, poll)
                heard = time.monotonic()
                thread.join()
                late.append(heard - cancelled[0])
    return late


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--poll", type=float, default=1.0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    rows = []
    for name, use in (("look, then sleep the poll (before)", False),
                      ("wait_s: answered once the job changes", True)):
        late = measure(args.runs, args.poll, use, seed=1)
        rows.append(f"| {name} | {args.runs} | {statistics.median(late) * 1e3:.0f} | "
                    f"{max(late) * 1e3:.0f} |")
    text = "\n".join([
        "# How late a waiting client hears of its job's finish", "",
        f"Command: `python3 -m bench.finish_latency {' '.join(argv or sys.argv[1:])}` (CPU, "
        f"{time.strftime('%Y-%m-%d')})", "",
        f"The app over real HTTP (TestClient), a real SQLite file; each job cancelled after a "
        f"random 0.2-1.2 s while a client waits with a {args.poll:g} s poll; late: from the "
        "cancel's answer to the client's return.", "",
        "| client | jobs | late, median ms | late, max ms |", "|---|---|---|---|", *rows, ""])
    Path(args.out).write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
