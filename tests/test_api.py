"""Jobs over HTTP: real requests through the app, a real SQLite file, a real interpreter worker."""

from __future__ import annotations

import pytest

from db.engine import init_db
from tests.api_support import GPU, INTERPRETER, JOB, SHAPE, config_params, run_worker_once, store
from tuner.worker import Worker


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
    pinned = api_client.post("/api/v1/jobs", json={**JOB, "device": GPU}).json()
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
