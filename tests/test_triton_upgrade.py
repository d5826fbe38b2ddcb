"""A Triton upgrade on a worker: the configs tuned under the previous minor stay served,
labelled ``other-triton``, and the shapes tuned there are queued for re-tuning under the new
minor when the worker registers its device (``repo.queue_upgrade_retunes``, called by
``tuner/app/service.py``): once per shape, at most ``TUNER_MISS_CAP_PER_KERNEL`` shapes a kernel,
one job per (kernel, kernel version, dtype), each saying why on the dashboard and in the API.
On SQLite and PostgreSQL."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from sqlalchemy import select, update

from db import repo
from db.engine import init_db
from db.models import BestConfig, Job, Task, utcnow
from search_spaces import get_kernel
from tuner.app.service import _register_device
from tuner.device import DeviceFingerprint
from tuner.settings import Settings
from tuner.shapes import shape_key

GPU = DeviceFingerprint(kind="cuda", name="NVIDIA H200", compute_capability="9.0",
                        triton_version="3.5.0")
CONFIG = {"VARIANT": 0, "SPLIT_K": 1, "BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 32,
          "GROUP_M": 8, "num_warps": 4, "num_stages": 3, "ALIGN": 0}
#: stored under Triton 3.5, the first the most recently tuned
SHAPES = [{"M": 16 * i, "N": 64, "K": 64} for i in range(1, 5)]
REASON = "re-tune after upgrade to Triton 3.6 (from 3.5)"


def register(factory: Any, triton_version: str, cap: int = 3) -> None:
    """What a worker's start does (``run_worker``)."""
    fingerprint = DeviceFingerprint(**{**GPU.__dict__, "triton_version": triton_version})
    _register_device(factory, fingerprint, {},
                     Settings(database_url="sqlite://", miss_cap_per_kernel=cap, miss_trials=5))


def store(factory: Any, shape: dict[str, int], triton_version: str, *, age_s: float = 0,
          dtype: str = "float16", kernel_version: str | None = None,
          kernel: str = "matmul", device: str = GPU.key, timing: str = "eager-flushed") -> None:
    with factory() as session:
        repo.store_best(session, device_key=device, kernel=kernel,
                        kernel_version=kernel_version or get_kernel("matmul").version,
                        dtype=dtype, shape=shape, triton_version=triton_version, config=CONFIG,
                        p20_ms=1.0, p50_ms=1.0, p80_ms=1.0, tflops=None, gbps=None,
                        torch_version=None, cuda_version=None, task_id=None, timing=timing)
        session.execute(update(BestConfig).where(
            BestConfig.device_key == device, BestConfig.kernel == kernel,
            BestConfig.dtype == dtype, BestConfig.shape_key == shape_key(shape),
            BestConfig.triton_version == triton_version, BestConfig.timing == timing)
            .values(updated_at=utcnow() - timedelta(seconds=age_s))
            .execution_options(synchronize_session=False))
        session.commit()


def jobs(factory: Any) -> list[dict[str, Any]]:
    """Every job, by status (queued last), dtype and timing method."""
    with factory() as session:
        found = [{"kernel": j.kernel, "version": j.kernel_version, "dtype": j.dtype,
                  "timing": j.timing, "device": j.device_key, "reason": j.reason,
                  "status": j.status, "trials": j.budget_trials,
                  "shapes": [t.shape for t in j.tasks]} for j in session.scalars(select(Job))]
    return sorted(found, key=lambda j: (j["status"] == "queued", j["dtype"], j["timing"]))


def test_a_newer_triton_minor_queues_the_old_minor_s_shapes_once(any_db_url):
    factory = init_db(any_db_url)
    version = get_kernel("matmul").version
    register(factory, "3.5.0")
    for age, shape in enumerate(SHAPES):
        store(factory, shape, "3.5.0", age_s=10 * (age + 1))
    store(factory, SHAPES[0], "3.5.0", dtype="float32", age_s=5)
    store(factory, {"M": 8, "N": 8, "K": 8}, "3.5.0", kernel_version="0123456789ab")  # old code
    store(factory, {"M": 8, "N": 8, "K": 8}, "3.5.0", kernel="not_installed")
    store(factory, {"M": 8, "N": 8, "K": 8}, "3.5.0", device="cuda:NVIDIA H100:sm90")
    register(factory, "3.5.1")  # the same minor: nothing to re-tune
    assert jobs(factory) == []

    register(factory, "3.6.0")
    assert jobs(factory) == [  # the three most recently tuned shapes, a job per dtype
        {"kernel": "matmul", "version": version, "dtype": "float16", "timing": "eager-flushed",
         "device": GPU.key, "reason": REASON, "status": "queued", "trials": 5,
         "shapes": SHAPES[:2]},
        {"kernel": "matmul", "version": version, "dtype": "float32", "timing": "eager-flushed",
         "device": GPU.key, "reason": REASON, "status": "queued", "trials": 5,
         "shapes": SHAPES[:1]}]
    register(factory, "3.6.0")  # a restart: queued already, and the cap is full
    assert len(jobs(factory)) == 2

    with factory() as session:  # the jobs ran: one shape was tuned under 3.6, one failed
        store(factory, SHAPES[0], "3.6.0")
        session.execute(update(Task).values(status="failed"))
        session.execute(update(Job).values(status="failed"))
        session.commit()
    register(factory, "3.6.1")  # again the three most recent of those still to re-tune
    queued = [j for j in jobs(factory) if j["status"] == "queued"]
    assert [(j["dtype"], j["shapes"], j["reason"]) for j in queued] == [
        ("float16", [SHAPES[1], SHAPES[2]], REASON), ("float32", [SHAPES[0]], REASON)]

    before = len(jobs(factory))
    register(factory, "3.4.0")  # a downgrade queues nothing
    assert len(jobs(factory)) == before


def test_bests_timed_another_way_are_re_tuned_that_way(any_db_url):
    """A shape's best timed in CUDA graphs is re-tuned in CUDA graphs, by a job of its own."""
    factory = init_db(any_db_url)
    register(factory, "3.5.0")
    store(factory, SHAPES[0], "3.5.0")
    store(factory, SHAPES[0], "3.5.0", timing="cuda-graph")
    store(factory, SHAPES[0], "3.6.0", timing="cuda-graph")  # already re-tuned that way
    store(factory, SHAPES[1], "3.5.0", timing="cuda-graph")
    register(factory, "3.6.0")
    assert [(j["timing"], j["shapes"]) for j in jobs(factory)] == [
        ("cuda-graph", SHAPES[1:2]), ("eager-flushed", SHAPES[:1])]


def test_the_old_minor_s_configs_are_served_as_other_triton_meanwhile(api_client, api_db_url):
    factory = init_db(api_db_url)
    register(factory, "3.5.0")
    store(factory, SHAPES[0], "3.5.0")
    register(factory, "3.6.0")
    params = {"kernel": "matmul", "dtype": "float16", **SHAPES[0], "device": GPU.key,
              "triton_version": "3.6.0"}
    answer = api_client.get("/api/v1/configs", params=params).json()
    assert (answer["match"], answer["triton_version"], answer["config"]) == (
        "other-triton", "3.5.0", CONFIG)
    listed = api_client.get("/api/v1/jobs").json()["data"]
    assert [j["reason"] for j in listed] == [REASON]
    page = api_client.get("/jobs").text
    assert REASON in page
    assert REASON in api_client.get(f"/jobs/{listed[0]['id']}").text
