"""Storage and queue behaviour, on a real SQLite file and on PostgreSQL."""

from __future__ import annotations

import sqlite3
import threading
from datetime import timedelta
from pathlib import Path

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect

from db import repo
from db.engine import init_db, make_engine
from db.models import Base, utcnow

SHAPE = {"M": 64, "N": 64, "K": 64}


def new_job(session, shapes=(SHAPE,), device_key=None):
    return repo.create_job(session, kernel="matmul", kernel_version="v1", dtype="float16",
                           shapes=list(shapes), budget_trials=8, budget_seconds=None,
                           strategy="auto", force=False, seed=0, backend="auto",
                           device_key=device_key)


def test_migrations_create_every_table_on_an_empty_sqlite_file_in_wal_mode(tmp_path: Path):
    path = tmp_path / "empty.db"
    init_db(f"sqlite:///{path}")
    tables = {r[0] for r in sqlite3.connect(path).execute(
        "SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"devices", "jobs", "tasks", "trials", "best_configs", "alembic_version"} <= tables
    assert sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_migrations_match_the_models(any_db_url):
    init_db(any_db_url)
    engine = make_engine(any_db_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    engine.dispose()
    assert diff == []


def test_a_task_is_claimed_by_exactly_one_worker(any_db_url):
    factory = init_db(any_db_url)
    with factory() as s:
        job = new_job(s, shapes=[{"M": m, "N": 8, "K": 8} for m in range(1, 13)])
        s.commit()
        job_id = job.id
    claimed: list[int] = []
    lock = threading.Lock()

    def worker(name: str) -> None:
        while True:
            with factory() as s:
                task = repo.claim_task(s, worker_id=name, device_key="dev", lease_seconds=60)
                s.commit()
            if task is None:
                return
            with lock:
                claimed.append(task.id)

    threads = [threading.Thread(target=worker, args=(f"w{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(claimed) == sorted(set(claimed)) and len(claimed) == 12
    with factory() as s:
        assert repo.get_job(s, job_id).status == "running"


def test_tasks_are_only_claimed_by_their_target_device(any_db_url):
    factory = init_db(any_db_url)
    with factory() as s:
        new_job(s, device_key="cuda:NVIDIA H200:sm90")
        s.commit()
        assert repo.claim_task(s, worker_id="h100", device_key="cuda:NVIDIA H100:sm90",
                               lease_seconds=60) is None
        assert repo.claim_task(s, worker_id="h200", device_key="cuda:NVIDIA H200:sm90",
                               lease_seconds=60) is not None


def test_expired_leases_are_requeued_until_attempts_run_out(any_db_url):
    factory = init_db(any_db_url)
    with factory() as s:
        new_job(s)
        s.commit()
        for attempt in range(1, 4):
            task = repo.claim_task(s, worker_id=f"w{attempt}", device_key="d", lease_seconds=1)
            assert task is not None and task.attempts == attempt
            assert repo.renew_lease(s, task.id, f"w{attempt}", 1)
            assert not repo.renew_lease(s, task.id, "someone-else", 1)
            assert repo.reap_expired(s, now=utcnow() + timedelta(seconds=5)) == 1
            s.commit()
        s.refresh(task)
        assert task.status == "failed" and "expired 3 times" in task.error
        assert task.job.status == "failed"


def test_trials_update_the_task_progress_and_best(any_db_url):
    factory = init_db(any_db_url)
    with factory() as s:
        task = new_job(s).tasks[0]
        cfg = {"BLOCK_M": 16}
        repo.record_trial(s, task.id, 1, {"config": cfg, "outcome": "ok", "p50_ms": 2.0})
        repo.record_trial(s, task.id, 2, {"config": cfg, "outcome": "crash", "error": "boom"})
        repo.record_trial(s, task.id, 3, {"config": {"BLOCK_M": 32}, "outcome": "ok",
                                          "p50_ms": 1.0})
        s.commit()
        s.refresh(task)
        assert task.trials_done == 3 and task.best_ms == 1.0
        assert task.best_config == {"BLOCK_M": 32}
        assert task.outcome_counts == {"ok": 2, "crash": 1}
        assert [t.number for t in repo.trials_for_task(s, task.id)] == [1, 2, 3]


def store(s, ms, margin=0.0, shape=SHAPE):
    return repo.store_best(s, device_key="d", kernel="matmul", kernel_version="v1",
                           dtype="float16", shape=shape, triton_version="3.6.0",
                           config={"BLOCK_M": int(ms * 100)}, p20_ms=ms, p50_ms=ms, p80_ms=ms,
                           tflops=None, gbps=None, torch_version=None, cuda_version=None,
                           task_id=None, noise_margin=margin)


def test_a_stored_best_is_replaced_only_beyond_the_noise(any_db_url):
    factory = init_db(any_db_url)
    with factory() as s:
        assert store(s, 1.00)[1] is True
        assert store(s, 0.99, margin=0.02)[1] is False  # 1% faster, 2% noise: keep
        assert store(s, 0.95, margin=0.02)[1] is True
        assert store(s, 1.20)[1] is False
        s.commit()
        best = repo.get_best(s, device_key="d", kernel="matmul", dtype="float16",
                             shape_key=repo.shape_key_of(SHAPE))
        assert best is not None and best.p50_ms == 0.95


def test_nearest_best_is_the_closest_shape_in_log_space(any_db_url):
    factory = init_db(any_db_url)
    with factory() as s:
        store(s, 1.0, shape={"M": 4096, "N": 4096, "K": 4096})
        store(s, 2.0, shape={"M": 16, "N": 4096, "K": 4096})
        s.commit()
        row, distance = repo.nearest_best(s, device_key="d", kernel="matmul", dtype="float16",
                                          shape={"M": 32, "N": 4096, "K": 4096})
        assert row.shape["M"] == 16 and distance == 1.0


def test_cancel_marks_unfinished_tasks(any_db_url):
    factory = init_db(any_db_url)
    with factory() as s:
        job = new_job(s, shapes=[SHAPE, {"M": 1, "N": 1, "K": 1}])
        s.commit()
        repo.cancel_job(s, job.id)
        s.commit()
        assert {t.status for t in job.tasks} == {"cancelled"} and job.status == "cancelled"
        assert repo.claim_task(s, worker_id="w", device_key="d", lease_seconds=5) is None


def test_sqlite_schema_has_the_best_config_key_unique(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'u.db'}"
    init_db(url)
    engine = make_engine(url)
    uniques = inspect(engine).get_unique_constraints("best_configs")
    assert any(set(u["column_names"]) == {"device_key", "kernel", "kernel_version", "dtype",
                                          "shape_key", "triton_version"} for u in uniques)
