"""API keys: writes need a read-write key when keys are configured; reads are open unless
``auth_reads``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from tests.api_support import JOB, SHAPE, config_params
from tuner.settings import Settings


def keyed_client(db_url: str, **settings: Any) -> TestClient:
    return TestClient(create_app(Settings(database_url=db_url, api_keys="writer,reader:ro",
                                          **settings)))


@pytest.fixture
def keyed(api_db_url: str) -> Iterator[TestClient]:
    with keyed_client(api_db_url) as client:
        yield client


def test_a_write_without_a_key_or_with_a_wrong_one_is_401(keyed):
    missing = keyed.post("/api/v1/jobs", json=JOB)
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
    assert keyed.post("/api/v1/jobs", json=JOB, headers={"X-API-Key": "wrong"}).status_code == (
        401)
    assert keyed.post("/api/v1/jobs", json=JOB,
                      headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_a_read_only_key_cannot_write(keyed):
    assert keyed.post("/api/v1/jobs", json=JOB, headers={"X-API-Key": "reader"}).status_code == (
        403)


def test_a_read_write_key_writes_in_either_header(keyed):
    first = keyed.post("/api/v1/jobs", json=JOB, headers={"Authorization": "Bearer writer"})
    assert first.status_code == 202
    cancel = f"{first.json()['url']}/cancel"
    assert keyed.post(cancel).status_code == 401
    assert keyed.post(cancel, headers={"X-API-Key": "writer"}).status_code == 200


def test_reads_stay_open_by_default(keyed):
    assert keyed.get("/api/v1/jobs").status_code == 200
    assert keyed.get("/api/v1/configs", params=config_params(SHAPE)).status_code == 404
    items = [{"kernel": "matmul", "dtype": "float16", "shape": SHAPE}]
    assert keyed.post("/api/v1/configs/query", json={"items": items}).status_code == 200


def test_auth_reads_makes_reads_need_any_valid_key(api_db_url):
    with keyed_client(api_db_url, auth_reads=True) as client:
        assert client.get("/api/v1/jobs").status_code == 401
        assert client.get("/api/v1/kernels", headers={"X-API-Key": "nope"}).status_code == 401
        assert client.get("/api/v1/jobs", headers={"X-API-Key": "reader"}).status_code == 200
        assert client.get("/healthz").status_code == 200  # probes never need a key
