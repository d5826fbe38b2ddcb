"""The procrastinate dispatcher: the PostgreSQL fleet's dispatch on an established task engine.

Each queued task of ours has one procrastinate job (task ``tuner.run_task``, argument
``task_id``) that carries it to a worker:

- **routing**: queue ``queue_name(device_key)`` for a job bound to a device, ``tuner-any``
  for one any device may run; a worker listens to its device's queue and ``tuner-any``.
- **once**: the procrastinate job's ``lock`` and ``queueing_lock`` are ``task_lock(id)``:
  no two runs of one task at once, at most one waiting job per task (a second enqueue is
  refused by the database, ``AlreadyEnqueued``).
- **prompt pick-up**: procrastinate's LISTEN/NOTIFY wakes a waiting worker on insert.
- **dead workers**: procrastinate workers heartbeat every ``stalled_after_s / 4``; every
  worker's upkeep pass (``stalled_after_s / 3``) retries the jobs of workers silent for
  ``stalled_after_s`` (``get_stalled_jobs`` then ``retry_job``). The task itself is taken
  over by whichever worker procrastinate hands it to next (``repo.take_task``: the lease
  owner changes, so the old worker, if only frozen, is fenced off every write; a requeue is
  counted, not an attempt), and resumes from its stored trials.
- **cancel**: ``cancel_job`` asks procrastinate to cancel waiting jobs and abort running ones
  (the running task sees the abort at its next stop check, as it sees our status).
- **stop**: a worker stopping mid-task gives the task back (``repo.release_task``) and raises
  ``Requeue``; the task's retry strategy puts the same procrastinate job back at once.

What stays ours: the tables of jobs, tasks, trials and bests, the lease owner that fences
writes, and one reconciling pass (in every worker's upkeep, and ``enqueue_job`` after a
submission): a queued task with no waiting or running procrastinate job gets one. It catches
what was queued without passing here (a miss report, the embedded reaper's safety net, an
enqueue that failed while the database blinked).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
from typing import TYPE_CHECKING, Any

from sqlalchemy import text
from sqlalchemy.engine import make_url

from db import repo
from db.engine import normalise_url
from tuner.lifecycle import Handback

if TYPE_CHECKING:
    from tuner.app.worker import Worker

log = logging.getLogger(__name__)

#: procrastinate's task name for running one of our tasks
TASK_NAME = "tuner.run_task"
#: the queue of jobs any device may run
ANY_QUEUE = "tuner-any"
#: advisory lock key taken while procrastinate's schema is created (one creator at a time)
_SCHEMA_LOCK = 0x7475_6E65


def queue_name(device_key: str | None) -> str:
    """The procrastinate queue of a device's tasks: short (a LISTEN channel name is at most
    63 bytes, and device keys are long) and stable (a digest of the key)."""
    if device_key is None:
        return ANY_QUEUE
    return "tuner-" + hashlib.sha256(device_key.encode()).hexdigest()[:16]


def task_lock(task_id: int) -> str:
    return f"tuner-task-{task_id}"


def conninfo(url: str) -> str:
    """A libpq URI for psycopg from the service's SQLAlchemy URL."""
    parsed = make_url(normalise_url(url)).set(drivername="postgresql")
    return parsed.render_as_string(hide_password=False)


class Requeue(Exception):
    """Raised by the task function when its task went back to our queue (the worker stopped,
    or the database stayed away): procrastinate's retry puts the job back at once."""


def ensure_schema(factory: Any) -> bool:
    """Create procrastinate's tables, types and functions in the service's database unless
    there; True when created. Concurrent callers take turns on an advisory lock."""
    from procrastinate.schema import SchemaManager

    with factory() as session:
        if session.scalar(text("SELECT to_regclass('procrastinate_jobs')")) is not None:
            return False
        # another process creating it holds the lock for a second: wait it out (the
        # connection's lock_timeout would fail the wait, as for migrations)
        session.execute(text("SET LOCAL lock_timeout = 0"))
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _SCHEMA_LOCK})
        if session.scalar(text("SELECT to_regclass('procrastinate_jobs')")) is not None:
            return False
        session.connection().exec_driver_sql(SchemaManager.get_schema().replace("%", "%%"))
        session.commit()
    log.info("created procrastinate's schema (dispatch for the PostgreSQL fleet)")
    return True


_UNDISPATCHED = text("""
SELECT t.id AS task_id, j.device_key AS device_key
  FROM tasks t JOIN jobs j ON j.id = t.job_id
 WHERE t.status = 'queued' AND j.status IN ('queued', 'running')
   AND (CAST(:job_id AS VARCHAR) IS NULL OR t.job_id = :job_id)
   AND NOT EXISTS (SELECT 1 FROM procrastinate_jobs p
                    WHERE p.lock = 'tuner-task-' || t.id
                      AND p.status IN ('todo', 'doing'))
 ORDER BY j.created_at, t.id
 LIMIT 2000""")

_LIVE_JOBS_OF = text("""
SELECT p.id FROM procrastinate_jobs p JOIN tasks t ON p.lock = 'tuner-task-' || t.id
 WHERE t.job_id = :job_id AND p.status IN ('todo', 'doing')""")


class ProcrastinateDispatcher:
    name = "procrastinate"

    def __init__(self, factory: Any, url: str, *, stalled_after_s: float = 15.0,
                 reap_interval_s: float = 15.0) -> None:
        self.factory, self.url = factory, url
        self.stalled_after_s = stalled_after_s
        self.reap_interval_s = reap_interval_s
        ensure_schema(factory)
        self._sync_app: Any = None
        self._lock = threading.Lock()

    # -- the app: one synchronous for enqueue and cancel, one asynchronous per serve --------

    def _app(self, connector: Any) -> Any:
        from procrastinate import App, RetryStrategy

        app = App(connector=connector)
        app.task(name=TASK_NAME, pass_context=True,
                 retry=RetryStrategy(max_attempts=10_000, wait=0,
                                     retry_exceptions={Requeue}))(_run_task)
        return app

    def sync_app(self) -> Any:
        with self._lock:
            if self._sync_app is None:
                from procrastinate import SyncPsycopgConnector

                app = self._app(SyncPsycopgConnector(
                    conninfo=conninfo(self.url), min_size=0, max_size=2,
                    kwargs={"application_name": "tuner-dispatch"}))
                app.open()
                self._sync_app = app
            return self._sync_app

    # -- the interface ------------------------------------------------------------------

    def enqueue_job(self, job_id: str) -> None:
        try:
            self.dispatch_queued(job_id)
        except Exception:  # noqa: BLE001 - the workers' upkeep pass catches up
            log.exception("dispatching job %s failed; the workers' next pass will", job_id)

    def dispatch_queued(self, job_id: str | None = None) -> int:
        """Give every queued task (of ``job_id``, else all) that has no waiting or running
        procrastinate job one; returns how many were deferred."""
        with self.factory() as session:
            rows = session.execute(_UNDISPATCHED, {"job_id": job_id}).all()
        return _defer(self.sync_app(), rows)

    def cancel_job(self, job_id: str) -> None:
        try:
            with self.factory() as session:
                ids = list(session.scalars(_LIVE_JOBS_OF, {"job_id": job_id}))
            manager = self.sync_app().job_manager
            for pid in ids:
                manager.cancel_job_by_id(pid, abort=True)
        except Exception:  # noqa: BLE001 - the running task still sees our status
            log.exception("asking procrastinate to abort job %s's tasks failed", job_id)

    def serve(self, worker: Worker) -> None:
        """Run procrastinate's worker for ``worker``'s device until ``worker.stopping``;
        restarted (after a pause) when it stops on its own, e.g. when the database went away
        under it."""
        from tuner.app.worker import reap_forever

        # the lease's safety net: a task whose owner stayed silent past its lease goes back
        # to our queue, and the upkeep pass dispatches it (when procrastinate has not already)
        threading.Thread(target=reap_forever, name="reaper", daemon=True,
                         args=(self.factory, self.reap_interval_s, worker.stopping)).start()
        delay = 1.0
        while not worker.stopping.is_set():
            try:
                asyncio.run(self._serve_async(worker))
                delay = 1.0
            except Exception:  # noqa: BLE001 - restarted below; the error is logged
                log.exception("procrastinate's worker stopped; restarting in %.0f s", delay)
            if worker.stopping.wait(delay):
                break
            delay = min(delay * 2, 30.0)
        worker.close()

    def close(self) -> None:
        with self._lock:
            if self._sync_app is not None:
                self._sync_app.close()
                self._sync_app = None

    # -- the worker side ----------------------------------------------------------------

    async def _serve_async(self, worker: Worker) -> None:
        from procrastinate import PsycopgConnector
        from procrastinate.worker import Worker as EngineWorker

        app = self._app(PsycopgConnector(conninfo=conninfo(self.url), min_size=1, max_size=3,
                                         kwargs={"application_name": "tuner-dispatch"}))
        async with app.open_async():
            engine = EngineWorker(
                app, queues=[queue_name(worker.device_key), ANY_QUEUE], name=worker.id,
                concurrency=1, install_signal_handlers=False, listen_notify=True,
                fetch_job_polling_interval=max(1.0, self.stalled_after_s / 3),
                abort_job_polling_interval=1.0, delete_jobs="successful",
                update_heartbeat_interval=self.stalled_after_s / 4,
                stalled_worker_timeout=self.stalled_after_s,
                additional_context={"worker": worker})
            running = asyncio.create_task(engine.run(), name="procrastinate worker")
            upkeep = asyncio.create_task(self._upkeep(app), name="upkeep")
            stop = asyncio.create_task(asyncio.to_thread(worker.stopping.wait), name="stop")
            try:
                await asyncio.wait({running, stop}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                engine.stop()
                upkeep.cancel()
                await asyncio.gather(running, upkeep, return_exceptions=True)
                if not stop.done():  # procrastinate stopped on its own: serve restarts it
                    stop.cancel()
            if running.done() and running.exception() is not None:
                raise running.exception()  # type: ignore[misc]

    async def _upkeep(self, app: Any) -> None:
        """Every third of ``stalled_after_s``: retry the jobs of silent workers, and dispatch
        queued tasks that have no procrastinate job."""
        period = max(0.5, self.stalled_after_s / 3)
        while True:
            try:
                await self.recover_stalled(app)
                rows = await asyncio.to_thread(self._undispatched)
                if rows:
                    count = await asyncio.to_thread(_defer, self.sync_app(), rows)
                    if count:
                        log.info("dispatched %d queued task(s) that had no job", count)
            except Exception:  # noqa: BLE001 - the next pass tries again
                log.exception("dispatch upkeep failed")
            await asyncio.sleep(period)

    def _undispatched(self) -> list[Any]:
        with self.factory() as session:
            return list(session.execute(_UNDISPATCHED, {"job_id": None}).all())

    async def recover_stalled(self, app: Any) -> int:
        """Put back the running jobs of workers silent for ``stalled_after_s`` (killed,
        frozen, cut off); returns how many."""
        manager = app.job_manager
        await manager.prune_stalled_workers(self.stalled_after_s)
        count = 0
        for job in await manager.get_stalled_jobs(
                seconds_since_heartbeat=self.stalled_after_s):
            try:
                await manager.retry_job(job)
                count += 1
            except Exception:  # noqa: BLE001 - another worker's pass retried it first
                log.debug("stalled job %s was already retried", job.id)
        if count:
            log.warning("re-queued %d job(s) of silent workers", count)
        return count


def _defer(app: Any, rows: list[Any]) -> int:
    from procrastinate.exceptions import AlreadyEnqueued

    count = 0
    for row in rows:
        lock = task_lock(row.task_id)
        try:
            app.configure_task(TASK_NAME, queue=queue_name(row.device_key), lock=lock,
                               queueing_lock=lock).defer(task_id=row.task_id)
            count += 1
        except AlreadyEnqueued:  # another process dispatched it meanwhile
            pass
    return count


def _run_task(context: Any, task_id: int) -> str:
    """Procrastinate's task: run our task ``task_id`` on this worker. Returns the task's
    outcome; raises ``Requeue`` when the task went back to our queue."""
    worker: Worker = context.additional_context["worker"]
    with worker.factory() as session:
        task = repo.take_task(session, task_id, worker.id, worker.lease_seconds)
        session.commit()
    if task is None:  # finished, cancelled or given up meanwhile: nothing to run
        return "skipped"
    outcome = worker.run_claimed(task_id, abort=context.should_abort)
    if outcome.status == Handback.REQUEUED or (outcome.status == Handback.LOST
                                               and worker.stopping.is_set()):
        raise Requeue(f"task {task_id} went back to the queue: {outcome.error or 'stopping'}")
    return outcome.status
