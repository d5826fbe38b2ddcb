"""Jobs over HTTP: real requests through the app, a real SQLite file, a real interpreter worker."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.validation import interpreter_trial_seconds
from db import repo
from db.engine import init_db
from tests.api_support import GPU, INTERPRETER, JOB, SHAPE, config_params, run_worker_once, store
from tuner.app.worker import Worker
from tuner.settings import Settings


def test_a_job_run_by_an_interpreter_worker_serves_its_verified_best(api_client, api_db_url):
    created = api_client.post("/api/v1/jobs", json=JOB)
    assert created.status_code == 202
    body = created.json()
    assert body["status"] == "queued" and body["url"] == f"/api/v1/jobs/{body['id']}"
    run_worker_once(api_db_url)
    job = api_client.get(body["url"]).json()
    assert job["status"] == "succeeded"
    task = job["tasks"][0]
    assert task["trials_done"] == 3 and task["budget_trials"] == 3
    assert task["outcome_counts"].get("ok", 0) >= 1 and task["best_ms"] > 0
    got = api_client.get("/api/v1/configs", params=config_params(SHAPE, INTERPRETER))
    assert got.status_code == 200
    assert got.json()["match"] == "exact" and got.json()["config"] == task["best_config"]


def test_trials_of_a_job_and_of_one_task_are_listed(api_client, api_db_url):
    url = api_client.post("/api/v1/jobs", json=JOB).json()["url"]
    run_worker_once(api_db_url)
    task_id = api_client.get(url).json()["tasks"][0]["id"]
    every = api_client.get(f"{url}/trials").json()
    assert every["count"] == 3 and [t["number"] for t in every["data"]] == [1, 2, 3]
    assert all(t["task_id"] == task_id and t["outcome"] for t in every["data"])
    one = api_client.get(f"{url}/tasks/{task_id}/trials").json()
    assert one["task_id"] == task_id and one["data"] == every["data"]


def test_interpreter_results_are_not_served_without_asking_for_that_device(api_client,
                                                                           api_db_url):
    api_client.post("/api/v1/jobs", json=JOB)
    run_worker_once(api_db_url)
    got = api_client.get("/api/v1/configs", params=config_params(SHAPE))
    assert got.status_code == 404 and got.json()["match"] == "default"


def test_identical_active_job_is_deduplicated(api_client):
    first = api_client.post("/api/v1/jobs", json=JOB).json()
    second = api_client.post("/api/v1/jobs", json=JOB)
    assert second.status_code == 200
    assert second.json()["id"] == first["id"] and second.json()["deduplicated"] is True
    other = api_client.post("/api/v1/jobs", json={**JOB, "budget": {"trials": 4}})
    assert other.status_code == 202 and other.json()["id"] != first["id"]


def test_shapes_already_tuned_for_the_device_are_answered_from_the_store(api_client,
                                                                         api_db_url):
    store(api_db_url, {"M": 64, "N": 64, "K": 64}, 0.01)
    body = {**JOB, "shapes": [{"M": 64, "N": 64, "K": 64}], "device": GPU}
    created = api_client.post("/api/v1/jobs", json=body)
    assert created.status_code == 200
    assert created.json()["answered_from_store"] == 1 and created.json()["status"] == "succeeded"
    task = api_client.get(created.json()["url"]).json()["tasks"][0]
    assert task["status"] == "succeeded" and task["best_ms"] == 0.01
    forced = api_client.post("/api/v1/jobs", json={**body, "force": True})
    assert forced.status_code == 202 and forced.json()["status"] == "queued"


def test_a_job_partly_tuned_queues_only_the_new_shapes(api_client, api_db_url):
    store(api_db_url, {"M": 64, "N": 64, "K": 64}, 0.01)
    body = {**JOB, "shapes": [{"M": 64, "N": 64, "K": 64}, SHAPE], "device": GPU}
    created = api_client.post("/api/v1/jobs", json=body)
    assert created.status_code == 202 and created.json()["answered_from_store"] == 1
    statuses = [t["status"] for t in api_client.get(created.json()["url"]).json()["tasks"]]
    assert statuses == ["succeeded", "queued"]


def test_a_job_without_a_device_is_claimed_by_any_worker(api_client, api_db_url):
    api_client.post("/api/v1/jobs", json=JOB)
    pinned = api_client.post("/api/v1/jobs", json={**JOB, "device": GPU,
                                                   "future_device": True}).json()
    outcome = run_worker_once(api_db_url)
    assert outcome.status == "succeeded" and outcome.device_key == INTERPRETER
    idle = Worker(init_db(api_db_url), backend_kind="interpret", device_key=INTERPRETER)
    assert idle.run_once() is None  # the job pinned to an H200 waits for an H200
    assert api_client.get(pinned["url"]).json()["status"] == "queued"


def test_cancel_stops_a_queued_job(api_client, api_db_url):
    job = api_client.post("/api/v1/jobs", json=JOB).json()
    cancelled = api_client.post(f"{job['url']}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert cancelled.json()["tasks"][0]["status"] == "cancelled"
    worker = Worker(init_db(api_db_url), backend_kind="interpret", device_key=INTERPRETER)
    assert worker.run_once() is None  # nothing left to claim
    again = api_client.post(f"{job['url']}/cancel")
    assert again.status_code == 200 and again.json()["status"] == "cancelled"


def test_jobs_are_listed_newest_first_with_filters_and_paging(api_client):
    ids = [api_client.post("/api/v1/jobs", json={**JOB, "budget": {"trials": 3 + i}}).json()["id"]
           for i in range(3)]
    api_client.post(f"/api/v1/jobs/{ids[0]}/cancel")
    page = api_client.get("/api/v1/jobs", params={"limit": 2}).json()
    assert page["count"] == 3 and [j["id"] for j in page["data"]] == ids[:0:-1]
    rest = api_client.get("/api/v1/jobs", params={"limit": 2, "offset": 2}).json()
    assert [j["id"] for j in rest["data"]] == [ids[0]]
    queued = api_client.get("/api/v1/jobs", params={"status": "queued"}).json()
    assert queued["count"] == 2
    assert api_client.get("/api/v1/jobs", params={"kernel": "other"}).json()["count"] == 0


@pytest.mark.parametrize(("change", "loc"), [
    ({"kernel": "nope"}, ["body", "kernel"]),
    ({"dtype": "int3"}, ["body", "dtype"]),
    ({"shapes": [{"M": 16, "N": 16}]}, ["body", "shapes", 0, "K"]),
    ({"shapes": [SHAPE, {"M": 0, "N": 16, "K": 16}]}, ["body", "shapes", 1, "M"]),
    ({"shapes": [{"M": -3, "N": 16, "K": 16}]}, ["body", "shapes", 0, "M"]),
    ({"shapes": [{"M": 16, "N": 16, "K": 10**6}]}, ["body", "shapes", 0, "K"]),
    ({"shapes": [{"M": 16, "N": "16", "K": 16}]}, ["body", "shapes", 0, "N"]),
    ({"shapes": [{"M": 16, "N": 16, "K": 16, "Z": 1}]}, ["body", "shapes", 0, "Z"]),
    ({"shapes": []}, ["body", "shapes"]),
    ({"colour": "blue"}, ["body", "colour"]),
    ({"budget": {"trials": 0}}, ["body", "budget", "trials"]),
    ({"budget": {"trials": 3, "minutes": 1}}, ["body", "budget", "minutes"]),
    ({"strategy": "magic"}, ["body", "strategy"]),
    ({"seed": 2**70}, ["body", "seed"]),
    ({"dtype": "bfloat16", "backend": "interpret"}, ["body", "dtype"]),
    ({"device": "x" * 300}, ["body", "device"]),
])
def test_bad_jobs_get_422_naming_the_field(api_client, change, loc):
    got = api_client.post("/api/v1/jobs", json={**JOB, **change})
    assert got.status_code == 422
    detail = got.json()["detail"]
    assert any(d["loc"] == loc for d in detail), detail
    assert all(d["msg"] for d in detail)


def test_unknown_job_is_404_in_the_same_error_shape(api_client):
    got = api_client.get("/api/v1/jobs/doesnotexist")
    assert got.status_code == 404 and got.json()["detail"][0]["loc"] == ["path"]
    assert api_client.post("/api/v1/jobs/doesnotexist/cancel").status_code == 404
    assert api_client.get("/api/v1/jobs/doesnotexist/trials").status_code == 404


def test_a_bad_list_filter_is_422_naming_it(api_client):
    got = api_client.get("/api/v1/jobs", params={"status": "sleeping"})
    assert got.status_code == 422 and got.json()["detail"][0]["loc"] == ["query", "status"]


# -- admission: work that cannot succeed here ---------------------------------------------------

@pytest.fixture
def any_client(any_db_url: str) -> Iterator[TestClient]:
    """The app on a fresh SQLite file or PostgreSQL database."""
    with TestClient(create_app(Settings(database_url=any_db_url))) as client:
        yield client


def live_worker(db_url: str, device: str, kind: str, *, minutes_ago: float = 0) -> None:
    """A worker of ``device`` as it registers itself, last seen ``minutes_ago``."""
    with init_db(db_url)() as session:
        repo.upsert_device(session, {"key": device, "kind": kind, "name": device})
        row = repo.register_worker(session, worker_id=f"w-{device}", host="h", pid=1,
                                   device_key=device, kind=kind, gpu_index=None, gpu_uuid=None)
        row.last_seen_at = row.last_seen_at - timedelta(minutes=minutes_ago)
        session.commit()


BF16 = {**JOB, "dtype": "bfloat16"}


def test_bf16_matmul_is_refused_when_only_interpreter_workers_are_live(any_client, any_db_url):
    assert any_client.post("/api/v1/jobs", json=BF16).status_code == 202  # no worker: unknown
    live_worker(any_db_url, INTERPRETER, "interpret")
    refused = any_client.post("/api/v1/jobs", json={**BF16, "budget": {"trials": 4}})
    assert refused.status_code == 422 and refused.json()["detail"][0]["loc"] == ["body", "dtype"]
    assert "interpreter" in refused.json()["detail"][0]["msg"]
    assert any_client.post("/api/v1/jobs", json={**BF16, "device": GPU,
                                                  "future_device": True}).status_code == 202
    live_worker(any_db_url, GPU, "cuda")  # a GPU can run it
    assert any_client.post("/api/v1/jobs", json={**BF16, "budget": {"trials": 4}}).status_code == (
        202)


def test_a_gpu_worker_gone_for_long_no_longer_counts(any_client, any_db_url):
    live_worker(any_db_url, INTERPRETER, "interpret")
    live_worker(any_db_url, GPU, "cuda", minutes_ago=30)
    assert any_client.post("/api/v1/jobs", json=BF16).status_code == 422


def test_a_shape_whose_interpreter_trial_is_too_long_is_refused(any_client, any_db_url):
    huge = {"M": 4096, "N": 4096, "K": 4096}
    pinned = any_client.post("/api/v1/jobs", json={**JOB, "backend": "interpret",
                                                   "shapes": [SHAPE, huge]})
    assert pinned.status_code == 422
    assert pinned.json()["detail"][0]["loc"] == ["body", "shapes", 1]
    assert "interpreter" in pinned.json()["detail"][0]["msg"]
    assert any_client.post("/api/v1/jobs", json={**JOB, "device": INTERPRETER,
                                                 "shapes": [huge]}).status_code == 422
    assert any_client.post("/api/v1/jobs", json={**JOB, "shapes": [huge]}).status_code == 202
    live_worker(any_db_url, INTERPRETER, "interpret")
    assert any_client.post("/api/v1/jobs", json={**JOB, "shapes": [huge], "budget": {
        "trials": 4}}).status_code == 422
    medium = {"M": 1024, "N": 1024, "K": 1024}  # about 10 s a trial: slow but possible
    assert any_client.post("/api/v1/jobs", json={**JOB, "shapes": [medium]}).status_code == 202
    live_worker(any_db_url, GPU, "cuda")
    assert any_client.post("/api/v1/jobs", json={**JOB, "shapes": [huge], "budget": {
        "trials": 5}}).status_code == 202


def test_a_shape_whose_tensors_cannot_fit_the_gpu_is_refused(any_client, any_db_url):
    """Once a GPU's memory is known, a shape whose inputs cannot fit a task's share of it is
    refused at submission (the worker would only fail the task)."""
    too_big = {"M": 40960, "N": 40960, "K": 40960}  # three tensors of 3.1 GiB each
    fits = {"M": 8192, "N": 8192, "K": 8192}
    assert any_client.post("/api/v1/jobs", json={**JOB, "shapes": [too_big]}).status_code == (
        202)  # no GPU known: nothing to refuse by
    live_worker(any_db_url, GPU, "cuda")
    with init_db(any_db_url)() as session:
        repo.upsert_device(session, {"key": GPU, "memory_bytes": 8 * 2**30})
        session.commit()
    refused = any_client.post("/api/v1/jobs", json={**JOB, "shapes": [fits, too_big],
                                                    "budget": {"trials": 3}})
    assert refused.status_code == 422
    assert refused.json()["detail"][0]["loc"] == ["body", "shapes", 1]
    assert "GiB" in refused.json()["detail"][0]["msg"]
    pinned = any_client.post("/api/v1/jobs", json={**JOB, "device": GPU, "shapes": [too_big]})
    assert pinned.status_code == 422
    assert any_client.post("/api/v1/jobs", json={**JOB, "shapes": [fits], "budget": {
        "trials": 3}}).status_code == 202


def test_the_interpreter_estimate_grows_with_the_problem():
    from search_spaces import get_kernel

    matmul = get_kernel("matmul")
    small = interpreter_trial_seconds(matmul, SHAPE, "float16")
    assert 0 < small < 0.01
    assert interpreter_trial_seconds(matmul, {"M": 4096, "N": 4096, "K": 4096},
                                     "float16") > 600 > interpreter_trial_seconds(
        matmul, {"M": 2048, "N": 2048, "K": 2048}, "float16")


def age_job(db_url: str, job_id: str, minutes: float) -> None:
    with init_db(db_url)() as session:
        job = repo.get_job(session, job_id)
        job.created_at = job.created_at - timedelta(minutes=minutes)
        session.commit()


def test_a_job_for_a_device_no_worker_has_says_it_is_waiting(any_client, any_db_url):
    live_worker(any_db_url, INTERPRETER, "interpret")
    made_up = any_client.post("/api/v1/jobs", json={**JOB, "device": "cuda:Made Up:sm00",
                                                    "future_device": True}).json()
    served = any_client.post("/api/v1/jobs", json={**JOB, "device": INTERPRETER}).json()
    assert any_client.get(made_up["url"]).json()["waiting"] is None  # not one lease length yet
    age_job(any_db_url, made_up["id"], 5)
    age_job(any_db_url, served["id"], 5)
    waiting = any_client.get(made_up["url"]).json()["waiting"]
    assert "cuda:Made Up:sm00" in waiting and INTERPRETER in waiting
    assert any_client.get(served["url"]).json()["waiting"] is None  # a live worker has it
    listed = {j["id"]: j["waiting"] for j in any_client.get("/api/v1/jobs").json()["data"]}
    assert listed == {made_up["id"]: waiting, served["id"]: None}
