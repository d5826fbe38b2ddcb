"""Tasks: claiming (``SKIP LOCKED`` on PostgreSQL), leases and their renewal, reaping expired
leases, finishing, and a task's best and re-timed times."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session

from db.models import ACTIVE, BASES, MEASURED, TERMINAL, Job, Task, Trial, utcnow
from db.repo._common import NotFound, _changed, _changed_row, _is_postgres, _reloaded, _rowcount
from db.repo.bests import BestTimes, write_best
from db.repo.devices import get_device
from db.repo.jobs import _follow_job, _reloaded_job, _settle_job
from tuner.config import config_key
from tuner.lifecycle import Handback, Status
from tuner.timing import check_timing

#: how many claim candidates SQLite tries per query (several workers may race for the first)
_SQLITE_CLAIM_CANDIDATES = 8
#: the largest id an INTEGER column holds on PostgreSQL (a larger one is an error there)
_MAX_INT_ID = 2**31 - 1


# -- tasks: claim, lease, finish --------------------------------------------------------------

def get_task(session: Session, task_id: int) -> Task:
    """The task; NotFound if there is none (an id outside 1..2**31-1 never reaches the
    database: PostgreSQL's INTEGER cannot hold it and would answer with an error)."""
    if not 1 <= task_id <= _MAX_INT_ID:
        raise NotFound(f"no task {task_id}")
    task = session.get(Task, task_id)
    if task is None:
        raise NotFound(f"no task {task_id}")
    return task


def claim_task(session: Session, *, worker_id: str, device_key: str,
               lease_seconds: float) -> Task | None:
    """Lease the oldest claimable task to ``worker_id`` for ``lease_seconds``; None if there
    is none. Claimable: queued, in a job that is not finished or cancelled, and whose job
    targets ``device_key`` or any device. The task becomes running with one more attempt;
    its job becomes running. Two workers never get the same task (the claim is a guarded
    UPDATE; commit soon, as PostgreSQL holds the candidate's row lock until then)."""
    while candidates := _claim_candidates(session, device_key):
        for task_id in candidates:
            if _lease(session, task_id, worker_id, lease_seconds):
                task = cast(Task, _reloaded(session, Task, task_id))
                _mark_job_running(session, task.job_id)
                return task
    return None


def _claim_candidates(session: Session, device_key: str) -> list[int]:
    query = (select(Task.id).join(Job, Task.job_id == Job.id)
             .where(Task.status == Status.QUEUED, Job.status.in_(ACTIVE),
                    or_(Job.device_key.is_(None), Job.device_key == device_key))
             .order_by(Job.created_at, Task.id))
    if _is_postgres(session):  # rows another claim holds are skipped, not waited for
        query = query.limit(1).with_for_update(skip_locked=True, of=Task)
    else:
        query = query.limit(_SQLITE_CLAIM_CANDIDATES)
    return list(session.scalars(query))


def _lease(session: Session, task_id: int, worker_id: str, lease_seconds: float) -> bool:
    now = utcnow()
    return _changed(session, update(Task).where(Task.id == task_id, Task.status == Status.QUEUED)
                    .values(status=Status.RUNNING, attempts=Task.attempts + 1,
                            lease_owner=worker_id,
                            lease_expires_at=now + timedelta(seconds=lease_seconds),
                            started_at=now, error=None))


def take_task(session: Session, task_id: int, worker_id: str,
              lease_seconds: float) -> Task | None:
    """Take a task a dispatcher handed to ``worker_id`` (``tuner.app.dispatch.procrastinate``: the
    engine's fetch already chose this worker, atomically): a queued task becomes running with
    one more attempt, as ``claim_task`` makes it; a running one (its worker went silent and
    the engine put its job back) changes lease owner, which fences the old worker off every
    write, and counts a requeue, not an attempt; past ``MAX_REQUEUES`` it fails instead,
    keeping its best (``reap_expired``'s rule). None when there is nothing to run: finished,
    cancelled, its job no longer active, or given up."""
    task = session.get(Task, task_id)
    if task is None:
        return None
    job_active = session.scalar(select(Job.status).where(Job.id == task.job_id)) in ACTIVE
    now = utcnow()
    lease = dict(lease_owner=worker_id, lease_expires_at=now + timedelta(seconds=lease_seconds))
    if task.status == Status.QUEUED and job_active:
        if not _lease(session, task_id, worker_id, lease_seconds):
            return None
    elif task.status == Status.RUNNING and job_active:
        guard = update(Task).where(Task.id == task_id, Task.status == Status.RUNNING,
                                   Task.requeues == task.requeues)
        if task.requeues + 1 >= MAX_REQUEUES:
            if _changed_row(session, Task, task_id, guard.values(
                    status=Status.FAILED, finished_at=now, requeues=Task.requeues + 1,
                    lease_owner=None, lease_expires_at=None,
                    error=f"its worker went silent {task.requeues + 1} times (at most "
                          f"{MAX_REQUEUES}: every worker that ran it died or lost the "
                          "database); giving up")):
                keep_best_of_given_up(session, task_id)
                _settle_job(session, task.job_id)
            return None
        if not _changed_row(session, Task, task_id, guard.values(
                requeues=Task.requeues + 1, started_at=now, **lease)):
            return None
    else:
        return None
    task = cast(Task, _reloaded(session, Task, task_id))
    _mark_job_running(session, task.job_id)
    return task


def _mark_job_running(session: Session, job_id: str) -> None:
    if _changed(session, update(Job).where(Job.id == job_id, Job.status == Status.QUEUED)
                .values(status=Status.RUNNING, started_at=utcnow())):
        _follow_job(session, job_id, Status.RUNNING, None)
    _reloaded(session, Job, job_id)


def start_task_locally(session: Session, task_id: int, worker_id: str) -> Task:
    """Mark a task running for an in-process run (the CLI), without a lease to renew."""
    task = get_task(session, task_id)
    task.status, task.lease_owner, task.attempts = Status.RUNNING, worker_id, task.attempts + 1
    task.started_at = utcnow()
    session.flush()
    _mark_job_running(session, task.job_id)
    return task


def set_task_device(session: Session, task_id: int, device_key: str,
                    timing: str | None = None) -> None:
    """Record the device that runs the task (and, given, the timing method its trials are
    timed with)."""
    task = get_task(session, task_id)
    task.device_key = device_key
    if timing is not None:
        task.timing = check_timing(timing)


def renew_lease(session: Session, task_id: int, worker_id: str, lease_seconds: float) -> bool:
    """Extend the lease to ``lease_seconds`` from now. False when the task is no longer this
    worker's: reaped, cancelled, or finished."""
    return _changed_row(session, Task, task_id, update(Task).where(
        Task.id == task_id, Task.lease_owner == worker_id, Task.status == Status.RUNNING)
        .values(lease_expires_at=utcnow() + timedelta(seconds=lease_seconds)))


def release_task(session: Session, task_id: int, worker_id: str, why: str | None = None) -> bool:
    """Give a running task back to the queue: its worker is shutting down cleanly, or (``why``,
    a sentence kept as the task's error until its next claim) could not reach the database.
    The attempt is not counted (the task did nothing wrong; ``why`` counts a requeue) and the
    stored trials stay, so the next worker resumes the search. False when the task is no
    longer this worker's."""
    fault = dict(requeues=Task.requeues + 1, error=why) if why else {}
    return _changed_row(session, Task, task_id, update(Task).where(
        Task.id == task_id, Task.lease_owner == worker_id, Task.status == Status.RUNNING)
        # the claim counted this attempt (attempts >= 1 while leased)
        .values(status=Status.QUEUED, lease_owner=None, lease_expires_at=None,
                attempts=Task.attempts - 1, **fault))


#: times a task may go back to the queue for faults not its own before it fails: far above
#: ``max_attempts`` (3), as a worker killed or cut off from the database is no fault of the
#: task's; the bound ends a task that kills every worker that runs it (a leak, a hang)
MAX_REQUEUES = 20


def reap_expired(session: Session, now: datetime | None = None) -> int:
    """Running tasks whose lease expired before ``now`` (their worker died, hung or lost the
    database) go back to the queue without using an attempt (the task did nothing wrong),
    counted in ``requeues``; a task requeued ``MAX_REQUEUES`` times fails instead, keeping its
    fastest verified trial as the stored best (``keep_best_of_given_up``), and its job
    settles. Returns how many tasks changed. Tasks are written first (by id), then jobs
    settled (by id): holding a job's lock while waiting for one of its tasks would deadlock
    with that task's worker finishing it."""
    now = now or utcnow()
    expired = session.execute(select(Task.id, Task.job_id, Task.requeues)
                              .where(Task.status == Status.RUNNING,
                                     Task.lease_expires_at.is_not(None),
                                     Task.lease_expires_at < now).order_by(Task.id)).all()
    changed = 0
    failed: list[tuple[int, str]] = []
    for task in expired:
        guard = update(Task).where(Task.id == task.id, Task.status == Status.RUNNING,
                                   Task.lease_expires_at < now,
                                   Task.requeues == task.requeues)
        released = dict(lease_owner=None, lease_expires_at=None)
        if task.requeues + 1 < MAX_REQUEUES:
            changed += _changed_row(session, Task, task.id, guard.values(
                status=Status.QUEUED, attempts=Task.attempts - 1, requeues=Task.requeues + 1,
                **released))
        elif _changed_row(session, Task, task.id, guard.values(
                status=Status.FAILED, finished_at=now, requeues=Task.requeues + 1, **released,
                error=f"the worker's lease expired {task.requeues + 1} times "
                      f"(at most {MAX_REQUEUES}: every worker that ran it died or lost the "
                      "database); giving up")):
            changed += 1
            failed.append((task.id, task.job_id))
    for task_id, _job_id in failed:
        keep_best_of_given_up(session, task_id)
    for job_id in sorted({job_id for _task_id, job_id in failed}):
        _settle_job(session, job_id)
    return changed


def keep_best_of_given_up(session: Session, task_id: int) -> bool:
    """A task that failed for good keeps its fastest verified trial: stored as the best of its
    identity where none is stored (trial times from one run are no yardstick against a stored
    best timed elsewhere, so one is never replaced), and noted in the task. True when stored."""
    task = get_task(session, task_id)
    fastest = session.scalar(select(Trial).where(Trial.task_id == task_id, Trial.outcome == "ok",
                                                 Trial.p50_ms.is_not(None))
                             .order_by(Trial.p50_ms, Trial.number).limit(1))
    device = get_device(session, task.device_key) if task.device_key else None
    if fastest is None or device is None or fastest.p50_ms is None:
        return False
    job = task.job
    p50 = fastest.p50_ms
    _row, written = write_best(
        session, device_key=device.key, kernel=job.kernel, kernel_version=job.kernel_version,
        dtype=job.dtype, shape=task.shape, triton_version=device.triton_version or "",
        timing=task.timing or job.timing,
        times=BestTimes(fastest.config, fastest.p20_ms or p50, p50, fastest.p80_ms or p50,
                        measured="trial"),
        revision=None, torch_version=device.torch_version, cuda_version=device.cuda_version,
        task_id=task_id)
    note = (f"the task gave up: stored its fastest verified trial ({p50:.4f} ms, trial "
            f"{fastest.number} of {task.trials_done}) as the best" if written else
            "the task gave up: a best was already stored for this identity; it stands")
    _changed_row(session, Task, task_id, update(Task).where(Task.id == task_id).values(
        best_ms=p50, best_config=dict(fastest.config), best_measured="trial", best_note=note))
    return written


#: statuses a worker may finish a task with; "lost" means "not mine any more: change nothing"
FINISH_STATUSES = (*TERMINAL, Handback.LOST)


def finish_task(session: Session, task_id: int, status: str, error: str | None = None,
                *, worker_id: str | None = None, stop_reason: str | None = None,
                phases: Mapping[str, float] | None = None) -> Task:
    """Finish a queued or running task as ``status`` (succeeded, failed or cancelled) with
    ``error``, why its search stopped (``stop_reason``, kept to 40 characters) and where its
    time went (``phases``: ``tuner.phases``, seconds by phase), and settle
    its job once every task is finished. A task that is already finished (e.g. cancelled while
    it ran) keeps its status. With ``worker_id``, only that lease owner may finish it.
    ``status="lost"`` changes nothing (the lease went to another worker)."""
    if status not in FINISH_STATUSES:
        raise ValueError(f"task status {status!r}: expected one of {', '.join(FINISH_STATUSES)}")
    task = get_task(session, task_id)
    if status == Handback.LOST:
        return task
    guard = update(Task).where(Task.id == task_id, Task.status.in_(ACTIVE))
    if worker_id is not None:
        guard = guard.where(Task.lease_owner == worker_id)
    if _changed(session, guard.values(status=status, error=error, finished_at=utcnow(),
                                      lease_owner=None, lease_expires_at=None,
                                      stop_reason=stop_reason[:40] if stop_reason else None,
                                      phases=dict(phases) if phases else None)):
        if status == Status.FAILED:  # given up for good: what it verified is not thrown away
            keep_best_of_given_up(session, task_id)
        _settle_job(session, task.job_id)
    _reloaded_job(session, task.job_id)
    return task


def running_tasks(session: Session) -> list[Task]:
    """Tasks a worker holds now, oldest lease first (the health report shows their owners)."""
    return list(session.scalars(select(Task).where(Task.status == Status.RUNNING)
                                .order_by(Task.lease_expires_at, Task.id)))


def count_tasks_by_status(session: Session) -> dict[str, int]:
    rows = session.execute(select(Task.status, func.count()).group_by(Task.status))
    return {status: int(count) for status, count in rows}


def _owned(statement: Any, worker_id: str | None) -> Any:
    """A task UPDATE guarded, with ``worker_id``, by the task running under its lease."""
    if worker_id is None:
        return statement
    return statement.where(Task.status == Status.RUNNING, Task.lease_owner == worker_id)


def set_task_best(session: Session, task_id: int, ms: float, config: Mapping[str, int], *,
                  worker_id: str | None = None, measured: str = "retimed",
                  baseline_ms: float | None = None, baseline_name: str | None = None,
                  incumbent_ms: float | None = None, note: str | None = None,
                  default_ms: float | None = None,
                  default_config: Mapping[str, int] | None = None, basis: str | None = None,
                  noise_margin: float | None = None) -> bool:
    """The task's final best, after the finalists were re-timed side by side (``measured``
    ``retimed``; ``trial`` when they could not be, e.g. an interrupted search), with what was
    timed beside them in the same process: the baseline (``baseline_name``, e.g. torch), the
    stored best (``incumbent_ms``) and the kernel's default (``default_config``,
    ``default_ms``), and ``note``, what became of the stored best: its ``basis`` against the
    default (``BASES``) by ``noise_margin``. With ``worker_id``, only while the task runs under
    that worker's lease. False: nothing written (no such task, or the lease is lost)."""
    if measured not in MEASURED:
        raise ValueError(f"measured {measured!r}: expected one of {', '.join(MEASURED)}")
    if basis is not None and basis not in BASES:
        raise ValueError(f"basis {basis!r}: expected one of {', '.join(BASES)}")
    return _changed_row(session, Task, task_id, _owned(update(Task).where(Task.id == task_id),
                                                       worker_id)
                        .values(best_ms=ms, best_config=dict(config), best_measured=measured,
                                baseline_ms=baseline_ms, baseline_name=baseline_name,
                                incumbent_ms=incumbent_ms, best_note=note,
                                default_ms=default_ms,
                                default_config=None if default_config is None
                                else dict(default_config),
                                best_basis=basis, noise_margin=noise_margin))


def record_retimed(session: Session, task_id: int,
                   measurements: Iterable[Mapping[str, Any]]) -> int:
    """Store the finalists' re-timed times (``Measurement.to_dict()``s) beside their trials'
    own (``Trial.retimed_*``), matched by config; the trial times are left as measured.
    Returns how many trials got one."""
    written = 0
    for m in measurements:
        if m.get("outcome") != "ok" or m.get("p50_ms") is None:
            continue
        written += _rowcount(session.execute(
            update(Trial).where(Trial.task_id == task_id,
                                Trial.config_key == config_key(m["config"]))
            .values(retimed_p20_ms=m.get("p20_ms"), retimed_p50_ms=m["p50_ms"],
                    retimed_p80_ms=m.get("p80_ms"))
            .execution_options(synchronize_session=False)))
    return written
