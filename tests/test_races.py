"""Races between transactions, on a real SQLite file and a real PostgreSQL database (READ
COMMITTED): the last tasks of a job finished at once, identical submissions at once (through the
repository and over HTTP), a worker that lost its lease, concurrent trial counters.

Two transactions overlap like this: the first makes its change and stays open; the second runs
in a thread and either finishes or blocks on a lock the first holds (PostgreSQL: a row lock,
seen in ``pg_stat_activity``; SQLite: the database's write lock, taken by its first write); only
then does the first commit."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import httpx
import pytest
from alembic import command
from sqlalchemy import event, inspect, select, text, update
from sqlalchemy.orm import Session, sessionmaker

from db import repo
from db.engine import alembic_config, init_db, make_engine
from db.models import Job, Task, utcnow
from tests.api_support import JOB, running_app
from tuner.settings import Settings

SHAPES = [{"M": 16, "N": 16, "K": 16}, {"M": 32, "N": 32, "K": 32}]
DEVICE = "cuda:NVIDIA H200:sm90"
FIELDS: dict[str, Any] = dict(kernel="matmul", kernel_version="v1", dtype="float16",
                              shapes=SHAPES, budget_trials=8, budget_seconds=None,
                              strategy="auto", force=False, seed=0, backend="auto",
                              device_key=None)


def new_job(factory: sessionmaker[Session], **overrides: Any) -> Job:
    with factory() as s:
        job = repo.create_job(s, **{**FIELDS, **overrides})
        s.commit()
        return job


def claim(factory: sessionmaker[Session], worker: str, lease_seconds: float = 60) -> Task:
    with factory() as s:
        task = repo.claim_task(s, worker_id=worker, device_key=DEVICE,
                               lease_seconds=lease_seconds)
        s.commit()
    assert task is not None
    return task


def job_status(factory: sessionmaker[Session], job_id: str) -> str:
    with factory() as s:
        return repo.get_job(s, job_id).status


# -- two overlapping transactions -------------------------------------------------------------

class Second:
    """The second transaction, run in a thread: it records its PostgreSQL backend's pid (or,
    on SQLite, that it reached its first write) so the test can see it blocked."""

    def __init__(self, factory: sessionmaker[Session],
                 work: Callable[[Session], None]) -> None:
        self.factory, self.work = factory, work
        self.pid: int | None = None
        self.writing = threading.Event()
        self.ready, self.done = threading.Event(), threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run)

    def _run(self) -> None:
        try:
            with self.factory() as s:
                conn = s.connection()
                if conn.dialect.name == "postgresql":
                    self.pid = int(conn.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())
                else:
                    event.listen(conn, "before_cursor_execute", self._before)
                self.ready.set()
                self.work(s)
                s.commit()
        except BaseException as error:  # noqa: BLE001 (re-raised by the test's thread)
            self.error = error
        finally:
            self.ready.set()
            self.done.set()

    def _before(self, _conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if statement.lstrip().upper().startswith(("INSERT", "UPDATE", "DELETE", "BEGIN")):
            self.writing.set()

    def blocked(self, probe: Session) -> bool:
        if self.pid is None:
            return self.writing.is_set()
        waiting = probe.execute(text("SELECT count(*) FROM pg_stat_activity WHERE pid = :pid "
                                     "AND wait_event_type = 'Lock'"), {"pid": self.pid})
        return waiting.scalar_one() > 0

    def start_and_wait_until_blocked_or_done(self, probe: Session) -> None:
        self.thread.start()
        assert self.ready.wait(30)
        deadline = time.monotonic() + 30
        while not (self.done.is_set() or self.blocked(probe)):
            assert time.monotonic() < deadline, "the second transaction neither ran nor blocked"
            time.sleep(0.01)

    def join(self) -> None:
        self.thread.join(60)
        assert not self.thread.is_alive()
        if self.error is not None:
            raise self.error


def overlap(factory: sessionmaker[Session], first: Callable[[Session], None],
            second: Callable[[Session], None]) -> None:
    """``first`` in an open transaction, then ``second`` in another (blocking or not), then
    the first commits, then the second."""
    with factory() as s, factory() as probe:
        first(s)
        other = Second(factory, second)
        other.start_and_wait_until_blocked_or_done(probe)
        probe.rollback()
        s.commit()
    other.join()


def finisher(task_id: int, worker: str, status: str = "succeeded") -> Callable[[Session], None]:
    def finish(s: Session) -> None:
        repo.finish_task(s, task_id, status, worker_id=worker)
    return finish


def test_the_last_two_tasks_finished_in_overlapping_transactions_settle_the_job(any_db_url):
    factory = init_db(any_db_url)
    job = new_job(factory)
    first, second = claim(factory, "w1"), claim(factory, "w2")
    overlap(factory, finisher(first.id, "w1"), finisher(second.id, "w2"))
    assert job_status(factory, job.id) == "succeeded"


def test_a_reaped_last_requeue_and_a_finish_in_overlapping_transactions_settle_the_job(
        any_db_url):
    factory = init_db(any_db_url)
    job = new_job(factory)
    dying, finished = claim(factory, "dying", lease_seconds=1), claim(factory, "w2")
    with factory() as s:
        s.execute(update(Task).where(Task.id == dying.id)
                  .values(requeues=repo.MAX_REQUEUES - 1))
        s.commit()

    def reap(s: Session) -> None:
        assert repo.reap_expired(s, now=utcnow() + timedelta(seconds=30)) == 1

    overlap(factory, reap, finisher(finished.id, "w2"))
    assert job_status(factory, job.id) == "failed"


def test_a_finish_and_a_cancel_in_overlapping_transactions_leave_the_job_cancelled(any_db_url):
    factory = init_db(any_db_url)
    job = new_job(factory)
    first, second = claim(factory, "w1"), claim(factory, "w2")

    def cancel(s: Session) -> None:
        repo.cancel_job(s, job.id)

    overlap(factory, finisher(first.id, "w1"), cancel)
    with factory() as s:
        after = repo.get_job(s, job.id)
        assert after.status == "cancelled"
        assert {t.id: t.status for t in after.tasks} == {first.id: "succeeded",
                                                         second.id: "cancelled"}


def test_trials_recorded_in_overlapping_transactions_are_all_counted(any_db_url):
    factory = init_db(any_db_url)
    new_job(factory)
    task = claim(factory, "w1")

    def trial(number: int, outcome: str, ms: float) -> Callable[[Session], None]:
        def record(s: Session) -> None:
            repo.record_trial(s, task.id, number, {"config": {"BLOCK_M": number},
                                                   "outcome": outcome, "p50_ms": ms},
                              worker_id="w1")
        return record

    overlap(factory, trial(1, "ok", 2.0), trial(2, "ok", 1.0))
    overlap(factory, trial(3, "crash", 0.5), trial(4, "ok", 3.0))
    with factory() as s:
        done = repo.get_task(s, task.id)
        assert done.trials_done == 4 and done.outcome_counts == {"ok": 3, "crash": 1}
        assert (done.best_ms, done.best_config) == (1.0, {"BLOCK_M": 2})


# -- a worker that lost its lease -------------------------------------------------------------

def test_a_worker_that_lost_its_lease_writes_nothing_and_the_new_owner_does(any_db_url):
    factory = init_db(any_db_url)
    job = new_job(factory, shapes=SHAPES[:1])
    old = claim(factory, "w1", lease_seconds=1)
    measured = {"config": {"BLOCK_M": 16}, "outcome": "ok", "p50_ms": 1.0}
    with factory() as s:
        repo.record_trial(s, old.id, 1, measured, worker_id="w1")
        assert repo.reap_expired(s, now=utcnow() + timedelta(seconds=30)) == 1
        s.commit()
    new = claim(factory, "w2")
    assert new.id == old.id
    with factory() as s:
        with pytest.raises(repo.LeaseLost, match="w1"):
            repo.record_trial(s, old.id, 2, {**measured, "p50_ms": 0.1}, worker_id="w1")
        assert not repo.set_task_best(s, old.id, 0.1, {"BLOCK_M": 1}, worker_id="w1")
        assert repo.finish_task(s, old.id, "failed", "late", worker_id="w1").status == "running"
        s.commit()
        # the number w1 would have used next is w2's to use
        repo.record_trial(s, new.id, 2, {**measured, "p50_ms": 0.5}, worker_id="w2")
        assert repo.set_task_best(s, new.id, 0.4, {"BLOCK_M": 32}, worker_id="w2")
        assert repo.finish_task(s, new.id, "succeeded", worker_id="w2").status == "succeeded"
        s.commit()
    with factory() as s:
        task = repo.get_task(s, old.id)
        assert (task.status, task.error, task.trials_done) == ("succeeded", None, 2)
        assert (task.best_ms, task.best_config) == (0.4, {"BLOCK_M": 32})
        assert [t.p50_ms for t in repo.trials_for_task(s, task.id)] == [1.0, 0.5]
        assert repo.get_job(s, job.id).status == "succeeded"


def test_a_trial_for_a_cancelled_task_is_refused(any_db_url):
    factory = init_db(any_db_url)
    job = new_job(factory, shapes=SHAPES[:1])
    task = claim(factory, "w1")
    with factory() as s:
        repo.cancel_job(s, job.id)
        s.commit()
        with pytest.raises(repo.LeaseLost):
            repo.record_trial(s, task.id, 1, {"config": {}, "outcome": "crash"}, worker_id="w1")
        assert repo.trials_for_task(s, task.id) == []


# -- identical submissions --------------------------------------------------------------------

def submit_at_once(factory: sessionmaker[Session], n: int = 16) -> list[tuple[str, bool]]:
    start = threading.Barrier(n)

    def submit(_: int) -> tuple[str, bool]:
        with factory() as s:
            start.wait()
            job, created = repo.submit_job(s, **FIELDS)
            s.commit()
            return job.id, created

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(submit, range(n)))


def test_identical_submissions_at_once_share_one_job(any_db_url):
    factory = init_db(any_db_url)
    results = submit_at_once(factory)
    with factory() as s:
        jobs = list(s.scalars(select(Job)))
    assert len(jobs) == 1
    assert [job_id for job_id, _ in results] == [jobs[0].id] * 16
    assert sorted(created for _, created in results) == [False] * 15 + [True]


def test_a_finished_job_does_not_stop_an_identical_submission(any_db_url):
    factory = init_db(any_db_url)
    with factory() as s:
        first, created = repo.submit_job(s, **FIELDS)
        assert created
        assert repo.submit_job(s, **FIELDS) == (first, False)
        repo.cancel_job(s, first.id)
        s.commit()
        second, created = repo.submit_job(s, **FIELDS)
        assert created and second.id != first.id
        for task in second.tasks:
            repo.finish_task(s, task.id, "succeeded")
        s.commit()
        assert repo.get_job(s, second.id).status == "succeeded"
        third, created = repo.submit_job(s, **FIELDS)
        s.commit()
        assert created and third.id not in (first.id, second.id)


def test_create_job_beside_an_identical_active_job_leaves_submissions_to_the_first(any_db_url):
    factory = init_db(any_db_url)
    with factory() as s:
        first = repo.create_job(s, **FIELDS)
        second = repo.create_job(s, **FIELDS)  # as the CLI does: its own job, run in-process
        s.commit()
        assert second.id != first.id and second.request_key != first.request_key
        assert repo.submit_job(s, **FIELDS) == (first, False)


def test_migration_0003_tells_apart_identical_active_jobs_created_before_it(any_db_url):
    engine = make_engine(any_db_url)
    command.upgrade(alembic_config(engine), "0002")
    key = "k" * 64
    rows = [("a" * 32, "running", 1), ("b" * 32, "queued", 2), ("c" * 32, "succeeded", 0)]
    with engine.begin() as conn:
        for job_id, status, minutes in rows:
            conn.execute(text(
                "INSERT INTO jobs (id, kernel, kernel_version, dtype, status, backend, strategy, "
                "budget_trials, force, seed, request_key, created_at) VALUES (:id, 'matmul', "
                "'v1', 'float16', :status, 'auto', 'auto', 8, false, 0, :key, :at)"),
                {"id": job_id, "status": status, "key": key,
                 "at": utcnow() - timedelta(minutes=10 - minutes)})
    command.upgrade(alembic_config(engine), "head")
    with engine.connect() as conn:
        keys = dict(conn.execute(text("SELECT id, request_key FROM jobs")).all())
    indexes = {i["name"]: i for i in inspect(engine).get_indexes("jobs")}
    engine.dispose()
    assert keys == {"a" * 32: key, "b" * 32: repo.unshared_request_key(key, "b" * 32),
                    "c" * 32: key}
    assert indexes["uq_jobs_active_request_key"]["unique"]


def test_identical_submissions_over_http_at_once_share_one_job(any_db_url):
    start = threading.Barrier(16)
    with running_app(Settings(database_url=any_db_url)) as base:
        def post(_: int) -> httpx.Response:
            with httpx.Client(base_url=base, timeout=60) as client:
                start.wait()
                return client.post("/api/v1/jobs", json=JOB)

        with ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(post, range(16)))
        listed = httpx.get(f"{base}/api/v1/jobs").json()
    assert sorted(a.status_code for a in answers) == [200] * 15 + [202], \
        [a.text for a in answers if a.status_code not in (200, 202)]
    assert listed["count"] == 1
    assert {a.json()["id"] for a in answers} == {listed["data"][0]["id"]}
    assert sum(a.json()["deduplicated"] for a in answers) == 15


# -- ids no row can have ------------------------------------------------------------------------

@pytest.mark.parametrize("task_id", [0, -1, 2**31, 2**63])
def test_a_task_id_outside_32_bits_is_not_found(any_db_url, task_id):
    with init_db(any_db_url)() as s:
        with pytest.raises(repo.NotFound):
            repo.get_task(s, task_id)


@pytest.mark.parametrize("job_id", ["a\x00b", "f" * 33, "f" * 5000])
def test_a_job_id_with_a_nul_byte_or_too_long_is_not_found(any_db_url, job_id):
    with init_db(any_db_url)() as s:
        with pytest.raises(repo.NotFound):
            repo.get_job(s, job_id)
        with pytest.raises(repo.NotFound):
            repo.cancel_job(s, job_id)
