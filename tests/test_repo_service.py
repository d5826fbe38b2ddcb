"""Repository functions the service added: presence, graceful release, health counts, the
workers table, why a job waits, the serving index; on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import inspect, select, update

from db import repo
from db.engine import init_db, make_engine
from db.models import BestConfig, WorkerRow, utcnow

SHAPE = {"M": 64, "N": 64, "K": 64}
DEVICE = {"key": "interpret:cpu", "kind": "interpret", "name": "Triton interpreter (CPU)"}


def queued_task(session) -> int:
    job = repo.create_job(session, kernel="matmul", kernel_version="v1", dtype="float16",
                          shapes=[SHAPE], budget_trials=8, budget_seconds=None,
                          strategy="auto", force=False, seed=0, backend="auto",
                          device_key=None)
    session.commit()
    return job.tasks[0].id


def claim(session, worker: str = "w1") -> int:
    task = repo.claim_task(session, worker_id=worker, device_key="interpret:cpu",
                           lease_seconds=60)
    session.commit()
    assert task is not None
    return task.id


def test_a_released_task_is_queued_again_without_using_an_attempt(any_db_url):
    with init_db(any_db_url)() as session:
        task_id = queued_task(session)
        claim(session)
        repo.record_trial(session, task_id, 1, {"config": {"BLOCK_M": 16}, "outcome": "ok",
                                                "p50_ms": 1.0})
        assert repo.release_task(session, task_id, "w1")
        session.commit()
        task = repo.get_task(session, task_id)
        session.refresh(task)
        assert (task.status, task.attempts, task.lease_owner) == ("queued", 0, None)
        assert len(repo.trials_for_task(session, task_id)) == 1
        assert claim(session, "w2") == task_id


def test_only_the_lease_owner_can_release_a_task(any_db_url):
    with init_db(any_db_url)() as session:
        task_id = queued_task(session)
        claim(session)
        assert not repo.release_task(session, task_id, "someone-else")
        session.commit()
        assert repo.get_task(session, task_id).status == "running"


def test_touch_device_refreshes_last_seen(any_db_url):
    with init_db(any_db_url)() as session:
        assert not repo.touch_device(session, "interpret:cpu")
        device = repo.upsert_device(session, DEVICE)
        device.last_seen_at = utcnow() - timedelta(hours=1)
        session.commit()
        assert repo.seconds_since(repo.list_devices(session)[0].last_seen_at) > 3000
        assert repo.touch_device(session, "interpret:cpu")
        session.commit()
        session.expire_all()
        assert repo.seconds_since(repo.list_devices(session)[0].last_seen_at) < 60


def test_running_tasks_and_counts_by_status(any_db_url):
    with init_db(any_db_url)() as session:
        first, _second = queued_task(session), queued_task(session)
        claim(session)
        assert [t.id for t in repo.running_tasks(session)] == [first]
        assert repo.count_tasks_by_status(session) == {"running": 1, "queued": 1}


# -- workers ----------------------------------------------------------------------------------

H200 = "cuda:NVIDIA H200:sm90"


def register(session, worker_id: str, device_key: str = H200, gpu_index: int | None = 0):
    kind = "interpret" if device_key.startswith("interpret") else "cuda"
    return repo.register_worker(session, worker_id=worker_id, host="node1", pid=1234,
                                device_key=device_key, kind=kind, gpu_index=gpu_index,
                                gpu_uuid=None if gpu_index is None else f"GPU-{gpu_index}")


def age(session, worker_id: str, seconds: float) -> None:
    session.execute(update(WorkerRow).where(WorkerRow.id == worker_id)
                    .values(last_seen_at=utcnow() - timedelta(seconds=seconds)))
    session.commit()


def test_a_worker_registers_beats_and_stops(any_db_url):
    with init_db(any_db_url)() as session:
        row = register(session, "w1")
        session.commit()
        assert (row.status, row.host, row.pid, row.gpu_index, row.gpu_uuid, row.task_id) == (
            "idle", "node1", 1234, 0, "GPU-0", None)
        assert repo.beat_worker(session, "w1", status="busy", task_id=7)
        session.commit()
        assert (repo.list_workers(session)[0].status, repo.list_workers(session)[0].task_id) == (
            "busy", 7)
        assert repo.beat_worker(session, "w1")  # presence only: what it does is unchanged
        assert repo.list_workers(session)[0].task_id == 7
        assert repo.beat_worker(session, "w1", status="unhealthy", error="CUDA error: ECC")
        session.commit()
        [worker] = repo.list_workers(session)
        assert (worker.status, worker.task_id, worker.error) == ("unhealthy", None,
                                                                 "CUDA error: ECC")
        assert not repo.beat_worker(session, "never-registered")
        with pytest.raises(ValueError, match="expected one of"):
            repo.beat_worker(session, "w1", status="sleeping")
        repo.stop_worker(session, "w1")
        session.commit()
        assert repo.list_workers(session)[0].status == "stopped"
        again = register(session, "w1", gpu_index=1)  # a restart with the same id
        session.commit()
        assert (again.status, again.gpu_index, again.error) == ("idle", 1, None)
        assert len(repo.list_workers(session)) == 1


def test_workers_are_listed_by_device_and_gpu_and_live_ones_give_device_keys(any_db_url):
    with init_db(any_db_url)() as session:
        register(session, "b", gpu_index=1)
        register(session, "a", gpu_index=0)
        register(session, "cpu", device_key="interpret:cpu", gpu_index=None)
        register(session, "h100", device_key="cuda:NVIDIA H100:sm90", gpu_index=0)
        session.commit()
        assert [w.id for w in repo.list_workers(session)] == ["h100", "a", "b", "cpu"]
        age(session, "h100", 600)
        repo.stop_worker(session, "cpu")
        session.commit()
        assert [w.id for w in repo.list_workers(session, seen_within_s=60)] == ["a", "b", "cpu"]
        assert repo.live_device_keys(session, 60) == {H200}
        assert repo.live_device_keys(session, 3600) == {H200, "cuda:NVIDIA H100:sm90"}


def test_a_job_waiting_for_a_device_no_live_worker_serves_says_so(any_db_url):
    factory = init_db(any_db_url)
    with factory() as session:
        repo.upsert_device(session, DEVICE)
        register(session, "cpu", device_key="interpret:cpu", gpu_index=None)
        job = repo.create_job(session, kernel="matmul", kernel_version="v1", dtype="float16",
                              shapes=[SHAPE], budget_trials=8, budget_seconds=None,
                              strategy="auto", force=False, seed=0, backend="auto",
                              device_key=H200)
        session.commit()
        later = utcnow() + timedelta(seconds=120)
        note = repo.waiting_note(session, job, now=later, after_s=60, seen_within_s=600)
        assert note == (f"no worker has served device '{H200}' in the last 600 s; known "
                        "devices: interpret:cpu (live)")
        # not yet waiting long enough; or the device's worker is alive
        assert repo.waiting_note(session, job, after_s=60, seen_within_s=60) is None
        register(session, "gpu0")
        session.commit()
        assert repo.waiting_note(session, job, now=later, after_s=60, seen_within_s=600) is None
        # a job for any device waits only when no worker at all is alive
        anywhere = repo.create_job(session, kernel="matmul", kernel_version="v1",
                                   dtype="float16", shapes=[SHAPE], budget_trials=8,
                                   budget_seconds=None, strategy="auto", force=False, seed=0,
                                   backend="auto", device_key=None)
        session.commit()
        assert repo.waiting_note(session, anywhere, now=later, after_s=60,
                                 seen_within_s=600) is None
        age(session, "gpu0", 3600)
        age(session, "cpu", 3600)
        note = repo.waiting_note(session, anywhere, now=later, after_s=60, seen_within_s=60)
        assert note is not None and note.startswith("no worker has been seen in the last 60 s")
        claim(session)  # a running job waits for nothing
        assert repo.waiting_note(session, repo.get_job(session, anywhere.id), now=later,
                                 after_s=60, seen_within_s=60) is None


# -- the serving index ------------------------------------------------------------------------

def test_best_configs_are_indexed_for_the_serving_lookup(any_db_url):
    init_db(any_db_url)
    engine = make_engine(any_db_url)
    indexes = {i["name"]: i["column_names"] for i in inspect(engine).get_indexes("best_configs")}
    assert indexes["ix_best_configs_serving"] == ["kernel", "kernel_version", "dtype"]
    if engine.dialect.name == "sqlite":  # the planner uses it (PostgreSQL's, on tiny tables,
        query = select(BestConfig).where(  # prefers a scan whatever the indexes)
            BestConfig.kernel == "matmul", BestConfig.kernel_version == "v1",
            BestConfig.dtype == "float16")
        with engine.connect() as conn:
            sql = str(query.compile(engine, compile_kwargs={"literal_binds": True}))
            plan = " ".join(str(r) for r in conn.exec_driver_sql(f"EXPLAIN QUERY PLAN {sql}"))
        assert "ix_best_configs_serving" in plan, plan
    engine.dispose()
