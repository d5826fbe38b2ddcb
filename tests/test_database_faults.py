"""Database faults that lost work (issue 28): a SQLite file deleted or replaced under a running
service is noticed (``/readyz`` not ready, writes refused with a 503 that says to restart), and
``tuner serve`` / ``tuner worker`` wait for a database that does not answer at start (one line
per attempt, no traceback) and start once it does; a URL that can never work exits 2 at once.

Real processes, real SQLite files, real PostgreSQL (TUNER_TEST_POSTGRES_URL) and real HTTP.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from db import repo
from db.engine import init_db
from tests.api_support import JOB
from tests.conftest import POSTGRES_URL, _postgres_database
from tests.support_processes import ROOT, free_port, interpreter_env, serving, wait_for
from tuner.settings import Settings

RETRYING = "; retrying in "


# -- 1. a SQLite file removed or replaced under the service ------------------------------------

def assert_refused_for_the_file(response: Any, what: str) -> None:
    assert response.status_code == 503, (response.status_code, response.text)
    detail = response.json()["detail"][0]
    assert detail["loc"] == ["database"]
    assert what in detail["msg"] and "restart the service" in detail["msg"], detail


def test_a_replaced_sqlite_file_makes_the_app_unready_and_refuses_writes(tmp_path: Path):
    path = tmp_path / "api.db"
    with TestClient(create_app(Settings(database_url=f"sqlite:///{path}"))) as client:
        assert client.get("/readyz").json() == {"status": "ready"}
        assert client.post("/api/v1/jobs", json=JOB).status_code == 202
        (tmp_path / "other.db").write_bytes(path.read_bytes())
        os.replace(tmp_path / "other.db", path)  # a restore from a backup, say
        ready = client.get("/readyz")
        assert ready.status_code == 503
        assert "was replaced" in ready.json()["error"]
        assert_refused_for_the_file(client.post("/api/v1/jobs", json=JOB), "was replaced")


@pytest.mark.timeout(300)
def test_serve_refuses_jobs_and_is_unready_once_its_sqlite_file_is_deleted(tmp_path: Path):
    with serving(tmp_path) as served:
        assert httpx.post(f"{served.base}/api/v1/jobs", json=JOB).status_code == 202
        (tmp_path / "tuner.db").unlink()
        ready = httpx.get(f"{served.base}/readyz")
        assert ready.status_code == 503
        assert "was removed" in ready.json()["error"]
        job = {**JOB, "shapes": [{"M": 32, "N": 32, "K": 32}]}
        assert_refused_for_the_file(httpx.post(f"{served.base}/api/v1/jobs", json=job),
                                    "was removed")


# -- 2. a database that does not answer at start -----------------------------------------------

def start(args: list[str], log: Path, **env: str) -> subprocess.Popen[bytes]:
    """``python -m tuner.app.cli ARGS`` on the interpreter, stdout and stderr into ``log``."""
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "tuner.app.cli", *args], cwd=ROOT,
                                env=interpreter_env(**env), stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)


def retry_lines(log: Path, who: str = "tuner") -> list[str]:
    """The retry lines of ``who`` (``tuner serve``'s workers, waiting beside it, say
    ``tuner worker``)."""
    return [line for line in log.read_text().splitlines()
            if RETRYING in line and line.startswith(f"{who}: ")]


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def service_args(command: str) -> list[str]:
    return (["serve", "--port", str(free_port()), "--backend", "interpret"]
            if command == "serve" else ["worker", "--backend", "interpret"])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", ["serve", "worker"])
def test_an_unreachable_postgresql_at_start_is_waited_for_one_line_per_attempt(
        tmp_path: Path, command: str):
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/test"  # nobody listens there
    log = tmp_path / "out.log"
    proc = start(["--db", url, *service_args(command)], log)
    try:
        lines = wait_for(lambda: (found := retry_lines(log)) and len(found) >= 2 and found,
                         proc, timeout=90)
        assert lines[0] == (f"tuner: database {url} unreachable (connection refused); "
                            "retrying in 1 s (Ctrl-C to stop)")
        assert "retrying in 2 s" in lines[1]  # the wait doubles
        assert proc.poll() is None
        if command == "serve":  # its worker, started before the database answered, waits too
            assert wait_for(lambda: retry_lines(log, "tuner worker"), proc, timeout=30)[0] == (
                f"tuner worker: database {url} unreachable (connection refused); retrying in "
                "1 s (Ctrl-C to stop)")
        assert "Traceback" not in log.read_text()
    finally:
        stop(proc)


class TcpForward:
    """Connections to a local port forwarded to ``target`` once ``open()`` is called: a
    PostgreSQL server that comes up while a process waits for it."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target, self.port = target, free_port()
        self.server = socket.socket()

    def open(self) -> None:
        self.server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.server.bind(("127.0.0.1", self.port))
        self.server.listen()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pipe, args=(a, b), daemon=True).start()

    def close(self) -> None:
        self.server.close()


def _pipe(source: socket.socket, sink: socket.socket) -> None:
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    finally:
        sink.close()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    if not POSTGRES_URL:
        pytest.skip("TUNER_TEST_POSTGRES_URL is not set")
    yield from _postgres_database()


@pytest.mark.timeout(180)
def test_a_worker_starts_once_postgresql_answers(tmp_path: Path, postgres_url: str):
    parsed = httpx.URL(postgres_url.replace("postgresql://", "http://"))
    forward = TcpForward((parsed.host, parsed.port or 5432))
    url = postgres_url.replace(f"{parsed.host}:{parsed.port}", f"127.0.0.1:{forward.port}")
    log = tmp_path / "worker.log"
    proc = start(["--db", url, "worker", "--backend", "interpret"], log)
    try:
        wait_for(lambda: retry_lines(log), proc, timeout=90)
        forward.open()
        factory = init_db(postgres_url)

        def registered() -> bool:
            with factory() as session:
                return bool(repo.list_workers(session))

        wait_for(registered, proc, timeout=120)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        assert "Traceback" not in log.read_text()
    finally:
        stop(proc)
        forward.close()


@pytest.mark.timeout(180)
def test_a_worker_waits_for_the_missing_folder_of_an_explicit_sqlite_file(tmp_path: Path):
    # a folder missing there may be a volume not mounted yet: a file created under the mount
    # point would vanish when it is mounted
    volume = tmp_path / "volume"
    log = tmp_path / "worker.log"
    proc = start(["--db", f"sqlite:///{volume / 'tuner.db'}", "worker", "--backend",
                  "interpret"], log)
    try:
        lines = wait_for(lambda: retry_lines(log), proc, timeout=90)
        assert f"({volume}: no such folder (create it, or mount the volume it is on))" in lines[0]
        volume.mkdir()
        factory = wait_for(lambda: (volume / "tuner.db").exists()
                           and init_db(f"sqlite:///{volume / 'tuner.db'}"), proc, timeout=60)

        def registered() -> bool:
            with factory() as session:
                return bool(repo.list_workers(session))

        wait_for(registered, proc, timeout=120)
        assert "Traceback" not in log.read_text()
    finally:
        stop(proc)


def test_the_default_data_folder_is_created(tmp_path: Path):
    from tuner.app.service import wait_for_database

    data = tmp_path / "new" / "data"
    wait_for_database(Settings(data_dir=data, database_url=""))
    assert (data / "tuner.db").is_file()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("command", ["serve", "worker"])
@pytest.mark.parametrize("url, says", [("not a url", "Could not parse"),
                                       ("nosuchdb://host/db", "Can't load plugin"),
                                       ("postgresql://u:secret@host:port/db", "does not parse")])
def test_a_database_url_that_can_never_work_exits_2_with_one_line(tmp_path: Path,
                                                                  command: str, url: str,
                                                                  says: str):
    done = subprocess.run([sys.executable, "-m", "tuner.app.cli", "--db", url,
                           *service_args(command)], cwd=ROOT, env=interpreter_env(),
                          capture_output=True, text=True, timeout=100)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tuner: error: database URL "), lines
    assert says in lines[0] and "secret" not in lines[0]
