"""Repository functions: every query the service makes, in one place.

Functions take a ``Session`` and leave committing to the caller unless they say otherwise. Task
claiming is safe with many workers: PostgreSQL uses ``SELECT ... FOR UPDATE SKIP LOCKED``; SQLite
(one writer at a time) claims with a compare-and-set UPDATE that only succeeds while the task is
still queued.
"""

from __future__ import annotations

import hashlib
import json
import math
import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, or_, select, update
from sqlalchemy.orm import Session

from db.models import BestConfig, Device, Job, Task, Trial, utcnow
from tuner.shapes import shape_key

TERMINAL = ("succeeded", "failed", "cancelled")
ACTIVE = ("queued", "running")


class NotFound(LookupError):
    """No row with that id."""


# -- devices ----------------------------------------------------------------------------------

_DEVICE_FIELDS = ("kind", "name", "compute_capability", "sm_count", "memory_bytes",
                  "smem_per_block", "triton_version", "torch_version", "cuda_version",
                  "driver_version")


def upsert_device(session: Session, fingerprint: Mapping[str, Any]) -> Device:
    """The device row for ``fingerprint["key"]``, created or refreshed."""
    device = session.scalar(select(Device).where(Device.key == fingerprint["key"]))
    if device is None:
        device = Device(key=fingerprint["key"])
        session.add(device)
    for name in _DEVICE_FIELDS:
        if name in fingerprint:
            setattr(device, name, fingerprint[name])
    device.last_seen_at = utcnow()
    session.flush()
    return device


def list_devices(session: Session) -> list[Device]:
    return list(session.scalars(select(Device).order_by(Device.key)))


def set_calibration(session: Session, device_key: str, copy_gbps: float | None,
                    matmul_tflops: float | None) -> None:
    device = session.scalar(select(Device).where(Device.key == device_key))
    if device is None:
        raise NotFound(f"no device {device_key!r}")
    device.copy_gbps, device.matmul_tflops = copy_gbps, matmul_tflops
    device.calibrated_at = utcnow()


# -- jobs -------------------------------------------------------------------------------------

def request_key(*, kernel: str, kernel_version: str, dtype: str,
                shapes: Sequence[Mapping[str, int]], budget_trials: int,
                budget_seconds: float | None, strategy: str, backend: str,
                device_key: str | None) -> str:
    payload = json.dumps([kernel, kernel_version, dtype, sorted(shape_key(s) for s in shapes),
                          budget_trials, budget_seconds, strategy, backend, device_key])
    return hashlib.sha256(payload.encode()).hexdigest()


def create_job(session: Session, *, kernel: str, kernel_version: str, dtype: str,
               shapes: Sequence[Mapping[str, int]], budget_trials: int,
               budget_seconds: float | None, strategy: str, force: bool, seed: int,
               backend: str, device_key: str | None) -> Job:
    """A queued job with one queued task per shape."""
    job = Job(id=uuid.uuid4().hex, kernel=kernel, kernel_version=kernel_version, dtype=dtype,
              status="queued", device_key=device_key, backend=backend, strategy=strategy,
              budget_trials=budget_trials, budget_seconds=budget_seconds, force=force, seed=seed,
              request_key=request_key(kernel=kernel, kernel_version=kernel_version, dtype=dtype,
                                      shapes=shapes, budget_trials=budget_trials,
                                      budget_seconds=budget_seconds, strategy=strategy,
                                      backend=backend, device_key=device_key))
    job.tasks = [Task(shape=dict(s), shape_key=shape_key(s), status="queued",
                      outcome_counts={}) for s in shapes]
    session.add(job)
    session.flush()
    return job


def find_active_duplicate(session: Session, key: str) -> Job | None:
    return session.scalar(select(Job).where(Job.request_key == key, Job.status.in_(ACTIVE))
                          .order_by(Job.created_at).limit(1))


def get_job(session: Session, job_id: str) -> Job:
    job = session.get(Job, job_id)
    if job is None:
        raise NotFound(f"no job {job_id!r}")
    return job


def list_jobs(session: Session, status: str | None = None, kernel: str | None = None,
              limit: int = 50, offset: int = 0) -> tuple[list[Job], int]:
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
    """Cancel a job's unfinished tasks; a running task stops at its next check."""
    job = get_job(session, job_id)
    now = utcnow()
    for task in job.tasks:
        if task.status in ACTIVE:
            task.status, task.finished_at, task.lease_owner = "cancelled", now, None
    if job.status in ACTIVE:
        job.status, job.finished_at = "cancelled", now
    session.flush()
    return job


# -- tasks ------------------------------------------------------------------------------------

def get_task(session: Session, task_id: int) -> Task:
    task = session.get(Task, task_id)
    if task is None:
        raise NotFound(f"no task {task_id}")
    return task


def claim_task(session: Session, *, worker_id: str, device_key: str,
               lease_seconds: float) -> Task | None:
    """The oldest queued task this device may run, now leased to ``worker_id``; None if none."""
    query = (select(Task.id).join(Job).where(
        Task.status == "queued", Job.status.in_(ACTIVE),
        or_(Job.device_key.is_(None), Job.device_key == device_key))
        .order_by(Job.created_at, Task.id).limit(8))
    postgres = session.get_bind().dialect.name == "postgresql"
    if postgres:
        query = query.with_for_update(skip_locked=True, of=Task)
    for task_id in list(session.scalars(query)):
        if _lease(session, task_id, worker_id, lease_seconds):
            task = get_task(session, task_id)
            session.refresh(task)
            _mark_job_running(task.job)
            return task
    return None


def _lease(session: Session, task_id: int, worker_id: str, lease_seconds: float) -> bool:
    now = utcnow()
    result = session.execute(
        update(Task).where(Task.id == task_id, Task.status == "queued")
        .values(status="running", attempts=Task.attempts + 1, lease_owner=worker_id,
                lease_expires_at=now + timedelta(seconds=lease_seconds), started_at=now,
                updated_at=now)
        .execution_options(synchronize_session=False))
    return bool(getattr(result, "rowcount", 0) == 1)


def _mark_job_running(job: Job) -> None:
    if job.status == "queued":
        job.status, job.started_at = "running", utcnow()


def start_task_locally(session: Session, task_id: int, worker_id: str) -> Task:
    """Mark a task running for an in-process run (the CLI), without a lease to renew."""
    task = get_task(session, task_id)
    task.status, task.lease_owner, task.attempts = "running", worker_id, task.attempts + 1
    task.started_at = utcnow()
    _mark_job_running(task.job)
    session.flush()
    return task


def set_task_device(session: Session, task_id: int, device_key: str) -> None:
    get_task(session, task_id).device_key = device_key


def renew_lease(session: Session, task_id: int, worker_id: str, lease_seconds: float) -> bool:
    """Extend the lease; False when the task is no longer this worker's (reaped, cancelled)."""
    result = session.execute(
        update(Task).where(Task.id == task_id, Task.lease_owner == worker_id,
                           Task.status == "running")
        .values(lease_expires_at=utcnow() + timedelta(seconds=lease_seconds))
        .execution_options(synchronize_session=False))
    return bool(getattr(result, "rowcount", 0) == 1)


def reap_expired(session: Session, now: datetime | None = None) -> int:
    """Re-queue running tasks whose lease expired (their worker died), up to their attempt
    limit; fail those that used every attempt. Returns how many tasks it touched."""
    now = now or utcnow()
    expired = list(session.scalars(select(Task).where(
        Task.status == "running", Task.lease_expires_at.is_not(None),
        Task.lease_expires_at < now).with_for_update(skip_locked=True)))
    for task in expired:
        task.lease_owner, task.lease_expires_at = None, None
        if task.attempts < task.max_attempts:
            task.status = "queued"
        else:
            task.status, task.finished_at = "failed", now
            task.error = f"the worker's lease expired {task.attempts} times; giving up"
            _settle_job(session, task.job)
    session.flush()
    return len(expired)


def finish_task(session: Session, task_id: int, status: str, error: str | None = None) -> Task:
    task = get_task(session, task_id)
    if task.status == "cancelled" and status != "cancelled":
        status = "cancelled"  # cancelled while it ran: keep the user's decision
    if status == "lost":  # another worker has it now (its lease expired): leave it alone
        return task
    task.status, task.error, task.finished_at = status, error, utcnow()
    task.lease_owner, task.lease_expires_at = None, None
    _settle_job(session, task.job)
    session.flush()
    return task


def _settle_job(session: Session, job: Job) -> None:
    statuses = {t.status for t in job.tasks}
    if not statuses <= set(TERMINAL):
        return
    if "failed" in statuses:
        job.status = "failed"
        job.error = "; ".join(f"{t.shape_key}: {t.error}" for t in job.tasks if t.error)[:4000]
    elif "cancelled" in statuses:
        job.status = "cancelled"
    else:
        job.status = "succeeded"
    job.finished_at = job.finished_at or utcnow()


# -- trials -----------------------------------------------------------------------------------

def record_trial(session: Session, task_id: int, number: int,
                 measurement: Mapping[str, Any]) -> Trial:
    """Store one trial and update the task's progress, outcome counts and best so far."""
    config = dict(measurement["config"])
    trial = Trial(task_id=task_id, number=number, config=config,
                  config_key=",".join(f"{k}={config[k]}" for k in sorted(config)),
                  outcome=str(measurement["outcome"]), p20_ms=measurement.get("p20_ms"),
                  p50_ms=measurement.get("p50_ms"), p80_ms=measurement.get("p80_ms"),
                  error=measurement.get("error"), compile_s=measurement.get("compile_s"),
                  max_error=measurement.get("max_error"))
    session.add(trial)
    task = get_task(session, task_id)
    task.trials_done = max(task.trials_done, number)
    counts = dict(task.outcome_counts or {})
    counts[trial.outcome] = counts.get(trial.outcome, 0) + 1
    task.outcome_counts = counts
    if trial.outcome == "ok" and trial.p50_ms is not None and (
            task.best_ms is None or trial.p50_ms < task.best_ms):
        task.best_ms, task.best_config = trial.p50_ms, config
    session.flush()
    return trial


def trials_for_task(session: Session, task_id: int) -> list[Trial]:
    return list(session.scalars(select(Trial).where(Trial.task_id == task_id)
                                .order_by(Trial.number)))


# -- best configs -----------------------------------------------------------------------------

def store_best(session: Session, *, device_key: str, kernel: str, kernel_version: str,
               dtype: str, shape: Mapping[str, int], triton_version: str,
               config: Mapping[str, int], p20_ms: float, p50_ms: float, p80_ms: float,
               tflops: float | None, gbps: float | None, torch_version: str | None,
               cuda_version: str | None, task_id: int | None,
               noise_margin: float = 0.0) -> tuple[BestConfig, bool]:
    """Insert the best config for its key, or replace the stored one only when the new one is
    faster beyond ``noise_margin`` (relative). Returns the row and whether it was written."""
    key = shape_key(shape)
    row = session.scalar(select(BestConfig).where(
        BestConfig.device_key == device_key, BestConfig.kernel == kernel,
        BestConfig.kernel_version == kernel_version, BestConfig.dtype == dtype,
        BestConfig.shape_key == key, BestConfig.triton_version == triton_version))
    if row is not None and not p50_ms < row.p50_ms * (1 - noise_margin):
        return row, False
    if row is None:
        row = BestConfig(device_key=device_key, kernel=kernel, kernel_version=kernel_version,
                         dtype=dtype, shape_key=key, triton_version=triton_version)
        session.add(row)
    row.shape, row.config = dict(shape), dict(config)
    row.p20_ms, row.p50_ms, row.p80_ms, row.tflops, row.gbps = p20_ms, p50_ms, p80_ms, tflops, gbps
    row.torch_version, row.cuda_version, row.task_id = torch_version, cuda_version, task_id
    row.updated_at = utcnow()
    session.flush()
    return row, True


def _best_query(kernel: str | None = None, device_key: str | None = None,
                dtype: str | None = None) -> Any:
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
    """The stored best for an exact key (newest when versions are not given)."""
    query = _best_query(kernel, device_key, dtype).where(BestConfig.shape_key == shape_key)
    if kernel_version:
        query = query.where(BestConfig.kernel_version == kernel_version)
    if triton_version:
        query = query.where(BestConfig.triton_version == triton_version)
    return session.scalar(query.order_by(BestConfig.updated_at.desc()).limit(1))


def list_best(session: Session, kernel: str | None = None, device_key: str | None = None,
              dtype: str | None = None) -> list[BestConfig]:
    query = _best_query(kernel, device_key, dtype)
    order = (BestConfig.kernel, BestConfig.dtype, BestConfig.device_key, BestConfig.shape_key)
    return list(session.scalars(query.order_by(*order)))


def shape_distance(a: Mapping[str, int], b: Mapping[str, int]) -> float:
    """Euclidean distance over log2 of each dimension (so 2x in any dimension counts 1)."""
    return math.sqrt(sum((math.log2(max(1, a.get(k, 1))) - math.log2(max(1, v))) ** 2
                         for k, v in b.items()))


def nearest_best(session: Session, *, device_key: str, kernel: str, dtype: str,
                 shape: Mapping[str, int], kernel_version: str | None = None
                 ) -> tuple[BestConfig, float] | None:
    rows = list_best(session, kernel=kernel, device_key=device_key, dtype=dtype)
    if kernel_version:
        rows = [r for r in rows if r.kernel_version == kernel_version]
    if not rows:
        return None
    best = min(rows, key=lambda r: (shape_distance(r.shape, shape), -r.updated_at.timestamp()))
    return best, shape_distance(best.shape, shape)


def shape_key_of(shape: Mapping[str, int]) -> str:
    return shape_key(shape)


def single_gpu_device_key(session: Session) -> str | None:
    """The one real GPU device this service knows, when there is exactly one."""
    keys = list(session.scalars(select(Device.key).where(Device.kind == "cuda")))
    return keys[0] if len(keys) == 1 else None


def answer_tuned_tasks(session: Session, job: Job) -> int:
    """Mark the job's tasks whose shape is already tuned on the target device (the job's, or
    the only GPU this service knows) as succeeded from the store. Returns how many."""
    device_key = job.device_key or single_gpu_device_key(session)
    if device_key is None:
        return 0
    answered = 0
    for task in job.tasks:
        best = get_best(session, device_key=device_key, kernel=job.kernel, dtype=job.dtype,
                        shape_key=task.shape_key, kernel_version=job.kernel_version)
        if best is None:
            continue
        task.status, task.device_key, task.finished_at = "succeeded", device_key, utcnow()
        task.best_ms, task.best_config = best.p50_ms, dict(best.config)
        task.error = None
        answered += 1
    _settle_job(session, job)
    session.flush()
    return answered


def set_task_best(session: Session, task_id: int, ms: float, config: Mapping[str, int]) -> None:
    """The task's final best, after the finalists were re-timed side by side."""
    task = get_task(session, task_id)
    task.best_ms, task.best_config = ms, dict(config)


# -- service additions (issue 3: worker presence, graceful stop, health) ----------------------
# Added by the service work; kept in one block so the owner of db/ can fold them in.

def _as_utc(moment: datetime) -> datetime:
    """SQLite hands back naive datetimes for timezone-aware columns; they are UTC."""
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=utcnow().tzinfo)


def touch_device(session: Session, device_key: str) -> bool:
    """Mark a device as seen now (a worker's presence beat); False if there is no such row."""
    result = session.execute(update(Device).where(Device.key == device_key)
                             .values(last_seen_at=utcnow())
                             .execution_options(synchronize_session=False))
    return bool(getattr(result, "rowcount", 0) == 1)


def release_task(session: Session, task_id: int, worker_id: str) -> bool:
    """Give a running task back to the queue because its worker is shutting down cleanly. The
    attempt is not counted (nothing went wrong) and the stored trials stay, so the next worker
    resumes the search. False when the task is no longer this worker's."""
    result = session.execute(
        update(Task).where(Task.id == task_id, Task.lease_owner == worker_id,
                           Task.status == "running")
        # a claim counted this attempt (attempts >= 1 while running under a lease)
        .values(status="queued", lease_owner=None, lease_expires_at=None,
                attempts=Task.attempts - 1, updated_at=utcnow())
        .execution_options(synchronize_session=False))
    return bool(getattr(result, "rowcount", 0) == 1)


def running_tasks(session: Session) -> list[Task]:
    """Tasks a worker holds now, oldest lease first (the health report shows their owners)."""
    return list(session.scalars(select(Task).where(Task.status == "running")
                                .order_by(Task.lease_expires_at, Task.id)))


def count_tasks_by_status(session: Session) -> dict[str, int]:
    rows = session.execute(select(Task.status, func.count()).group_by(Task.status))
    return {status: int(count) for status, count in rows}


def seconds_since(moment: datetime | None, now: datetime | None = None) -> float | None:
    """Seconds from ``moment`` to ``now`` (None stays None), whatever the backend's tz."""
    if moment is None:
        return None
    return ((now or utcnow()) - _as_utc(moment)).total_seconds()
