"""Triton upgrades: queueing re-tunes of the stored bests tuned under an older Triton minor
version."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from db.models import ACTIVE, BestConfig, Job, Task
from db.repo.jobs import submit_job
from tuner.identity import triton_minor
from tuner.job_spec import JobSpec

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
    ``tuner/app/service.py``). The old bests stay served meanwhile, labelled ``other-triton``.

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
            job, new_job = submit_job(session, JobSpec(
                kernel=kernel, kernel_version=version, dtype=dtype,
                shapes=[dict(row.shape) for row in picked], budget_trials=trials,
                budget_seconds=None, strategy="auto", backend="auto", device_key=device_key,
                force=False, seed=0, timing=timing))
            if new_job:
                since = ", ".join(sorted({str(triton_minor(row.triton_version))
                                          for row in picked}))
                job.reason = f"{UPGRADE_REASON} {triton_minor(triton_version)} (from {since})"
                session.flush()
                created.append(job)
    return created
