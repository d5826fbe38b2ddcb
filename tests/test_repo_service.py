"""Repository functions the service added (end of db/repo.py): presence, graceful release,
health counts; on SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta

from db import repo
from db.engine import init_db
from db.models import utcnow

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
