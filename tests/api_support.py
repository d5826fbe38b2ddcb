"""Helpers of the HTTP service tests: a job body, an in-process interpreter worker, a stored
best config."""

from __future__ import annotations

from typing import Any

from db import repo
from db.engine import init_db
from tuner.worker import TaskOutcome, Worker

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


def store(db_url: str, shape: dict[str, int], ms: float, device: str = GPU,
          config: dict[str, int] | None = None, dtype: str = "float16") -> None:
    """A best config as a GPU worker would have stored it."""
    from search_spaces import get_kernel

    version = get_kernel("matmul").version
    with init_db(db_url)() as session:
        repo.upsert_device(session, {"key": device, "kind": "cuda", "name": "NVIDIA H200"})
        repo.store_best(session, device_key=device, kernel="matmul", kernel_version=version,
                        dtype=dtype, shape=shape, triton_version="3.6.0",
                        config=config or CONFIG, p20_ms=ms, p50_ms=ms, p80_ms=ms, tflops=1.0,
                        gbps=1.0, torch_version=None, cuda_version=None, task_id=None)
        session.commit()


def config_params(shape: dict[str, int], device: str | None = None,
                  dtype: str = "float16") -> dict[str, Any]:
    """Query parameters of GET /api/v1/configs."""
    params: dict[str, Any] = {"kernel": "matmul", "dtype": dtype, **shape}
    if device:
        params["device"] = device
    return params
