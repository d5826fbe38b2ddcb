"""Trials: recording one per search trial (only while the worker holds the task's lease), and
reading them back."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, get_args

from sqlalchemy import JSON, ColumnElement, Text, case, func, literal, or_, select, update
from sqlalchemy import cast as sql_cast
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session

from db.models import Task, Trial
from db.repo._common import LeaseLost, NotFound, _changed_row, _is_postgres
from db.repo.tasks import _owned
from tuner.config import config_key

# -- a trial's fields ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class TrialField:
    """One field of a stored trial (a column of ``Trial`` of the same name)."""

    name: str
    #: its value's type as read back (the API's trial and the job page's row declare it so)
    type: Any
    #: where its value comes from: ``task`` (the task and the trial's number), ``measured``
    #: (the measurement's dict, ``Measurement.to_dict``, under the same name), ``retimed``
    #: (the finalists' side-by-side re-timing, ``record_retimed``) or ``gpu`` (the GPU's state
    #: the measurement carries in ``extra["gpu"]``)
    source: str
    #: whether the API's trial (``TrialPublic``) shows it; the GPU's fields as its ``gpu``
    public: bool = True


#: A trial's fields, in the order the API's trial lists them (the GPU's fields where its
#: ``gpu`` object stands): the one list that the store (``record_trial``, ``trial_columns``),
#: the worker's resumed measurements (``measurement_dict``), the API's trial
#: (``api.schemas.TrialPublic``) and the job page's rows (``api.dashboard_job.TrialRow``) are
#: made from. A new field is a ``Trial`` column and a line here.
TRIAL_FIELDS: tuple[TrialField, ...] = (
    TrialField("task_id", int, "task"),
    TrialField("number", int, "task"),
    TrialField("config", dict[str, int], "measured"),
    TrialField("outcome", str, "measured"),
    TrialField("p20_ms", float | None, "measured"),
    TrialField("p50_ms", float | None, "measured"),
    TrialField("p80_ms", float | None, "measured"),
    TrialField("retimed_p20_ms", float | None, "retimed"),
    TrialField("retimed_p50_ms", float | None, "retimed"),
    TrialField("retimed_p80_ms", float | None, "retimed"),
    TrialField("sm_mhz", int | None, "gpu"),
    TrialField("mem_mhz", int | None, "gpu"),
    TrialField("power_w", float | None, "gpu"),
    TrialField("temp_c", int | None, "gpu"),
    #: NVML's clock throttle reasons bitmask (0: not throttled)
    TrialField("throttle", int | None, "gpu"),
    TrialField("error", str | None, "measured"),
    TrialField("compile_s", float | None, "measured"),
    #: max abs error against the reference (verified runs only)
    TrialField("max_error", float | None, "measured", public=False),
)
#: the fields a measurement gives (``Measurement.to_dict``'s keys but ``extra``)
MEASURED_FIELDS = tuple(f.name for f in TRIAL_FIELDS if f.source == "measured")
#: the GPU state a measurement carries (``extra["gpu"]``) -> the trial's column and its type
GPU_STATE_FIELDS: dict[str, type] = {f.name: get_args(f.type)[0] for f in TRIAL_FIELDS
                                     if f.source == "gpu"}


def measurement_dict(trial: Trial) -> dict[str, Any]:
    """A stored trial as the measurement it recorded (``Measurement.from_dict`` takes it):
    its ``MEASURED_FIELDS``."""
    return {name: getattr(trial, name) for name in MEASURED_FIELDS}


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
    measured = {name: measurement.get(name) for name in MEASURED_FIELDS}
    trial = Trial(task_id=task_id, number=number, config_key=config_key(config),
                  **{**measured, "config": config, "outcome": outcome},
                  **gpu_state_columns((measurement.get("extra") or {}).get("gpu")))
    session.add(trial)
    session.flush()
    return trial


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
