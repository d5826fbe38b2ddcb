"""A trial's fields are declared once (``db.repo.TRIAL_FIELDS``): the store's columns, the
worker's resumed measurements, the API's trial and the job page's rows are made from that list,
so a field added there (and as a ``Trial`` column) reaches every one of them."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from sqlalchemy import inspect

from api.dashboard_job import TrialRow
from api.schemas import GpuStatePublic, TrialPublic, trial_public
from db import repo
from db.engine import init_db
from db.models import Trial
from search_spaces import get_kernel
from tuner.config import KernelConfig
from tuner.measurement import Measurement, Outcome

GPU_STATE = {"sm_mhz": 1755, "mem_mhz": 2619, "power_w": 512.3, "temp_c": 61, "throttle": 4}
#: the trial's columns that are no field of its own: its row id, the config's key, when stored
NOT_FIELDS = {"id", "config_key", "created_at"}


def test_every_trial_column_is_a_declared_field_and_every_field_a_column():
    columns = {c.key for c in inspect(Trial).columns}
    assert {f.name for f in repo.TRIAL_FIELDS} == columns - NOT_FIELDS


def test_the_measured_fields_are_the_measurement_s_own():
    assert set(repo.MEASURED_FIELDS) == {f.name for f in dataclasses.fields(Measurement)} - {
        "extra"}


def test_the_field_list_drives_the_api_s_trial_and_its_gpu_state():
    public = [f.name for f in repo.TRIAL_FIELDS if f.public and f.source != "gpu"]
    gpu_at = next(i for i, f in enumerate(repo.TRIAL_FIELDS) if f.source == "gpu")
    expected = public[:gpu_at] + ["gpu"] + public[gpu_at:]
    assert list(TrialPublic.model_fields) == expected
    assert "max_error" not in TrialPublic.model_fields  # a field the API keeps to itself
    assert list(GpuStatePublic.model_fields) == [*repo.GPU_STATE_FIELDS, "throttle_reasons"]
    required = {name for name, f in TrialPublic.model_fields.items() if f.is_required()}
    assert required == {f.name for f in repo.TRIAL_FIELDS
                        if f.public and f.source in ("task", "measured")}


def test_the_field_list_drives_the_job_page_s_row():
    assert ("task_id", *TrialRow.__slots__) == repo.TRIAL_COLUMNS
    row = TrialRow(**{name: None for name in TrialRow.__slots__})
    assert row.max_error is None and row.ms is None and row.gpu_text == "-"
    with pytest.raises(TypeError, match="missing"):
        TrialRow(number=1)
    with pytest.raises(TypeError, match="unknown"):
        TrialRow(**{name: None for name in TrialRow.__slots__}, colour="red")
    with pytest.raises(AttributeError):
        _ = row.colour  # type: ignore[attr-defined]


def _task(session: Any) -> int:
    job = repo.create_job(session, kernel="matmul", kernel_version=get_kernel("matmul").version,
                          dtype="float16", shapes=[{"M": 64, "N": 64, "K": 64}],
                          budget_trials=4, budget_seconds=None, strategy="auto", force=True,
                          seed=0, backend="replay", device_key=None)
    task_id = int(job.tasks[0].id)
    repo.start_task_locally(session, task_id, worker_id="cli")
    return task_id


def test_a_measurement_goes_through_the_store_and_comes_back_the_same(any_db_url: str):
    measured = Measurement(KernelConfig({"BLOCK_M": 64, "num_warps": 4}), Outcome.OK,
                           p20_ms=0.19, p50_ms=0.2, p80_ms=0.21, compile_s=1.5, max_error=0.003,
                           extra={"gpu": GPU_STATE})
    failed = Measurement.failure(KernelConfig({"BLOCK_M": 32}), Outcome.COMPILE_ERROR, "boom")
    assert Measurement.from_dict(measured.to_dict()) == measured
    factory = init_db(any_db_url)
    with factory() as s:
        task_id = _task(s)
        repo.record_trial(s, task_id, 1, measured.to_dict())
        repo.record_trial(s, task_id, 2, failed.to_dict())
        s.commit()
    with factory() as s:
        first, second = repo.trials_for_task(s, task_id)
        columns = repo.trial_columns(s, [task_id])
    # what a resumed task's search is told: the measurement, without its GPU state
    assert Measurement.from_dict(repo.measurement_dict(first)) == dataclasses.replace(
        measured, extra={})
    assert Measurement.from_dict(repo.measurement_dict(second)) == failed
    assert trial_public(first).model_dump() == {
        "task_id": task_id, "number": 1, "config": {"BLOCK_M": 64, "num_warps": 4},
        "outcome": "ok", "p20_ms": 0.19, "p50_ms": 0.2, "p80_ms": 0.21,
        "retimed_p20_ms": None, "retimed_p50_ms": None, "retimed_p80_ms": None,
        "gpu": {**GPU_STATE, "throttle_reasons": ["sw_power_cap"]},
        "error": None, "compile_s": 1.5}
    assert trial_public(second).model_dump()["gpu"] is None
    row = TrialRow(**{k: v for k, v in columns[0].items() if k != "task_id"})
    assert (row.max_error, row.sm_mhz, row.measured) == (0.003, 1755, "trial")
