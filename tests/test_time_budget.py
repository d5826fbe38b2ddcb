"""A task's wall time is bounded by its time budget (issue 32, item 5): a config that hangs is
stopped once the budget is spent, not after its own run timeout; an interpreter task without a
budget gets one from the admission estimate; a budget shorter than one trial is refused."""

from __future__ import annotations

import time

import pytest

from db import repo
from db.engine import init_db
from search_spaces import get_kernel
from tests.api_support import queue_task
from tuner.interpreter_estimate import (
    INTERPRETER_MIN_TRIAL_S,
    interpreter_time_budget_s,
    interpreter_trial_seconds,
)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("budget_s", [6.0, None], ids=["job budget", "interpreter default"])
def test_a_hanging_config_is_stopped_at_the_time_budget(any_db_url, monkeypatch, budget_s):
    from tests.fakes.faulty import HANGS
    from tuner import interpreter_estimate
    from tuner.app import worker
    from tuner.backends import TimingOptions

    factory = init_db(any_db_url)
    task_id = queue_task(factory, {"N": 64}, 6, kernel=HANGS.name, version=HANGS.version,
                         dtype="float32", strategy="exhaustive", force=True, started_by="cli")
    with factory() as session:
        repo.get_task(session, task_id).job.budget_seconds = budget_s
        session.commit()
    monkeypatch.setattr(worker, "get_kernel", lambda name: HANGS)
    # without a budget: 6 trials of at least 1 s each (the estimate of N=64 is ~0)
    monkeypatch.setattr(interpreter_estimate, "INTERPRETER_MIN_TRIAL_S", 1.0)
    started = time.monotonic()
    # each hanging config would hold the worker for its run timeout: 120 s
    outcome = worker.execute_task(factory, task_id, backend_kind="interpret", worker_id="cli",
                                  timing=TimingOptions(run_timeout_s=120, start_timeout_s=120))
    took = time.monotonic() - started
    assert took < 60, f"the task took {took:.0f} s past its 6 s budget"
    assert outcome.status == "succeeded", outcome.error
    with factory() as session:
        task = repo.get_task(session, task_id)
        assert task.status == "succeeded"
        assert task.best_config is not None and task.best_config["MODE"] == 0
        outcomes = [t.outcome for t in repo.trials_for_task(session, task_id)]
    assert outcomes[:3] == ["ok"] * 3 and len(outcomes) <= 4


def test_the_default_interpreter_budget_bounds_the_softmax_job_that_took_12_minutes():
    softmax = get_kernel("softmax")
    shape = {"M": 256, "N": 4096}
    budget = interpreter_time_budget_s(softmax, shape, "float16", 48)
    # minutes, not the 12 it once held the worker for (three configs hanging 60 s each), and
    # more than the admission's lower bound of its trials
    assert 48 * interpreter_trial_seconds(softmax, shape, "float16") < budget < 600
    assert budget >= 48 * INTERPRETER_MIN_TRIAL_S


def test_an_interpreter_job_whose_budget_is_shorter_than_one_trial_is_refused(api_client):
    from tests.api_support import JOB

    medium = {"M": 1024, "N": 1024, "K": 1024}  # at least ~10 s a trial on the interpreter
    short = api_client.post("/api/v1/jobs", json={**JOB, "backend": "interpret",
                                                  "shapes": [medium],
                                                  "budget": {"trials": 4, "seconds": 5}})
    assert short.status_code == 422
    assert short.json()["detail"][0]["loc"] == ["body", "budget", "seconds"]
    assert "budget.seconds 5" in short.json()["detail"][0]["msg"]
    assert api_client.post("/api/v1/jobs", json={**JOB, "backend": "interpret",
                                                 "shapes": [medium], "budget": {
                                                     "trials": 4, "seconds": 60}}
                           ).status_code == 202
