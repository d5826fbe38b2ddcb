"""Helpers of the HTTP service tests: a job body, an in-process interpreter worker, a queued
task, a stored best config, the app on a real socket."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn

from api.app import create_app
from db import repo
from db.engine import init_db
from tests.support_processes import free_port
from tuner.app.worker import TaskOutcome, Worker
from tuner.settings import Settings

SHAPE = {"M": 16, "N": 16, "K": 16}
JOB: dict[str, Any] = {"kernel": "matmul", "dtype": "float16", "shapes": [SHAPE],
                       "budget": {"trials": 3}}
GPU = "cuda:NVIDIA H200:sm90"
INTERPRETER = "interpret:cpu"
CONFIG = {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8,
          "num_stages": 3}


def run_worker_once(db_url: str) -> TaskOutcome:
    """Claim and run one task on the CPU interpreter, in this process."""
    worker = Worker(init_db(db_url), backend_kind="interpret", device_key=INTERPRETER)
    outcome = worker.run_once()
    assert outcome is not None, "nothing was queued"
    return outcome


def queue_task(factory: Any, shape: dict[str, int], trials: int, *, kernel: str = "matmul",
               version: str | None = None, dtype: str = "float16", backend: str = "interpret",
               strategy: str = "auto", force: bool = False, started_by: str | None = None) -> int:
    """A job of one shape, as the API or ``tuner tune`` creates it (seed 0, no time budget, any
    device; kernel version: the registered kernel's unless given); the id of its task, started
    by worker ``started_by`` where given (as the CLI starts its own)."""
    from search_spaces import get_kernel

    with factory() as session:
        job = repo.create_job(session, kernel=kernel,
                              kernel_version=version or get_kernel(kernel).version, dtype=dtype,
                              shapes=[shape], budget_trials=trials, budget_seconds=None,
                              strategy=strategy, force=force, seed=0, backend=backend,
                              device_key=None)
        task_id = int(job.tasks[0].id)
        if started_by is not None:
            repo.start_task_locally(session, task_id, worker_id=started_by)
        session.commit()
    return task_id


def store(db_url: str, shape: dict[str, int], ms: float, device: str = GPU,
          config: dict[str, int] | None = None, dtype: str = "float16", *,
          triton_version: str = "3.6.0", kernel_version: str | None = None,
          kind: str = "cuda", timing: str = "eager-flushed") -> None:
    """A best config as a worker of that device kind would have stored it (kernel version:
    the registered matmul's unless given), timed with ``timing``."""
    from search_spaces import get_kernel

    version = kernel_version or get_kernel("matmul").version
    with init_db(db_url)() as session:
        repo.upsert_device(session, {"key": device, "kind": kind,
                                     "name": device.split(":")[1] if ":" in device else device})
        repo.store_best(session, device_key=device, kernel="matmul", kernel_version=version,
                        dtype=dtype, shape=shape, triton_version=triton_version,
                        config=config or CONFIG, p20_ms=ms, p50_ms=ms, p80_ms=ms, tflops=1.0,
                        gbps=1.0, torch_version=None, cuda_version=None, task_id=None,
                        timing=timing)
        session.commit()


def register_devices(db_url: str, *keys: str) -> None:
    """Devices as their workers register them on start (misses are queued only for those)."""
    with init_db(db_url)() as session:
        for key in keys:
            repo.upsert_device(session, {"key": key, "kind": key.split(":")[0], "name": key})
        session.commit()


def config_params(shape: dict[str, int], device: str | None = None,
                  dtype: str = "float16", **identity: str) -> dict[str, Any]:
    """Query parameters of GET /api/v1/configs (``identity``: kernel_version,
    triton_version)."""
    params: dict[str, Any] = {"kernel": "matmul", "dtype": dtype, **shape, **identity}
    if device:
        params["device"] = device
    return params


@contextmanager
def running_app(settings: Settings, **config: Any) -> Iterator[str]:
    """The app served by uvicorn on a free local port, in a thread; yields its base URL (for
    tests that need concurrent requests over real sockets). ``config``: more of
    ``uvicorn.Config``'s options (``http="api.connections:GuardedHTTP"``: the service's own
    protocol, as ``tuner serve`` runs it)."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=port,
                                           log_level="warning", **config))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
