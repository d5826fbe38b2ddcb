"""The embedded dispatcher: the tasks table is the queue (one machine, SQLite by default).

A worker polls ``repo.claim_task`` (a guarded UPDATE: two workers never get one task), renews
the task's lease while it runs, and a reaper thread in every worker re-queues tasks whose
lease expired (their worker died or froze). A cancel is seen by the running task at its
next status check; nothing needs telling."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tuner.app.worker import Worker


class EmbeddedDispatcher:
    name = "embedded"

    def __init__(self, factory: Any, *, reap_interval_s: float) -> None:
        self.factory, self.reap_interval_s = factory, reap_interval_s

    def enqueue_job(self, job_id: str) -> None:
        """Nothing to do: a committed queued task is claimable."""

    def cancel_job(self, job_id: str) -> None:
        """Nothing to do: the task's status is what its worker checks."""

    def serve(self, worker: Worker) -> None:
        from tuner.app.worker import reap_forever

        threading.Thread(target=reap_forever, name="reaper", daemon=True,
                         args=(self.factory, self.reap_interval_s, worker.stopping)).start()
        worker.run_forever()

    def close(self) -> None:
        """Holds nothing."""
