"""Repository functions: every query the service makes, in one place.

Functions take a ``Session`` and leave committing to the caller unless they say otherwise.
Functions that return rows return them fresh from the database (reloaded where a guarded
UPDATE changed them), so callers can read them after commit.

Concurrency: every state change that two processes could race for is a guarded UPDATE (a
compare-and-set whose WHERE clause states the status it expects), so a row changes hands at
most once whatever the interleaving. On PostgreSQL, claims also pick candidates with
``SELECT ... FOR UPDATE SKIP LOCKED`` so that workers do not queue behind each other; SQLite
has one writer at a time and relies on the guard alone. Settling a job from its tasks' statuses
reads other rows, so on PostgreSQL it first locks the job row (``SELECT ... FOR UPDATE``): of
two transactions finishing a job's last tasks, the second waits for the first's commit and
then sees it (under READ COMMITTED neither would see the other's). Locks are taken tasks
first, then their job. A worker's writes to its task (trials, best, finish) name the worker and
change nothing once the lease went to another (``LeaseLost``). Identical submissions share one
job: a partial unique index allows one queued or running job per request key, and
``submit_job`` inserts in a SAVEPOINT and returns the other job when the index refuses. Best
configs and devices are written with ``INSERT ... ON CONFLICT DO NOTHING`` followed by a
guarded UPDATE, so two workers storing the same key at once never fail on the unique
constraint. Misses are written the same way, and a report holds its miss row's write lock
(SQLite: the database's) from its first statement to its commit, so reports of one miss take
turns and queue at most one job.
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

from sqlalchemy import (
    JSON,
    ColumnElement,
    CursorResult,
    Result,
    Select,
    Text,
    case,
    func,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.orm.util import identity_key

from db.models import (
    ACTIVE,
    BASES,
    MEASURED,
    TERMINAL,
    WORKER_STATUSES,
    BestConfig,
    Device,
    Job,
    Miss,
    Task,
    Trial,
    WorkerRow,
    utcnow,
)
from tuner.config import config_key
from tuner.identity import same_triton_minor, triton_minor
from tuner.shapes import log_distance, log_shape, shape_distance, shape_key
from tuner.timing import DEFAULT_TIMING, TIMING_METHODS, check_timing

#: how many claim candidates SQLite tries per query (several workers may race for the first)
_SQLITE_CLAIM_CANDIDATES = 8


#: the largest id an INTEGER column holds on PostgreSQL (a larger one is an error there)
_MAX_INT_ID = 2**31 - 1
#: how long a job id is (``uuid4().hex``); ``jobs.id`` holds no longer one
_JOB_ID_LENGTH = 32
#: times ``submit_job`` tries again when the job its insert collided with finished meanwhile
_SUBMIT_ATTEMPTS = 5


class NotFound(LookupError):
    """No row with that id or key (the API answers 404)."""


class LeaseLost(Exception):
    """The task is no longer the calling worker's (reaped, leased to another worker, cancelled
    or finished): its write was not made."""


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


def _write_transaction(session: Session) -> None:
    """SQLite: make sure the connection is in a transaction that holds the write lock, so that a
    SAVEPOINT nests in it (the sqlite3 driver opens transactions only before INSERT, UPDATE and
    DELETE; a SAVEPOINT outside one would start its own, and releasing it would commit) and
    what this transaction reads stays true until it commits. PostgreSQL: nothing to do."""
    if _is_postgres(session):
        return
    connection = session.connection()
    if not getattr(connection.connection.dbapi_connection, "in_transaction", True):
        connection.exec_driver_sql("BEGIN IMMEDIATE")


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
                    matmul_tflops: float | None, *, copy_gbps_spread: float | None = None,
                    matmul_tflops_spread: float | None = None,
                    runs: int | None = None) -> Device:
    """Record a device's measured limits (the roofline's ceilings): the medians of ``runs``
    repeated runs and their spreads ((max - min) / median). NotFound if unknown."""
    device = session.scalar(select(Device).where(Device.key == device_key))
    if device is None:
        raise NotFound(f"no device {device_key!r}")
    device.copy_gbps, device.matmul_tflops = copy_gbps, matmul_tflops
    device.copy_gbps_spread, device.matmul_tflops_spread = copy_gbps_spread, matmul_tflops_spread
    device.calibration_runs = runs
    device.calibrated_at = utcnow()
    session.flush()
    return device


def single_gpu_device_key(session: Session) -> str | None:
    """The one real GPU device this service knows, when there is exactly one."""
    keys = list(session.scalars(select(Device.key).where(Device.kind == "cuda")))
    return keys[0] if len(keys) == 1 else None


# -- workers: one row per worker process, refreshed by its beats --------------------------------

def register_worker(session: Session, *, worker_id: str, host: str, pid: int, device_key: str,
                    kind: str, gpu_index: int | None, gpu_uuid: str | None) -> WorkerRow:
    """The worker's row, created or reset for a (re)start: ``idle``, no task or error,
    started and seen now."""
    now = utcnow()
    fields = dict(host=host, pid=pid, device_key=device_key, kind=kind, gpu_index=gpu_index,
                  gpu_uuid=gpu_uuid, status="idle", task_id=None, error=None, started_at=now,
                  last_seen_at=now)
    if not _insert_ignoring_conflicts(session, WorkerRow, {"id": worker_id, **fields}, ["id"]):
        _changed(session, update(WorkerRow).where(WorkerRow.id == worker_id).values(**fields))
    return cast(WorkerRow, _reloaded(session, WorkerRow, worker_id))


def beat_worker(session: Session, worker_id: str, *, status: str | None = None,
                task_id: int | None = None, error: str | None = None) -> bool:
    """The worker is alive: ``last_seen_at`` is now. With ``status``, the beat says everything
    the worker is doing, so ``task_id`` and ``error`` are written as given (None clears them);
    without, only those given are written. False if the worker has no row (never registered).
    ValueError for a status not in ``WORKER_STATUSES``."""
    values: dict[str, Any] = {"last_seen_at": utcnow()}
    if status is not None:
        if status not in WORKER_STATUSES:
            raise ValueError(f"worker status {status!r}: expected one of "
                             f"{', '.join(WORKER_STATUSES)}")
        values.update(status=status, task_id=task_id, error=error)
    else:
        values.update({k: v for k, v in (("task_id", task_id), ("error", error))
                       if v is not None})
    return _changed_row(session, WorkerRow, worker_id,
                        update(WorkerRow).where(WorkerRow.id == worker_id).values(**values))


def stop_worker(session: Session, worker_id: str) -> None:
    """The worker exited cleanly: ``stopped``, holding no task."""
    _changed_row(session, WorkerRow, worker_id, update(WorkerRow).where(WorkerRow.id == worker_id)
                 .values(status="stopped", task_id=None, last_seen_at=utcnow()))


def _seen_since(seen_within_s: float, now: datetime | None = None) -> datetime:
    return (now or utcnow()) - timedelta(seconds=seen_within_s)


def list_workers(session: Session, seen_within_s: float | None = None) -> list[WorkerRow]:
    """Workers (seen within ``seen_within_s`` seconds, if given) by device, GPU index (the
    interpreter's none last) and id."""
    query = select(WorkerRow)
    if seen_within_s is not None:
        query = query.where(WorkerRow.last_seen_at >= _seen_since(seen_within_s))
    return list(session.scalars(query.order_by(WorkerRow.device_key,
                                               WorkerRow.gpu_index.asc().nulls_last(),
                                               WorkerRow.id)))


def live_device_keys(session: Session, seen_within_s: float,
                     now: datetime | None = None) -> set[str]:
    """Devices with a worker that beat within ``seen_within_s`` seconds and is not stopped."""
    return set(session.scalars(select(WorkerRow.device_key).distinct().where(
        WorkerRow.last_seen_at >= _seen_since(seen_within_s, now),
        WorkerRow.status != "stopped")))


def waiting_note(session: Session, job: Job, *, now: datetime | None = None, after_s: float,
                 seen_within_s: float) -> str | None:
    """Why a job has been queued for over ``after_s`` seconds, when it is because no worker
    serves its target device (or, with no target, no worker at all) within ``seen_within_s``
    seconds: a sentence naming the device and the devices known. None otherwise (not queued,
    not waiting that long yet, or a live worker could claim it)."""
    now = now or utcnow()
    if job.status != "queued" or (seconds_since(job.created_at, now) or 0.0) < after_s:
        return None
    live = live_device_keys(session, seen_within_s, now)
    if (job.device_key in live) if job.device_key else bool(live):
        return None
    known = sorted(set(session.scalars(select(Device.key))) | live)
    devices = ", ".join(f"{k} (live)" if k in live else k for k in known) or "none"
    missing = (f"no worker has served device {job.device_key!r}" if job.device_key
               else "no worker has been seen")
    return f"{missing} in the last {seen_within_s:g} s; known devices: {devices}"


# -- jobs -------------------------------------------------------------------------------------

def request_key(*, kernel: str, kernel_version: str, dtype: str,
                shapes: Sequence[Mapping[str, int]], budget_trials: int,
                budget_seconds: float | None, strategy: str, backend: str,
                device_key: str | None, timing: str = DEFAULT_TIMING) -> str:
    """sha256 (hex) of what makes two submissions the same; shape order does not matter.
    ``seed`` and ``force`` are left out: a resubmission differing only in them is a duplicate.
    ``timing`` counts only when it is not the default (the keys of jobs submitted before it
    existed stay what they were)."""
    fields: list[Any] = [kernel, kernel_version, dtype, sorted(shape_key(s) for s in shapes),
                         budget_trials, budget_seconds, strategy, backend, device_key]
    if timing != DEFAULT_TIMING:
        fields.append(timing)
    return hashlib.sha256(json.dumps(fields).encode()).hexdigest()


def unshared_request_key(request_key: str, job_id: str) -> str:
    """The request key of a job created while an identical one is active (``create_job``):
    unique to the job, so the partial unique index lets both exist and submissions keep
    being deduplicated to the other."""
    return hashlib.sha256(f"{request_key}:{job_id}".encode()).hexdigest()


def _job_key(kernel: str, kernel_version: str, dtype: str, shapes: Sequence[Mapping[str, int]],
             budget_trials: int, budget_seconds: float | None, strategy: str, backend: str,
             device_key: str | None, timing: str = DEFAULT_TIMING, **_: Any) -> str:
    return request_key(kernel=kernel, kernel_version=kernel_version, dtype=dtype, shapes=shapes,
                       budget_trials=budget_trials, budget_seconds=budget_seconds,
                       strategy=strategy, backend=backend, device_key=device_key,
                       timing=timing)


def _insert_job(session: Session, key: str, kernel: str, kernel_version: str, dtype: str,
                shapes: Sequence[Mapping[str, int]], budget_trials: int,
                budget_seconds: float | None, strategy: str, force: bool, seed: int,
                backend: str, device_key: str | None, timing: str = DEFAULT_TIMING,
                job_id: str | None = None) -> Job:
    """Insert a queued job and its tasks in a SAVEPOINT (IntegrityError when the partial
    unique index already has an active job with ``key``; the transaction goes on)."""
    job = Job(id=job_id or uuid.uuid4().hex, kernel=kernel, kernel_version=kernel_version,
              dtype=dtype, status="queued", device_key=device_key, backend=backend,
              strategy=strategy, budget_trials=budget_trials, budget_seconds=budget_seconds,
              force=force, seed=seed, timing=check_timing(timing), request_key=key)
    job.tasks = [Task(shape=dict(s), shape_key=shape_key(s), status="queued",
                      outcome_counts={}) for s in shapes]
    _write_transaction(session)
    with session.begin_nested():
        session.add(job)
    return job


def create_job(session: Session, *, kernel: str, kernel_version: str, dtype: str,
               shapes: Sequence[Mapping[str, int]], budget_trials: int,
               budget_seconds: float | None, strategy: str, force: bool, seed: int,
               backend: str, device_key: str | None, timing: str = DEFAULT_TIMING) -> Job:
    """A new queued job with one queued task per shape (in the given order), flushed, even
    when an identical job is active (the CLI runs its own; see ``submit_job`` to share one).
    It gets the submission's request key unless an identical job is active, else
    ``unshared_request_key``: identical submissions are deduplicated to the older job.
    ``timing``: how its configs are timed (``tuner/timing.py``; ValueError for another)."""
    fields: dict[str, Any] = dict(
        kernel=kernel, kernel_version=kernel_version, dtype=dtype, shapes=shapes,
        budget_trials=budget_trials, budget_seconds=budget_seconds, strategy=strategy,
        force=force, seed=seed, backend=backend, device_key=device_key, timing=timing)
    key = _job_key(**fields)
    try:
        return _insert_job(session, key, **fields)
    except IntegrityError:
        job_id = uuid.uuid4().hex
        return _insert_job(session, unshared_request_key(key, job_id), **fields, job_id=job_id)


def submit_job(session: Session, *, kernel: str, kernel_version: str, dtype: str,
               shapes: Sequence[Mapping[str, int]], budget_trials: int,
               budget_seconds: float | None, strategy: str, force: bool, seed: int,
               backend: str, device_key: str | None,
               timing: str = DEFAULT_TIMING) -> tuple[Job, bool]:
    """The queued or running job identical to this submission (``request_key``) and False, or
    a new one as ``create_job`` makes it and True. Safe when identical submissions race: the
    database allows one active job per request key, the insert runs in a SAVEPOINT, and the
    loser gets the winner's job (PostgreSQL: once the winner commits). Commit soon after."""
    fields: dict[str, Any] = dict(
        kernel=kernel, kernel_version=kernel_version, dtype=dtype, shapes=shapes,
        budget_trials=budget_trials, budget_seconds=budget_seconds, strategy=strategy,
        force=force, seed=seed, backend=backend, device_key=device_key, timing=timing)
    key = _job_key(**fields)
    for attempt in range(_SUBMIT_ATTEMPTS):
        if (existing := find_active_duplicate(session, key)) is not None:
            return existing, False
        try:
            return _insert_job(session, key, **fields), True
        except IntegrityError:
            # an identical job was inserted first; it is found above unless it already
            # finished (or its transaction rolled back), and then this insert is tried again
            if attempt == _SUBMIT_ATTEMPTS - 1:
                raise
    raise AssertionError("unreachable")


def find_active_duplicate(session: Session, request_key: str) -> Job | None:
    """The oldest queued or running job with this request key, if any."""
    return session.scalar(select(Job).where(Job.request_key == request_key,
                                            Job.status.in_(ACTIVE))
                          .order_by(Job.created_at, Job.id).limit(1))


def get_job(session: Session, job_id: str) -> Job:
    """The job; NotFound if there is none (an id no job can have, too long or with a NUL byte,
    never reaches the database: PostgreSQL refuses NUL bytes in text with an error)."""
    if len(job_id) > _JOB_ID_LENGTH or "\x00" in job_id:
        raise NotFound(f"no job {job_id!r}")
    job = session.get(Job, job_id)
    if job is None:
        raise NotFound(f"no job {job_id!r}")
    return job


#: the fewest characters of a job id that name a job (``resolve_job_id``): the dashboard and the
#: CLI show 8; fewer would soon match several jobs
JOB_ID_MIN_PREFIX = 4
#: how many of the jobs an ambiguous prefix matches ``AmbiguousJobId`` lists
_AMBIGUOUS_LISTED = 10
_HEX_DIGITS = frozenset("0123456789abcdef")


class ShortJobId(ValueError):
    """A job id prefix shorter than ``JOB_ID_MIN_PREFIX`` (the API answers 422)."""


class AmbiguousJobId(LookupError):
    """A job id prefix that several jobs' ids start with (the API answers 409). ``candidates``:
    their full ids, oldest first (at most ``_AMBIGUOUS_LISTED``; ``more``: there are others)."""

    def __init__(self, prefix: str, candidates: Sequence[str], more: bool) -> None:
        self.prefix, self.candidates, self.more = prefix, list(candidates), more
        listed = ", ".join(candidates) + (", ..." if more else "")
        super().__init__(f"job id prefix {prefix!r} is ambiguous: it starts the ids of jobs "
                         f"{listed}; give more characters")


def resolve_job_id(session: Session, text: str) -> str:
    """The full id of the one job whose id is ``text`` or starts with it (ids are 32 lowercase
    hex characters; the dashboard and the CLI show the first 8, and either is accepted back).
    ShortJobId when ``text`` has fewer than ``JOB_ID_MIN_PREFIX`` characters, AmbiguousJobId
    when several jobs' ids start with it, NotFound when none does (text that is not hex or is
    longer than an id never reaches the database)."""
    prefix = text.lower()
    if len(prefix) < JOB_ID_MIN_PREFIX:
        raise ShortJobId(f"job id {text!r} is too short to name a job: give at least "
                         f"{JOB_ID_MIN_PREFIX} of its characters (the dashboard shows 8)")
    if len(prefix) > _JOB_ID_LENGTH or not set(prefix) <= _HEX_DIGITS:
        raise NotFound(f"no job {text!r}")
    if len(prefix) == _JOB_ID_LENGTH:
        return get_job(session, prefix).id
    # hex digits only: nothing in the prefix is a LIKE wildcard
    ids = list(session.scalars(select(Job.id).where(Job.id.like(f"{prefix}%"))
                               .order_by(Job.created_at, Job.id).limit(_AMBIGUOUS_LISTED + 1)))
    if not ids:
        raise NotFound(f"no job {text!r}")
    if len(ids) > 1:
        raise AmbiguousJobId(text, ids[:_AMBIGUOUS_LISTED], more=len(ids) > _AMBIGUOUS_LISTED)
    return ids[0]


def get_job_by_prefix(session: Session, text: str) -> Job:
    """The job whose id is ``text`` or, alone, starts with it (``resolve_job_id``'s errors)."""
    return get_job(session, resolve_job_id(session, text))


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


def _lock_job(session: Session, job_id: str) -> None:
    """PostgreSQL: lock the job row until commit, so that transactions deciding about the job
    from its tasks' statuses take turns, each reading after the previous one committed.
    SQLite: the caller's task write already holds the database's write lock."""
    if _is_postgres(session):
        session.execute(select(Job.id).where(Job.id == job_id).with_for_update())


def _settle_job(session: Session, job_id: str) -> None:
    """Once every task of an active job is terminal, the job is too: failed if any task failed,
    else cancelled if any was cancelled, else succeeded. A finished job is left alone. Call it
    after writing the task, never before (locks: tasks, then the job)."""
    _lock_job(session, job_id)
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
    job's, or the only GPU this service knows) with the job's timing method as succeeded from
    the store. Returns how many; the job is succeeded when that covers every shape."""
    device_key = job.device_key or single_gpu_device_key(session)
    if device_key is None:
        return 0
    answered = 0
    for task in job.tasks:
        best = get_best(session, device_key=device_key, kernel=job.kernel, dtype=job.dtype,
                        shape_key=task.shape_key, kernel_version=job.kernel_version,
                        timing=job.timing)
        if best is None:
            continue
        answered += _changed(session, update(Task).where(Task.id == task.id,
                                                         Task.status == "queued")
                             .values(status="succeeded", device_key=device_key,
                                     timing=best.timing, finished_at=utcnow(),
                                     best_ms=best.p50_ms,
                                     best_config=dict(best.config), error=None,
                                     best_measured=best.measured, best_basis=best.basis,
                                     default_ms=best.default_ms,
                                     noise_margin=best.noise_margin,
                                     best_note="answered from the store (tuned before)"))
    _settle_job(session, job.id)
    _reloaded_job(session, job.id)
    return answered


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


def take_task(session: Session, task_id: int, worker_id: str,
              lease_seconds: float) -> Task | None:
    """Take a task a dispatcher handed to ``worker_id`` (``tuner.dispatch.procrastinate``: the
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
    if task.status == "queued" and job_active:
        if not _lease(session, task_id, worker_id, lease_seconds):
            return None
    elif task.status == "running" and job_active:
        guard = update(Task).where(Task.id == task_id, Task.status == "running",
                                   Task.requeues == task.requeues)
        if task.requeues + 1 >= MAX_REQUEUES:
            if _changed_row(session, Task, task_id, guard.values(
                    status="failed", finished_at=now, requeues=Task.requeues + 1,
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
        Task.id == task_id, Task.lease_owner == worker_id, Task.status == "running")
        .values(lease_expires_at=utcnow() + timedelta(seconds=lease_seconds)))


def release_task(session: Session, task_id: int, worker_id: str, why: str | None = None) -> bool:
    """Give a running task back to the queue: its worker is shutting down cleanly, or (``why``,
    a sentence kept as the task's error until its next claim) could not reach the database.
    The attempt is not counted (the task did nothing wrong; ``why`` counts a requeue) and the
    stored trials stay, so the next worker resumes the search. False when the task is no
    longer this worker's."""
    fault = dict(requeues=Task.requeues + 1, error=why) if why else {}
    return _changed_row(session, Task, task_id, update(Task).where(
        Task.id == task_id, Task.lease_owner == worker_id, Task.status == "running")
        # the claim counted this attempt (attempts >= 1 while leased)
        .values(status="queued", lease_owner=None, lease_expires_at=None,
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
                              .where(Task.status == "running",
                                     Task.lease_expires_at.is_not(None),
                                     Task.lease_expires_at < now).order_by(Task.id)).all()
    changed = 0
    failed: list[tuple[int, str]] = []
    for task in expired:
        guard = update(Task).where(Task.id == task.id, Task.status == "running",
                                   Task.lease_expires_at < now,
                                   Task.requeues == task.requeues)
        released = dict(lease_owner=None, lease_expires_at=None)
        if task.requeues + 1 < MAX_REQUEUES:
            changed += _changed_row(session, Task, task.id, guard.values(
                status="queued", attempts=Task.attempts - 1, requeues=Task.requeues + 1,
                **released))
        elif _changed_row(session, Task, task.id, guard.values(
                status="failed", finished_at=now, requeues=Task.requeues + 1, **released,
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
FINISH_STATUSES = (*TERMINAL, "lost")


def finish_task(session: Session, task_id: int, status: str, error: str | None = None,
                *, worker_id: str | None = None, stop_reason: str | None = None) -> Task:
    """Finish a queued or running task as ``status`` (succeeded, failed or cancelled) with
    ``error`` and why its search stopped (``stop_reason``, kept to 40 characters), and settle
    its job once every task is finished. A task that is already finished (e.g. cancelled while
    it ran) keeps its status. With ``worker_id``, only that lease owner may finish it.
    ``status="lost"`` changes nothing (the lease went to another worker)."""
    if status not in FINISH_STATUSES:
        raise ValueError(f"task status {status!r}: expected one of {', '.join(FINISH_STATUSES)}")
    task = get_task(session, task_id)
    if status == "lost":
        return task
    guard = update(Task).where(Task.id == task_id, Task.status.in_(ACTIVE))
    if worker_id is not None:
        guard = guard.where(Task.lease_owner == worker_id)
    if _changed(session, guard.values(status=status, error=error, finished_at=utcnow(),
                                      lease_owner=None, lease_expires_at=None,
                                      stop_reason=stop_reason[:40] if stop_reason else None)):
        if status == "failed":  # given up for good: what it verified is not thrown away
            keep_best_of_given_up(session, task_id)
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


def _owned(statement: Any, worker_id: str | None) -> Any:
    """A task UPDATE guarded, with ``worker_id``, by the task running under its lease."""
    if worker_id is None:
        return statement
    return statement.where(Task.status == "running", Task.lease_owner == worker_id)


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


# -- trials -----------------------------------------------------------------------------------

def record_trial(session: Session, task_id: int, number: int,
                 measurement: Mapping[str, Any], *, worker_id: str | None = None) -> Trial:
    """Store trial ``number`` (from 1) of a task from ``Measurement.to_dict()``, and update
    the task in one guarded UPDATE (never a read-modify-write: a concurrent writer's counts
    are not lost): trials_done (trials stored), outcome_counts, and best_ms/best_config when
    the outcome is ok and its p50 is faster. With ``worker_id``, only while the task runs
    under that worker's lease, else ``LeaseLost`` and nothing is written. NotFound without a
    task. A repeated number violates the unique constraint."""
    config = dict(measurement["config"])
    outcome, p50_ms = str(measurement["outcome"]), measurement.get("p50_ms")
    values: dict[str, Any] = dict(trials_done=Task.trials_done + 1,
                                  outcome_counts=_counted_outcome(session, outcome))
    if outcome == "ok" and p50_ms is not None:
        faster = or_(Task.best_ms.is_(None), Task.best_ms > p50_ms)
        values.update(best_ms=case((faster, p50_ms), else_=Task.best_ms),
                      best_config=case((faster, literal(config, JSON)), else_=Task.best_config),
                      best_measured=case((faster, "trial"), else_=Task.best_measured))
    if not _changed_row(session, Task, task_id,
                        _owned(update(Task).where(Task.id == task_id), worker_id)
                        .values(**values)):
        if worker_id is not None:
            raise LeaseLost(f"task {task_id} is no longer leased to worker {worker_id}: "
                            f"trial {number} not stored")
        raise NotFound(f"no task {task_id}")
    trial = Trial(task_id=task_id, number=number, config=config, config_key=config_key(config),
                  outcome=outcome, p20_ms=measurement.get("p20_ms"), p50_ms=p50_ms,
                  p80_ms=measurement.get("p80_ms"), error=measurement.get("error"),
                  compile_s=measurement.get("compile_s"),
                  max_error=measurement.get("max_error"),
                  **gpu_state_columns((measurement.get("extra") or {}).get("gpu")))
    session.add(trial)
    session.flush()
    return trial


#: the GPU state a measurement carries (``extra["gpu"]``) -> the trial's column and its type
GPU_STATE_FIELDS: dict[str, type] = {"sm_mhz": int, "mem_mhz": int, "power_w": float,
                                     "temp_c": int, "throttle": int}


def gpu_state_columns(gpu: Any) -> dict[str, Any]:
    """The trial columns of a measurement's GPU state (``extra["gpu"]``): each field present
    as a finite number, else None (no NVML, the interpreter, a field the driver lacks)."""
    columns: dict[str, Any] = dict.fromkeys(GPU_STATE_FIELDS)
    if not isinstance(gpu, Mapping):
        return columns
    for name, kind in GPU_STATE_FIELDS.items():
        value = gpu.get(name)
        if isinstance(value, bool) and name == "throttle":
            value = int(value)
        if isinstance(value, int | float) and not isinstance(value, bool) \
                and math.isfinite(value):
            columns[name] = kind(value)
    return columns


def _counted_outcome(session: Session, outcome: str) -> ColumnElement[Any]:
    """``tasks.outcome_counts`` with one more trial of ``outcome``, as a SQL expression."""
    count = func.coalesce(Task.outcome_counts[outcome].as_integer(), 0) + 1
    if _is_postgres(session):
        added = func.jsonb_build_object(sql_cast(literal(outcome), Text), count)
        return sql_cast(sql_cast(Task.outcome_counts, postgresql.JSONB).op("||")(added), JSON)
    return func.json_set(Task.outcome_counts, f'$."{outcome}"', count)


def has_trial(session: Session, task_id: int, number: int) -> bool:
    """Whether trial ``number`` of the task is stored (a write retried after its commit may
    have landed)."""
    return session.scalar(select(Trial.id).where(Trial.task_id == task_id,
                                                 Trial.number == number)) is not None


def trials_for_task(session: Session, task_id: int) -> list[Trial]:
    """The task's trials by number."""
    return list(session.scalars(select(Trial).where(Trial.task_id == task_id)
                                .order_by(Trial.number)))


# -- best configs -----------------------------------------------------------------------------

def _best_key(device_key: str, kernel: str, kernel_version: str, dtype: str, shape_key: str,
              triton_version: str, timing: str) -> dict[str, str]:
    return dict(device_key=device_key, kernel=kernel, kernel_version=kernel_version,
                dtype=dtype, shape_key=shape_key, triton_version=triton_version,
                timing=check_timing(timing))


def _matching(model: type[Any], values: Mapping[str, Any]) -> list[ColumnElement[bool]]:
    return [getattr(model, name) == value for name, value in values.items()]


@dataclass(frozen=True, slots=True)
class BestTimes:
    """One config's timing as a best config row records it: ``measured`` says which
    measurement it is (``MEASURED``; None: unknown, e.g. an imported file's)."""

    config: Mapping[str, int]
    p20_ms: float
    p50_ms: float
    p80_ms: float
    tflops: float | None = None
    gbps: float | None = None
    measured: str | None = None
    #: against the kernel's default (``BestConfig.basis``; None: not compared), with the
    #: default's and the search's best p50 re-timed beside it and the noise margin used
    basis: str | None = None
    default_ms: float | None = None
    search_ms: float | None = None
    noise_margin: float | None = None


def _best_values(shape: Mapping[str, int], times: BestTimes, torch_version: str | None,
                 cuda_version: str | None, task_id: int | None) -> dict[str, Any]:
    if times.basis is not None and times.basis not in BASES:
        raise ValueError(f"basis {times.basis!r}: expected one of {', '.join(BASES)}")
    return dict(shape=dict(shape), config=dict(times.config), p20_ms=times.p20_ms,
                p50_ms=times.p50_ms, p80_ms=times.p80_ms, tflops=times.tflops, gbps=times.gbps,
                measured=times.measured, basis=times.basis, default_ms=times.default_ms,
                search_ms=times.search_ms, noise_margin=times.noise_margin,
                torch_version=torch_version,
                cuda_version=cuda_version, task_id=task_id, client_state=None,
                updated_at=utcnow())


def write_best(session: Session, *, device_key: str, kernel: str, kernel_version: str,
               dtype: str, shape: Mapping[str, int], triton_version: str, times: BestTimes,
               revision: int | None, torch_version: str | None, cuda_version: str | None,
               task_id: int | None, timing: str = DEFAULT_TIMING) -> tuple[BestConfig, bool]:
    """Write the best config of its key as a compare-and-set on the row's revision, after the
    caller decided from timings taken side by side in one process (the worker re-times the
    stored config beside its finalists): ``revision`` None inserts it only where the key has
    no row; a revision replaces the row only while it is still at that revision (the row whose
    config the caller re-timed), and counts it up. Returns the row as stored now and whether
    this call wrote it; False: another writer changed the key meanwhile and its row stands
    (nothing here was timed against it). Safe when workers store the same key at once. The key
    includes ``timing``, the method the times were taken with (``tuner/timing.py``)."""
    key = _best_key(device_key, kernel, kernel_version, dtype, shape_key(shape), triton_version,
                    timing)
    values = _best_values(shape, times, torch_version, cuda_version, task_id)
    if revision is None:
        written = _insert_ignoring_conflicts(session, BestConfig,
                                             {**key, **values, "revision": 1}, list(key))
    else:
        written = _changed(session, update(BestConfig).where(
            *_matching(BestConfig, key), BestConfig.revision == revision)
            .values(**values, revision=BestConfig.revision + 1))
    return _best_row(session, key), written


def store_best(session: Session, *, device_key: str, kernel: str, kernel_version: str,
               dtype: str, shape: Mapping[str, int], triton_version: str,
               config: Mapping[str, int], p20_ms: float, p50_ms: float, p80_ms: float,
               tflops: float | None, gbps: float | None, torch_version: str | None,
               cuda_version: str | None, task_id: int | None,
               noise_margin: float = 0.0, measured: str | None = None,
               timing: str = DEFAULT_TIMING, replaces_only: str | None = None,
               client_state: Mapping[str, Any] | None = None) -> tuple[BestConfig, bool]:
    """Insert the best config for its key, or replace the stored one only when the new p50 is
    below the stored p50 * (1 - ``noise_margin``) (and, with ``replaces_only``, only while the
    stored one's ``measured`` is that: a client's timings never replace a worker's best, even
    one written since the caller looked). For times that cannot be re-timed side by side
    (``tuner import``: a file carries one time per config): a worker decides by re-timing and
    writes with ``write_best`` instead. Returns the stored row and whether this call wrote it.
    Safe when two workers store the same key at once."""
    key = _best_key(device_key, kernel, kernel_version, dtype, shape_key(shape), triton_version,
                    timing)
    values = {**_best_values(shape, BestTimes(config, p20_ms, p50_ms, p80_ms, tflops, gbps,
                                              measured), torch_version, cuda_version, task_id),
              "client_state": dict(client_state) if client_state is not None else None}
    written = _insert_ignoring_conflicts(session, BestConfig, {**key, **values, "revision": 1},
                                         list(key))
    if not written:
        only = [BestConfig.measured == replaces_only] if replaces_only is not None else []
        written = _changed(session, update(BestConfig).where(
            *_matching(BestConfig, key), BestConfig.p50_ms * (1 - noise_margin) > p50_ms,
            *only).values(**values, revision=BestConfig.revision + 1))
    return _best_row(session, key), written


def _best_row(session: Session, key: Mapping[str, str]) -> BestConfig:
    return session.scalars(select(BestConfig).where(*_matching(BestConfig, key))
                           .execution_options(populate_existing=True)).one()


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
             triton_version: str | None = None,
             timing: str | None = DEFAULT_TIMING) -> BestConfig | None:
    """The stored best for an exact shape on a device timed with ``timing`` (None: any
    method); among several kernel or Triton versions (when not given), the most recently
    updated."""
    query = _best_query(kernel, device_key, dtype).where(BestConfig.shape_key == shape_key)
    if timing is not None:
        query = query.where(BestConfig.timing == timing)
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
    #: the timing method of its times (``tuner/timing.py``)
    timing: str
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


def serving_candidates(session: Session, *, kernel: str, kernel_version: str,
                       dtype: str) -> list[Candidate]:
    """Every stored best of that kernel source version and dtype, on any device. A config of
    another kernel version is never a candidate: it was tuned for other code."""
    rows = session.execute(
        select(BestConfig, Device.kind).outerjoin(Device, Device.key == BestConfig.device_key)
        .where(BestConfig.kernel == kernel, BestConfig.kernel_version == kernel_version,
               BestConfig.dtype == dtype).order_by(BestConfig.id))
    return [Candidate(row, kind, row.device_key, row.shape_key, row.triton_version, row.timing,
                      log_shape(row.shape), row.updated_at.timestamp()) for row, kind in rows]


def all_serving_candidates(session: Session) -> dict[tuple[str, str, str], list[Candidate]]:
    """Every stored best as ``serving_candidates`` gives it, by (kernel, kernel version, dtype),
    in one query (the serving index loads them all at start)."""
    groups: dict[tuple[str, str, str], list[Candidate]] = {}
    rows = session.execute(select(BestConfig, Device.kind).outerjoin(
        Device, Device.key == BestConfig.device_key).order_by(BestConfig.id))
    for row, kind in rows:
        groups.setdefault((row.kernel, row.kernel_version, row.dtype), []).append(Candidate(
            row, kind, row.device_key, row.shape_key, row.triton_version, row.timing,
            log_shape(row.shape), row.updated_at.timestamp()))
    return groups


def serve_best(candidates: Iterable[Candidate], *, shape: Mapping[str, int],
               device_key: str | None, triton_version: str | None,
               timing: str = DEFAULT_TIMING) -> Served | None:
    """The config to serve a caller from ``serving_candidates`` (its kernel version and
    dtype), down the ladder: on the caller's device with its Triton minor version, the exact
    shape (``exact``) else the nearest (``nearest``); on its device with another Triton minor
    (``other-triton``); on another real GPU (``other-device``; the interpreter's and replayed
    results are never served for another device). None: serve the kernel's default. Without
    ``device_key`` only ``other-device`` can match (the caller's GPU is unknown); without
    ``triton_version`` every Triton version counts as the caller's. Only candidates timed with
    ``timing`` count (``serve_timed`` falls back to the other methods)."""
    candidates = [c for c in candidates if c.timing == timing]
    key, logs = shape_key(shape), log_shape(shape)
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
        return log_distance(c.log_shape, logs)

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


#: how good each match is, best first (``serve_timed`` compares answers of two methods)
MATCH_RANK = {"exact": 0, "nearest": 1, "other-triton": 2, "other-device": 3}


def serve_timed(serve: Callable[[str], Served | None], timing: str) -> Served | None:
    """The answer for a caller who asked for configs timed with ``timing``: ``serve(method)``
    is the ladder's answer among the configs timed with ``method`` (``serve_best``). The asked
    method's answer, unless another method's matches better (``MATCH_RANK``: the exact shape on
    the caller's device timed ``eager-flushed`` beats a nearest shape timed ``cuda-graph``);
    among other methods, the default's first. The caller sees the method in the answer."""
    best = serve(timing)
    if best is not None and best.match == "exact":
        return best
    for other in sorted((m for m in TIMING_METHODS if m != timing),
                        key=lambda m: m != DEFAULT_TIMING):
        found = serve(other)
        if found is not None and (best is None
                                  or MATCH_RANK[found.match] < MATCH_RANK[best.match]):
            best = found
    return best


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
                 "kernel-version-mismatch", "no-device", "unknown-device", "read-only",
                 "unregistered")


@dataclass(frozen=True, slots=True)
class MissLimits:
    """How much tuning misses may queue (``Settings.miss_*``)."""

    rate_per_client: int
    cap_per_kernel: int
    trials: int


def report_miss(session: Session, *, device_key: str | None, kernel: str,
                kernel_version: str, registered_version: str | None, dtype: str,
                shape: Mapping[str, int], client: str, limits: MissLimits,
                label: str | None = None, may_queue: bool = True,
                timing: str = DEFAULT_TIMING) -> str:
    """Record one report of a lookup that was not served exactly, and queue a tuning job on the
    caller's device when it should be. Returns what became of it (the API's ``miss``):

    - ``queued``: a job was created now (strategy and backend auto, ``limits.trials`` trials);
    - ``pending``: a job for it is queued or running; ``tuned``: its job succeeded;
    - ``failed``: its job failed or was cancelled less than ``MISS_RETRY_AFTER`` ago (a later
      report queues it again);
    - not queued, only recorded: ``unregistered`` (``registered_version`` None: no kernel of
      that name is registered, its configs are what clients measure),
      ``kernel-version-mismatch`` (``kernel_version`` is not the ``registered_version`` the
      workers would tune), ``no-device`` (no worker to target),
      ``unknown-device`` (no worker ever registered ``device_key``), ``read-only`` (the
      caller may not queue: not ``may_queue``), ``rate-limited`` (``client`` queued
      ``limits.rate_per_client`` misses within ``MISS_RATE_WINDOW``), ``capped`` (the kernel
      has ``limits.cap_per_kernel`` misses whose jobs are queued or running).

    ``client``: who the rate limit counts (an identity the caller cannot choose); ``label``:
    the name shown as the miss's ``last_client`` (default: ``client``). ``timing``: the
    method the lookup asked for, part of the miss's identity; its job tunes with it.

    Commit after each call: the miss row stays write-locked until then, which is what makes
    concurrent reports of one miss queue one job (the rate and cap counts read other rows and
    may be overrun by reports that race)."""
    now = utcnow()
    miss = _counted_miss(session, device_key or "", kernel, kernel_version, dtype, shape,
                         label or client, now, timing)
    unqueueable = _unqueueable(session, device_key, kernel_version, registered_version)
    if unqueueable is not None:
        return _miss_is(session, miss.id, *unqueueable)
    assert device_key  # _unqueueable refuses none
    job = session.get(Job, miss.job_id, populate_existing=True) if miss.job_id else None
    if job is not None and job.status in ACTIVE:
        return "pending"
    if job is not None and job.status == "succeeded":
        return "tuned"
    if job is not None and job.finished_at and now - job.finished_at < MISS_RETRY_AFTER:
        return "failed"
    if not may_queue:
        return _miss_is(session, miss.id, "read-only", "the caller may not queue tuning jobs "
                        "(reporting misses that queue jobs needs an API key with write access)")
    return _queue_miss(session, miss, device_key, client, limits, now)


def _unqueueable(session: Session, device_key: str | None, kernel_version: str,
                 registered_version: str | None) -> tuple[str, str] | None:
    """The status and note of a miss that no job could tune, None for one that could."""
    if registered_version is None:
        return ("unregistered", "no kernel of this name is registered here: it is served from "
                "client measurements only (tuner.install()); register it as a plugin to tune "
                "it on workers")
    if kernel_version != registered_version:
        return ("kernel-version-mismatch", f"the caller's kernel version {kernel_version} is "
                f"not the server's {registered_version}: tuning here would tune other code")
    if not device_key:
        return "no-device", "the caller gave no device: no worker to tune it on"
    if get_device(session, device_key) is None:
        # a made-up device key would queue jobs no worker ever claims, filling the kernel's cap
        return ("unknown-device", f"no worker has registered device {device_key}: misses are "
                "queued only for devices a worker has run on")
    return None


def _counted_miss(session: Session, device_key: str, kernel: str, kernel_version: str,
                  dtype: str, shape: Mapping[str, int], client: str, now: datetime,
                  timing: str = DEFAULT_TIMING) -> Miss:
    """The miss row, inserted or counted once more: this write locks the row until commit."""
    key = dict(device_key=device_key, kernel=kernel, kernel_version=kernel_version,
               dtype=dtype, shape_key=shape_key(shape), timing=check_timing(timing))
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
    # an identical job someone submitted serves the miss as well as a new one would
    job, created = submit_job(
        session, kernel=miss.kernel, kernel_version=miss.kernel_version, dtype=miss.dtype,
        shapes=[miss.shape], budget_trials=limits.trials, budget_seconds=None, strategy="auto",
        backend="auto", device_key=device_key, force=False, seed=0, timing=miss.timing)
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


# -- the dashboard's reads ----------------------------------------------------------------------

#: the trial columns a job page shows, in ``trial_columns``' order (columns, not ORM objects:
#: a job page may hold thousands of trials)
TRIAL_COLUMNS = ("task_id", "number", "config", "outcome", "p20_ms", "p50_ms", "p80_ms", "error",
                 "compile_s", "retimed_p20_ms", "retimed_p50_ms", "retimed_p80_ms", "sm_mhz",
                 "mem_mhz", "power_w", "temp_c", "throttle")


def trial_columns(session: Session, task_ids: Sequence[int]) -> list[dict[str, Any]]:
    """The ``TRIAL_COLUMNS`` of every trial of the given tasks, by task then trial number."""
    if not task_ids:
        return []
    rows = session.execute(select(*(getattr(Trial, c) for c in TRIAL_COLUMNS))
                           .where(Trial.task_id.in_(list(task_ids)))
                           .order_by(Trial.task_id, Trial.number))
    return [dict(zip(TRIAL_COLUMNS, r, strict=True)) for r in rows]


def count_trials(session: Session) -> int:
    """Every trial stored, of every job."""
    return int(session.scalar(select(func.count()).select_from(Trial)) or 0)


def count_best_by_kernel(session: Session) -> dict[str, int]:
    """How many best configs are stored per kernel (every device, dtype and shape)."""
    rows = session.execute(select(BestConfig.kernel, func.count()).group_by(BestConfig.kernel))
    return {kernel: int(count) for kernel, count in rows}


def jobs_for_progress(session: Session, ids: Sequence[str], *, active: bool = False,
                      limit: int = 200) -> list[Job]:
    """The given jobs (those that exist) and, with ``active``, every queued or running job
    (the newest ``limit``), newest first: what a page's live progress follows."""
    jobs: dict[str, Job] = {}
    if ids:
        jobs.update((j.id, j) for j in session.scalars(select(Job).where(Job.id.in_(ids))))
    if active:
        jobs.update((j.id, j) for j in session.scalars(
            select(Job).where(Job.status.in_(ACTIVE)).order_by(Job.created_at.desc())
            .limit(limit)))
    return sorted(jobs.values(), key=lambda j: (j.created_at, j.id), reverse=True)


# -- Triton upgrades ----------------------------------------------------------------------------

#: how the ``reason`` of the jobs ``queue_upgrade_retunes`` queues begins
UPGRADE_REASON = "re-tune after upgrade to Triton"
#: kernel, kernel version, dtype, timing method, shape key
_BestKey = tuple[str, str, str, str, str]


def _minor_of(version: str | None) -> tuple[int, ...] | None:
    """``"3.6.1"`` -> ``(3, 6)``; None for no version, or one that is not numbers."""
    minor = triton_minor(version)
    try:
        return tuple(int(part) for part in minor.split(".")) if minor else None
    except ValueError:
        return None


def queue_upgrade_retunes(session: Session, *, device_key: str, triton_version: str | None,
                          version_of: Callable[[str], str | None], cap_per_kernel: int,
                          trials: int) -> list[Job]:
    """Queue the shapes tuned on ``device_key`` under older Triton minors for re-tuning under
    ``triton_version``, the one a worker just registered the device with (a worker's start:
    ``tuner/service.py``). The old bests stay served meanwhile, labelled ``other-triton``.

    Per kernel with such bests: the shapes of its current version (``version_of(kernel)``;
    None: not installed here, nothing queued) whose bests on the device are all of older
    minors, at most ``cap_per_kernel`` shapes queued or running for this reason at a time
    (the most recently tuned first), none already in a queued or running task of the kernel
    on the device; one job per dtype and timing method on the device (``trials`` trials,
    strategy and backend auto, ``reason`` "re-tune after upgrade to Triton 3.6 (from 3.5)").
    A downgrade queues nothing. Returns the jobs created; commit after."""
    new = _minor_of(triton_version)
    if new is None:
        return []
    rows = session.execute(
        select(BestConfig.kernel, BestConfig.kernel_version, BestConfig.dtype,
               BestConfig.timing, BestConfig.shape_key, BestConfig.shape,
               BestConfig.triton_version, BestConfig.updated_at)
        .where(BestConfig.device_key == device_key)).all()
    tuned: set[_BestKey] = set()  # under the new minor (or a newer one)
    old: dict[_BestKey, Any] = {}  # the newest older-minor best of each
    for row in rows:
        minor = _minor_of(row.triton_version)
        if minor is None:
            continue
        key = (row.kernel, row.kernel_version, row.dtype, row.timing, row.shape_key)
        if minor >= new:
            tuned.add(key)
        elif key not in old or row.updated_at > old[key].updated_at:
            old[key] = row
    if not old:
        return []
    busy: set[_BestKey] = set()
    upgrading: dict[str, int] = {}  # kernel -> its shapes queued or running for this reason
    for job_kernel, job_version, job_dtype, job_timing, task_shape, reason in session.execute(
            select(Job.kernel, Job.kernel_version, Job.dtype, Job.timing, Task.shape_key,
                   Job.reason).join(Task, Task.job_id == Job.id)
            .where(Job.device_key == device_key, Task.status.in_(ACTIVE))):
        busy.add((job_kernel, job_version, job_dtype, job_timing, task_shape))
        if reason and reason.startswith(UPGRADE_REASON):
            upgrading[job_kernel] = upgrading.get(job_kernel, 0) + 1
    created: list[Job] = []
    for kernel in sorted({key[0] for key in old}):
        version = version_of(kernel)
        room = cap_per_kernel - upgrading.get(kernel, 0)
        if version is None or room <= 0:
            continue
        due = sorted((row for key, row in old.items() if key[:2] == (kernel, version)
                      and key not in tuned and key not in busy),
                     key=lambda row: (row.updated_at, row.dtype, row.timing, row.shape_key),
                     reverse=True)[:room]
        for dtype, timing in sorted({(row.dtype, row.timing) for row in due}):
            picked = sorted((row for row in due if (row.dtype, row.timing) == (dtype, timing)),
                            key=lambda row: row.shape_key)
            job, new_job = submit_job(
                session, kernel=kernel, kernel_version=version, dtype=dtype,
                shapes=[dict(row.shape) for row in picked], budget_trials=trials,
                budget_seconds=None, strategy="auto", backend="auto", device_key=device_key,
                force=False, seed=0, timing=timing)
            if new_job:
                since = ", ".join(sorted({str(triton_minor(row.triton_version))
                                          for row in picked}))
                job.reason = f"{UPGRADE_REASON} {triton_minor(triton_version)} (from {since})"
                session.flush()
                created.append(job)
    return created
