"""A database that fails for a moment loses no work: a worker whose PostgreSQL connection is
terminated, or whose SQLite writes meet a lock held past the busy timeout, retries and finishes
its task; one that cannot reach the database for the whole retry window gives its task back to
the queue, never fails it; a database error that does fail a task reads as a sentence. And a
task that gives up for good keeps its fastest verified trial as the stored best.

Real databases throughout: the connection is terminated with ``pg_terminate_backend`` from
another connection, the SQLite lock is a ``BEGIN IMMEDIATE`` of another connection."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.exc import IntegrityError, OperationalError

from db import engine as db_engine
from db import repo
from db.engine import APPLICATION_NAME, init_db, normalise_url
from db.models import utcnow
from db.transient import backoff_delays, describe, is_transient
from tests.api_support import queue_task
from tests.support_processes import ROOT

TABLE = ROOT / "tests/data/replay/matmul_4096x4096x4096_float16_h200.json"
SHAPE = {"M": 4096, "N": 4096, "K": 4096}
TRIALS = 10


@pytest.fixture(autouse=True)
def _searches_run_their_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    # the "no expected gain" stop off: every search measures its whole budget
    monkeypatch.setenv("TUNER_STOP_CHANCE", "0")


def _claimed_task(factory: Any, worker: str = "w1") -> int:
    task_id = queue_task(factory, SHAPE, TRIALS, backend="replay", force=True)
    with factory() as session:
        assert repo.claim_task(session, worker_id=worker, device_key="x", lease_seconds=60)
        session.commit()
    return task_id


def _run(factory: Any, task_id: int, worker: str = "w1", **kwargs: Any) -> Any:
    from tuner.app.worker import execute_task
    from tuner.backends.replay import load_table

    return execute_task(factory, task_id, backend_kind="replay", worker_id=worker,
                        replay_table=load_table(TABLE), **kwargs)


def _assert_finished_with_every_trial(factory: Any, task_id: int) -> None:
    with factory() as session:
        task = repo.get_task(session, task_id)
        trials = repo.trials_for_task(session, task_id)
        assert (task.status, task.error) == ("succeeded", None)
        assert [t.number for t in trials] == list(range(1, TRIALS + 1)) == list(
            range(1, task.trials_done + 1))
        assert repo.get_job(session, task.job_id).status == "succeeded"
        [best] = repo.list_best(session, kernel="matmul")
        assert best.task_id == task_id


# -- a connection terminated mid-search (PostgreSQL) ------------------------------------------

@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database: terminating a server connection is PostgreSQL's (SQLite's
    fault is the lock below)."""
    from tests.conftest import POSTGRES_URL, _postgres_database

    if not POSTGRES_URL:
        pytest.skip("TUNER_TEST_POSTGRES_URL is not set (scripts/test.sh sets it when a "
                    "PostgreSQL server answers)")
    yield from _postgres_database()


def _bind(factory: Any) -> Engine:
    return factory.kw["bind"]


class Terminator:
    """Terminates the worker's connection (found by its ``application_name``, in a
    transaction) just before it sends a write that starts with ``statement``, at the given
    occurrences of that write."""

    def __init__(self, url: str, statement: str, at: set[int]) -> None:
        self.admin = create_engine(normalise_url(url),
                                   connect_args={"application_name": "tuner-test"})
        self.statement, self.at, self.seen, self.killed = statement, at, 0, 0

    def __call__(self, _conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if not statement.startswith(self.statement):
            return
        self.seen += 1
        if self.seen not in self.at:
            return
        with self.admin.connect() as conn:
            pids = conn.execute(text(
                "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND "
                "application_name = :name AND state = 'idle in transaction'"),
                {"name": APPLICATION_NAME}).scalars().all()
            assert len(pids) == 1, pids  # the worker's, between its UPDATE and this INSERT
            # the second argument waits (ms) until the backend is gone
            assert conn.execute(text("SELECT pg_terminate_backend(:pid, 5000)"),
                                {"pid": pids[0]}).scalar_one()
        self.killed += 1


@pytest.mark.timeout(120)
def test_a_terminated_postgres_connection_mid_search_loses_no_trial(postgres_url: str):
    factory = init_db(postgres_url)
    task_id = _claimed_task(factory)
    terminator = Terminator(postgres_url, "INSERT INTO trials", at={3, 8})
    event.listen(_bind(factory), "before_cursor_execute", terminator)
    try:
        outcome = _run(factory, task_id)
    finally:
        event.remove(_bind(factory), "before_cursor_execute", terminator)
        terminator.admin.dispose()
    assert terminator.killed == 2
    assert (outcome.status, outcome.error) == ("succeeded", None)
    _assert_finished_with_every_trial(factory, task_id)


# -- a SQLite write lock held past the busy timeout -----------------------------------------

@pytest.fixture
def sqlite_url(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A SQLite file whose connections give up waiting for the write lock after 1 s (30 s in
    the service), so that a lock held a few seconds raises "database is locked"."""
    monkeypatch.setattr(db_engine, "SQLITE_BUSY_TIMEOUT_S", 1)
    url = f"sqlite:///{tmp_path / 'locked.db'}"
    yield url
    db_engine.dispose(url)


class WriteLock:
    """An ``on_trial`` that, once trial ``trial`` is stored, takes the database's write lock
    from another connection and holds it ``seconds`` (``released`` is set after)."""

    def __init__(self, url: str, trial: int, seconds: float) -> None:
        self.path, self.trial, self.seconds = url.removeprefix("sqlite:///"), trial, seconds
        self.released = threading.Event()

    def __call__(self, number: int, _m: Any) -> None:
        if number != self.trial:
            return
        holder = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        holder.execute("BEGIN IMMEDIATE")

        def release() -> None:
            holder.rollback()
            holder.close()
            self.released.set()

        threading.Timer(self.seconds, release).start()


@pytest.mark.timeout(120)
def test_a_sqlite_lock_held_past_the_busy_timeout_loses_no_trial(sqlite_url: str):
    factory = init_db(sqlite_url)
    task_id = _claimed_task(factory)
    # trial 4's write waits 1 s, fails, and is tried again after 1 s and 2 s: the lock is gone
    outcome = _run(factory, task_id, on_trial=WriteLock(sqlite_url, trial=3, seconds=3.0))
    assert (outcome.status, outcome.error) == ("succeeded", None)
    _assert_finished_with_every_trial(factory, task_id)


@pytest.mark.timeout(120)
def test_a_database_unreachable_past_the_retry_window_requeues_the_task_not_fails_it(
        sqlite_url: str, monkeypatch: pytest.MonkeyPatch):
    factory = init_db(sqlite_url)
    task_id = _claimed_task(factory)
    monkeypatch.setenv("TUNER_DB_RETRY_SECONDS", "0.5")
    # 4 tries of 1 s each and 0.5 s of waits, then the release (1 s, refused too): the lock
    # outlasts them all, so the task is left to its lease's expiry
    lock = WriteLock(sqlite_url, trial=3, seconds=8.0)
    outcome = _run(factory, task_id, on_trial=lock)
    assert lock.released.wait(30)
    assert outcome.status == "requeued"
    assert outcome.error is not None and outcome.error.startswith(
        "the database was unreachable for ")
    assert outcome.error.endswith(" s while storing trial 4; the task was requeued")
    with factory() as session:
        task = repo.get_task(session, task_id)
        assert (task.status, task.trials_done) == ("running", 3)
        # its worker is gone: the reaper re-queues it, without using an attempt
        assert repo.reap_expired(session, now=utcnow() + timedelta(seconds=120)) == 1
        session.commit()
        session.refresh(task)
        assert (task.status, task.attempts, task.requeues) == ("queued", 0, 1)
        assert repo.claim_task(session, worker_id="w2", device_key="x", lease_seconds=60)
        session.commit()
    monkeypatch.delenv("TUNER_DB_RETRY_SECONDS")
    assert _run(factory, task_id, worker="w2").status == "succeeded"
    _assert_finished_with_every_trial(factory, task_id)


def test_a_released_task_says_why_in_a_sentence(any_db_url: str):
    factory = init_db(any_db_url)
    task_id = _claimed_task(factory)
    why = "the database was unreachable for 60 s while storing trial 31; the task was requeued"
    with factory() as session:
        assert repo.release_task(session, task_id, "w1", why)
        session.commit()
        task = repo.get_task(session, task_id)
        assert (task.status, task.error, task.attempts, task.requeues) == ("queued", why, 0, 1)


# -- what a database error that fails a task reads like -------------------------------------

_STATEMENT = ("INSERT INTO trials (task_id, number, config, config_key, outcome, p20_ms, "
              "p50_ms, p80_ms, error, compile_s) VALUES (%(task_id)s, %(number)s, ...)")


def test_a_database_error_that_fails_a_task_reads_as_a_sentence_not_sql(
        any_db_url: str, monkeypatch: pytest.MonkeyPatch):
    from tuner.app import worker

    def refused(*_args: Any, **_kwargs: Any) -> Any:
        raise IntegrityError(_STATEMENT, {"task_id": 1, "number": 1, "config": "x" * 900},
                             Exception('duplicate key value violates unique constraint '
                                       '"uq_trial_task_number"\nDETAIL: Key exists.'))

    factory = init_db(any_db_url)
    task_id = _claimed_task(factory)
    monkeypatch.setattr(worker.repo, "record_trial", refused)
    assert _run(factory, task_id).status == "failed"
    with factory() as session:
        task = repo.get_task(session, task_id)
        job = repo.get_job(session, task.job_id)
    for error in (task.error or "", job.error or ""):
        assert "INSERT" not in error and "\n" not in error and len(error) < 300
        assert "the database refused the work while running the task" in error
        assert 'unique constraint "uq_trial_task_number"' in error


@pytest.mark.parametrize(("message", "transient"), [
    ("database is locked", True),
    ("could not serialize access due to concurrent update", True),
    ("server closed the connection unexpectedly", True),
    ("no such table: trials", False),
    ('duplicate key value violates unique constraint "uq_trial_task_number"', False),
])
def test_errors_that_pass_are_told_apart_from_those_that_do_not(message: str, transient: bool):
    assert is_transient(OperationalError("SELECT 1", {}, Exception(message))) is transient
    assert "SELECT" not in describe(OperationalError("SELECT 1", {}, Exception(message)))


def test_the_retry_window_is_a_few_doubling_waits_adding_up_to_it():
    assert backoff_delays(60) == (1, 2, 4, 8, 16, 29)
    assert backoff_delays(0) == ()
    assert sum(backoff_delays(0.5)) == pytest.approx(0.5) and len(backoff_delays(0.5)) >= 3


# -- a task that gives up for good keeps what it verified ------------------------------------

def test_a_task_that_fails_for_good_keeps_its_fastest_verified_trial_as_the_stored_best(
        any_db_url: str):
    factory = init_db(any_db_url)
    task_id = _claimed_task(factory)

    def broken(number: int, _m: Any) -> None:
        if number == 5:
            raise RuntimeError("the measuring host lost its GPU")

    assert _run(factory, task_id, on_trial=broken).status == "failed"
    with factory() as session:
        task = repo.get_task(session, task_id)
        trials = repo.trials_for_task(session, task_id)
        fastest = min((t for t in trials if t.outcome == "ok"), key=lambda t: t.p50_ms)
        [best] = repo.list_best(session, kernel="matmul")
    assert task.status == "failed" and "lost its GPU" in (task.error or "")
    assert (best.config, best.p50_ms, best.measured, best.task_id) == (
        fastest.config, fastest.p50_ms, "trial", task_id)
    assert "the task gave up: stored its fastest verified trial" in (task.best_note or "")


def test_a_transient_driver_error_of_another_class_is_a_503_not_a_500(tmp_path):
    """PostgreSQL aborts a transaction left idle past idle_in_transaction_session_timeout
    (SQLSTATE 25P03), which psycopg raises as an InternalError, not an OperationalError: the
    API answers it 503 like any unavailable database; another driver error stays a 500."""
    import psycopg
    from fastapi.testclient import TestClient
    from sqlalchemy.exc import InternalError, ProgrammingError

    from api.app import create_app
    from tuner.settings import Settings

    app = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'x.db'}"))

    @app.get("/boom/{kind}")
    def boom(kind: str) -> None:
        if kind == "idle":
            raise InternalError("SELECT 1", {}, psycopg.errors.IdleInTransactionSessionTimeout(
                "terminating connection due to idle-in-transaction timeout"))
        raise ProgrammingError("SELECT nope", {}, psycopg.errors.UndefinedColumn("no nope"))

    with TestClient(app, raise_server_exceptions=False) as client:
        idle = client.get("/boom/idle")
        assert idle.status_code == 503 and idle.json()["detail"][0]["loc"] == ["database"]
        assert client.get("/boom/other").status_code == 500
