"""The dashboard's reads: trials as plain columns, counts, and the jobs whose progress a page
follows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from db.models import ACTIVE, BestConfig, Job, Trial
from db.repo.trials import TRIAL_FIELDS

# -- the dashboard's reads ----------------------------------------------------------------------

#: the trial columns a job page reads (``TRIAL_FIELDS``), in ``trial_columns``' order
#: (columns, not ORM objects: a job page may hold thousands of trials)
TRIAL_COLUMNS = tuple(f.name for f in TRIAL_FIELDS)


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
