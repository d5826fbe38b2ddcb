"""API keys: writes need a read-write key when keys are configured; reads are open unless
``auth_reads``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fastapi.testclient import TestClient
from pydantic import ValidationError

from api.app import create_app
from tests.api_support import JOB, SHAPE, config_params, running_app
from tuner.settings import Settings

ROOT = Path(__file__).resolve().parent.parent


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


def test_keys_are_compared_in_constant_time_with_every_key(api_db_url, monkeypatch):
    import api.deps

    compared: list[tuple[bytes, bytes]] = []
    real = api.deps.hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(api.deps.hmac, "compare_digest", spy)
    with keyed_client(api_db_url) as client:
        for key, status in (("writer", 202), ("reader", 403), ("wrong", 401)):
            compared.clear()
            got = client.post("/api/v1/jobs", json=JOB, headers={"X-API-Key": key})
            assert got.status_code == status
            # every configured key was compared, also after the first one matched
            assert sorted(b for _, b in compared) == [b"reader", b"writer"]
            assert {a for a, _ in compared} == {key.encode()}


def test_a_key_that_is_not_ascii_is_compared_as_utf8_bytes_not_a_500(api_db_url):
    # real HTTP: a header is bytes; a client sends a non-ASCII key as its UTF-8 bytes
    settings = Settings(database_url=api_db_url, api_keys="caf\u00e9,writer")
    with running_app(settings) as base, httpx.Client(base_url=base) as client:
        def submit(key: bytes) -> int:
            return client.post("/api/v1/jobs", json=JOB, headers={"X-API-Key": key}).status_code

        assert submit("caf\u00e9".encode()) == 202
        assert submit(b"caf\xe9") == 401  # latin-1: another key
        assert submit(b"\xff\xfe") == 401


@pytest.mark.parametrize("keys", ["k:RO", "k:readonly", "k:", "writer,k:r0", ":ro", "k:rw:ro"])
def test_an_unknown_key_mode_stops_start_up_naming_the_variable(keys, monkeypatch):
    monkeypatch.setenv("TUNER_API_KEYS", keys)
    with pytest.raises(ValidationError) as err:
        Settings()
    assert "TUNER_API_KEYS" in str(err.value)
    assert "k:" not in str(err.value) or keys.startswith(":")  # no key is echoed


def test_known_key_modes_parse():
    assert Settings(api_keys=" a , b:rw,c:ro,").parsed_api_keys() == {"a": "rw", "b": "rw",
                                                                      "c": "ro"}


def test_the_api_process_refuses_to_start_with_an_unknown_key_mode(tmp_path):
    env = {**os.environ, "TUNER_API_KEYS": "secret:readonly", "TUNER_DATA_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "uvicorn", "api.app:app", "--port", "0"],
                         env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode != 0
    assert "TUNER_API_KEYS" in out.stderr and "secret" not in out.stderr


def test_compose_publishes_the_api_on_localhost_only_by_default():
    api = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]["api"]
    assert api["ports"] == ["${TUNER_API_BIND:-127.0.0.1}:8000:8000"]


@pytest.mark.skipif(shutil.which("docker-compose") is None,
                    reason="docker-compose is not installed (scripts/test.sh installs it)")
def test_compose_config_binds_the_api_to_localhost_unless_told_otherwise():
    def api_ports(**env: str) -> str:
        out = subprocess.run(["docker-compose", "config"], cwd=ROOT, capture_output=True,
                             text=True, timeout=60, env={**os.environ, **env})
        assert out.returncode == 0, out.stderr
        return yaml.safe_load(out.stdout)["services"]["api"]["ports"]

    env = {k: v for k, v in os.environ.items() if k != "TUNER_API_BIND"}
    assert [p["host_ip"] if isinstance(p, dict) else p for p in api_ports(**env)] in (
        ["127.0.0.1"], ["127.0.0.1:8000:8000/tcp"])
    assert "0.0.0.0" in str(api_ports(TUNER_API_BIND="0.0.0.0"))
