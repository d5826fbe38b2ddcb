"""A stopped service leaves its SQLite file whole: what its write-ahead log held is moved into
the file, so that a copy of the file alone (a backup, a move to another machine) holds every
job. A copy of the main file of a store whose log was never checkpointed lost the last jobs
(the benchmark's ``--save`` met it: bench/NOTES.md, tuning time's seventh pass)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import httpx

from db.engine import checkpoint_sqlite, close_engine, dispose, init_db
from tests.support_processes import free_port, interpreter_env, wait_ready
from tests.support_sqlite import row_count, writer_with_rows_only_in_its_log
from tuner.client import TunerClient

JOB = {"kernel": "vector_add", "dtype": "float32", "shapes": [{"N": 1024}],
       "budget": {"trials": 2}}


def test_a_checkpoint_moves_the_log_into_the_file_while_a_writer_stays_open(tmp_path):
    db = tmp_path / "tuner.db"
    writer = writer_with_rows_only_in_its_log(db, 3)
    shutil.copy(db, tmp_path / "before.db")
    assert row_count(tmp_path / "before.db", "jobs") is None  # the file alone: no table yet

    assert checkpoint_sqlite(f"sqlite:///{db}") is True
    shutil.copy(db, tmp_path / "after.db")
    assert row_count(tmp_path / "after.db", "jobs") == 3
    assert (tmp_path / "tuner.db-wal").stat().st_size == 0  # TRUNCATE: the log emptied
    writer.close()


def test_a_checkpoint_of_what_is_not_a_sqlite_file_does_nothing(tmp_path):
    assert checkpoint_sqlite(f"sqlite:///{tmp_path / 'missing.db'}") is False
    assert not (tmp_path / "missing.db").exists()  # not created by the attempt
    assert checkpoint_sqlite("postgresql://u@127.0.0.1:1/x") is False
    assert checkpoint_sqlite("sqlite://") is False  # in memory


def test_closing_the_engine_leaves_the_file_whole_and_the_engine_usable(tmp_path):
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    factory = init_db(url)
    try:
        from db import repo

        with factory() as session:
            repo.register_worker(session, worker_id="w1", host="h", pid=1,
                                 device_key="interpret:cpu", kind="interpret",
                                 gpu_index=None, gpu_uuid=None)
            session.commit()
        close_engine(url)
        shutil.copy(tmp_path / "tuner.db", tmp_path / "copy.db")
        assert row_count(tmp_path / "copy.db", "workers") == 1
        with factory() as session:  # a new connection from the same engine
            assert [w.id for w in repo.list_workers(session)] == ["w1"]
    finally:
        dispose(url)


def test_a_stopped_serve_leaves_a_sqlite_file_that_holds_its_jobs_alone(tmp_path):
    """SIGTERM to ``tuner serve`` alone, as ``kill PID`` sends it: serve stops its workers
    itself, and the API's own connections in serve's process were the last open."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    db = f"sqlite:///{tmp_path / 'tuner.db'}"
    env = interpreter_env(TUNER_DATABASE_URL=db)
    with open(tmp_path / "serve.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tuner.app.cli", "--db", db, "serve",
                                 "--port", str(port), "--backend", "interpret", "--workers", "1",
                                 "--api-workers", "1"], cwd=tmp_path, env=env, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_ready(base, proc)
            created = httpx.post(f"{base}/api/v1/jobs", json=JOB, timeout=30)
            assert created.status_code == 202, created.text
            with TunerClient(base) as client:  # its trials and best written too
                assert client.wait(created.json()["id"], timeout=120, poll=0.2)[
                    "status"] == "succeeded"
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=90) == 0
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
    wal = tmp_path / "tuner.db-wal"
    assert not wal.exists() or wal.stat().st_size == 0
    shutil.copy(tmp_path / "tuner.db", tmp_path / "copy.db")  # the main file only
    assert row_count(tmp_path / "copy.db", "jobs") == 1
    assert row_count(tmp_path / "copy.db", "trials") == 2
