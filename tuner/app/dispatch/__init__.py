"""Dispatch: how queued tasks reach the workers that run them.

Jobs, tasks, trials and bests live in the service's own tables whichever dispatcher runs;
a dispatcher only decides which worker runs which queued task, when, and what happens when
that worker dies or the job is cancelled. Two implement one small interface (``Dispatcher``),
and one conformance suite (tests/test_dispatch_conformance.py) runs against both:

``embedded`` (``tuner.app.dispatch.embedded``)
    The default on SQLite (one machine, no server): the tasks table is the queue. A worker
    claims the oldest claimable task with a guarded UPDATE, holds it under a lease it renews,
    and a reaper re-queues tasks whose lease expired.

``procrastinate`` (``tuner.app.dispatch.procrastinate``)
    The default on PostgreSQL (a fleet of machines sharing one database): dispatch runs on
    procrastinate, a task engine built on PostgreSQL alone (no other server). One procrastinate
    job per queued task, on one queue per device (``queue_name``) plus ``tuner-any`` for jobs
    any device may run; a lock per task (no two runs of one task at once, and no duplicate
    queued job for it); worker heartbeats with stalled-job retry when a worker dies; abort for
    cancellation; LISTEN/NOTIFY for prompt pick-up. Its schema lives in the same database.

``TUNER_DISPATCH`` (``auto``, ``embedded``, ``procrastinate``) picks one; ``auto`` takes
procrastinate on PostgreSQL and embedded on SQLite. Every process of one deployment must
agree (``tuner serve`` passes its settings to its workers); mixing them on one database is
safe (both take a task with the same guarded UPDATE) but the embedded workers do not see
procrastinate's cancellations until their next status check.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import TYPE_CHECKING, Any, Protocol

from db.engine import is_sqlite

if TYPE_CHECKING:
    from tuner.app.worker import Worker
    from tuner.settings import Settings

log = logging.getLogger(__name__)

#: ``TUNER_DISPATCH`` values
DISPATCHERS = ("auto", "embedded", "procrastinate")


class Dispatcher(Protocol):
    """Brings queued tasks to workers. Every method is safe to call from any process that
    shares the database; ``enqueue_job`` and ``cancel_job`` are best-effort hints (a failure
    is logged, never raised: a worker's own pass over the queue catches up)."""

    #: "embedded" or "procrastinate"
    name: str

    def enqueue_job(self, job_id: str) -> None:
        """The job's queued tasks were committed: make them reachable to workers now."""

    def cancel_job(self, job_id: str) -> None:
        """The job was cancelled (``repo.cancel_job``, committed): stop its running tasks
        promptly and make sure its queued ones never start."""

    def serve(self, worker: Worker) -> None:
        """Run tasks for ``worker`` (its device) until ``worker.stopping`` is set."""

    def close(self) -> None:
        """Release connections held by this dispatcher."""


def dispatch_name(settings: Settings) -> str:
    """The dispatcher ``settings`` ask for: ``TUNER_DISPATCH``, with ``auto`` resolved by the
    database (procrastinate on PostgreSQL where installed, embedded on SQLite). ValueError for
    procrastinate on SQLite (it needs PostgreSQL) or without the package."""
    url = settings.resolved_database_url
    wanted = settings.dispatch
    if wanted == "auto":
        if is_sqlite(url):
            return "embedded"
        if importlib.util.find_spec("procrastinate") is None:
            log.warning("procrastinate is not installed (pip install 'triton-tuner[postgres]'):"
                        " the PostgreSQL fleet dispatches with the embedded queue")
            return "embedded"
        return "procrastinate"
    if wanted == "procrastinate" and is_sqlite(url):
        raise ValueError("TUNER_DISPATCH=procrastinate needs a PostgreSQL database "
                         "(TUNER_DATABASE_URL=postgresql://...); SQLite uses 'embedded'")
    if wanted == "procrastinate" and importlib.util.find_spec("procrastinate") is None:
        raise ValueError("TUNER_DISPATCH=procrastinate needs the procrastinate package: "
                         "pip install 'triton-tuner[postgres]'")
    return wanted


def make_dispatcher(settings: Settings, factory: Any) -> Dispatcher:
    """The dispatcher ``settings`` ask for (``dispatch_name``), over ``factory``'s database.
    Procrastinate's schema is created in that database when missing."""
    name = dispatch_name(settings)
    if name == "embedded":
        from tuner.app.dispatch.doorbell import doorbell_dir
        from tuner.app.dispatch.embedded import EmbeddedDispatcher

        return EmbeddedDispatcher(factory, reap_interval_s=settings.reap_interval_seconds,
                                  doorbells=doorbell_dir(settings.data_dir))
    from tuner.app.dispatch.procrastinate import ProcrastinateDispatcher

    return ProcrastinateDispatcher(factory, settings.resolved_database_url,
                                   stalled_after_s=settings.stalled_after_s,
                                   reap_interval_s=settings.reap_interval_seconds)
