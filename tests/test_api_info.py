"""Kernels, devices, liveness and readiness over HTTP."""

from __future__ import annotations

from datetime import timedelta

from db import repo
from db.engine import init_db
from db.models import WorkerRow
from tests.api_support import GPU, INTERPRETER, JOB, run_worker_once


def test_kernels_list_dims_with_bounds_dtypes_and_the_space(api_client):
    kernels = api_client.get("/api/v1/kernels").json()
    matmul = next(k for k in kernels["data"] if k["name"] == "matmul")
    assert kernels["count"] == len(kernels["data"])
    assert [d["name"] for d in matmul["dims"]] == ["M", "N", "K"]
    assert all(d["min"] == 1 and d["max"] >= 4096 for d in matmul["dims"])
    assert "float16" in matmul["dtypes"] and matmul["space_size"] > 1
    assert {"BLOCK_M", "num_warps"} <= {p["name"] for p in matmul["space"]}


def test_devices_appear_once_a_worker_ran(api_client, api_db_url):
    assert api_client.get("/api/v1/devices").json()["count"] == 0
    api_client.post("/api/v1/jobs", json=JOB)
    run_worker_once(api_db_url)
    devices = api_client.get("/api/v1/devices").json()["data"]
    assert [d["key"] for d in devices] == [INTERPRETER]
    assert devices[0]["kind"] == "interpret" and devices[0]["seen_seconds_ago"] < 600


def test_healthz_reports_workers_seen_and_the_queue(api_client, api_db_url):
    empty = api_client.get("/healthz").json()
    assert empty["status"] == "ok" and empty["workers"] == {"devices": [], "workers": [],
                                                            "running": [], "queued_tasks": 0}
    assert {"matmul", "softmax"} <= set(empty["plugins"]["kernels"])
    assert empty["plugins"]["errors"] == []
    api_client.post("/api/v1/jobs", json=JOB)
    assert api_client.get("/healthz").json()["workers"]["queued_tasks"] == 1
    run_worker_once(api_db_url)
    workers = api_client.get("/healthz").json()["workers"]
    assert workers["queued_tasks"] == 0 and workers["running"] == []
    assert workers["devices"][0]["key"] == INTERPRETER and workers["devices"][0]["alive"]


def register_gpus(db_url: str, count: int, *, busy_task: int | None = None,
                  stale: str | None = None) -> None:
    """``count`` workers of one H200 host as ``tuner serve`` starts them (one per GPU), the
    first busy with ``busy_task``; ``stale``: a worker id whose last beat is 10 minutes old."""
    with init_db(db_url)() as session:
        repo.upsert_device(session, {"key": GPU, "kind": "cuda", "name": "NVIDIA H200"})
        for i in range(count):
            repo.register_worker(session, worker_id=f"host-a:{i}", host="host-a", pid=100 + i,
                                 device_key=GPU, kind="cuda", gpu_index=i,
                                 gpu_uuid=f"GPU-{i:04d}")
        if busy_task is not None:
            repo.beat_worker(session, "host-a:0", status="busy", task_id=busy_task)
        if stale is not None:
            row = session.get(WorkerRow, stale)
            assert row is not None
            row.last_seen_at = row.last_seen_at - timedelta(minutes=10)
        session.commit()


def test_healthz_reports_each_worker_with_its_gpu_status_and_task(api_client, api_db_url):
    job = api_client.post("/api/v1/jobs", json={**JOB, "device": GPU,
                                                "future_device": True}).json()
    task_id = api_client.get(job["url"]).json()["tasks"][0]["id"]
    register_gpus(api_db_url, 3, busy_task=task_id, stale="host-a:2")
    workers = api_client.get("/healthz").json()["workers"]["workers"]
    assert [(w["index"], w["uuid"], w["device"]) for w in workers] == [
        (0, "GPU-0000", GPU), (1, "GPU-0001", GPU), (2, "GPU-0002", GPU)]
    assert [(w["status"], w["task_id"], w["alive"]) for w in workers] == [
        ("busy", task_id, True), ("idle", None, True), ("idle", None, False)]
    assert workers[0]["seen_seconds_ago"] < 60 and workers[2]["seen_seconds_ago"] >= 590


def test_devices_list_each_devices_live_workers(api_client, api_db_url):
    register_gpus(api_db_url, 2, stale="host-a:1")
    api_client.post("/api/v1/jobs", json=JOB)
    run_worker_once(api_db_url)  # the interpreter's device, with no worker row
    devices = {d["key"]: d for d in api_client.get("/api/v1/devices").json()["data"]}
    live = devices[GPU]["workers"]
    assert [(w["id"], w["gpu_index"], w["gpu_uuid"], w["status"], w["alive"]) for w in live] == [
        ("host-a:0", 0, "GPU-0000", "idle", True)]  # the stale one is not live
    assert devices[INTERPRETER]["workers"] == []


def test_readyz_and_the_openapi_schema(api_client):
    assert api_client.get("/readyz").json() == {"status": "ready"}
    paths = api_client.get("/openapi.json").json()["paths"]
    assert {"/api/v1/jobs", "/api/v1/jobs/{job_id}/trials", "/api/v1/configs",
            "/api/v1/configs/query", "/api/v1/kernels", "/api/v1/devices"} <= set(paths)
