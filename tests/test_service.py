"""``tuner serve`` as a user starts it: a real process, real HTTP, an interpreter worker."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest

from db import repo
from db.engine import init_db
from tests.api_support import queue_task
from tests.support_processes import ROOT, interpreter_env, serving, wait_for
from tuner.app import service, supervision
from tuner.client import TunerClient
from tuner.settings import Settings


def test_serve_runs_a_job_end_to_end_on_the_interpreter(tmp_path: Path):
    with serving(tmp_path) as served:
        client = TunerClient(served.base, timeout=10)
        job_id = client.submit("matmul", [{"M": 32, "N": 16, "K": 16}], "float16", trials=2)
        job = client.wait(job_id, timeout=240, poll=0.5)
        assert job["status"] == "succeeded", job
        config = client.best_config("matmul", {"M": 32, "N": 16, "K": 16}, "float16",
                                    device="interpret:cpu")
        assert config.to_dict() == job["tasks"][0]["best_config"]
        assert (tmp_path / "tuner.db").is_file()
        _a_killed_worker_is_replaced(served.proc)
    assert served.proc.returncode == 0
    assert "Triton CPU interpreter" in (tmp_path / "serve.log").read_text()
    assert _workers_of(served.proc.pid) == []  # serve stopped its workers before exiting


def _workers_of(serve_pid: int) -> list[int]:
    """Pids of the worker processes ``serve`` started (they carry its pid)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--parent-pid" in argv and str(serve_pid).encode() in argv:
            found.append(int(entry.name))
    return found


def _a_killed_worker_is_replaced(serve: subprocess.Popen[bytes]) -> None:
    [first] = _workers_of(serve.pid)
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: _workers_of(serve.pid) not in ([], [first]), serve, timeout=30)


def test_a_worker_stopped_by_sigterm_requeues_its_task_with_its_trials(tmp_path: Path):
    db_url = f"sqlite:///{tmp_path / 'w.db'}"
    factory = init_db(db_url)
    # 64^3 has more feasible configs than a few batches, and with the early stops off the
    # search runs to its 2000-trial budget: the stop lands mid-search however slow the machine
    # (with them on, a slow CI machine once saw the search end before the stop landed)
    task_id = queue_task(factory, {"M": 64, "N": 64, "K": 64}, 2000)
    no_early_stop = {"TUNER_STOP_CHANCE": "0", "TUNER_PATIENCE": "0", "TUNER_ROOFLINE_STOP": "0"}
    with open(tmp_path / "worker.log", "wb") as log:  # the child writes to its own copy
        proc = subprocess.Popen([sys.executable, "-m", "tuner.app.cli", "worker", "--backend",
                                 "interpret"],
                                env=interpreter_env(TUNER_DATABASE_URL=db_url, **no_early_stop),
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: _task(factory, task_id).trials_done >= 1, proc, timeout=180)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    task = _task(factory, task_id)
    assert task.status == "queued" and task.attempts == 0 and task.lease_owner is None
    with factory() as session:
        assert len(repo.trials_for_task(session, task_id)) == task.trials_done >= 1


def _task(factory: Any, task_id: int) -> Any:
    with factory() as session:
        return repo.get_task(session, task_id)


def test_without_a_gpu_serve_plans_one_interpreter_worker_and_says_so(monkeypatch):
    monkeypatch.setattr(service, "resolve_backend_kind", lambda kind: "interpret")
    kind, indices, note = service.worker_plan(Settings(), workers=None, backend="auto")
    assert (kind, indices) == ("interpret", [0]) and note == service.NO_GPU_NOTE
    assert "timings are not GPU timings" in service.NO_GPU_NOTE


def test_serve_plans_one_worker_per_gpu(monkeypatch):
    monkeypatch.setattr(service, "resolve_backend_kind", lambda kind: "cuda")
    monkeypatch.setattr(service, "count_gpus_without_init", lambda: 4)
    assert service.worker_plan(Settings(), workers=None, backend=None) == (
        "cuda", [0, 1, 2, 3], None)
    assert service.worker_plan(Settings(), workers=0, backend=None)[1] == []


def test_gpu_workers_on_one_machine_share_its_cores_for_compiling(monkeypatch):
    """Compiling is CPU-bound: two workers each with a process per core paid twice the start-up
    and fought over the cores (1.17x from 2 GPUs on the H200 pair)."""
    from tuner.backends import compile_pool

    monkeypatch.setattr(compile_pool.os, "sched_getaffinity", lambda _pid: set(range(32)))
    assert service.compile_workers_for(Settings(), "cuda", 1) == 31
    assert service.compile_workers_for(Settings(), "cuda", 2) == 15
    assert service.compile_workers_for(Settings(), "cuda", 64) == 1
    assert service.compile_workers_for(Settings(compile_workers=3), "cuda", 2) == 3
    assert service.compile_workers_for(Settings(), "interpret", 2) is None


def test_serve_tells_each_worker_how_many_share_the_machine(monkeypatch):
    started: list[list[str]] = []

    class Recorded:
        def __init__(self, cmd: list[str], **_kwargs: Any) -> None:
            started.append(cmd)

    monkeypatch.setattr(service.subprocess, "Popen", Recorded)
    pool = service.WorkerPool("cuda", [0, 1, 2], env={})
    pool.slots = [service._Slot(i) for i in pool.device_indices]
    for slot in pool.slots:
        pool._spawn(slot)
    assert [cmd[cmd.index("--workers-on-host") + 1] for cmd in started] == ["3", "3", "3"]
    assert [cmd[cmd.index("--device-index") + 1] for cmd in started] == ["0", "1", "2"]


def _scripted_pool(tmp_path: Path, script: str, **options: Any) -> service.WorkerPool:
    """A pool whose workers run ``script`` (real processes), noting when each started."""

    class Scripted(service.WorkerPool):
        starts: list[float] = []

        def command(self, slot: service._Slot) -> list[str]:
            return [sys.executable, "-c", script]

        def _spawn(self, slot: service._Slot) -> None:
            self.starts.append(time.monotonic())
            super()._spawn(slot)

    return Scripted("interpret", [0], env=dict(os.environ), poll_s=0.01,
                    state_file=tmp_path / "state.json", **options)


def _state(pool: service.WorkerPool) -> dict[str, Any]:
    assert pool.state_file is not None
    [worker] = json.loads(pool.state_file.read_text())["workers"]
    return dict(worker)


@pytest.mark.timeout(120)
def test_a_worker_that_keeps_exiting_is_restarted_forever_after_a_growing_back_off(
        tmp_path: Path):
    pool = _scripted_pool(tmp_path, "import sys; sys.exit(3)", first_delay_s=0.02,
                          max_delay_s=0.16)
    pool.start()
    try:  # the pool once gave up after five exits in a row, leaving the device without one
        wait_for(lambda: _state(pool)["restarts"] >= 8, None, timeout=90)
        worker = _state(pool)
    finally:
        pool.stop()
    assert worker["exits_in_a_row"] >= 8 and worker["last_exit"].startswith(
        "exited with status 3 after ")
    gaps = [b - a for a, b in pairwise(pool.starts)]
    # each restart waits its back-off, doubling from 0.02 s and capped at 0.16 s
    assert all(gap >= min(0.16, 0.02 * 2 ** i) for i, gap in enumerate(gaps))
    assert [supervision.restart_delay(n, 1.0, 60.0) for n in range(9)] == [
        0, 1, 2, 4, 8, 16, 32, 60, 60]


@pytest.mark.timeout(120)
def test_a_worker_that_stays_up_resets_the_back_off(tmp_path: Path):
    runs = tmp_path / "runs"
    # the first three exit at once; the fourth stays up
    script = (f"import pathlib, sys, time; p = pathlib.Path({str(runs)!r}); "
              "p.write_text(p.read_text() + 'x' if p.exists() else 'x'); "
              "sys.exit(3) if len(p.read_text()) <= 3 else time.sleep(600)")
    pool = _scripted_pool(tmp_path, script, first_delay_s=0.02, quick_s=1.0)
    pool.start()
    try:
        wait_for(lambda: _state(pool)["exits_in_a_row"] == 3, None, timeout=60)
        assert _state(pool)["restarts"] <= 3
        wait_for(lambda: _state(pool)["exits_in_a_row"] == 0, None, timeout=60)
        worker = _state(pool)
    finally:
        pool.stop()
    assert worker["state"] == "running" and worker["restarts"] == 3
    assert worker["last_exit"].startswith("exited with status 3")


def test_a_worker_hands_its_compile_share_to_each_task(monkeypatch, tmp_path: Path):
    from tuner.app import worker as worker_module

    seen: dict[str, Any] = {}

    def fake_execute(_factory: Any, task_id: int, **kwargs: Any) -> Any:
        seen.update(kwargs, task_id=task_id)
        return worker_module.TaskOutcome(task_id, "succeeded", None, None, False)

    monkeypatch.setattr(worker_module, "execute_task", fake_execute)
    factory = init_db(f"sqlite:///{tmp_path / 'w.db'}")
    queue_task(factory, {"M": 4, "N": 8}, 1, kernel="softmax", dtype="float32",
               backend="cuda", force=True)
    w = worker_module.Worker(factory, backend_kind="cuda", device_key="cuda:X:sm90",
                             compile_workers=7)
    assert w.run_once() is not None
    assert seen["compile_workers"] == 7


@pytest.mark.skipif(shutil.which("docker-compose") is None,
                    reason="docker-compose is not installed (scripts/test.sh installs it)")
def test_docker_compose_file_is_valid_alone_and_with_postgres():
    postgres = ["-f", "docker-compose.yml", "-f", "docker-compose.postgres.yml"]
    for args in ([], postgres):
        out = subprocess.run(["docker-compose", *args, "config"], cwd=ROOT,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert "worker" in out.stdout and "api" in out.stdout
    assert "postgres:" in subprocess.run(["docker-compose", *postgres, "config"],
                                         cwd=ROOT, capture_output=True, text=True).stdout
