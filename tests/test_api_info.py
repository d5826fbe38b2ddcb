"""Kernels, devices, liveness and readiness over HTTP."""

from __future__ import annotations

from tests.api_support import INTERPRETER, JOB, run_worker_once


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
    assert empty["status"] == "ok" and empty["workers"] == {"devices": [], "running": [],
                                                            "queued_tasks": 0}
    assert {"matmul", "softmax"} <= set(empty["plugins"]["kernels"])
    assert empty["plugins"]["errors"] == []
    api_client.post("/api/v1/jobs", json=JOB)
    assert api_client.get("/healthz").json()["workers"]["queued_tasks"] == 1
    run_worker_once(api_db_url)
    workers = api_client.get("/healthz").json()["workers"]
    assert workers["queued_tasks"] == 0 and workers["running"] == []
    assert workers["devices"][0]["key"] == INTERPRETER and workers["devices"][0]["alive"]


def test_readyz_and_the_openapi_schema(api_client):
    assert api_client.get("/readyz").json() == {"status": "ready"}
    paths = api_client.get("/openapi.json").json()["paths"]
    assert {"/api/v1/jobs", "/api/v1/jobs/{job_id}/trials", "/api/v1/configs",
            "/api/v1/configs/query", "/api/v1/kernels", "/api/v1/devices"} <= set(paths)
