"""The serving index (``api/serving.py``): the same answers as the database ladder, fresh within
its refresh interval of another process's write (at once after this process's), and a bulk
query that issues no SQL per item; on SQLite and PostgreSQL."""

from __future__ import annotations

import http.client
import itertools
import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import event

from api.app import create_app
from api.serving import ServingIndex
from db import repo
from db.engine import init_db
from search_spaces import get_kernel
from tests.api_support import GPU, INTERPRETER, store
from tuner.app import service
from tuner.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
H100 = "cuda:NVIDIA H100 80GB HBM3:sm90"
A100 = "cuda:NVIDIA A100-SXM4-80GB:sm80"
REPLAY = "replay:NVIDIA H200"
VERSION = get_kernel("matmul").version
SMALL = {"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 1, "num_warps": 4,
         "num_stages": 2}


class Clock:
    """A clock the test moves by hand (the index's refresh interval without sleeping)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _database_answer(db_url: str, shape: dict[str, int], device: str | None,
                     triton: str | None, dtype: str = "float16",
                     kernel_version: str = VERSION) -> Any:
    with init_db(db_url)() as session:
        candidates = repo.serving_candidates(session, kernel="matmul",
                                             kernel_version=kernel_version, dtype=dtype)
    return _key(repo.serve_best(candidates, shape=shape, device_key=device,
                                triton_version=triton))


def _index_answer(index: ServingIndex, shape: dict[str, int], device: str | None,
                  triton: str | None, dtype: str = "float16",
                  kernel_version: str = VERSION) -> Any:
    return _key(index.group("matmul", kernel_version, dtype).serve(shape, device, triton))


def _key(served: repo.Served | None) -> tuple[str, int, float] | None:
    return None if served is None else (served.match, served.row.id, served.distance)


def _store_many(db_url: str) -> None:
    """Bests on two GPUs, the interpreter and a replay table, under three Triton versions
    (two of one minor), with shapes at equal distances from the queries (ties) and one shape
    missing a dimension (it counts as 1), plus another kernel version and dtype."""
    rng = random.Random(7)
    rows = [(GPU, "cuda", "3.6.0"), (GPU, "cuda", "3.6.2"), (GPU, "cuda", "3.5.1"),
            (H100, "cuda", "3.6.0"), (INTERPRETER, "interpret", "3.6.0"),
            (REPLAY, "replay", "3.6.0")]
    for (device, kind, triton), m in itertools.product(rows, (16, 64, 256)):
        for n, k in ((64, 64), (128, 64), (64, 256)):
            if rng.random() < 0.6:
                store(db_url, {"M": m, "N": n, "K": k}, rng.uniform(0.01, 1), device=device,
                      kind=kind, triton_version=triton,
                      config=SMALL if rng.random() < 0.5 else None)
    store(db_url, {"M": 32, "N": 64}, 0.5, device=H100, triton_version="3.6.0")
    store(db_url, {"M": 64, "N": 64, "K": 64}, 0.5, device=GPU, triton_version="3.6.0",
          kernel_version="0ld5ource")
    store(db_url, {"M": 64, "N": 64, "K": 64}, 0.5, device=GPU, dtype="float32")


def test_the_index_answers_exactly_as_the_database_ladder(any_db_url):
    _store_many(any_db_url)
    index = ServingIndex(init_db(any_db_url), refresh_s=60)
    shapes = [{"M": m, "N": n, "K": k} for m in (1, 16, 32, 64, 100, 128, 256, 4096)
              for n in (64, 96, 128) for k in (64, 256)]
    devices = [GPU, H100, A100, INTERPRETER, REPLAY, None]
    tritons = ["3.6.0", "3.6.1", "3.5.0", "3.7.0", None]
    matches = set()
    for shape, device, triton in itertools.product(shapes, devices, tritons):
        expected = _database_answer(any_db_url, shape, device, triton)
        assert _index_answer(index, shape, device, triton) == expected, (shape, device, triton)
        matches.add(expected[0] if expected else "default")
    for dtype, version in (("float32", VERSION), ("float16", "0ld5ource"),
                           ("bfloat16", VERSION)):
        for shape, device in itertools.product(shapes[:8], devices):
            expected = _database_answer(any_db_url, shape, device, "3.6.0", dtype, version)
            assert _index_answer(index, shape, device, "3.6.0", dtype, version) == expected
            matches.add(expected[0] if expected else "default")
    assert matches == {"exact", "nearest", "other-triton", "other-device", "default"}


def test_a_best_stored_by_another_process_is_served_after_the_refresh_interval(any_db_url):
    shape = {"M": 64, "N": 64, "K": 64}
    store(any_db_url, {"M": 128, "N": 64, "K": 64}, 0.1)
    clock = Clock()
    index = ServingIndex(init_db(any_db_url), refresh_s=0.5, clock=clock)
    assert _index_answer(index, shape, GPU, "3.6.0")[0] == "nearest"
    checks = index.checks
    _store_in_another_process(any_db_url, shape)
    clock.now += 0.4  # within the interval: no database read, the old answer
    assert _index_answer(index, shape, GPU, "3.6.0")[0] == "nearest"
    assert index.checks == checks
    clock.now += 0.1
    assert _index_answer(index, shape, GPU, "3.6.0") == _database_answer(
        any_db_url, shape, GPU, "3.6.0")
    assert _index_answer(index, shape, GPU, "3.6.0")[0] == "exact"
    assert index.checks == checks + 1


def _store_in_another_process(db_url: str, shape: dict[str, int]) -> None:
    code = f"from tests.api_support import store; store({db_url!r}, {shape!r}, 0.05)"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True, timeout=120)


def test_a_write_through_this_process_is_served_at_once(any_db_url):
    shape = {"M": 64, "N": 64, "K": 64}
    store(any_db_url, {"M": 128, "N": 64, "K": 64}, 0.1)
    index = ServingIndex(init_db(any_db_url), refresh_s=0.5, clock=Clock())  # never moves
    assert _index_answer(index, shape, GPU, "3.6.0")[0] == "nearest"
    store(any_db_url, shape, 0.05)
    assert _index_answer(index, shape, GPU, "3.6.0")[0] == "exact"
    store(any_db_url, shape, 0.01, config=SMALL)  # a faster config replaces it
    [row] = [c.row for c in index.group("matmul", VERSION, "float16").candidates
             if c.shape_key == repo.shape_key_of(shape)]
    assert row.config == SMALL


def test_the_app_serves_another_process_s_best_within_its_refresh_interval(tmp_path):
    db_url = f"sqlite:///{tmp_path / 'app.db'}"
    shape = {"M": 64, "N": 64, "K": 64}
    params = {"kernel": "matmul", "dtype": "float16", **shape, "device": GPU}
    settings = Settings(database_url=db_url, serving_refresh_s=0.2)
    with TestClient(create_app(settings)) as client:
        assert client.get("/api/v1/configs", params=params).status_code == 404
        _store_in_another_process(db_url, shape)
        deadline = time.monotonic() + 30
        while (got := client.get("/api/v1/configs", params=params)).status_code == 404:
            assert time.monotonic() < deadline, "the new best was never served"
            time.sleep(0.05)
        assert got.json()["match"] == "exact"
        assert got.headers["server-timing"].startswith("app;dur=")


def _items(count: int) -> list[dict[str, Any]]:
    rng = random.Random(3)
    items = []
    for i in range(count):
        kernel, dtype, dims = rng.choice([("matmul", "float16", "MNK"),
                                          ("matmul", "float32", "MNK"),
                                          ("softmax", "float16", "MN")])
        shape = {d: rng.choice((16, 50, 64, 128)) for d in dims}
        items.append({"kernel": kernel, "dtype": dtype, "shape": shape,
                      "device": GPU if i % 3 else H100, "triton_version": "3.6.0"})
    return items


@pytest.mark.parametrize("refresh_s", [60.0, 0.0])
def test_the_bulk_query_issues_no_statement_per_item(any_db_url, refresh_s):
    for shape in ({"M": 64, "N": 64, "K": 64}, {"M": 16, "N": 128, "K": 64}):
        store(any_db_url, shape, 0.1)
        store(any_db_url, shape, 0.1, dtype="float32", device=H100)
    statements: list[str] = []
    engine = init_db(any_db_url).kw["bind"]
    listener = (lambda _conn, _cursor, sql, *_args: statements.append(sql))
    settings = Settings(database_url=any_db_url, serving_refresh_s=refresh_s)
    with TestClient(create_app(settings)) as client:
        event.listen(engine, "before_cursor_execute", listener)
        try:
            counts = []
            for _ in range(2):
                statements.clear()
                got = client.post("/api/v1/configs/query", json={"items": _items(600)})
                assert got.status_code == 200 and got.json()["count"] == 600
                counts.append(len(statements))
        finally:
            event.remove(engine, "before_cursor_execute", listener)
    matches = {d["match"] for d in got.json()["data"]}
    assert {"exact", "nearest", "other-device", "default"} <= matches
    groups = 3  # (matmul, float16), (matmul, float32), (softmax, float16)
    if refresh_s:  # every group loaded at start (the lifespan's load_all): all from memory
        assert counts == [0, 0], counts
    else:  # no index: a query per group and request, never per item
        assert counts == [groups, groups], counts


def test_serve_runs_api_workers_from_the_flag_or_the_environment(monkeypatch):
    assert service.api_processes(Settings()) == 2
    monkeypatch.setenv("TUNER_API_WORKERS", "3")
    assert service.api_processes(Settings()) == 3
    assert service.api_processes(Settings(), requested=1) == 1
    monkeypatch.setenv("TUNER_API_WORKERS", "0")
    assert service.api_processes(Settings()) == min(8, os.cpu_count() or 1)


def test_tuner_serve_with_api_workers_answers_without_the_delayed_ack_stall(tmp_path):
    """Several uvicorn processes share a socket that uvicorn binds without naming TCP, and
    asyncio then leaves Nagle's algorithm on: each lookup on a keep-alive connection waited
    40 ms for the client's delayed ACK. ``serve`` runs uvicorn with TCP_NODELAY set."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = int(s.getsockname()[1])
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TUNER_DATA_DIR": str(tmp_path),
           "TUNER_DATABASE_URL": ""}
    proc = subprocess.Popen([sys.executable, "-m", "tuner.app.cli", "serve", "--port", str(port),
                             "--workers", "0", "--api-workers", "2"], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        conn = _connect_when_ready(port, proc)
        path = "/api/v1/configs?kernel=matmul&dtype=float16&M=64&N=64&K=64"
        seconds = []
        for _ in range(15):
            start = time.perf_counter()
            conn.request("GET", path)
            response = conn.getresponse()
            assert response.status == 404 and response.read()
            seconds.append(time.perf_counter() - start)
        conn.close()
        assert sorted(seconds)[7] < 0.025, seconds
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=90) == 0


def _connect_when_ready(port: int, proc: subprocess.Popen[bytes]) -> http.client.HTTPConnection:
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, "tuner serve exited"
        assert time.monotonic() < deadline, "tuner serve did not start"
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            conn.request("GET", "/readyz")
            if conn.getresponse().read() and conn.sock is not None:
                return conn
        except OSError:
            pass
        conn.close()
        time.sleep(0.2)
