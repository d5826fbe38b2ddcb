"""How long a queued job waits for an idle worker, with and without the doorbell (issue 33).

The embedded dispatcher's idle workers look at the queue every ``TUNER_WORKER_POLL_SECONDS``
(0.2 s by default); since the doorbell (``tuner.app.dispatch.doorbell``), the API's enqueue
also wakes the idle workers on its machine. This queues ``--jobs`` one-shape jobs one after
the other in a real SQLite file, each enqueued through the embedded dispatcher as the API
does, and measures from the enqueue to the worker's claim (the task's ``started_at`` less the
enqueue's time), with the doorbell and without it (``doorbells=None``), the worker serving on
the dispatcher in a thread as ``tuner worker`` does. The worker finishes each task at once
instead of tuning it: only the pick-up is timed. CPU only (no GPU is involved in a pick-up).

Usage::

    python3 -m bench.pickup_latency --out bench/results/pickup_latency.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any


def _measure(doorbell: bool, jobs: int, poll_s: float) -> list[float]:
    """Seconds from each job's enqueue to its task's claim."""
    from db import repo
    from db.engine import init_db
    from search_spaces import get_kernel
    from tuner.app.dispatch.doorbell import doorbell_dir
    from tuner.app.dispatch.embedded import EmbeddedDispatcher
    from tuner.app.worker import TaskOutcome, Worker

    claimed: dict[int, float] = {}
    done = threading.Event()

    class Instant(Worker):
        def run_claimed(self, task_id: int, abort: Any = None) -> TaskOutcome:
            claimed[task_id] = time.monotonic()
            with self.factory() as session:
                repo.finish_task(session, task_id, "succeeded", worker_id=self.id)
                session.commit()
            done.set()
            return TaskOutcome(task_id, "succeeded", None, None, False, None)

    with tempfile.TemporaryDirectory() as tmp:
        factory = init_db(f"sqlite:///{Path(tmp) / 'pickup.db'}")
        bells = doorbell_dir(Path(tmp)) if doorbell else None
        worker = Instant(factory, backend_kind="interpret", device_key="interpret:cpu",
                         poll_seconds=poll_s, name="pickup")
        serving = threading.Thread(
            target=EmbeddedDispatcher(factory, reap_interval_s=60, doorbells=bells).serve,
            args=(worker,), daemon=True)
        serving.start()
        api = EmbeddedDispatcher(factory, reap_interval_s=60, doorbells=bells)
        waits = []
        version = get_kernel("vector_add").version
        try:
            time.sleep(1.0)
            for i in range(jobs):
                time.sleep(0.05 + 0.37 * (i % 7) / 7)  # the worker idle for a while
                done.clear()
                with factory() as session:
                    job = repo.create_job(session, kernel="vector_add", kernel_version=version,
                                          dtype="float32", shapes=[{"N": 1024 + 16 * i}],
                                          budget_trials=4, budget_seconds=None,
                                          strategy="random", force=True, seed=0,
                                          backend="interpret", device_key=None)
                    session.commit()
                    job_id, task_id = job.id, job.tasks[0].id
                queued = time.monotonic()
                api.enqueue_job(job_id)
                if not done.wait(10):
                    raise RuntimeError(f"job {i} was not picked up within 10 s")
                waits.append(claimed[task_id] - queued)
        finally:
            worker.stopping.set()
            serving.join(10)
    return waits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--poll", type=float, default=0.2,
                        help="the worker's poll (TUNER_WORKER_POLL_SECONDS' default: 0.2)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    rows = []
    for doorbell in (False, True):
        waits = sorted(_measure(doorbell, args.jobs, args.poll))
        rows.append((doorbell, waits))
    lines = [
        "# Pick-up of a queued job by an idle worker, with and without the doorbell",
        "",
        f"Command: `python3 -m bench.pickup_latency --jobs {args.jobs} --poll {args.poll}` "
        f"({time.strftime('%Y-%m-%d')}; CPU only; a real SQLite file, the embedded "
        "dispatcher, a worker serving in a thread that finishes each task at once).",
        "",
        "| doorbell | jobs | median ms | p90 ms | max ms |",
        "|---|---|---|---|---|",
    ]
    for doorbell, waits in rows:
        p90 = waits[int(0.9 * (len(waits) - 1))]
        lines.append(f"| {'on' if doorbell else 'off'} | {len(waits)} | "
                     f"{1e3 * statistics.median(waits):.1f} | {1e3 * p90:.1f} | "
                     f"{1e3 * waits[-1]:.1f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
