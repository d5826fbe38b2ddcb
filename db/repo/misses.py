"""Misses: lookups clients reported as not served exactly, and the jobs queued to tune them
(rate limits per client, a cap per kernel, a retry after a failed job)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, func, select, update
from sqlalchemy.orm import Session

from db.models import ACTIVE, Job, Miss, utcnow
from db.repo._common import _changed_row, _insert_ignoring_conflicts, _page
from db.repo.bests import _matching
from db.repo.devices import get_device
from db.repo.jobs import _MISS_STATUS_OF_JOB, submit_job
from tuner.job_spec import JobSpec
from tuner.lifecycle import Status
from tuner.shapes import shape_key
from tuner.timing import DEFAULT_TIMING, check_timing

# -- misses: lookups not served exactly, and the jobs queued to tune them ---------------------

#: a miss whose job failed or was cancelled is queued again when reported after this long
MISS_RETRY_AFTER = timedelta(hours=1)
#: the window of the per-client rate limit on queueing misses
MISS_RATE_WINDOW = timedelta(hours=1)
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
    if job is not None and job.status == Status.SUCCEEDED:
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
    job, created = submit_job(session, JobSpec(
        kernel=miss.kernel, kernel_version=miss.kernel_version, dtype=miss.dtype,
        shapes=[miss.shape], budget_trials=limits.trials, budget_seconds=None, strategy="auto",
        backend="auto", device_key=device_key, force=False, seed=0, timing=miss.timing))
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


def list_misses(session: Session, kernel: str | None = None, status: str | None = None,
                limit: int = 50, offset: int = 0) -> tuple[list[Miss], int]:
    """One page of misses, most recently reported first, and how many match in all."""
    query = select(Miss)
    if kernel:
        query = query.where(Miss.kernel == kernel)
    if status:
        query = query.where(Miss.status == status)
    return _page(session, query, (Miss.last_seen_at.desc(), Miss.id.desc()), limit, offset)


def count_misses_by_status(session: Session) -> dict[str, int]:
    rows = session.execute(select(Miss.status, func.count()).group_by(Miss.status))
    return {status: int(count) for status, count in rows}
