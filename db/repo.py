"""Repository functions: every query the service makes, in one place.

Functions take a ``Session`` and leave committing to the caller unless they say otherwise.
Functions that return rows return them fresh from the database (reloaded where a guarded
UPDATE changed them), so callers can read them after commit.

Concurrency: every state change that two processes could race for is a guarded UPDATE (a
compare-and-set whose WHERE clause states the status it expects), so a row changes hands at
most once whatever the interleaving. On PostgreSQL, claims also pick candidates with
``SELECT ... FOR UPDATE SKIP LOCKED`` so that workers do not queue behind each other; SQLite
has one writer at a time and relies on the guard alone. Best configs and devices are written
with ``INSERT ... ON CONFLICT DO NOTHING`` followed by a guarded UPDATE, so two workers storing
the same key at once never fail on the unique constraint. Misses are written the same way, and a
report holds its miss row's write lock (SQLite: the database's) from its first statement to its
commit, so reports of one miss take turns and queue at most one job.
"""

from __future__ import annotations

import hashlib
import json
import math
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import ColumnElement, CursorResult, Result, Select, func, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session
from sqlalchemy.orm.util import identity_key

from db.models import ACTIVE, TERMINAL, BestConfig, Device, Job, Miss, Task, Trial, utcnow
from tuner.identity import same_triton_minor
from tuner.shapes import shape_key

#: how many claim candidates SQLite tries per query (several workers may race for the first)
_SQLITE_CLAIM_CANDIDATES = 8


class NotFound(LookupError):
    """No row with that id or key (the API answers 404)."""


# -- helpers ----------------------------------------------------------------------------------

def _rowcount(result: Result[Any]) -> int:
    return int(cast(CursorResult[Any], result).rowcount)


def _changed(session: Session, statement: Any) -> bool:
    """Run a guarded UPDATE that targets one row; True when it matched."""
    return _rowcount(session.execute(statement.execution_options(
        synchronize_session=False))) == 1


def _changed_row(session: Session, model: type[Any], row_id: Any, statement: Any) -> bool:
    """``_changed``, then the session's copy of the row (if it holds one) reloads on next
    access, so callers holding it never read what the UPDATE replaced."""
    changed = _changed(session, statement)
    cached = session.identity_map.get(identity_key(model, row_id))
    if cached is not None:
        session.expire(cached)
    return changed


def _is_postgres(session: Session) -> bool:
    return session.get_bind().dialect.name == "postgresql"


def _insert_ignoring_conflicts(session: Session, model: type[Any], values: Mapping[str, Any],
                               key: Sequence[str]) -> bool:
    """``INSERT ... ON CONFLICT (key) DO NOTHING``; True when the row was inserted."""
    dialect = session.get_bind().dialect.name
    insert_for: Callable[..., Any]
    if dialect == "postgresql":
        insert_for = postgresql.insert
    elif dialect == "sqlite":
        insert_for = sqlite.insert
    else:
        raise NotImplementedError(f"database {dialect!r}: use SQLite or PostgreSQL")
    statement = (insert_for(model).values(**values).on_conflict_do_nothing(index_elements=key)
                 .returning(model.id))  # rowcount is -1 on psycopg; a returned id is certain
    return session.execute(statement).first() is not None


def _reloaded(session: Session, model: type[Any], row_id: Any) -> Any:
    """The row as the database has it now (in-session copies are overwritten)."""
    row = session.get(model, row_id, populate_existing=True)
    if row is None:
        raise NotFound(f"no {model.__tablename__} row {row_id!r}")
    return row


# -- devices ----------------------------------------------------------------------------------

_DEVICE_FIELDS = ("kind", "name", "compute_capability", "sm_count", "memory_bytes",
                  "smem_per_block", "triton_version", "torch_version", "cuda_version",
                  "driver_version")


def upsert_device(session: Session, fingerprint: Mapping[str, Any]) -> Device:
    """The device row for ``fingerprint["key"]``, created or refreshed: the fields of
    ``_DEVICE_FIELDS`` present in ``fingerprint`` are written and ``last_seen_at`` is now.
    Other keys are ignored. A new device needs ``kind`` and ``name``: ValueError otherwise."""
    key = fingerprint.get("key")
    if not key:
        raise ValueError(f"device fingerprint has no 'key': {dict(fingerprint)!r}")
    fields = {f: fingerprint[f] for f in _DEVICE_FIELDS if f in fingerprint}
    now = utcnow()
    if {"kind", "name"} <= fields.keys():
        _insert_ignoring_conflicts(session, Device, {"key": key, **fields, "created_at": now,
                                                     "last_seen_at": now}, ["key"])
    if not _changed(session, update(Device).where(Device.key == key)
                    .values(**fields, last_seen_at=now)):
        raise ValueError(f"device {key!r} is new: its fingerprint needs 'kind' and 'name'")
    device = session.scalars(select(Device).where(Device.key == key)
                             .execution_options(populate_existing=True)).one()
    return device


def touch_device(session: Session, device_key: str) -> bool:
    """Mark a device as seen now (a worker's presence beat); False if there is no such row."""
    return _changed(session, update(Device).where(Device.key == device_key)
                    .values(last_seen_at=utcnow()))


def get_device(session: Session, device_key: str) -> Device | None:
    return session.scalar(select(Device).where(Device.key == device_key))


def list_devices(session: Session) -> list[Device]:
    """Every known device, by key."""
    return list(session.scalars(select(Device).order_by(Device.key)))


def set_calibration(session: Session, device_key: str, copy_gbps: float | None,
                    matmul_tflops: float | None) -> Device:
    """Record a device's measured limits (the roofline's ceilings). NotFound if unknown."""
    device = session.scalar(select(Device).where(Device.key == device_key))
    if device is None:
        raise NotFound(f"no device {device_key!r}")
    device.copy_gbps, device.matmul_tflops = copy_gbps, matmul_tflops
    device.calibrated_at = utcnow()
    session.flush()
    return device


def single_gpu_device_key(session: Session) -> str | None:
    """The one real GPU device this service knows, when there is exactly one."""
    keys = list(session.scalars(select(Device.key).where(Device.kind == "cuda")))
    return keys[0] if len(keys) == 1 else None


# -- jobs -------------------------------------------------------------------------------------

def request_key(*, kernel: str, kernel_version: str, dtype: str,
                shapes: Sequence[Mapping[str, int]], budget_trials: int,
                budget_seconds: float | None, strategy: str, backend: str,
                device_key: str | None) -> str:
    """sha256 (hex) of what makes two submissions the same; shape order does not matter.
    ``seed`` and ``force`` are left out: a resubmission differing only in them is a duplicate."""
    payload = json.dumps([kernel, kernel_version, dtype, sorted(shape_key(s) for s in shapes),
                          budget_trials, budget_seconds, strategy, backend, device_key])
    return hashlib.sha256(payload.encode()).hexdigest()


def create_job(session: Session, *, kernel: str, kernel_version: str, dtype: str,
               shapes: Sequence[Mapping[str, int]], budget_trials: int,
               budget_seconds: float | None, strategy: str, force: bool, seed: int,
               backend: str, device_key: str | None) -> Job:
    """A queued job with one queued task per shape (in the given order), flushed."""
    key = request_key(kernel=kernel, kernel_version=kernel_version, dtype=dtype, shapes=shapes,
                      budget_trials=budget_trials, budget_seconds=budget_seconds,
                      strategy=strategy, backend=backend, device_key=device_key)
    job = Job(id=uuid.uuid4().hex, kernel=kernel, kernel_version=kernel_version, dtype=dtype,
              status="queued", device_key=device_key, backend=backend, strategy=strategy,
              budget_trials=budget_trials, budget_seconds=budget_seconds, force=force, seed=seed,
              request_key=key)
    job.tasks = [Task(shape=dict(s), shape_key=shape_key(s), status="queued",
                      outcome_counts={}) for s in shapes]
    session.add(job)
    session.flush()
    return job


def find_active_duplicate(session: Session, request_key: str) -> Job | None:
    """The oldest queued or running job with this request key, if any."""
    return session.scalar(select(Job).where(Job.request_key == request_key,
                                            Job.status.in_(ACTIVE))
                          .order_by(Job.created_at, Job.id).limit(1))


def get_job(session: Session, job_id: str) -> Job:
    """The job; NotFound if there is none."""
    job = session.get(Job, job_id)
    if job is None:
        raise NotFound(f"no job {job_id!r}")
    return job


def list_jobs(session: Session, status: str | None = None, kernel: str | None = None,
              limit: int = 50, offset: int = 0) -> tuple[list[Job], int]:
    """One page of jobs, newest first, and how many match in all."""
    query = select(Job)
    if status:
        query = query.where(Job.status == status)
    if kernel:
        query = query.where(Job.kernel == kernel)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.scalars(query.order_by(Job.created_at.desc(), Job.id).limit(limit)
                           .offset(offset))
    return list(rows), int(total)


def count_jobs_by_status(session: Session) -> dict[str, int]:
    rows = session.execute(select(Job.status, func.count()).group_by(Job.status))
    return {status: int(count) for status, count in rows}


def cancel_job(session: Session, job_id: str) -> Job:
    """Cancel the job and its queued and running tasks (a running task's worker sees it at its
    next check or lease renewal). Finished tasks and finished jobs are left as they are.
    NotFound if there is no such job."""
    get_job(session, job_id)
    now = utcnow()
    session.execute(update(Task).where(Task.job_id == job_id, Task.status.in_(ACTIVE))
                    .values(status="cancelled", finished_at=now, lease_owner=None,
                            lease_expires_at=None)
                    .execution_options(synchronize_session=False))
    session.execute(update(Job).where(Job.id == job_id, Job.status.in_(ACTIVE))
                    .values(status="cancelled", finished_at=now)
                    .execution_options(synchronize_session=False))
    _follow_job(session, job_id, "cancelled", None)
    return _reloaded_job(session, job_id)


def _reloaded_job(session: Session, job_id: str) -> Job:
    session.scalars(select(Task).where(Task.job_id == job_id)
                    .execution_options(populate_existing=True)).all()
    return cast(Job, _reloaded(session, Job, job_id))


def _settle_job(session: Session, job_id: str) -> None:
    """Once every task of an active job is terminal, the job is too: failed if any task failed,
    else cancelled if any was cancelled, else succeeded. A finished job is left alone."""
    tasks = session.execute(select(Task.status, Task.shape_key, Task.error)
                            .where(Task.job_id == job_id)).all()
    statuses = {t.status for t in tasks}
    if not statuses or not statuses <= set(TERMINAL):
        return
    error = None
    if "failed" in statuses:
        status = "failed"
        error = "; ".join(f"{t.shape_key}: {t.error}" for t in tasks if t.error)[:4000] or None
    else:
        status = "cancelled" if "cancelled" in statuses else "succeeded"
    if _changed_row(session, Job, job_id, update(Job).where(Job.id == job_id,
                                                            Job.status.in_(ACTIVE))
                    .values(status=status, error=error, finished_at=utcnow())):
        _follow_job(session, job_id, status, error)


def answer_tuned_tasks(session: Session, job: Job) -> int:
    """Mark the job's queued tasks whose shape is already tuned on the target device (the
    job's, or the only GPU this service knows) as succeeded from the store. Returns how many;
    the job is succeeded when that covers every shape."""
    device_key = job.device_key or single_gpu_device_key(session)
    if device_key is None:
        return 0
    answered = 0
    for task in job.tasks:
        best = get_best(session, device_key=device_key, kernel=job.kernel, dtype=job.dtype,
                        shape_key=task.shape_key, kernel_version=job.kernel_version)
        if best is None or task.status != "queued":
            continue
        task.status, task.device_key, task.finished_at = "succeeded", device_key, utcnow()
        task.best_ms, task.best_config, task.error = best.p50_ms, dict(best.config), None
        answered += 1
    session.flush()
    _settle_job(session, job.id)
    _reloaded_job(session, job.id)
    return answered


# -- tasks: claim, lease, finish --------------------------------------------------------------

def get_task(session: Session, task_id: int) -> Task:
    """The task; NotFound if there is none."""
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
             .where(Task.status == "queued", Job.status.in_(ACTIVE),
                    or_(Job.device_key.is_(None), Job.device_key == device_key))
             .order_by(Job.created_at, Task.id))
    if _is_postgres(session):  # rows another claim holds are skipped, not waited for
        query = query.limit(1).with_for_update(skip_locked=True, of=Task)
    else:
        query = query.limit(_SQLITE_CLAIM_CANDIDATES)
    return list(session.scalars(query))


def _lease(session: Session, task_id: int, worker_id: str, lease_seconds: float) -> bool:
    now = utcnow()
    return _changed(session, update(Task).where(Task.id == task_id, Task.status == "queued")
                    .values(status="running", attempts=Task.attempts + 1,
                            lease_owner=worker_id,
                            lease_expires_at=now + timedelta(seconds=lease_seconds),
                            started_at=now, error=None))


def _mark_job_running(session: Session, job_id: str) -> None:
    if _changed(session, update(Job).where(Job.id == job_id, Job.status == "queued")
                .values(status="running", started_at=utcnow())):
        _follow_job(session, job_id, "running", None)
    _reloaded(session, Job, job_id)


def start_task_locally(session: Session, task_id: int, worker_id: str) -> Task:
    """Mark a task running for an in-process run (the CLI), without a lease to renew."""
    task = get_task(session, task_id)
    task.status, task.lease_owner, task.attempts = "running", worker_id, task.attempts + 1
    task.started_at = utcnow()
    session.flush()
    _mark_job_running(session, task.job_id)
    return task


def set_task_device(session: Session, task_id: int, device_key: str) -> None:
    """Record the device that runs the task."""
    get_task(session, task_id).device_key = device_key


def renew_lease(session: Session, task_id: int, worker_id: str, lease_seconds: float) -> bool:
    """Extend the lease to ``lease_seconds`` from now. False when the task is no longer this
    worker's: reaped, cancelled, or finished."""
    return _changed_row(session, Task, task_id, update(Task).where(
        Task.id == task_id, Task.lease_owner == worker_id, Task.status == "running")
        .values(lease_expires_at=utcnow() + timedelta(seconds=lease_seconds)))


def release_task(session: Session, task_id: int, worker_id: str) -> bool:
    """Give a running task back to the queue because its worker is shutting down cleanly. The
    attempt is not counted (nothing went wrong) and the stored trials stay, so the next worker
    resumes the search. False when the task is no longer this worker's."""
    return _changed_row(session, Task, task_id, update(Task).where(
        Task.id == task_id, Task.lease_owner == worker_id, Task.status == "running")
        # the claim counted this attempt (attempts >= 1 while leased)
        .values(status="queued", lease_owner=None, lease_expires_at=None,
                attempts=Task.attempts - 1))


def reap_expired(session: Session, now: datetime | None = None) -> int:
    """Running tasks whose lease expired before ``now`` (their worker died or hung) go back to
    the queue while they have attempts left, else fail with an error saying how many times
    the lease expired (and their job settles). Returns how many tasks changed."""
    now = now or utcnow()
    expired = session.execute(select(Task.id, Task.job_id, Task.attempts, Task.max_attempts)
                              .where(Task.status == "running",
                                     Task.lease_expires_at.is_not(None),
                                     Task.lease_expires_at < now)).all()
    changed = 0
    for task in expired:
        guard = update(Task).where(Task.id == task.id, Task.status == "running",
                                   Task.lease_expires_at < now,
                                   Task.attempts == task.attempts)
        released = dict(lease_owner=None, lease_expires_at=None)
        if task.attempts < task.max_attempts:
            changed += _changed_row(session, Task, task.id,
                                    guard.values(status="queued", **released))
        elif _changed_row(session, Task, task.id, guard.values(
                status="failed", finished_at=now, **released,
                error=f"the worker's lease expired {task.attempts} times "
                      f"(max_attempts={task.max_attempts}); giving up")):
            changed += 1
            _settle_job(session, task.job_id)
    return changed


#: statuses a worker may finish a task with; "lost" means "not mine any more: change nothing"
FINISH_STATUSES = (*TERMINAL, "lost")


def finish_task(session: Session, task_id: int, status: str, error: str | None = None,
                *, worker_id: str | None = None) -> Task:
    """Finish a queued or running task as ``status`` (succeeded, failed or cancelled) with
    ``error``, and settle its job once every task is finished. A task that is already finished
    (e.g. cancelled while it ran) keeps its status. With ``worker_id``, only that lease owner
    may finish it. ``status="lost"`` changes nothing (the lease went to another worker)."""
    if status not in FINISH_STATUSES:
        raise ValueError(f"task status {status!r}: expected one of {', '.join(FINISH_STATUSES)}")
    task = get_task(session, task_id)
    if status == "lost":
        return task
    guard = update(Task).where(Task.id == task_id, Task.status.in_(ACTIVE))
    if worker_id is not None:
        guard = guard.where(Task.lease_owner == worker_id)
    if _changed(session, guard.values(status=status, error=error, finished_at=utcnow(),
                                      lease_owner=None, lease_expires_at=None)):
        _settle_job(session, task.job_id)
    _reloaded_job(session, task.job_id)
    return task


def running_tasks(session: Session) -> list[Task]:
    """Tasks a worker holds now, oldest lease first (the health report shows their owners)."""
    return list(session.scalars(select(Task).where(Task.status == "running")
                                .order_by(Task.lease_expires_at, Task.id)))


def count_tasks_by_status(session: Session) -> dict[str, int]:
    rows = session.execute(select(Task.status, func.count()).group_by(Task.status))
    return {status: int(count) for status, count in rows}


def set_task_best(session: Session, task_id: int, ms: float, config: Mapping[str, int]) -> None:
    """The task's final best, after the finalists were re-timed side by side."""
    task = get_task(session, task_id)
    task.best_ms, task.best_config = ms, dict(config)


# -- trials -----------------------------------------------------------------------------------

def record_trial(session: Session, task_id: int, number: int,
                 measurement: Mapping[str, Any]) -> Trial:
    """Store trial ``number`` (from 1) of a task from ``Measurement.to_dict()``, and update
    the task: trials_done (trials stored), outcome_counts, and best_ms/best_config when the
    outcome is ok and its p50 is faster. A repeated number violates the unique constraint."""
    config = dict(measurement["config"])
    trial = Trial(task_id=task_id, number=number, config=config,
                  # same as KernelConfig.key(): sorted name=value pairs
                  config_key=",".join(f"{k}={config[k]}" for k in sorted(config)),
                  outcome=str(measurement["outcome"]), p20_ms=measurement.get("p20_ms"),
                  p50_ms=measurement.get("p50_ms"), p80_ms=measurement.get("p80_ms"),
                  error=measurement.get("error"), compile_s=measurement.get("compile_s"),
                  max_error=measurement.get("max_error"))
    session.add(trial)
    task = get_task(session, task_id)
    task.trials_done += 1
    counts = dict(task.outcome_counts or {})
    counts[trial.outcome] = counts.get(trial.outcome, 0) + 1
    task.outcome_counts = counts  # a new dict: JSON columns do not track in-place changes
    if trial.outcome == "ok" and trial.p50_ms is not None and (
            task.best_ms is None or trial.p50_ms < task.best_ms):
        task.best_ms, task.best_config = trial.p50_ms, config
    session.flush()
    return trial


def trials_for_task(session: Session, task_id: int) -> list[Trial]:
    """The task's trials by number."""
    return list(session.scalars(select(Trial).where(Trial.task_id == task_id)
                                .order_by(Trial.number)))


# -- best configs -----------------------------------------------------------------------------

def _best_key(device_key: str, kernel: str, kernel_version: str, dtype: str, shape_key: str,
              triton_version: str) -> dict[str, str]:
    return dict(device_key=device_key, kernel=kernel, kernel_version=kernel_version,
                dtype=dtype, shape_key=shape_key, triton_version=triton_version)


def _matching(model: type[Any], values: Mapping[str, Any]) -> list[ColumnElement[bool]]:
    return [getattr(model, name) == value for name, value in values.items()]


def store_best(session: Session, *, device_key: str, kernel: str, kernel_version: str,
               dtype: str, shape: Mapping[str, int], triton_version: str,
               config: Mapping[str, int], p20_ms: float, p50_ms: float, p80_ms: float,
               tflops: float | None, gbps: float | None, torch_version: str | None,
               cuda_version: str | None, task_id: int | None,
               noise_margin: float = 0.0) -> tuple[BestConfig, bool]:
    """Insert the best config for its key, or replace the stored one only when the new p50 is
    below the stored p50 * (1 - ``noise_margin``). Returns the stored row and whether this
    call wrote it. Safe when two workers store the same key at once."""
    key = _best_key(device_key, kernel, kernel_version, dtype, shape_key(shape), triton_version)
    result = dict(shape=dict(shape), config=dict(config), p20_ms=p20_ms, p50_ms=p50_ms,
                  p80_ms=p80_ms, tflops=tflops, gbps=gbps, torch_version=torch_version,
                  cuda_version=cuda_version, task_id=task_id, updated_at=utcnow())
    written = _insert_ignoring_conflicts(session, BestConfig, {**key, **result}, list(key))
    if not written:
        written = _changed(session, update(BestConfig).where(
            *_matching(BestConfig, key), BestConfig.p50_ms * (1 - noise_margin) > p50_ms)
            .values(**result))
    row = session.scalars(select(BestConfig).where(*_matching(BestConfig, key))
                          .execution_options(populate_existing=True)).one()
    return row, written


def _best_query(kernel: str | None = None, device_key: str | None = None,
                dtype: str | None = None) -> Select[BestConfig]:
    query = select(BestConfig)
    if kernel:
        query = query.where(BestConfig.kernel == kernel)
    if device_key:
        query = query.where(BestConfig.device_key == device_key)
    if dtype:
        query = query.where(BestConfig.dtype == dtype)
    return query


def get_best(session: Session, *, device_key: str, kernel: str, dtype: str, shape_key: str,
             kernel_version: str | None = None,
             triton_version: str | None = None) -> BestConfig | None:
    """The stored best for an exact shape on a device; among several kernel or Triton
    versions (when not given), the most recently updated."""
    query = _best_query(kernel, device_key, dtype).where(BestConfig.shape_key == shape_key)
    if kernel_version:
        query = query.where(BestConfig.kernel_version == kernel_version)
    if triton_version:
        query = query.where(BestConfig.triton_version == triton_version)
    order = (BestConfig.updated_at.desc(), BestConfig.id.desc())
    return session.scalar(query.order_by(*order).limit(1))


def list_best(session: Session, kernel: str | None = None, device_key: str | None = None,
              dtype: str | None = None) -> list[BestConfig]:
    """Stored bests, filtered, by kernel, dtype, device and shape."""
    order = (BestConfig.kernel, BestConfig.dtype, BestConfig.device_key, BestConfig.shape_key,
             BestConfig.id)
    return list(session.scalars(_best_query(kernel, device_key, dtype).order_by(*order)))


def shape_distance(a: Mapping[str, int], b: Mapping[str, int]) -> float:
    """Euclidean distance over log2 of each dimension (2x in one dimension counts 1); a
    dimension missing from one shape counts as 1 there."""
    return math.sqrt(sum((math.log2(max(1, a.get(k, 1))) - math.log2(max(1, b.get(k, 1)))) ** 2
                         for k in {*a, *b}))


def nearest_best(session: Session, *, device_key: str, kernel: str, dtype: str,
                 shape: Mapping[str, int], kernel_version: str | None = None
                 ) -> tuple[BestConfig, float] | None:
    """The stored best of the same device, kernel and dtype (and kernel version, if given)
    whose shape is nearest to ``shape`` (``shape_distance``; ties: most recently updated),
    with its distance; None if there is none. An exact match has distance 0."""
    rows: Iterable[BestConfig] = list_best(session, kernel=kernel, device_key=device_key,
                                           dtype=dtype)
    if kernel_version:
        rows = [r for r in rows if r.kernel_version == kernel_version]
    scored = [(shape_distance(r.shape, shape), -r.updated_at.timestamp(), r.id, r) for r in rows]
    if not scored:
        return None
    distance, _, _, best = min(scored, key=lambda s: s[:3])
    return best, distance


def shape_key_of(shape: Mapping[str, int]) -> str:
    """The normalised shape key the store uses (``tuner.shapes.shape_key``)."""
    return shape_key(shape)


def seconds_since(moment: datetime | None, now: datetime | None = None) -> float | None:
    """Seconds from ``moment`` to ``now`` (None stays None); naive datetimes are UTC."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=utcnow().tzinfo)
    return ((now or utcnow()) - moment).total_seconds()


# -- serving configs: the match ladder --------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Candidate:
    """A stored best that may be served, with its device's kind (``cuda``, ``interpret``,
    ``replay``; None when no worker registered the device) and plain copies of what ranking
    reads (reading ORM attributes took most of a 10,000-item bulk query's time)."""

    row: BestConfig
    device_kind: str | None
    device_key: str
    shape_key: str
    triton_version: str
    #: log2 of each dimension (``shape_distance``'s terms)
    log_shape: dict[str, float]
    updated: float


@dataclass(frozen=True, slots=True)
class Served:
    """The stored best chosen for a caller: how it matches the caller's identity (``exact``,
    ``nearest``, ``other-triton`` or ``other-device``) and the log2 distance of its shape."""

    match: str
    row: BestConfig
    distance: float


def _log_shape(shape: Mapping[str, int]) -> dict[str, float]:
    return {k: math.log2(max(1, v)) for k, v in shape.items()}


def serving_candidates(session: Session, *, kernel: str, kernel_version: str,
                       dtype: str) -> list[Candidate]:
    """Every stored best of that kernel source version and dtype, on any device. A config of
    another kernel version is never a candidate: it was tuned for other code."""
    rows = session.execute(
        select(BestConfig, Device.kind).outerjoin(Device, Device.key == BestConfig.device_key)
        .where(BestConfig.kernel == kernel, BestConfig.kernel_version == kernel_version,
               BestConfig.dtype == dtype).order_by(BestConfig.id))
    return [Candidate(row, kind, row.device_key, row.shape_key, row.triton_version,
                      _log_shape(row.shape), row.updated_at.timestamp()) for row, kind in rows]


def serve_best(candidates: Iterable[Candidate], *, shape: Mapping[str, int],
               device_key: str | None, triton_version: str | None) -> Served | None:
    """The config to serve a caller from ``serving_candidates`` (its kernel version and
    dtype), down the ladder: on the caller's device with its Triton minor version, the exact
    shape (``exact``) else the nearest (``nearest``); on its device with another Triton minor
    (``other-triton``); on another real GPU (``other-device``; the interpreter's and replayed
    results are never served for another device). None: serve the kernel's default. Without
    ``device_key`` only ``other-device`` can match (the caller's GPU is unknown); without
    ``triton_version`` every Triton version counts as the caller's."""
    candidates = list(candidates)
    key, logs = shape_key(shape), _log_shape(shape)
    if device_key:
        mine = [c for c in candidates if c.device_key == device_key]
        same = [c for c in mine if same_triton_minor(c.triton_version, triton_version)]
        if found := _closest(same, key, logs, triton_version):
            row, distance = found
            return Served("exact" if row.shape_key == key else "nearest", row, distance)
        if found := _closest(mine, key, logs, triton_version):
            return Served("other-triton", *found)
    gpus = [c for c in candidates if c.device_kind == "cuda" and c.device_key != device_key]
    if found := _closest(gpus, key, logs, triton_version):
        return Served("other-device", *found)
    return None


def _closest(candidates: Sequence[Candidate], key: str, logs: Mapping[str, float],
             triton_version: str | None) -> tuple[BestConfig, float] | None:
    """The candidate of the nearest shape (the exact shape first), then of the caller's Triton
    minor, then of its very version, then the most recently updated; with its distance
    (``shape_distance``: a dimension missing from one shape counts as 1 there)."""
    def distance(c: Candidate) -> float:
        return math.sqrt(sum((c.log_shape.get(d, 0.0) - logs.get(d, 0.0)) ** 2
                             for d in {*c.log_shape, *logs}))

    def rank(c: Candidate) -> tuple[float, bool, bool, bool, float, int]:
        return (distance(c), c.shape_key != key,
                not same_triton_minor(c.triton_version, triton_version),
                bool(triton_version) and c.triton_version != triton_version,
                -c.updated, -c.row.id)

    if not candidates:
        return None
    exact = [c for c in candidates if c.shape_key == key]  # no distance to compute
    best = min(exact or candidates, key=rank)
    return best.row, 0.0 if exact else distance(best)


def best_configs_version(session: Session) -> tuple[Any, ...]:
    """A fingerprint of what ``serving_candidates`` reads, in one aggregate query: the number
    of bests, their largest id and latest ``updated_at`` (a best stored, replaced or removed
    changes one), and the number of devices (a device's kind decides what is served to
    others). The serving index (``api/serving.py``) reloads when it changes."""
    devices = select(func.count()).select_from(Device).scalar_subquery()
    row = session.execute(select(func.count(BestConfig.id), func.max(BestConfig.id),
                                 func.max(BestConfig.updated_at), devices)).one()
    return tuple(row)


# -- misses: lookups not served exactly, and the jobs queued to tune them ---------------------

#: a miss whose job failed or was cancelled is queued again when reported after this long
MISS_RETRY_AFTER = timedelta(hours=1)
#: the window of the per-client rate limit on queueing misses
MISS_RATE_WINDOW = timedelta(hours=1)
#: a miss's status while it has a job in each job status
_MISS_STATUS_OF_JOB = {"queued": "queued", "running": "running", "succeeded": "tuned",
                       "failed": "failed", "cancelled": "failed"}
#: statuses of a miss whose job is queued or running
_MISS_ACTIVE = ("queued", "running")
#: every status a miss row can have (``status`` of GET /misses)
MISS_STATUSES = ("queued", "running", "tuned", "failed", "rate-limited", "capped",
                 "kernel-version-mismatch", "no-device")


@dataclass(frozen=True, slots=True)
class MissLimits:
    """How much tuning misses may queue (``Settings.miss_*``)."""

    rate_per_client: int
    cap_per_kernel: int
    trials: int


def report_miss(session: Session, *, device_key: str | None, kernel: str,
                kernel_version: str, registered_version: str, dtype: str,
                shape: Mapping[str, int], client: str, limits: MissLimits) -> str:
    """Record one report of a lookup that was not served exactly, and queue a tuning job on the
    caller's device when it should be. Returns what became of it (the API's ``miss``):

    - ``queued``: a job was created now (strategy and backend auto, ``limits.trials`` trials);
    - ``pending``: a job for it is queued or running; ``tuned``: its job succeeded;
    - ``failed``: its job failed or was cancelled less than ``MISS_RETRY_AFTER`` ago (a later
      report queues it again);
    - not queued, only recorded: ``kernel-version-mismatch`` (``kernel_version`` is not the
      ``registered_version`` the workers would tune), ``no-device`` (no worker to target),
      ``rate-limited`` (``client`` queued ``limits.rate_per_client`` misses within
      ``MISS_RATE_WINDOW``), ``capped`` (the kernel has ``limits.cap_per_kernel`` misses whose
      jobs are queued or running).

    Commit after each call: the miss row stays write-locked until then, which is what makes
    concurrent reports of one miss queue one job (the rate and cap counts read other rows and
    may be overrun by reports that race)."""
    now = utcnow()
    miss = _counted_miss(session, device_key or "", kernel, kernel_version, dtype, shape,
                         client, now)
    if kernel_version != registered_version:
        return _miss_is(session, miss.id, "kernel-version-mismatch",
                        f"the caller's kernel version {kernel_version} is not the server's "
                        f"{registered_version}: tuning here would tune other code")
    if not device_key:
        return _miss_is(session, miss.id, "no-device",
                        "the caller gave no device: no worker to tune it on")
    job = session.get(Job, miss.job_id, populate_existing=True) if miss.job_id else None
    if job is not None and job.status in ACTIVE:
        return "pending"
    if job is not None and job.status == "succeeded":
        return "tuned"
    if job is not None and job.finished_at and now - job.finished_at < MISS_RETRY_AFTER:
        return "failed"
    return _queue_miss(session, miss, device_key, client, limits, now)


def _counted_miss(session: Session, device_key: str, kernel: str, kernel_version: str,
                  dtype: str, shape: Mapping[str, int], client: str, now: datetime) -> Miss:
    """The miss row, inserted or counted once more: this write locks the row until commit."""
    key = dict(device_key=device_key, kernel=kernel, kernel_version=kernel_version,
               dtype=dtype, shape_key=shape_key(shape))
    inserted = _insert_ignoring_conflicts(session, Miss, {
        **key, "shape": dict(shape), "count": 1, "first_seen_at": now, "last_seen_at": now,
        "last_client": client, "status": "new"}, list(key))
    if not inserted:
        session.execute(update(Miss).where(*_matching(Miss, key))
                        .values(count=Miss.count + 1, last_seen_at=now, last_client=client)
                        .execution_options(synchronize_session=False))
    return session.scalars(select(Miss).where(*_matching(Miss, key))
                           .execution_options(populate_existing=True)).one()


def _miss_is(session: Session, miss_id: int, status: str, note: str) -> str:
    """Set why a miss is not queued; returns ``status``."""
    _changed_row(session, Miss, miss_id, update(Miss).where(Miss.id == miss_id)
                 .values(status=status, note=note))
    return status


def _queue_miss(session: Session, miss: Miss, device_key: str, client: str,
                limits: MissLimits, now: datetime) -> str:
    queued = session.scalar(select(func.count()).select_from(Miss).where(
        Miss.queued_by == client, Miss.queued_at >= now - MISS_RATE_WINDOW)) or 0
    if queued >= limits.rate_per_client:
        return _miss_is(session, miss.id, "rate-limited",
                        f"client {client} queued {queued} misses in the last hour "
                        f"(TUNER_MISS_RATE_PER_CLIENT={limits.rate_per_client})")
    active = session.scalar(select(func.count()).select_from(Miss).join(Job, Miss.job_id == Job.id)
                            .where(Miss.kernel == miss.kernel, Job.status.in_(ACTIVE))) or 0
    if active >= limits.cap_per_kernel:
        return _miss_is(session, miss.id, "capped",
                        f"{miss.kernel} has {active} misses queued or running "
                        f"(TUNER_MISS_CAP_PER_KERNEL={limits.cap_per_kernel})")
    fields: dict[str, Any] = dict(
        kernel=miss.kernel, kernel_version=miss.kernel_version, dtype=miss.dtype,
        shapes=[miss.shape], budget_trials=limits.trials, budget_seconds=None, strategy="auto",
        backend="auto", device_key=device_key)
    # an identical job someone submitted serves the miss as well as a new one would
    job = find_active_duplicate(session, request_key(**fields))
    created = job is None
    if job is None:
        job = create_job(session, **fields, force=False, seed=0)
    mine = dict(queued_by=client, queued_at=now) if created else {}
    if not _changed_row(session, Miss, miss.id, update(Miss).where(
            Miss.id == miss.id, _same_job(miss.job_id))
            .values(job_id=job.id, status=_MISS_STATUS_OF_JOB[job.status], note=None, **mine)):
        if created:  # another report queued it first (the row lock makes this unexpected)
            session.delete(job)
            session.flush()
        return "pending"
    return "queued" if created else "pending"


def _same_job(job_id: str | None) -> ColumnElement[bool]:
    return Miss.job_id.is_(None) if job_id is None else Miss.job_id == job_id


def _follow_job(session: Session, job_id: str, job_status: str, error: str | None) -> None:
    """Misses whose job is queued or running take its new status (only forwards)."""
    note = {"failed": f"its job failed: {error}"[:4000] if error else "its job failed",
            "cancelled": "its job was cancelled"}.get(job_status)
    session.execute(update(Miss).where(Miss.job_id == job_id, Miss.status.in_(_MISS_ACTIVE))
                    .values(status=_MISS_STATUS_OF_JOB[job_status], note=note)
                    .execution_options(synchronize_session=False))


def list_misses(session: Session, kernel: str | None = None, status: str | None = None,
                limit: int = 50, offset: int = 0) -> tuple[list[Miss], int]:
    """One page of misses, most recently reported first, and how many match in all."""
    query = select(Miss)
    if kernel:
        query = query.where(Miss.kernel == kernel)
    if status:
        query = query.where(Miss.status == status)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.scalars(query.order_by(Miss.last_seen_at.desc(), Miss.id.desc())
                           .limit(limit).offset(offset))
    return list(rows), int(total)


def count_misses_by_status(session: Session) -> dict[str, int]:
    rows = session.execute(select(Miss.status, func.count()).group_by(Miss.status))
    return {status: int(count) for status, count in rows}
