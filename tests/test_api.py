"""The HTTP API through real requests on the app, a real SQLite file and a real worker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from db import repo
from db.engine import init_db
from tuner.settings import Settings
from tuner.worker import Worker

JOB = {"kernel": "matmul", "dtype": "float16", "shapes": [{"M": 16, "N": 16, "K": 16}],
       "budget": {"trials": 3}}


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'api.db'}"


@pytest.fixture
def client(db_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(Settings(database_url=db_url))) as c:
        yield c


def run_worker_once(db_url: str) -> None:
    worker = Worker(init_db(db_url), backend_kind="interpret", device_key="interpret:cpu")
    assert worker.run_once() is not None


def store(db_url: str, shape: dict[str, int], ms: float, device: str = "cuda:NVIDIA H200:sm90",
          config: dict[str, int] | None = None) -> None:
    from search_spaces import get_kernel

    k = get_kernel("matmul")
    with init_db(db_url)() as session:
        repo.upsert_device(session, {"key": device, "kind": "cuda", "name": "NVIDIA H200"})
        repo.store_best(session, device_key=device, kernel="matmul", kernel_version=k.version,
                        dtype="float16", shape=shape, triton_version="3.6.0",
                        config=config or {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64,
                                          "GROUP_M": 8, "num_warps": 8, "num_stages": 3},
                        p20_ms=ms, p50_ms=ms, p80_ms=ms, tflops=1.0, gbps=1.0,
                        torch_version=None, cuda_version=None, task_id=None)
        session.commit()


def test_a_job_run_by_an_interpreter_worker_serves_its_verified_best(client, db_url):
    created = client.post("/api/v1/jobs", json=JOB)
    assert created.status_code == 202
    body = created.json()
    assert body["status"] == "queued" and body["url"] == f"/api/v1/jobs/{body['id']}"
    run_worker_once(db_url)
    job = client.get(body["url"]).json()
    assert job["status"] == "succeeded"
    task = job["tasks"][0]
    assert task["trials_done"] == 3 and task["outcome_counts"].get("ok", 0) >= 1
    got = client.get("/api/v1/configs", params={"kernel": "matmul", "dtype": "float16",
                                                "device": "interpret:cpu", "M": 16, "N": 16,
                                                "K": 16})
    assert got.status_code == 200
    assert got.json()["match"] == "exact" and got.json()["config"] == task["best_config"]
    trials = client.get(f"{body['url']}/tasks/{task['id']}/trials").json()
    assert trials["count"] == 3 and all("outcome" in t for t in trials["data"])


def test_interpreter_results_are_not_served_without_asking_for_that_device(client, db_url):
    client.post("/api/v1/jobs", json=JOB)
    run_worker_once(db_url)
    got = client.get("/api/v1/configs", params={"kernel": "matmul", "dtype": "float16",
                                                "M": 16, "N": 16, "K": 16})
    assert got.status_code == 404 and got.json()["match"] == "default"


def test_identical_active_job_is_deduplicated(client):
    first = client.post("/api/v1/jobs", json=JOB).json()
    second = client.post("/api/v1/jobs", json=JOB)
    assert second.status_code == 200
    assert second.json()["id"] == first["id"] and second.json()["deduplicated"] is True


def test_shapes_already_tuned_for_the_device_are_answered_from_the_store(client, db_url):
    store(db_url, {"M": 64, "N": 64, "K": 64}, 0.01)
    body = {**JOB, "shapes": [{"M": 64, "N": 64, "K": 64}], "device": "cuda:NVIDIA H200:sm90"}
    created = client.post("/api/v1/jobs", json=body).json()
    assert created["answered_from_store"] == 1 and created["status"] == "succeeded"
    forced = client.post("/api/v1/jobs", json={**body, "force": True}).json()
    assert forced["status"] == "queued" and forced["answered_from_store"] == 0


def test_cancel_stops_a_queued_job(client, db_url):
    job = client.post("/api/v1/jobs", json=JOB).json()
    cancelled = client.post(f"{job['url']}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    worker = Worker(init_db(db_url), backend_kind="interpret", device_key="interpret:cpu")
    assert worker.run_once() is None  # nothing left to claim


def test_nearest_tuned_shape_is_served_with_its_distance(client, db_url):
    store(db_url, {"M": 4096, "N": 4096, "K": 4096}, 0.2)
    store(db_url, {"M": 64, "N": 64, "K": 64}, 0.01,
          config={"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 1, "num_warps": 4,
                  "num_stages": 2})
    got = client.get("/api/v1/configs", params={"kernel": "matmul", "dtype": "float16",
                                                "M": 4000, "N": 4096, "K": 4096}).json()
    assert got["match"] == "nearest" and got["tuned_shape"] == {"M": 4096, "N": 4096, "K": 4096}
    assert 0 < got["distance"] < 0.1


def test_nothing_tuned_answers_404_with_the_default(client):
    got = client.get("/api/v1/configs", params={"kernel": "matmul", "dtype": "float16",
                                                "M": 8, "N": 8, "K": 8})
    assert got.status_code == 404
    assert got.json()["match"] == "default" and got.json()["config"]["BLOCK_M"] == 16


def test_bulk_query_answers_every_item(client, db_url):
    store(db_url, {"M": 64, "N": 64, "K": 64}, 0.01)
    items = [{"kernel": "matmul", "dtype": "float16", "shape": {"M": 64, "N": 64, "K": 64}},
             {"kernel": "matmul", "dtype": "float16", "shape": {"M": 70, "N": 64, "K": 64}},
             {"kernel": "matmul", "dtype": "float32", "shape": {"M": 64, "N": 64, "K": 64}}]
    got = client.post("/api/v1/configs/query", json={"items": items})
    assert got.status_code == 200
    assert [d["match"] for d in got.json()["data"]] == ["exact", "nearest", "default"]


@pytest.mark.parametrize(("change", "loc"), [
    ({"kernel": "nope"}, ["body", "kernel"]),
    ({"dtype": "int3"}, ["body", "dtype"]),
    ({"shapes": [{"M": 16, "N": 16}]}, ["body", "shapes", 0, "K"]),
    ({"shapes": [{"M": 0, "N": 16, "K": 16}]}, ["body", "shapes", 0, "M"]),
    ({"shapes": [{"M": 16, "N": 16, "K": 10**6}]}, ["body", "shapes", 0, "K"]),
    ({"shapes": [{"M": 16, "N": 16, "K": 16, "Z": 1}]}, ["body", "shapes", 0, "Z"]),
    ({"colour": "blue"}, ["body", "colour"]),
    ({"budget": {"trials": 0}}, ["body", "budget", "trials"]),
    ({"strategy": "magic"}, ["body", "strategy"]),
])
def test_bad_jobs_get_422_naming_the_field(client, change, loc):
    got = client.post("/api/v1/jobs", json={**JOB, **change})
    assert got.status_code == 422
    detail = got.json()["detail"]
    assert any(d["loc"] == loc for d in detail), detail
    assert all(d["msg"] for d in detail)


def test_unknown_job_is_404(client):
    assert client.get("/api/v1/jobs/doesnotexist").status_code == 404


def test_kernels_and_health(client):
    kernels = client.get("/api/v1/kernels").json()["data"]
    assert kernels[0]["name"] == "matmul"
    assert {d["name"] for d in kernels[0]["dims"]} == {"M", "N", "K"}
    assert client.get("/healthz").json()["status"] == "ok"
    assert client.get("/readyz").status_code == 200
    assert "/api/v1/jobs" in client.get("/openapi.json").json()["paths"]


def test_write_keys_guard_writes_and_leave_reads_open(db_url):
    settings = Settings(database_url=db_url, api_keys="writer,reader:ro")
    with TestClient(create_app(settings)) as c:
        assert c.post("/api/v1/jobs", json=JOB).status_code == 401
        assert c.post("/api/v1/jobs", json=JOB,
                      headers={"X-API-Key": "wrong"}).status_code == 401
        assert c.post("/api/v1/jobs", json=JOB,
                      headers={"X-API-Key": "reader"}).status_code == 403
        ok = c.post("/api/v1/jobs", json=JOB, headers={"Authorization": "Bearer writer"})
        assert ok.status_code == 202
        assert c.get("/api/v1/jobs").status_code == 200
        assert c.post(f"{ok.json()['url']}/cancel").status_code == 401
