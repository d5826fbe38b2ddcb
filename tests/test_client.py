"""TunerClient against the real app on a real socket (uvicorn in a thread), and with the
service down."""

from __future__ import annotations

import json
import logging
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from search_spaces import get_kernel
from tests.api_support import INTERPRETER, SHAPE, run_worker_once, running_app
from tuner.client import TunerClient, TunerClientError
from tuner.config import KernelConfig
from tuner.settings import Settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Service:
    url: str
    db_url: str


@contextmanager
def running_service(tmp_path: Path, **settings: Any) -> Iterator[Service]:
    """The app served by uvicorn on a free local port, in a thread."""
    db_url = f"sqlite:///{tmp_path / 'client.db'}"
    with running_app(Settings(database_url=db_url, **settings)) as url:
        yield Service(url, db_url)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    with running_service(tmp_path) as running:
        yield running


class CountingTransport(httpx.HTTPTransport):
    """A real transport that remembers which paths it was asked for."""

    def __init__(self) -> None:
        super().__init__()
        self.paths: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.paths.append(request.url.path)
        return super().handle_request(request)


class BusyFirst(CountingTransport):
    """The real service, except that its first ``busy`` answers are the 503 it gives while its
    database is locked (a SQLite writer holding the lock past the busy timeout)."""

    def __init__(self, busy: int) -> None:
        super().__init__()
        self.busy = busy

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        if self.busy > 0:
            self.busy -= 1
            self.paths.append(request.url.path)
            return httpx.Response(503, headers={"Retry-After": "0"}, json={"detail": [
                {"loc": ["database"], "msg": "the database is unavailable or busy; retry "
                 "shortly", "type": "database_unavailable"}]})
        return super().handle_request(request)


def test_job_requests_are_retried_when_the_service_is_busy(service):
    transport = BusyFirst(busy=2)
    client = TunerClient(service.url, transport=transport)
    job_id = client.submit("matmul", [SHAPE], "float16", trials=2)
    assert transport.paths == ["/api/v1/jobs"] * 3
    assert client.job(job_id)["status"] == "queued"
    stubborn = TunerClient(service.url, transport=BusyFirst(busy=10))
    with pytest.raises(TunerClientError, match="503"):
        stubborn.submit("matmul", [SHAPE], "float16", trials=2)


def default(shape: dict[str, int]) -> KernelConfig:
    return get_kernel("matmul").default_config(shape, "float16")


def test_client_submits_waits_and_fetches_the_tuned_config(service):
    client = TunerClient(service.url)
    job_id = client.submit("matmul", [SHAPE], "float16", trials=2)
    assert client.job(job_id)["status"] == "queued"
    run_worker_once(service.db_url)
    job = client.wait(job_id, timeout=30, poll=0.1)
    assert job["status"] == "succeeded"
    config = client.best_config("matmul", SHAPE, "float16", device=INTERPRETER)
    assert config == KernelConfig(job["tasks"][0]["best_config"])
    assert client.lookup("matmul", SHAPE, "float16", device=INTERPRETER)["match"] == "exact"


def test_prefetch_is_one_request_and_answers_from_memory_afterwards(service):
    transport = CountingTransport()
    client = TunerClient(service.url, transport=transport)
    shapes = [{"M": m, "N": 64, "K": 64} for m in (1, 16, 128, 1024)]
    assert client.prefetch("matmul", shapes, "float16") == 4
    configs = [client.best_config("matmul", s, "float16") for s in shapes]
    assert transport.paths == ["/api/v1/configs/query"]
    assert configs == [default(s) for s in shapes]  # nothing tuned: the service's default


def test_service_down_returns_defaults_within_the_timeout_with_one_warning(caplog):
    transport = CountingTransport()
    client = TunerClient(f"http://127.0.0.1:{free_port()}", timeout=1.0, transport=transport)
    shapes = [{"M": 8, "N": 8, "K": 8}, {"M": 4096, "N": 4096, "K": 4096}]
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="tuner.client"):
        configs = [client.best_config("matmul", s, "float16") for s in shapes]
    assert time.monotonic() - started < 1.0 + 1.0
    assert configs == [default(s) for s in shapes]
    assert len([r for r in caplog.records if r.name == "tuner.client"]) == 1
    assert len(transport.paths) == 1  # after a failure it waits retry_after_s before asking


def test_an_unroutable_service_costs_one_timeout_at_most():
    # 10.255.255.1 is a non-routable address: the connection hangs until the timeout
    client = TunerClient("http://10.255.255.1:9", timeout=0.5)
    started = time.monotonic()
    for m in (1, 2, 3, 4):
        client.best_config("matmul", {"M": m, "N": 8, "K": 8}, "float16")
    assert time.monotonic() - started < 0.5 + 1.0
    client.close()  # the abandoned lookup's connection, else left for the garbage collector


def test_an_error_answer_falls_back_to_the_default_with_one_warning(tmp_path, caplog):
    with running_service(tmp_path, api_keys="secret", auth_reads=True) as locked:
        client = TunerClient(locked.url)  # no key: every lookup is refused with a 401
        with caplog.at_level(logging.WARNING, logger="tuner.client"):
            configs = [client.best_config("matmul", {"M": m, "N": 8, "K": 8}, "float16")
                       for m in (8, 64)]
        keyed = TunerClient(locked.url, api_key="secret")
        assert keyed.prefetch("matmul", [SHAPE], "float16") == 1
    assert configs == [default({"M": m, "N": 8, "K": 8}) for m in (8, 64)]
    warnings = [r.getMessage() for r in caplog.records if r.name == "tuner.client"]
    assert len(warnings) == 1 and "401" in warnings[0]


def test_cache_file_serves_the_last_answers_when_the_service_is_down(service, tmp_path):
    cache = tmp_path / "configs.json"
    client = TunerClient(service.url, cache_file=cache)
    job_id = client.submit("matmul", [SHAPE], "float16", trials=2)
    run_worker_once(service.db_url)
    client.wait(job_id, timeout=30, poll=0.1)
    tuned = client.best_config("matmul", SHAPE, "float16", device=INTERPRETER)
    assert json.loads(cache.read_text())  # written after the answer came
    offline = TunerClient(f"http://127.0.0.1:{free_port()}", timeout=0.5, cache_file=cache)
    assert offline.best_config("matmul", SHAPE, "float16", device=INTERPRETER) == tuned
    assert offline.lookup("matmul", SHAPE, "float16", device=INTERPRETER)["match"] == "exact"


def test_a_corrupt_cache_file_is_ignored(tmp_path):
    cache = tmp_path / "configs.json"
    cache.write_text("{not json")
    client = TunerClient(f"http://127.0.0.1:{free_port()}", timeout=0.5, cache_file=cache)
    assert client.best_config("matmul", SHAPE, "float16") == default(SHAPE)


def test_submit_errors_are_raised_with_the_services_reason(service):
    client = TunerClient(service.url)
    with pytest.raises(TunerClientError, match="422"):
        client.submit("matmul", [{"M": 0, "N": 8, "K": 8}], "float16")
    down = TunerClient(f"http://127.0.0.1:{free_port()}", timeout=0.5)
    with pytest.raises(TunerClientError):
        down.submit("matmul", [SHAPE], "float16")
