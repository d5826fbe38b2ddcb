"""Trials: recording one per search trial (only while the worker holds the task's lease), and
reading them back."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from sqlalchemy import JSON, ColumnElement, Text, case, func, literal, or_, select, update
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session

from db.models import Task, Trial
from db.repo._common import LeaseLost, NotFound, _changed_row, _is_postgres
from db.repo.tasks import _owned
from tuner.config import config_key

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
