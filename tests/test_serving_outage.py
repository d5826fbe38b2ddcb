"""Lookups during a database outage (issue 28): GET /configs and POST /configs/query go on
answering from the serving index's memory, saying so (``X-Tuner-Database: unavailable``),
without trying the database per request; a kernel version never loaded is a 503 that says so;
reported misses are deferred and written once the database is back. Real HTTP through the app,
on a SQLite file whose folder is moved away and on a PostgreSQL database that refuses
connections (``ALLOW_CONNECTIONS false``, its sessions terminated)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import make_url

import db.engine
from api.app import create_app
from api.serving import ServingIndex
from db.engine import init_db, make_engine, make_session_factory
from search_spaces import get_kernel
from tests.api_support import GPU, config_params, register_devices, store
from tests.conftest import POSTGRES_URL, _postgres_database
from tests.support_processes import wait_for
from tuner.settings import Settings

H100 = "cuda:NVIDIA H100 80GB HBM3:sm90"
A100 = "cuda:NVIDIA A100-SXM4-80GB:sm80"
CONFIGS = "/api/v1/configs"
QUERY = "/api/v1/configs/query"
SHAPE = {"M": 64, "N": 64, "K": 64}
VERSION = get_kernel("matmul").version
HEADER = "x-tuner-database"
RECOVERY_THREAD = "serving-index-recovery"


class Store:
    """A database the test makes unreachable (``cut``) and brings back (``restore``)."""

    def __init__(self, url: str) -> None:
        self.url = url

    def cut(self) -> None:
        raise NotImplementedError

    def restore(self) -> None:
        raise NotImplementedError


class SqliteStore(Store):
    """A SQLite file in a folder of its own: moving the folder away makes every new
    connection fail ("unable to open database file"); moving it back restores the very file
    (its identity unchanged), in one rename, so no connection can create an empty one."""

    def __init__(self, folder: Path) -> None:
        super().__init__(f"sqlite:///{folder / 'api.db'}")
        self.folder, self.aside = folder, folder.with_name(folder.name + ".away")

    def cut(self) -> None:
        # a pooled connection would go on reading the moved file: close them first
        init_db(self.url).kw["bind"].dispose()
        self.folder.rename(self.aside)

    def restore(self) -> None:
        if self.aside.exists():
            self.aside.rename(self.folder)


class PostgresStore(Store):
    """A PostgreSQL database of its own that stops accepting connections, its sessions
    terminated (what a failover or a server restart looks like to the service)."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.name = make_url(url).database
        assert POSTGRES_URL is not None
        admin_url = POSTGRES_URL.rsplit("/", 1)[0] + "/postgres"
        self.admin = create_engine(admin_url.replace("postgresql://", "postgresql+psycopg://"),
                                   isolation_level="AUTOCOMMIT")

    def cut(self) -> None:
        with self.admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS false'))
            conn.execute(text("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                              "WHERE datname = :name AND pid <> pg_backend_pid()"),
                         {"name": self.name})

    def restore(self) -> None:
        with self.admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{self.name}" ALLOW_CONNECTIONS true'))


@pytest.fixture(params=["sqlite", "postgres"])
def outage_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "sqlite":
        sqlite = SqliteStore(tmp_path / "store")
        try:
            yield sqlite
        finally:
            sqlite.restore()
        return
    if not POSTGRES_URL:
        pytest.skip("TUNER_TEST_POSTGRES_URL is not set (scripts/test.sh sets it when a "
                    "PostgreSQL server answers)")
    database = _postgres_database()
    postgres = PostgresStore(next(database))
    try:
        yield postgres
    finally:
        postgres.restore()
        postgres.admin.dispose()
        next(database, None)  # drops it


def app_client(url: str, refresh_s: float) -> TestClient:
    return TestClient(create_app(Settings(database_url=url, serving_refresh_s=refresh_s)))


def index_of(client: TestClient, retry_s: float = 0.1) -> ServingIndex:
    """The app's serving index, trying the database every ``retry_s`` during an outage."""
    index: ServingIndex = client.app.state.serving_index  # type: ignore[attr-defined]
    index.retry_s = retry_s
    return index


def answers(client: TestClient, lookups: dict[str, dict[str, Any]],
            items: list[dict[str, Any]]) -> dict[str, Any]:
    """Each lookup's status, body and header, and the bulk query's."""
    got = {name: client.get(CONFIGS, params=params) for name, params in lookups.items()}
    bulk = client.post(QUERY, json={"items": items})
    return {**{name: (r.status_code, r.json(), r.headers.get(HEADER))
               for name, r in got.items()},
            "bulk": (bulk.status_code, bulk.json(), bulk.headers.get(HEADER))}


def test_lookups_are_answered_from_memory_while_the_database_is_away(outage_store: Store):
    url = outage_store.url
    store(url, SHAPE, 0.1)
    store(url, {"M": 256, "N": 64, "K": 64}, 0.2, device=H100)
    with app_client(url, refresh_s=0.2) as client:
        index = index_of(client)
        # stored after the start-up load: loaded on its first lookup
        store(url, SHAPE, 0.1, dtype="float32")
        lookups = {"exact": config_params(SHAPE, GPU),
                   "nearest": config_params({"M": 100, "N": 64, "K": 64}, GPU),
                   "other-device": config_params({"M": 256, "N": 64, "K": 64}, A100,
                                                 triton_version="3.6.0"),
                   "loaded since start": config_params(SHAPE, GPU, dtype="float32"),
                   # nothing tuned: the registered kernel's group was loaded empty at start
                   "default": {"kernel": "softmax", "dtype": "float16", "M": 64, "N": 64,
                               "device": GPU}}
        items = [{"kernel": "matmul", "dtype": "float16", "shape": shape, "device": device}
                 for shape in (SHAPE, {"M": 32, "N": 64, "K": 64}) for device in (GPU, H100)]
        before = answers(client, lookups, items)
        assert [before[name][0] for name in lookups] == [200, 200, 200, 200, 404]
        assert {before[name][1].get("match") for name in lookups} == {
            "exact", "nearest", "other-device", "default"}
        assert before["bulk"][0] == 200 and not any(h for _, _, h in before.values())

        outage_store.cut()
        time.sleep(0.25)  # the version check is due: it finds the database gone
        during = answers(client, lookups, items)
        assert {name: (status, body) for name, (status, body, _) in during.items()} == {
            name: (status, body) for name, (status, body, _) in before.items()}
        assert {header for _, _, header in during.values()} == {"unavailable"}
        assert index.outage is not None

        # no lookup tries the database: only the recovery thread, every retry_s
        attempts: list[str] = []
        engine = init_db(url).kw["bind"]

        def attempt(*_args: Any) -> None:
            attempts.append(threading.current_thread().name)

        event.listen(engine, "do_connect", attempt)
        try:
            start = time.monotonic()
            for _ in range(40):
                got = client.get(CONFIGS, params=lookups["exact"])
                assert got.status_code == 200 and got.headers[HEADER] == "unavailable"
            elapsed = time.monotonic() - start
        finally:
            event.remove(engine, "do_connect", attempt)
        assert set(attempts) <= {RECOVERY_THREAD}, attempts
        assert len(attempts) <= 2 + elapsed / index.retry_s, (attempts, elapsed)

        # a kernel version never loaded cannot be answered from memory
        unknown = client.get(CONFIGS, params=config_params(SHAPE, GPU,
                                                           kernel_version="0123456789abcdef"))
        assert unknown.status_code == 503 and unknown.headers["retry-after"]
        [detail] = unknown.json()["detail"]
        assert detail["loc"] == ["database"]
        assert detail["msg"] == ("the database is unavailable and the configs of matmul float16 "
                                 "(kernel version 0123456789abcdef) were not in this API "
                                 "process's memory: retry once the database is back")
        bulk = client.post(QUERY, json={"items": [*items, {
            "kernel": "matmul", "dtype": "bfloat16", "shape": SHAPE, "kernel_version": "0ld"}]})
        assert bulk.status_code == 503 and "matmul bfloat16" in bulk.json()["detail"][0]["msg"]

        outage_store.restore()
        wait_for(lambda: index.outage is None, None, timeout=60)
        after = answers(client, lookups, items)
        assert {name: (status, body) for name, (status, body, _) in after.items()} == {
            name: (status, body) for name, (status, body, _) in before.items()}
        assert not any(header for _, _, header in after.values())
        store(url, {"M": 100, "N": 64, "K": 64}, 0.1)  # the index follows the store again
        assert client.get(CONFIGS, params=lookups["nearest"]).json()["match"] == "exact"


def test_misses_reported_during_an_outage_are_written_once_the_database_is_back(
        outage_store: Store):
    url = outage_store.url
    store(url, SHAPE, 0.1)
    register_devices(url, GPU)
    # lookups never read the database (no version check due): the miss reports find it gone
    with app_client(url, refresh_s=600) as client:
        index = index_of(client)
        items = [{"kernel": "matmul", "dtype": "float16", "shape": shape, "device": GPU}
                 for shape in ({"M": 100, "N": 64, "K": 64}, SHAPE, {"M": 32, "N": 64, "K": 64})]
        outage_store.cut()
        for _ in range(2):
            got = client.post(QUERY, json={"items": items, "report_misses": True,
                                           "client": "vllm-0"})
            assert got.status_code == 200, got.text
            assert got.headers[HEADER] == "unavailable"
            assert [(a["match"], a["miss"]) for a in got.json()["data"]] == [
                ("nearest", "deferred"), ("exact", None), ("nearest", "deferred")]
        assert (index.deferred_misses, index.misses_deferred) == (4, 4)
        assert client.get("/api/v1/misses").status_code == 503  # other routes need it

        outage_store.restore()
        wait_for(lambda: index.outage is None, None, timeout=60)
        assert (index.deferred_misses, index.misses_written, index.misses_dropped) == (0, 4, 0)
        listed = client.get("/api/v1/misses").json()
        assert sorted((m["shape"]["M"], m["count"], m["status"], m["last_client"])
                      for m in listed["data"]) == [(32, 2, "queued", "vllm-0"),
                                                   (100, 2, "queued", "vllm-0")]
        got = client.post(QUERY, json={"items": items[:1], "report_misses": True})
        assert got.json()["data"][0]["miss"] == "pending" and HEADER not in got.headers


def test_deferred_misses_are_bounded_the_oldest_dropped(tmp_path: Path):
    outage = SqliteStore(tmp_path / "store")
    store(outage.url, SHAPE, 0.1)
    register_devices(outage.url, GPU)
    with app_client(outage.url, refresh_s=600) as client:
        index = index_of(client)
        index.misses_max = 3
        outage.cut()
        items = [{"kernel": "matmul", "dtype": "float16", "shape": {"M": m, "N": 64, "K": 64},
                  "device": GPU} for m in (17, 18, 19, 20, 21)]
        got = client.post(QUERY, json={"items": items, "report_misses": True})
        assert [a["miss"] for a in got.json()["data"]] == ["deferred"] * 5
        assert (index.deferred_misses, index.misses_dropped) == (3, 2)
        outage.restore()
        wait_for(lambda: index.outage is None, None, timeout=60)
        listed = client.get("/api/v1/misses").json()
        assert sorted(m["shape"]["M"] for m in listed["data"]) == [19, 20, 21]


@pytest.mark.timeout(120)
def test_a_silent_database_server_costs_one_lookup_the_connect_timeout_and_no_more(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A PostgreSQL host that drops packets: the first lookup waits for the connection
    attempt at most ``CONNECT_TIMEOUT_S`` (without it libpq waits for ever), the next ones
    are answered from memory at once."""
    monkeypatch.setattr(db.engine, "CONNECT_TIMEOUT_S", 2)  # libpq's least
    url = f"sqlite:///{tmp_path / 'api.db'}"
    store(url, SHAPE, 0.1)
    factory = make_session_factory(init_db(url).kw["bind"])
    index = ServingIndex(factory, refresh_s=0.05, retry_s=600)
    try:
        assert index.load_all()
        with socket.socket() as silent:  # accepts connections (the backlog) and never answers
            silent.bind(("127.0.0.1", 0))
            silent.listen(16)
            port = silent.getsockname()[1]
            factory.configure(bind=make_engine(f"postgresql://tuner@127.0.0.1:{port}/tuner"))
            time.sleep(0.1)
            start = time.monotonic()
            group, from_memory = index.lookup("matmul", VERSION, "float16")
            first = time.monotonic() - start
            assert from_memory and len(group.candidates) == 1
            assert 1.5 < first < 15, first
            start = time.monotonic()
            for _ in range(50):
                assert index.lookup("matmul", VERSION, "float16") == (group, True)
            assert time.monotonic() - start < 1.0
    finally:
        index.close()
