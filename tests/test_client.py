"""TunerClient against the real app (ASGI through the test client's transport), and with the
service down."""

from __future__ import annotations

import logging
import socket
import time
from pathlib import Path

from fastapi.testclient import TestClient

from api.app import create_app
from db.engine import init_db
from tuner.client import TunerClient
from tuner.config import KernelConfig
from tuner.settings import Settings
from tuner.worker import Worker

SHAPE = {"M": 16, "N": 16, "K": 16}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_client_submits_waits_and_fetches_the_tuned_config(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'c.db'}"
    with TestClient(create_app(Settings(database_url=url))) as app_client:
        client = TunerClient("http://testserver", transport=app_client._transport)
        job_id = client.submit("matmul", [SHAPE], "float16", trials=2)
        Worker(init_db(url), backend_kind="interpret", device_key="interpret:cpu").run_once()
        job = client.wait(job_id, timeout=30, poll=0.1)
        assert job["status"] == "succeeded"
        config = client.best_config("matmul", SHAPE, "float16", device="interpret:cpu")
        assert config == KernelConfig(job["tasks"][0]["best_config"])
        assert client.lookup("matmul", SHAPE, "float16", device="interpret:cpu")["match"] == (
            "exact")


def test_prefetch_is_one_request_and_answers_from_memory_afterwards(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'c.db'}"
    with TestClient(create_app(Settings(database_url=url))) as app_client:
        calls = []
        app_client.app.middleware_stack = None  # type: ignore[attr-defined]

        @app_client.app.middleware("http")  # type: ignore[attr-defined]
        async def count(request, call_next):  # type: ignore[no-untyped-def]
            calls.append(request.url.path)
            return await call_next(request)

        client = TunerClient("http://testserver", transport=app_client._transport)
        shapes = [{"M": m, "N": 64, "K": 64} for m in (1, 16, 128, 1024)]
        assert client.prefetch("matmul", shapes, "float16") == 4
        for s in shapes:
            client.best_config("matmul", s, "float16")
        assert calls == ["/api/v1/configs/query"]


def test_service_down_returns_defaults_within_the_timeout_with_one_warning(caplog):
    client = TunerClient(f"http://127.0.0.1:{_free_port()}", timeout=1.0)
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="tuner.client"):
        first = client.best_config("matmul", {"M": 8, "N": 8, "K": 8}, "float16")
        second = client.best_config("matmul", {"M": 4096, "N": 4096, "K": 4096}, "float16")
    assert time.monotonic() - started < 2 * 1.0 + 1.0
    from search_spaces import get_kernel

    k = get_kernel("matmul")
    assert first == k.default_config({"M": 8, "N": 8, "K": 8}, "float16")
    assert second == k.default_config({"M": 4096, "N": 4096, "K": 4096}, "float16")
    assert len([r for r in caplog.records if r.name == "tuner.client"]) == 1


def test_cache_file_serves_the_last_answers_when_the_service_is_down(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'c.db'}"
    cache = tmp_path / "configs.json"
    with TestClient(create_app(Settings(database_url=url))) as app_client:
        client = TunerClient("http://testserver", transport=app_client._transport)
        job_id = client.submit("matmul", [SHAPE], "float16", trials=2)
        Worker(init_db(url), backend_kind="interpret", device_key="interpret:cpu").run_once()
        client.wait(job_id, timeout=30, poll=0.1)
        online = TunerClient("http://testserver", transport=app_client._transport,
                             cache_file=cache)
        tuned = online.best_config("matmul", SHAPE, "float16", device="interpret:cpu")
    offline = TunerClient(f"http://127.0.0.1:{_free_port()}", timeout=0.5, cache_file=cache)
    assert offline.best_config("matmul", SHAPE, "float16", device="interpret:cpu") == tuned
