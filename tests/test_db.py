"""Storage and queue behaviour, on a real SQLite file and (with TUNER_TEST_POSTGRES_URL) on a
fresh PostgreSQL database: ``any_db_url`` in conftest.py gives one of each per test."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.orm import Session, sessionmaker

from db import repo
from db.engine import default_database_url, init_db, make_engine, normalise_url, upgrade
from db.models import Base, BestConfig, Job, utcnow
from tuner.job_spec import JobSpec

ROOT = Path(__file__).resolve().parents[1]
SHAPE = {"M": 64, "N": 64, "K": 64}
H200 = "cuda:NVIDIA H200:sm90"
H100 = "cuda:NVIDIA H100 80GB HBM3:sm90"


def new_job(session: Session, shapes: Iterable[Mapping[str, int]] = (SHAPE,),
            device_key: str | None = None, **overrides: Any) -> Job:
    fields: dict[str, Any] = dict(kernel="matmul", kernel_version="v1", dtype="float16",
                                  budget_trials=8, budget_seconds=None, strategy="auto",
                                  force=False, seed=0, backend="auto")
    fields.update(overrides)
    return repo.create_job(session, shapes=list(shapes), device_key=device_key, **fields)


def claim(session: Session, worker: str = "w", device_key: str = H200,
          lease_seconds: float = 60) -> Any:
    task = repo.claim_task(session, worker_id=worker, device_key=device_key,
                           lease_seconds=lease_seconds)
    session.commit()
    return task


def store(session: Session, ms: float, margin: float = 0.0, shape: Mapping[str, int] = SHAPE,
          **key: str) -> tuple[BestConfig, bool]:
    fields = dict(device_key="d", kernel="matmul", kernel_version="v1", dtype="float16",
                  triton_version="3.6.0")
    fields.update(key)
    return repo.store_best(session, **fields, shape=shape, config={"BLOCK_M": int(ms * 100)},
                           p20_ms=ms * 0.99, p50_ms=ms, p80_ms=ms * 1.01, tflops=None,
                           gbps=None, torch_version=None, cuda_version=None, task_id=None,
                           noise_margin=margin)


# -- engine and migrations --------------------------------------------------------------------

def _head() -> str:
    """The newest migration (it fails when the migrations have several heads)."""
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    from db.engine import MIGRATIONS

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    head = ScriptDirectory.from_config(config).get_current_head()
    assert head is not None
    return head


def test_migrations_create_every_table_on_an_empty_sqlite_file_in_wal_mode(tmp_path: Path):
    path = tmp_path / "new" / "folder" / "empty.db"
    init_db(f"sqlite:///{path}")
    conn = sqlite3.connect(path)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"devices", "jobs", "tasks", "trials", "best_configs", "misses", "workers",
            "alembic_version"} <= tables
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("SELECT version_num FROM alembic_version").fetchall() == [(_head(),)]


def test_sqlite_connections_wait_for_writers_and_enforce_foreign_keys(tmp_path: Path):
    engine = make_engine(f"sqlite:///{tmp_path / 'p.db'}")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30000
        assert conn.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1  # NORMAL
    engine.dispose()


def test_migrations_match_the_models(any_db_url: str):
    init_db(any_db_url)
    engine = make_engine(any_db_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == []


def test_processes_starting_at_once_migrate_an_empty_database_once(any_db_url: str):
    script = "import sys; from db.engine import upgrade; upgrade(sys.argv[1])"
    procs = [subprocess.Popen([sys.executable, "-c", script, any_db_url], cwd=ROOT,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0] * 4, errors
    upgrade(any_db_url)  # and once more: nothing to do
    engine = make_engine(any_db_url)
    with engine.connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).all() == [(_head(),)]
    engine.dispose()


def test_the_sqlite_best_config_key_is_unique(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'u.db'}"
    upgrade(url)
    engine = make_engine(url)
    uniques = inspect(engine).get_unique_constraints("best_configs")
    engine.dispose()
    assert any(set(u["column_names"]) == {"device_key", "kernel", "kernel_version", "dtype",
                                          "shape_key", "triton_version", "timing"}
               for u in uniques)


def test_the_default_database_is_a_sqlite_file_in_the_data_dir(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("TUNER_DATA_DIR", str(tmp_path / "state"))
    assert default_database_url() == f"sqlite:///{tmp_path / 'state' / 'tuner.db'}"
    monkeypatch.delenv("TUNER_DATA_DIR")
    monkeypatch.chdir(tmp_path)
    assert default_database_url() == f"sqlite:///{tmp_path / 'data' / 'tuner.db'}"


def test_postgresql_urls_use_psycopg_3():
    assert normalise_url("postgresql://u@h:5432/db") == "postgresql+psycopg://u@h:5432/db"
    assert normalise_url("postgres://u@h/db") == "postgresql+psycopg://u@h/db"
    assert normalise_url("postgresql+psycopg://u@h/db") == "postgresql+psycopg://u@h/db"
    assert normalise_url("sqlite:///x.db") == "sqlite:///x.db"


def test_timestamps_come_back_timezone_aware_in_utc(any_db_url: str):
    factory = init_db(any_db_url)
    with factory() as s:
        job_id = new_job(s).id
        s.commit()
        claim(s)
    with factory() as s:
        task = repo.get_job(s, job_id).tasks[0]
        for moment in (task.job.created_at, task.started_at, task.lease_expires_at,
                       task.updated_at):
            assert moment is not None and moment.utcoffset() == timedelta(0)
        assert task.lease_expires_at is not None and task.lease_expires_at > utcnow()


# -- devices ----------------------------------------------------------------------------------

def test_a_device_is_created_then_refreshed_by_key(any_db_url: str):
    factory = init_db(any_db_url)
    fingerprint = {"key": H200, "kind": "cuda", "name": "NVIDIA H200", "sm_count": 132,
                   "memory_bytes": 150_000_000_000, "triton_version": "3.5.0", "extra": 1}
    with factory() as s:
        first = repo.upsert_device(s, fingerprint)
        s.commit()
        seen = first.last_seen_at
        again = repo.upsert_device(s, {**fingerprint, "triton_version": "3.6.0"})
        s.commit()
        assert again.id == first.id and again.triton_version == "3.6.0"
        assert again.memory_bytes == 150_000_000_000 and again.last_seen_at >= seen
        repo.set_calibration(s, H200, copy_gbps=4270.0, matmul_tflops=750.0)
        s.commit()
        [device] = repo.list_devices(s)
        assert (device.copy_gbps, device.matmul_tflops) == (4270.0, 750.0)
        assert device.calibrated_at is not None


def test_an_unknown_device_needs_kind_and_name(any_db_url: str):
    with init_db(any_db_url)() as s:
        with pytest.raises(ValueError, match="kind"):
            repo.upsert_device(s, {"key": H200})
        with pytest.raises(repo.NotFound):
            repo.set_calibration(s, H200, copy_gbps=1.0, matmul_tflops=1.0)


# -- jobs -------------------------------------------------------------------------------------

def test_a_job_has_one_queued_task_per_shape(any_db_url: str):
    factory = init_db(any_db_url)
    shapes = [SHAPE, {"M": 1, "N": 2, "K": 3}]
    with factory() as s:
        job_id = new_job(s, shapes=shapes).id
        s.commit()
    with factory() as s:
        job = repo.get_job(s, job_id)
        assert len(job_id) == 32 and job.status == "queued"
        assert [t.shape for t in job.tasks] == shapes
        assert [t.shape_key for t in job.tasks] == ["K=64,M=64,N=64", "K=3,M=1,N=2"]
        assert {(t.status, t.attempts, t.trials_done) for t in job.tasks} == {("queued", 0, 0)}
        assert job.tasks[0].outcome_counts == {} and job.tasks[0].max_attempts == 3


def test_an_identical_active_submission_is_found_whatever_the_shape_order(any_db_url: str):
    factory = init_db(any_db_url)
    shapes = [SHAPE, {"M": 1, "N": 2, "K": 3}]
    with factory() as s:
        job = new_job(s, shapes=shapes)
        s.commit()
        same = repo.request_key(kernel="matmul", kernel_version="v1", dtype="float16",
                                shapes=shapes[::-1], budget_trials=8, budget_seconds=None,
                                strategy="auto", backend="auto", device_key=None)
        assert same == job.request_key
        found = repo.find_active_duplicate(s, same)
        assert found is not None and found.id == job.id
        assert new_job(s, shapes=shapes, budget_trials=9).request_key != job.request_key
        repo.cancel_job(s, job.id)
        s.commit()
        assert repo.find_active_duplicate(s, same) is None


def _sha256(fields: list[Any]) -> str:
    return hashlib.sha256(json.dumps(fields).encode()).hexdigest()


def test_a_job_spec_is_what_the_job_stores_and_keys_as_before(any_db_url: str):
    """One value for a submission (``tuner.job_spec.JobSpec``): a job made from it or from its
    fields is the same, reads back as it, and its request key is the one jobs always had."""
    factory = init_db(any_db_url)
    shapes = [SHAPE, {"M": 1, "N": 2, "K": 3}]
    spec = JobSpec(kernel="matmul", kernel_version="v1", dtype="float16", shapes=shapes,
                   budget_trials=8, budget_seconds=2.5, strategy="auto", force=True, seed=3,
                   backend="auto", device_key=H200, timing="eager-hot")
    with factory() as s:
        job = repo.create_job(s, spec)
        assert JobSpec.of(job, [t.shape for t in job.tasks]) == spec
        assert [t.shape for t in job.tasks] == shapes
        keyed: list[Any] = ["matmul", "v1", "float16", ["K=3,M=1,N=2", "K=64,M=64,N=64"], 8,
                            2.5, "auto", "auto", H200]
        assert job.request_key == spec.request_key() == _sha256([*keyed, "eager-hot"])
        default = replace(spec, timing="eager-flushed")  # the default timing is not keyed
        assert default.request_key() == _sha256(keyed)
        submitted, created = repo.submit_job(s, default)
        assert created and submitted.request_key == default.request_key()
        with pytest.raises(TypeError, match="not both"):
            repo.create_job(s, spec, seed=4)
        assert JobSpec(**{**vars(spec), "shapes": ()}).search_options() == dict(
            trials=8, seed=3, strategy="auto", time_budget_s=2.5)


def test_jobs_are_listed_newest_first_with_filters_and_a_total(any_db_url: str):
    factory = init_db(any_db_url)
    with factory() as s:
        ids = [new_job(s, kernel=k).id for k in ("matmul", "softmax", "matmul")]
        s.commit()
        jobs, total = repo.list_jobs(s, kernel="matmul", limit=1)
        assert total == 2 and [j.id for j in jobs] == [ids[2]]
        assert repo.list_jobs(s, kernel="matmul", limit=1, offset=1)[0][0].id == ids[0]
        assert repo.list_jobs(s, status="running") == ([], 0)
        with pytest.raises(repo.NotFound):
            repo.get_job(s, "0" * 32)


def test_cancel_stops_unfinished_tasks_and_keeps_finished_ones(any_db_url: str):
    factory = init_db(any_db_url)
    with factory() as s:
        job = new_job(s, shapes=[SHAPE, {"M": 1, "N": 1, "K": 1}, {"M": 2, "N": 2, "K": 2}])
        s.commit()
        done, running = claim(s, "w1"), claim(s, "w2")
        repo.finish_task(s, done.id, "succeeded")
        s.commit()
        job = repo.cancel_job(s, job.id)
        s.commit()
        assert [t.status for t in job.tasks] == ["succeeded", "cancelled", "cancelled"]
        assert job.status == "cancelled" and job.finished_at is not None
        assert not repo.renew_lease(s, running.id, "w2", 60)
        assert claim(s) is None


# -- claims and leases ------------------------------------------------------------------------

def test_one_task_and_two_claims_only_the_first_gets_it(any_db_url: str):
    factory = init_db(any_db_url)
    with factory() as s:
        job_id = new_job(s).id
        s.commit()
    with factory() as first, factory() as second:
        task = claim(first, "w1")
        assert claim(second, "w2") is None
    assert task is not None and task.job_id == job_id
    assert (task.status, task.attempts, task.lease_owner) == ("running", 1, "w1")
    with factory() as s:
        assert repo.get_job(s, job_id).status == "running"
        assert repo.get_job(s, job_id).started_at is not None


def test_concurrent_workers_claim_every_task_exactly_once(any_db_url: str):
    factory = init_db(any_db_url)
    with factory() as s:
        for n in range(4):
            new_job(s, shapes=[{"M": m, "N": n + 1, "K": 8} for m in range(1, 11)])
        s.commit()
    claimed: list[int] = []
    lock = threading.Lock()
    start = threading.Barrier(6)

    def worker(name: str) -> None:
        start.wait()
        while True:
            with factory() as s:
                task = claim(s, name)
            if task is None:
                return
            with lock:
                claimed.append(task.id)

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(claimed) == 40 and len(set(claimed)) == 40
    with factory() as s:
        assert repo.count_tasks_by_status(s) == {"running": 40}
        assert {t.attempts for t in repo.running_tasks(s)} == {1}


def test_the_oldest_job_is_claimed_first(any_db_url: str):
    factory = init_db(any_db_url)
    with factory() as s:
        old = new_job(s, shapes=[SHAPE, {"M": 1, "N": 1, "K": 1}])
        old.created_at = utcnow() - timedelta(minutes=5)
        new_job(s)
        s.commit()
        assert [claim(s).id, claim(s).id] == [t.id for t in old.tasks]


def test_tasks_are_only_claimed_by_their_target_device(any_db_url: str):
    factory = init_db(any_db_url)
    with factory() as s:
        targeted = new_job(s, device_key=H200).tasks[0].id
        s.commit()
        assert claim(s, "h100", device_key=H100) is None
        anywhere = new_job(s, shapes=[{"M": 1, "N": 1, "K": 1}]).tasks[0].id
        s.commit()
        assert claim(s, "h100", device_key=H100).id == anywhere
        assert claim(s, "h200", device_key=H200).id == targeted


def test_only_the_lease_owner_renews_a_running_task(any_db_url: str):
    factory = init_db(any_db_url)
    with factory() as s:
        new_job(s)
        s.commit()
        task = claim(s, "w1", lease_seconds=1)
        before = task.lease_expires_at
        assert repo.renew_lease(s, task.id, "w1", 600)
        assert not repo.renew_lease(s, task.id, "w2", 600)
        s.commit()
        s.refresh(task)
        assert task.lease_expires_at > before + timedelta(seconds=500)
        repo.finish_task(s, task.id, "succeeded")
        s.commit()
        assert not repo.renew_lease(s, task.id, "w1", 600)


def test_an_expired_lease_puts_the_task_back_in_the_queue(any_db_url: str):
    factory = init_db(any_db_url)
    with factory() as s:
        new_job(s, shapes=[SHAPE, {"M": 1, "N": 1, "K": 1}])
        s.commit()
        dead, alive = claim(s, "dead", lease_seconds=10), claim(s, "alive", lease_seconds=600)
        assert repo.reap_expired(s, now=utcnow() + timedelta(seconds=60)) == 1
        s.commit()
        s.refresh(dead)
        s.refresh(alive)
        # the worker's death is no fault of the task's: no attempt used, one requeue counted
        assert (dead.status, dead.attempts, dead.requeues, dead.lease_owner) == (
            "queued", 0, 1, None)
        assert (alive.status, alive.lease_owner) == ("running", "alive")
        assert not repo.renew_lease(s, dead.id, "dead", 60)
        again = claim(s, "next")
        assert again.id == dead.id and again.attempts == 1
        assert repo.reap_expired(s) == 0


def test_lease_expiries_use_no_attempt_and_the_task_succeeds_afterwards(any_db_url: str):
    factory = init_db(any_db_url)
    with factory() as s:
        job_id = new_job(s).id
        s.commit()
        for expiry in range(1, 5):  # more expiries than max_attempts (3)
            task = claim(s, f"w{expiry}", lease_seconds=1)
            assert task is not None and task.attempts == 1
            assert repo.reap_expired(s, now=utcnow() + timedelta(seconds=5)) == 1
            s.commit()
        task = claim(s, "w5")
        assert task is not None and (task.attempts, task.requeues) == (1, 4)
        repo.finish_task(s, task.id, "succeeded", worker_id="w5")
        s.commit()
        assert repo.get_job(s, job_id).status == "succeeded"


def test_a_task_requeued_max_requeues_times_fails_and_keeps_its_fastest_verified_trial(
        any_db_url: str):
    factory = init_db(any_db_url)
    with factory() as s:
        repo.upsert_device(s, {"key": H200, "kind": "cuda", "name": "NVIDIA H200",
                               "triton_version": "3.6.0"})
        job_id = new_job(s).id
        s.commit()
        for expiry in range(1, repo.MAX_REQUEUES + 1):
            task = claim(s, f"w{expiry}", lease_seconds=1)
            if expiry == 1:
                repo.set_task_device(s, task.id, H200)
                for number, (block, ms) in enumerate([(16, 2.0), (32, 1.5), (64, 0.5)], 1):
                    repo.record_trial(s, task.id, number, {
                        "config": {"BLOCK_M": block}, "p50_ms": ms,
                        "outcome": "ok" if block != 64 else "wrong_result"})
            assert repo.reap_expired(s, now=utcnow() + timedelta(seconds=5)) == 1
            s.commit()
        assert claim(s) is None
        job = repo.get_job(s, job_id)
        s.refresh(job)
        [task] = job.tasks
        assert task.status == "failed" and task.requeues == repo.MAX_REQUEUES
        assert f"expired {repo.MAX_REQUEUES} times" in (task.error or "")
        assert job.status == "failed" and "expired" in (job.error or "")
        [best] = repo.list_best(s, kernel="matmul")
        assert (best.config, best.p50_ms, best.measured, best.task_id) == (
            {"BLOCK_M": 32}, 1.5, "trial", task.id)
        assert best.device_key == H200 and best.triton_version == "3.6.0"
        assert "gave up" in (task.best_note or "")


# -- finishing --------------------------------------------------------------------------------

def finish_all(factory: sessionmaker[Session], statuses: list[str]) -> Job:
    """A three-shape job whose first tasks finish with ``statuses`` in order."""
    device = f"cuda:{uuid.uuid4().hex}"
    with factory() as s:
        job_id = new_job(s, shapes=[{"M": m, "N": 1, "K": 1} for m in range(1, 4)],
                         device_key=device).id
        s.commit()
        for status in statuses:
            error = "no config ran correctly" if status == "failed" else None
            repo.finish_task(s, claim(s, device_key=device).id, status, error)
            s.commit()
        return repo.get_job(s, job_id)


def test_a_job_succeeds_once_every_task_succeeded(any_db_url: str):
    factory = init_db(any_db_url)
    job = finish_all(factory, ["succeeded", "succeeded"])
    assert job.status == "running" and job.finished_at is None
    job = finish_all(factory, ["succeeded"] * 3)
    assert job.status == "succeeded" and job.finished_at is not None and job.error is None


def test_a_job_fails_when_any_task_failed(any_db_url: str):
    job = finish_all(init_db(any_db_url), ["succeeded", "failed", "succeeded"])
    assert job.status == "failed" and job.error == "K=1,M=2,N=1: no config ran correctly"


def test_a_task_cancelled_while_it_ran_stays_cancelled(any_db_url: str):
    factory = init_db(any_db_url)
    with factory() as s:
        job = new_job(s)
        s.commit()
        task = claim(s)
        repo.cancel_job(s, job.id)
        s.commit()
        assert repo.finish_task(s, task.id, "succeeded").status == "cancelled"
        assert repo.finish_task(s, task.id, "lost").status == "cancelled"
        with pytest.raises(ValueError, match="expected one of"):
            repo.finish_task(s, task.id, "done")


def test_only_the_lease_owner_finishes_when_it_says_who_it_is(any_db_url: str):
    factory = init_db(any_db_url)
    with factory() as s:
        new_job(s)
        s.commit()
        task = claim(s, "w1")
        assert repo.finish_task(s, task.id, "failed", "boom", worker_id="w2").status == "running"
        assert repo.finish_task(s, task.id, "succeeded", worker_id="w1").status == "succeeded"


# -- trials -----------------------------------------------------------------------------------

def test_trials_update_the_task_progress_and_best(any_db_url: str):
    factory = init_db(any_db_url)
    with factory() as s:
        task_id = new_job(s).tasks[0].id
        cfg = {"num_warps": 4, "BLOCK_M": 16}
        repo.record_trial(s, task_id, 1, {"config": cfg, "outcome": "ok", "p20_ms": 1.9,
                                          "p50_ms": 2.0, "p80_ms": 2.1, "compile_s": 0.4,
                                          "max_error": 1e-3, "error": None})
        repo.record_trial(s, task_id, 2, {"config": cfg, "outcome": "crash", "error": "boom"})
        repo.record_trial(s, task_id, 3, {"config": {"BLOCK_M": 32}, "outcome": "ok",
                                          "p50_ms": 1.0})
        repo.record_trial(s, task_id, 4, {"config": {"BLOCK_M": 64}, "outcome": "wrong_result",
                                          "p50_ms": 0.1})
        s.commit()
    with factory() as s:
        task = repo.get_task(s, task_id)
        assert task.trials_done == 4 and task.best_ms == 1.0
        assert task.best_config == {"BLOCK_M": 32}
        assert task.outcome_counts == {"ok": 2, "crash": 1, "wrong_result": 1}
        trials = repo.trials_for_task(s, task_id)
        assert [t.number for t in trials] == [1, 2, 3, 4]
        assert trials[0].config_key == "BLOCK_M=16,num_warps=4"
        assert (trials[0].p20_ms, trials[0].compile_s, trials[0].max_error) == (1.9, 0.4, 1e-3)
        assert trials[1].error == "boom" and trials[1].p50_ms is None


# -- best configs -----------------------------------------------------------------------------

def test_a_stored_best_is_replaced_only_beyond_the_noise(any_db_url: str):
    factory = init_db(any_db_url)
    with factory() as s:
        assert store(s, 1.00)[1] is True
        row, written = store(s, 0.99, margin=0.02)  # 1% faster, 2% noise: keep the old one
        assert written is False and row.p50_ms == 1.00
        row, written = store(s, 0.95, margin=0.02)
        assert written is True and (row.p50_ms, row.config) == (0.95, {"BLOCK_M": 95})
        assert store(s, 1.20)[1] is False
        s.commit()
        best = repo.get_best(s, device_key="d", kernel="matmul", dtype="float16",
                             shape_key=repo.shape_key_of(SHAPE))
        assert best is not None and best.p50_ms == 0.95 and best.p20_ms == 0.95 * 0.99
        assert len(repo.list_best(s)) == 1


def test_each_triton_version_keeps_its_own_best_and_the_newest_is_served(any_db_url: str):
    factory = init_db(any_db_url)
    with factory() as s:
        store(s, 1.0, triton_version="3.5.0")
        s.commit()
        store(s, 2.0, triton_version="3.6.0")
        s.commit()
        key = repo.shape_key_of(SHAPE)
        newest = repo.get_best(s, device_key="d", kernel="matmul", dtype="float16",
                               shape_key=key)
        older = repo.get_best(s, device_key="d", kernel="matmul", dtype="float16",
                              shape_key=key, triton_version="3.5.0")
        assert newest is not None and newest.triton_version == "3.6.0"
        assert older is not None and older.p50_ms == 1.0
        assert repo.get_best(s, device_key="other", kernel="matmul", dtype="float16",
                             shape_key=key) is None
        assert len(repo.list_best(s, kernel="matmul", device_key="d", dtype="float16")) == 2


def test_nearest_best_is_the_closest_shape_in_log_space(any_db_url: str):
    factory = init_db(any_db_url)
    with factory() as s:
        store(s, 1.0, shape={"M": 4096, "N": 4096, "K": 4096})
        store(s, 2.0, shape={"M": 16, "N": 4096, "K": 4096})
        store(s, 3.0, shape={"M": 32, "N": 4096, "K": 4096}, device_key="other")
        store(s, 4.0, shape={"M": 32, "N": 4096, "K": 4096}, dtype="bfloat16")
        s.commit()
        found = repo.nearest_best(s, device_key="d", kernel="matmul", dtype="float16",
                                  shape={"M": 32, "N": 4096, "K": 4096})
        assert found is not None
        row, distance = found
        assert row.shape["M"] == 16 and distance == 1.0
        assert repo.nearest_best(s, device_key="d", kernel="softmax", dtype="float16",
                                 shape=SHAPE) is None


def test_shape_distance_counts_doublings():
    assert repo.shape_distance({"M": 8, "N": 8}, {"M": 8, "N": 8}) == 0
    assert repo.shape_distance({"M": 8, "N": 8}, {"M": 32, "N": 4}) == pytest.approx(5 ** 0.5)


def test_switching_to_wal_waits_out_a_lock_another_connection_holds():
    """SQLite answers a WAL switch that would deadlock with "database is locked" at once, not
    after its busy timeout (CI: one of four processes migrating an empty file at once failed);
    the switch is asked again until it passes, and other errors are not retried."""
    import sqlite3

    from db.engine import _set_wal

    class Cursor:
        def __init__(self, failures: list[str]) -> None:
            self.failures, self.calls = failures, 0

        def execute(self, sql: str) -> None:
            assert sql == "PRAGMA journal_mode=WAL"
            self.calls += 1
            if self.failures:
                raise sqlite3.OperationalError(self.failures.pop(0))

    locked = Cursor(["database is locked", "database is locked"])
    _set_wal(locked)
    assert locked.calls == 3
    broken = Cursor(["disk I/O error"])
    with pytest.raises(sqlite3.OperationalError, match="disk I/O"):
        _set_wal(broken)
    assert broken.calls == 1
