"""Never worse than the default on a real GPU (issue 29): a task through the worker re-times
the kernel's default in the measuring child, interleaved with the finalists, and stores a
config only when it beats the default by more than the noise of the two; else the default,
labelled so."""

from __future__ import annotations

from pathlib import Path

import pytest

from db import repo
from db.engine import init_db
from search_spaces import get_kernel
from tests.gpu.smi import Gpu
from tuner.app.worker import execute_task
from tuner.config import KernelConfig

pytestmark = pytest.mark.gpu

KERNEL = get_kernel("vector_add")
SHAPE = {"N": 1 << 24}
DTYPE = "float32"


def test_the_stored_best_beats_the_default_beyond_the_noise_or_is_the_default(
        cuda_machine: list[Gpu], tmp_path: Path):
    factory = init_db(f"sqlite:///{tmp_path / 'gpu.db'}")
    with factory() as s:
        job = repo.create_job(s, kernel=KERNEL.name, kernel_version=KERNEL.version, dtype=DTYPE,
                              shapes=[SHAPE], budget_trials=8, budget_seconds=None,
                              strategy="auto", force=True, seed=0, backend="cuda",
                              device_key=None)
        task_id = int(job.tasks[0].id)
        repo.start_task_locally(s, task_id, worker_id="cli")
        s.commit()
    outcome = execute_task(factory, task_id, backend_kind="cuda", worker_id="cli")
    assert outcome.status == "succeeded", outcome.error
    result = outcome.result
    default = KERNEL.default_config(SHAPE, DTYPE)
    # the default was timed in the same child, in the finalists' interleaved rounds
    assert result is not None and result.default is not None
    assert result.default.config == default and result.default.ok
    # the rounds stop after 3 once the fastest is separated (tuner.backends.child.separated)
    assert result.default.extra["measured"] == "retimed"
    assert 3 <= result.default.extra["rounds"] <= 5, result.default.extra
    with factory() as s:
        [row] = repo.list_best(s)
        task = repo.get_task(s, task_id)
    print(f"default {task.default_ms:.4f} ms, search's best {task.best_ms:.4f} ms, noise margin "
          f"{100 * task.noise_margin:.1f}%: stored {row.basis} {row.config}")
    assert task.default_ms == result.default.p50_ms
    assert KernelConfig(task.default_config) == default
    assert row.basis == task.best_basis and row.basis in ("search", "default")
    assert row.noise_margin is not None and row.noise_margin >= 0.01
    if row.basis == "default":
        assert KernelConfig(row.config) == default and row.p50_ms == task.default_ms
        assert task.best_ms >= task.default_ms * (1 - row.noise_margin)
    else:
        assert row.p50_ms < task.default_ms * (1 - row.noise_margin)
