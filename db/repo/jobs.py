"""Jobs: submitting (one queued or running job per request key), ids and their prefixes,
listing, cancelling, settling a job from its tasks' statuses, and the misses that follow a
job's status."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, cast

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from db.models import ACTIVE, TERMINAL, Job, Miss, Task, utcnow
from db.repo._common import (
    NotFound,
    _changed,
    _changed_row,
    _is_postgres,
    _page,
    _reloaded,
    _write_transaction,
)
from db.repo.bests import get_best
from db.repo.devices import single_gpu_device_key
from tuner.job_spec import JobSpec
from tuner.lifecycle import Status
from tuner.shapes import shape_key
from tuner.timing import DEFAULT_TIMING, check_timing

#: how long a job id is (``uuid4().hex``); ``jobs.id`` holds no longer one
_JOB_ID_LENGTH = 32
#: times ``submit_job`` tries again when the job its insert collided with finished meanwhile
_SUBMIT_ATTEMPTS = 5


# -- jobs -------------------------------------------------------------------------------------

def request_key(*, kernel: str, kernel_version: str, dtype: str,
                shapes: Sequence[Mapping[str, int]], budget_trials: int,
                budget_seconds: float | None, strategy: str, backend: str,
                device_key: str | None, timing: str = DEFAULT_TIMING) -> str:
    """The request key of a submission with these fields (``JobSpec.request_key``: ``seed``
    and ``force`` are not part of it)."""
    return JobSpec(kernel=kernel, kernel_version=kernel_version, dtype=dtype, shapes=shapes,
                   budget_trials=budget_trials, budget_seconds=budget_seconds,
                   strategy=strategy, force=False, seed=0, backend=backend,
                   device_key=device_key, timing=timing).request_key()


def unshared_request_key(request_key: str, job_id: str) -> str:
    """The request key of a job created while an identical one is active (``create_job``):
    unique to the job, so the partial unique index lets both exist and submissions keep
    being deduplicated to the other."""
    return hashlib.sha256(f"{request_key}:{job_id}".encode()).hexdigest()


def _job_spec(spec: JobSpec | None, fields: Mapping[str, Any]) -> JobSpec:
    """``spec``, or the one its fields make (``create_job(session, kernel=..., ...)``)."""
    if spec is None:
        return JobSpec(**fields)
    if fields:
        raise TypeError(f"give a job's spec or its fields, not both ({', '.join(fields)})")
    return spec


def _insert_job(session: Session, key: str, spec: JobSpec, job_id: str | None = None) -> Job:
    """Insert a queued job and its tasks in a SAVEPOINT (IntegrityError when the partial
    unique index already has an active job with ``key``; the transaction goes on)."""
    check_timing(spec.timing)
    job = Job(id=job_id or uuid.uuid4().hex, status=Status.QUEUED, request_key=key,
              **spec.job_columns())
    job.tasks = [Task(shape=dict(s), shape_key=shape_key(s), status=Status.QUEUED,
                      outcome_counts={}) for s in spec.shapes]
    _write_transaction(session)
    with session.begin_nested():
        session.add(job)
    return job


def create_job(session: Session, spec: JobSpec | None = None, **fields: Any) -> Job:
    """A new queued job with one queued task per shape (in the given order), flushed, even
    when an identical job is active (the CLI runs its own; see ``submit_job`` to share one).
    ``spec``, or its fields as keywords (``JobSpec``'s: kernel, kernel_version, dtype, shapes,
    budget_trials, budget_seconds, strategy, force, seed, backend, device_key, timing).
    It gets the submission's request key unless an identical job is active, else
    ``unshared_request_key``: identical submissions are deduplicated to the older job.
    ``timing``: how its configs are timed (``tuner/timing.py``; ValueError for another)."""
    spec = _job_spec(spec, fields)
    key = spec.request_key()
    try:
        return _insert_job(session, key, spec)
    except IntegrityError:
        job_id = uuid.uuid4().hex
        return _insert_job(session, unshared_request_key(key, job_id), spec, job_id=job_id)


def submit_job(session: Session, spec: JobSpec | None = None,
               **fields: Any) -> tuple[Job, bool]:
    """The queued or running job identical to this submission (``spec``, or its fields as
    keywords; ``JobSpec.request_key``) and False, or a new one as ``create_job`` makes it and
    True. Safe when identical submissions race: the database allows one active job per request
    key, the insert runs in a SAVEPOINT, and the loser gets the winner's job (PostgreSQL: once
    the winner commits). Commit soon after."""
    spec = _job_spec(spec, fields)
    key = spec.request_key()
    for attempt in range(_SUBMIT_ATTEMPTS):
        if (existing := find_active_duplicate(session, key)) is not None:
            return existing, False
        try:
            return _insert_job(session, key, spec), True
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
    return _page(session, query, (Job.created_at.desc(), Job.id), limit, offset)


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
                    .values(status=Status.CANCELLED, finished_at=now, lease_owner=None,
                            lease_expires_at=None)
                    .execution_options(synchronize_session=False))
    session.execute(update(Job).where(Job.id == job_id, Job.status.in_(ACTIVE))
                    .values(status=Status.CANCELLED, finished_at=now)
                    .execution_options(synchronize_session=False))
    _follow_job(session, job_id, Status.CANCELLED, None)
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
    if Status.FAILED in statuses:
        status = Status.FAILED
        error = "; ".join(f"{t.shape_key}: {t.error}" for t in tasks if t.error)[:4000] or None
    else:
        status = Status.CANCELLED if Status.CANCELLED in statuses else Status.SUCCEEDED
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
                                                         Task.status == Status.QUEUED)
                             .values(status=Status.SUCCEEDED, device_key=device_key,
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


# -- a job's misses follow its status ---------------------------------------------------------

#: a miss's status while it has a job in each job status
_MISS_STATUS_OF_JOB: dict[str, str] = {Status.QUEUED: "queued", Status.RUNNING: "running",
                                       Status.SUCCEEDED: "tuned", Status.FAILED: "failed",
                                       Status.CANCELLED: "failed"}
#: statuses of a miss whose job is queued or running
_MISS_ACTIVE = ("queued", "running")


def _follow_job(session: Session, job_id: str, job_status: str, error: str | None) -> None:
    """Misses whose job is queued or running take its new status (only forwards)."""
    notes: dict[str, str] = {
        Status.FAILED: f"its job failed: {error}"[:4000] if error else "its job failed",
        Status.CANCELLED: "its job was cancelled"}
    note = notes.get(job_status)
    session.execute(update(Miss).where(Miss.job_id == job_id, Miss.status.in_(_MISS_ACTIVE))
                    .values(status=_MISS_STATUS_OF_JOB[job_status], note=note)
                    .execution_options(synchronize_session=False))
