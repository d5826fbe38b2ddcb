"""A process frozen in the middle of a transaction (SIGSTOP, a debugger, a swap storm) holds up
no other (issue 28): PostgreSQL aborts the frozen transaction after
``idle_in_transaction_session_timeout`` and the others' lock waits end within ``lock_timeout``
and are tried again, so another worker's lease renewal, the reaper and a cancel go through
within seconds, and the frozen worker, resumed, writes nothing for a task no longer its. No
transaction is open while a worker loads a kernel, ranks its warm start, measures or re-times.
A cancel stops a running task within seconds, also in the middle of a long measurement or of
the finalists' re-timing.

Real processes and signals (SIGSTOP, SIGCONT), real SQLite files and a real PostgreSQL
(TUNER_TEST_POSTGRES_URL).
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, text
from sqlalchemy.exc import DBAPIError, OperationalError

from api.app import create_app
from db import repo
from db.engine import APPLICATION_NAME, init_db, make_engine, normalise_url
from db.transient import is_transient
from search_spaces import get_kernel
from tests.api_support import queue_task
from tests.conftest import POSTGRES_URL, _postgres_database
from tests.support_processes import ROOT, interpreter_env, wait_for
from tuner.settings import DatabaseBounds, Settings

TABLE = ROOT / "tests/data/replay/matmul_4096x4096x4096_float16_h200.json"
SHAPE = {"M": 4096, "N": 4096, "K": 4096}
#: the service's bounds, made short: a frozen transaction is aborted 2 s after it froze
BOUNDS = DatabaseBounds(lock_timeout_s=1.0, idle_in_transaction_s=2.0)
#: what "within a bound" means below: well under the 60 s a frozen holder cost before
WITHIN_S = 10.0


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh PostgreSQL database (frozen lock holders are PostgreSQL's to break: a SQLite
    file's writer holds its lock until it resumes or dies)."""
    if not POSTGRES_URL:
        pytest.skip("TUNER_TEST_POSTGRES_URL is not set (scripts/test.sh sets it when a "
                    "PostgreSQL server answers)")
    yield from _postgres_database()


@pytest.fixture(autouse=True)
def _searches_run_their_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    # the "no expected gain" stop off: every search measures its whole budget
    monkeypatch.setenv("TUNER_STOP_CHANCE", "0")


def _admin(url: str) -> Any:
    """An engine of the test's own (not the service's: another application_name, no bounds)."""
    return create_engine(normalise_url(url), connect_args={"application_name": "tuner-test"})


# -- 1. the bounds: on every connection, settings, and their errors pass ---------------------

def test_every_postgresql_connection_carries_the_server_bounds(postgres_url: str,
                                                               monkeypatch: pytest.MonkeyPatch):
    factory = init_db(postgres_url, bounds=DatabaseBounds(1.5, 2.5))
    with factory() as session:
        assert session.execute(text("SHOW lock_timeout")).scalar_one() == "1500ms"
        assert session.execute(text("SHOW idle_in_transaction_session_timeout")
                               ).scalar_one() == "2500ms"
    # the URL's own options win (an operator's choice), the other bound stays
    engine = make_engine(f"{postgres_url}?options=-c%20lock_timeout%3D0")
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SHOW lock_timeout")).scalar_one() == "0"
            assert conn.execute(text("SHOW idle_in_transaction_session_timeout")
                                ).scalar_one() == "10s"
    finally:
        engine.dispose()
    assert Settings().database_bounds == DatabaseBounds(5.0, 10.0)
    monkeypatch.setenv("TUNER_DB_LOCK_TIMEOUT_S", "0.25")
    monkeypatch.setenv("TUNER_DB_IDLE_IN_TRANSACTION_S", "0")
    assert Settings().database_bounds == DatabaseBounds(0.25, 0.0)


def test_a_lock_timeout_and_an_aborted_idle_transaction_are_transient(postgres_url: str):
    factory = init_db(postgres_url, bounds=DatabaseBounds(0.3, 0.5))
    task_id = queue_task(factory, SHAPE, 4, backend="replay", force=True, started_by="w1")
    admin = _admin(postgres_url)
    try:
        with admin.connect() as holder:  # a row lock that outlasts the lock timeout
            holder.execute(text("UPDATE tasks SET error = 'held' WHERE id = :id"),
                           {"id": task_id})
            with factory() as session, pytest.raises(OperationalError) as waited:
                repo.renew_lease(session, task_id, "w1", 60)
            holder.rollback()
        assert waited.value.orig.sqlstate == "55P03", waited.value  # type: ignore[union-attr]
        assert is_transient(waited.value)
        with factory() as session:  # this process is the one that went silent
            repo.get_task(session, task_id)
            time.sleep(1.5)
            with pytest.raises(DBAPIError) as aborted:
                session.execute(text("SELECT 1"))
        assert aborted.value.orig.sqlstate == "25P03", aborted.value  # type: ignore[union-attr]
        assert is_transient(aborted.value)
    finally:
        admin.dispose()


def test_migrations_wait_for_another_process_migrating_past_the_lock_timeout(
        postgres_url: str):
    admin = _admin(postgres_url)
    try:
        with admin.connect() as other:  # another process migrating for 2 s (the lock's key:
            # db/migrations/env.py's MIGRATION_LOCK_KEY, which only Alembic may import)
            other.execute(text("SELECT pg_advisory_xact_lock(:key)"),
                          {"key": 0x74756E6572206462})
            threading.Timer(2.0, other.rollback).start()
            started = time.monotonic()
            init_db(postgres_url, bounds=DatabaseBounds(0.2, 10.0))
            assert time.monotonic() - started >= 1.5
    finally:
        admin.dispose()


# -- 2. no transaction open while a worker loads, computes or measures ------------------------

class TransactionProbe:
    """What another connection sees at a moment of the worker's: on SQLite whether the write
    lock is free (``BEGIN IMMEDIATE``, not waiting), on PostgreSQL the service's connections
    with a transaction open. ``seen``: moment -> what was open (empty: nothing)."""

    def __init__(self, url: str) -> None:
        self.url, self.seen = url, {}
        self.admin = None if url.startswith("sqlite") else _admin(url)

    def __call__(self, moment: str) -> None:
        self.seen.setdefault(moment, []).extend(self.open_transactions())

    def open_transactions(self) -> list[str]:
        if self.admin is None:
            conn = sqlite3.connect(self.url.removeprefix("sqlite:///"), timeout=0,
                                   isolation_level=None)
            try:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("ROLLBACK")
                return []
            except sqlite3.OperationalError as exc:
                return [f"the write lock is held ({exc})"]
            finally:
                conn.close()
        with self.admin.connect() as conn:
            rows = conn.execute(text(
                "SELECT state, now() - xact_start FROM pg_stat_activity WHERE datname = "
                "current_database() AND application_name = :name AND xact_start IS NOT NULL"),
                {"name": APPLICATION_NAME}).all()
        return [f"{state} for {age}" for state, age in rows]


@pytest.mark.timeout(120)
def test_no_transaction_is_open_while_a_worker_loads_ranks_measures_or_retimes(
        any_db_url: str, monkeypatch: pytest.MonkeyPatch):
    from search_spaces import get_kernel
    from tuner.app import worker
    from tuner.backends.replay import ReplayBackend, load_table

    # the cancel check's reads (one short transaction a second) would race with the probe
    monkeypatch.setattr(worker, "CANCEL_POLL_S", 3600.0)
    probe = TransactionProbe(any_db_url)

    class Probed(ReplayBackend):
        def restrict(self, space: Any) -> Any:
            probe("restricting the space")
            return super().restrict(space)

        def measure(self, configs: Any, on_result: Any = None) -> Any:
            probe("measuring")
            return super().measure(configs, on_result)

        def retime(self, configs: Any, rounds: int, baseline: bool = False) -> Any:
            probe("re-timing")
            return super().retime(configs, rounds, baseline)

    def probed(moment: str, fn: Any) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            probe(moment)
            return fn(*args, **kwargs)
        return call

    monkeypatch.setattr(worker, "get_kernel", probed("loading the kernel", get_kernel))
    monkeypatch.setattr(worker, "known_good_first",
                        probed("ranking the warm start", worker.known_good_first))
    factory = init_db(any_db_url)
    task_id = queue_task(factory, SHAPE, 6, backend="replay", force=True)
    with factory() as session:
        assert repo.claim_task(session, worker_id="w1", device_key="x", lease_seconds=60)
        session.commit()
    try:
        outcome = worker.execute_task(factory, task_id, backend_kind="replay", worker_id="w1",
                                      backend=Probed(load_table(TABLE)))
    finally:
        if probe.admin is not None:
            probe.admin.dispose()
    assert outcome.status == "succeeded", outcome.error
    assert set(probe.seen) == {"loading the kernel", "restricting the space",
                               "ranking the warm start", "measuring", "re-timing"}
    assert all(open_ == [] for open_ in probe.seen.values()), probe.seen


# -- 3. a worker frozen inside its write transaction (PostgreSQL) -----------------------------

#: a worker that stores trials of ``task`` on the replay backend and stops itself (SIGSTOP)
#: right after trial ``freeze_at``'s UPDATE of its task row and INSERT, before their commit
_FROZEN = """
import os, signal, sys
from db import repo
from db.engine import init_db
from tuner.app import worker
from tuner.backends.replay import load_table
from tuner.settings import DatabaseBounds

url, task_id, worker_id, freeze_at, table = sys.argv[1:6]
record = repo.record_trial

def record_then_freeze(session, task_id, number, measurement, **kwargs):
    trial = record(session, task_id, number, measurement, **kwargs)
    if number == int(freeze_at):
        print("frozen", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
    return trial

repo.record_trial = record_then_freeze
outcome = worker.execute_task(init_db(url, bounds=DatabaseBounds(1.0, 2.0)), int(task_id),
                              backend_kind="replay", worker_id=worker_id,
                              replay_table=load_table(table))
print("outcome", outcome.status, flush=True)
"""
FREEZE_AT = 3


def _state(pid: int) -> str:
    """The process's state letter (T: stopped)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def _two_task_job(factory: Any) -> tuple[str, int, int]:
    """A job of two shapes: its first task leased to w1 for 1 s (expired by the time w1
    freezes: nothing renews it), the second to w2 for an hour."""
    with factory() as session:
        job = repo.create_job(session, kernel="matmul",
                              kernel_version=get_kernel("matmul").version, dtype="float16",
                              shapes=[SHAPE, {"M": 2048, "N": 2048, "K": 2048}],
                              budget_trials=10, budget_seconds=None, strategy="auto",
                              force=True, seed=0, backend="replay", device_key=None)
        first = repo.claim_task(session, worker_id="w1", device_key="x", lease_seconds=1)
        second = repo.claim_task(session, worker_id="w2", device_key="x", lease_seconds=3600)
        assert first is not None and second is not None
        session.commit()
        return job.id, first.id, second.id


class Frozen:
    """The ``_FROZEN`` worker for ``task_id``, stopped inside its transaction."""

    def __init__(self, url: str, task_id: int, log: Path) -> None:
        self.log = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _FROZEN, url, str(task_id), "w1", str(FREEZE_AT),
                 str(TABLE)], cwd=ROOT, env=interpreter_env(TUNER_STOP_CHANCE="0"),
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        wait_for(lambda: "frozen" in log.read_text() and _state(self.proc.pid) == "T",
                 self.proc, timeout=120)

    def resume(self) -> str:
        """SIGCONT, and what it ended with (``outcome <status>``)."""
        os.kill(self.proc.pid, signal.SIGCONT)
        self.proc.wait(timeout=90)
        printed = self.log.read_text()
        assert self.proc.returncode == 0, printed
        return printed.splitlines()[-1]

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)  # stopped or not
            self.proc.wait(timeout=30)


def _assert_wrote_nothing_after_freezing(factory: Any, task_id: int) -> Any:
    with factory() as session:
        task = repo.get_task(session, task_id)
        trials = repo.trials_for_task(session, task_id)
    assert [t.number for t in trials] == list(range(1, FREEZE_AT)) == list(
        range(1, task.trials_done + 1))
    assert task.lease_owner is None and task.best_note is None
    return task


def _within(seconds: float, work: Any) -> tuple[Any, float]:
    """``work()`` in a thread: its result and how long it took; fails after ``seconds`` (the
    thread is left to finish once the frozen process is gone)."""
    box: dict[str, Any] = {}

    def run() -> None:
        started = time.monotonic()
        try:
            box["value"] = work()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            box["error"] = exc
        box["took"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {seconds:.0f} s"
    if "error" in box:
        raise box["error"]
    return box["value"], box["took"]


@pytest.mark.timeout(240)
def test_a_frozen_worker_holds_up_neither_lease_renewals_nor_the_reaper(postgres_url: str,
                                                                        tmp_path: Path):
    from tuner.app.worker import reap_forever

    factory = init_db(postgres_url, bounds=BOUNDS)
    _job_id, frozen_task, other_task = _two_task_job(factory)
    frozen = Frozen(postgres_url, frozen_task, tmp_path / "frozen.log")
    stopping = threading.Event()
    try:
        def renew() -> bool:  # the other worker's heartbeat, on the same job
            with factory() as session:
                ours = repo.renew_lease(session, other_task, "w2", 3600)
                session.commit()
                return ours

        ours, took = _within(WITHIN_S, renew)
        assert ours and took < 3.0

        def status() -> str:
            with factory() as session:
                return repo.get_task(session, frozen_task).status

        # the reaper (every 0.2 s) re-queues the frozen worker's task, whose lease expired:
        # it waits at most a lock timeout per pass until the server aborts the frozen
        # transaction, 2 s after it froze
        threading.Thread(target=reap_forever, args=(factory, 0.2, stopping),
                         daemon=True).start()
        wait_for(lambda: status() == "queued", None, timeout=WITHIN_S)
        stopping.set()
        # resumed, its commit finds its connection closed; tried again, its write is fenced
        assert frozen.resume() == "outcome lost"
    finally:
        stopping.set()
        frozen.kill()
    task = _assert_wrote_nothing_after_freezing(factory, frozen_task)
    assert (task.status, task.requeues) == ("queued", 1)
    with factory() as session:
        assert repo.get_task(session, other_task).lease_owner == "w2"


@pytest.mark.timeout(240)
def test_a_cancel_returns_within_seconds_of_a_frozen_worker_and_it_then_writes_nothing(
        postgres_url: str, tmp_path: Path):
    factory = init_db(postgres_url, bounds=BOUNDS)
    job_id, frozen_task, other_task = _two_task_job(factory)
    settings = Settings(database_url=postgres_url, db_lock_timeout_s=BOUNDS.lock_timeout_s,
                        db_idle_in_transaction_s=BOUNDS.idle_in_transaction_s,
                        dispatch="embedded")
    with TestClient(create_app(settings)) as client:
        frozen = Frozen(postgres_url, frozen_task, tmp_path / "frozen.log")
        try:
            answer, took = _within(WITHIN_S,
                                   lambda: client.post(f"/api/v1/jobs/{job_id}/cancel"))
            assert answer.status_code == 200, answer.text
            assert answer.json()["status"] == "cancelled"
            assert [t["status"] for t in answer.json()["tasks"]] == ["cancelled"] * 2
            assert took < WITHIN_S
            assert frozen.resume() == "outcome cancelled"
        finally:
            frozen.kill()
    task = _assert_wrote_nothing_after_freezing(factory, frozen_task)
    assert task.status == "cancelled"
    with factory() as session:
        assert repo.get_task(session, other_task).status == "cancelled"
        assert repo.get_job(session, job_id).status == "cancelled"


# -- 4. a cancel stops a running task within seconds -----------------------------------------

def test_a_search_cancelled_between_batches_ends_without_retiming_its_finalists():
    from tuner.backends.replay import ReplayBackend, load_table
    from tuner.search import SearchOptions, run_search

    retimed: list[int] = []

    class Counted(ReplayBackend):
        def retime(self, configs: Any, rounds: int, baseline: bool = False) -> Any:
            retimed.append(len(configs))
            return super().retime(configs, rounds, baseline)

    stored: list[Any] = []
    result = run_search(get_kernel("matmul"), SHAPE, "float16", Counted(load_table(TABLE)),
                        SearchOptions(trials=10, batch_size=1),
                        on_trial=lambda _n, m: stored.append(m),
                        should_stop=lambda: len(stored) >= 3)
    assert (result.stop_reason, len(result.trials), retimed) == ("cancelled", 3, [])
    fastest = min((m for m in stored if m.ok), key=lambda m: m.p50_ms)
    assert result.best == fastest and result.best.extra["measured"] == "trial"


#: a worker (as ``tuner worker`` runs one) claiming one task of the sleepy kernel on the
#: interpreter; it prints how the task ended. With a second argument, as a dispatcher's worker
#: runs it: the task handed over, the dispatcher's abort signal that file's existence
_SLEEPY_WORKER = """
import os, sys
from db import repo
from db.engine import init_db
from tests.fakes.faulty import SLEEPY
from tuner.app import worker

worker.get_kernel = lambda name: SLEEPY
factory = init_db(sys.argv[1])
w = worker.Worker(factory, backend_kind="interpret", device_key="interpret:cpu", name="w1")
if len(sys.argv) > 2:
    with factory() as session:
        task = repo.claim_task(session, worker_id=w.id, device_key=w.device_key,
                               lease_seconds=w.lease_seconds)
        session.commit()
    outcome = w.run_claimed(task.id, abort=lambda: os.path.exists(sys.argv[2]))
else:
    outcome = w.run_once()
print("outcome", outcome.status, flush=True)
"""
#: how soon a cancelled task must have stopped (the worker checks every second)
STOPPED_WITHIN_S = 10.0


def _sleepy_task(factory: Any, trials: int) -> int:
    from tests.fakes.faulty import SLEEPY

    return queue_task(factory, {"N": 64}, trials, kernel=SLEEPY.name, version=SLEEPY.version,
                      dtype="float32", strategy="exhaustive", force=True)


def _cancel_and_time_the_stop(factory: Any, task_id: int, proc: Any, log: Path,
                              abort: Path | None = None) -> float:
    """Cancel the task's job (then, with ``abort``, signal the dispatcher's abort, as the
    API's cancel does) and wait for the worker's outcome: how long that took."""
    with factory() as session:
        repo.cancel_job(session, repo.get_task(session, task_id).job_id)
        session.commit()
    if abort is not None:
        abort.touch()
    cancelled = time.monotonic()
    deadline = cancelled + STOPPED_WITHIN_S
    while "outcome" not in log.read_text():
        assert time.monotonic() < deadline, (
            f"the task did not stop within {STOPPED_WITHIN_S:.0f} s of its cancel")
        time.sleep(0.05)
    took = time.monotonic() - cancelled
    assert proc.wait(timeout=60) == 0
    assert log.read_text().splitlines()[-1] == "outcome cancelled"
    return took


def _start_sleepy(url: str, tmp_path: Path, launch_s: float,
                  abort: Path | None = None) -> tuple[Any, Path, Path]:
    log, mark = tmp_path / "worker.log", tmp_path / "launched"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-c", _SLEEPY_WORKER, url, *([str(abort)] if abort else [])],
            cwd=ROOT,
            env=interpreter_env(FAKE_LAUNCH_S=str(launch_s), FAKE_LAUNCH_MARK=str(mark),
                                TUNER_STOP_CHANCE="0"),
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, log, mark


def _kill(proc: Any) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("dispatched", [False, True], ids=["claimed", "dispatched"])
def test_a_cancel_stops_a_task_in_the_middle_of_a_long_measurement(any_db_url: str,
                                                                   tmp_path: Path,
                                                                   dispatched: bool):
    factory = init_db(any_db_url)
    task_id = _sleepy_task(factory, trials=4)
    abort = tmp_path / "abort" if dispatched else None
    # every launch takes 10 minutes: the first trial's is in flight when the job is cancelled
    proc, log, mark = _start_sleepy(any_db_url, tmp_path, launch_s=600, abort=abort)
    try:
        wait_for(mark.exists, proc, timeout=180)
        took = _cancel_and_time_the_stop(factory, task_id, proc, log, abort)
    finally:
        _kill(proc)
    assert took < STOPPED_WITHIN_S
    with factory() as session:
        task = repo.get_task(session, task_id)
        assert (task.status, task.trials_done, task.lease_owner) == ("cancelled", 0, None)


@pytest.mark.timeout(300)
def test_a_cancel_stops_a_task_in_the_middle_of_the_finalists_retiming(any_db_url: str,
                                                                       tmp_path: Path):
    factory = init_db(any_db_url)
    task_id = _sleepy_task(factory, trials=2)
    # launches of 1 s: a trial takes about 4 s, the re-timing of the two finalists 30 s
    proc, log, _mark = _start_sleepy(any_db_url, tmp_path, launch_s=1.0)

    def trials_done() -> int:
        with factory() as session:
            return repo.get_task(session, task_id).trials_done

    try:
        wait_for(lambda: trials_done() == 2, proc, timeout=180)
        took = _cancel_and_time_the_stop(factory, task_id, proc, log)
    finally:
        _kill(proc)
    assert took < STOPPED_WITHIN_S
    with factory() as session:
        task = repo.get_task(session, task_id)
        assert (task.status, task.trials_done, task.best_measured) == ("cancelled", 2, "trial")
