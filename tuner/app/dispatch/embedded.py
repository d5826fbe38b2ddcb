"""The embedded dispatcher: the tasks table is the queue (one machine, SQLite by default).

A worker polls ``repo.claim_task`` (a guarded UPDATE: two workers never get one task), renews
the task's lease while it runs, and a reaper thread in every worker re-queues tasks whose
lease expired (their worker died or froze). A queued job rings the doorbells of the idle
workers on this machine (``tuner.app.dispatch.doorbell``), which look at once instead of at
their next poll. A cancel is seen by the running task at its next status check; nothing
needs telling."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tuner.app.dispatch.doorbell import Doorbell, ring

if TYPE_CHECKING:
    from tuner.app.worker import Worker


class EmbeddedDispatcher:
    name = "embedded"

    def __init__(self, factory: Any, *, reap_interval_s: float,
                 doorbells: Path | None = None) -> None:
        self.factory, self.reap_interval_s = factory, reap_interval_s
        #: the folder of this machine's workers' doorbells (None: workers only poll)
        self.doorbells = doorbells

    def enqueue_job(self, job_id: str) -> None:
        """A committed queued task is claimable: the idle workers here are told to look."""
        if self.doorbells is not None:
            ring(self.doorbells)

    def cancel_job(self, job_id: str) -> None:
        """Nothing to do: the task's status is what its worker checks."""

    def serve(self, worker: Worker) -> None:
        from tuner.app.worker import reap_forever

        threading.Thread(target=reap_forever, name="reaper", daemon=True,
                         args=(self.factory, self.reap_interval_s, worker.stopping)).start()
        doorbell = None
        if self.doorbells is not None:
            doorbell = Doorbell(self.doorbells, worker.id, worker.stopping)
            worker.idle_wait = doorbell.wait
        try:
            worker.run_forever()
        finally:
            if doorbell is not None:
                doorbell.close()

    def close(self) -> None:
        """Holds nothing."""
