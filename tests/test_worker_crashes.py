"""Runs that are interrupted, crash or lose their lease leave the store consistent: no task stuck
in ``running``, no finished trial lost, no measuring process left behind.

Real processes and signals throughout: ``python -m tuner.app.cli`` subprocesses on the Triton CPU
interpreter, real SQLite files and (with TUNER_TEST_POSTGRES_URL) a real PostgreSQL database.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from db import repo
from db.engine import init_db
from search_spaces import get_kernel
from tests.api_support import queue_task
from tests.support_processes import ROOT, alive, interpreter_env, wait_for


def _only_task(factory: Any) -> Any:
    with factory() as session:
        jobs, _total = repo.list_jobs(session)
        return jobs[0].tasks[0] if jobs else None


# -- 1. a run never leaves its task running -----------------------------------------------------

@pytest.mark.timeout(300)
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_interrupted_tune_stores_its_best_so_far_and_cancels_the_job(any_db_url, tmp_path,
                                                                        sig):
    factory = init_db(any_db_url)
    with open(tmp_path / "tune.out", "w+") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tuner.app.cli", "--db", any_db_url, "tune", "matmul",
             "--shape", "M=32,N=32,K=32", "--dtype", "float16", "--backend", "interpret",
             "--trials", "500", "--no-progress"],
            # the "no expected gain" stop off: the search must still be running when interrupted
            cwd=ROOT, env=interpreter_env(TUNER_STOP_CHANCE="0"), stdout=out,
            stderr=subprocess.STDOUT, start_new_session=True)
        try:
            # a verified trial is in the database: there is a best to keep
            wait_for(lambda: (t := _only_task(factory)) is not None and t.best_ms is not None,
                     proc)
            proc.send_signal(sig)
            assert proc.wait(timeout=120) == 130
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        out.seek(0)
        printed = out.read()
    task = _only_task(factory)
    with factory() as session:
        job = repo.get_job(session, task.job_id)
        trials = repo.trials_for_task(session, task.id)
        stored = repo.list_best(session, kernel="matmul")
    assert (job.status, task.status) == ("cancelled", "cancelled"), printed
    assert "interrupted" in (task.error or "") and task.lease_owner is None
    verified = [t for t in trials if t.outcome == "ok"]
    fastest = min(verified, key=lambda t: t.p50_ms)
    assert len(trials) < 500
    assert len(stored) == 1 and stored[0].device_key == "interpret:cpu"
    assert stored[0].task_id == task.id
    # the fastest verified config the search knew: the fastest recorded trial, or one measured
    # as the signal came, before its trial row was written (then faster still)
    if stored[0].config != fastest.config:
        assert stored[0].p50_ms < fastest.p50_ms, (stored[0].config, fastest.config)
    assert "the job is cancelled; stored its best verified config" in printed
    assert "stopped: interrupted" in printed


def test_an_unknown_strategy_is_refused_before_a_job_is_created(tmp_path):
    db = tmp_path / "s.db"
    out = subprocess.run(
        [sys.executable, "-m", "tuner.app.cli", "--db", f"sqlite:///{db}", "tune", "matmul",
         "--shape", "M=16,N=16,K=16", "--backend", "interpret", "--strategy", "nope"],
        cwd=ROOT, env=interpreter_env(), capture_output=True, text=True, timeout=120)
    from tuner.strategies import strategy_names

    assert out.returncode == 2
    [line] = out.stderr.strip().splitlines()
    assert "--strategy 'nope'" in line and all(n in line for n in strategy_names())
    assert not db.exists()  # no job: the store was not even opened


def test_tune_help_lists_every_strategy():
    from tuner.app.cli import STRATEGY_NAMES
    from tuner.strategies import strategy_names

    assert list(STRATEGY_NAMES) == strategy_names()
    out = subprocess.run([sys.executable, "-m", "tuner.app.cli", "tune", "--help"], cwd=ROOT,
                         env=interpreter_env(COLUMNS="300"), capture_output=True, text=True,
                         timeout=60)
    assert f"search strategy: {', '.join(strategy_names())}" in out.stdout


def _started_task(factory: Any, *, trials: int = 4, worker_id: str = "cli") -> int:
    return queue_task(factory, {"M": 16, "N": 16, "K": 16}, trials, backend="replay",
                      force=True, started_by=worker_id)


@pytest.mark.parametrize("where", ["open_backend", "run_search"])
def test_any_exception_while_opening_or_searching_fails_the_task(any_db_url, monkeypatch,
                                                                  where):
    from tuner.app import worker

    def broken(*_args: Any, **_kwargs: Any) -> Any:
        raise RuntimeError("the driver said no")

    factory = init_db(any_db_url)
    task_id = _started_task(factory)
    monkeypatch.setattr(worker, where, broken)
    outcome = worker.execute_task(factory, task_id, backend_kind="interpret")
    assert outcome.status == "failed"
    with factory() as session:
        task = repo.get_task(session, task_id)
        assert task.status == "failed" and task.error == "RuntimeError: the driver said no"
        assert repo.get_job(session, task.job_id).status == "failed"


# -- 2. every finished trial reaches the database as it is measured ----------------------------

#: a worker process running one task of the faulty kernel on the interpreter. The interpreter
#: has no compile pool (its batches are one config), so batches of 8 are asked for as the
#: GPU's compile pool makes the loop do. Before sending a config to the measuring child it
#: prints "measuring <config> <child pid>": every config printed before is finished.
_WORKER = """
import functools, sys
from db.engine import init_db
from tests.fakes.faulty import KERNEL
from tuner.app import worker
from tuner.backends import TimingOptions
from tuner.backends.process import ChildProcess

worker.get_kernel = lambda name: KERNEL
worker.SearchOptions = functools.partial(worker.SearchOptions, batch_size=8)
send = ChildProcess.send

def announce(self, message):
    if message[0] == "measure":  # a batch of one: no compile pool on the interpreter
        [config] = message[1]
        print("measuring", config.key(), self.process.pid, flush=True)
    send(self, message)

ChildProcess.send = announce
worker.execute_task(init_db(sys.argv[1]), int(sys.argv[2]), backend_kind="interpret",
                    timing=TimingOptions(run_timeout_s=600, start_timeout_s=120))
"""


def _faulty_task(factory: Any, trials: int) -> int:
    from tests.fakes.faulty import KERNEL

    return queue_task(factory, {"N": 64}, trials, kernel=KERNEL.name, version=KERNEL.version,
                      dtype="float32", strategy="exhaustive", force=True, started_by="cli")


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


@pytest.mark.timeout(300)
def test_a_worker_killed_mid_batch_keeps_every_finished_trial(any_db_url, tmp_path):
    from tests.fakes.faulty import HANG

    factory = init_db(any_db_url)
    task_id = _faulty_task(factory, trials=24)
    proc = subprocess.Popen([sys.executable, "-c", _WORKER, any_db_url, str(task_id)],
                            cwd=ROOT, env=interpreter_env(), stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    measuring: list[tuple[str, int]] = []
    try:
        # the first batch: MODE=0 x3 (good), then MODE=1 x3 (each kills the child), then
        # MODE=2 (hangs): killed while it hangs, six configs of the batch are finished
        for line in proc.stdout:
            _word, key, pid = line.split()
            measuring.append((key, int(pid)))
            if key == f"MODE={HANG},SLOW=1":
                break
        proc.kill()
        proc.wait(timeout=30)
    finally:
        _kill(proc.pid)
        for _key, pid in measuring:  # the hung child (until children die with their parent)
            _kill(pid)
        proc.stdout.close()
    finished = [key for key, _pid in measuring[:-1]]
    with factory() as session:
        trials = repo.trials_for_task(session, task_id)
    assert len(finished) == 6
    assert [t.config_key for t in trials] == finished
    assert [t.outcome for t in trials] == ["ok"] * 3 + ["crash"] * 3


# -- 4. a worker writes only while it holds the task's lease -----------------------------------

TABLE = ROOT / "tests/data/replay/matmul_4096x4096x4096_float16_h200.json"


@pytest.mark.parametrize("stolen_after", [2, 4])
def test_a_worker_whose_lease_went_to_another_stops_and_writes_nothing(any_db_url,
                                                                       stolen_after):
    """The lease is reaped and claimed by worker w2 after trial ``stolen_after`` of w1 (4 is
    the last: the search is over, its best not yet stored)."""
    from tuner.app.worker import execute_task
    from tuner.backends.replay import load_table

    factory = init_db(any_db_url)
    task_id = queue_task(factory, {"M": 4096, "N": 4096, "K": 4096}, 4, backend="replay",
                         force=True)
    with factory() as session:
        assert repo.claim_task(session, worker_id="w1", device_key="x", lease_seconds=60)
        session.commit()

    def steal(number: int, _m: Any) -> None:
        if number == stolen_after:
            with factory() as session:
                assert repo.release_task(session, task_id, "w1")
                assert repo.claim_task(session, worker_id="w2", device_key="x",
                                       lease_seconds=60)
                session.commit()

    outcome = execute_task(factory, task_id, backend_kind="replay", worker_id="w1",
                           replay_table=load_table(TABLE), on_trial=steal)
    assert outcome.status == "lost" and not outcome.stored
    with factory() as session:
        task = repo.get_task(session, task_id)
        assert (task.status, task.lease_owner) == ("running", "w2")
        assert len(repo.trials_for_task(session, task_id)) == task.trials_done == stolen_after
        assert repo.list_best(session, kernel="matmul") == []


# -- 5. measuring and compiling processes die with their parent --------------------------------

#: a parent with a compile pool (2 processes) and a measuring child, all three busy: each
#: pool process compiles a config that hangs, the child runs one that spins. It prints their
#: pids and waits to be killed
_PARENT = """
import sys, time
from tests.fakes.faulty import COMPILE_HANG, HANG, KERNEL
from tuner.backends import TimingOptions
from tuner.backends.compile_pool import CompilePool
from tuner.backends.process import ChildProcess
from tuner.config import KernelConfig

pool = CompilePool("interpret", KERNEL.ref, {"N": 64}, "float32", 2, timeout_s=600)
pool.submit([KernelConfig(MODE=COMPILE_HANG, SLOW=s) for s in (1, 2)])
child = ChildProcess("interpret", 0, start_timeout_s=120)
child.send(("setup", KERNEL.ref, {"N": 64}, "float32", 0))
assert child.receive(120) == ("ok",)
child.send(("measure", [KernelConfig(MODE=HANG, SLOW=1)], TimingOptions()))
assert child.receive(120)[0] == "compiled"  # now it spins in the hanging launch
while any(slot.config is None for slot in pool._slots):  # both compiles handed out
    time.sleep(0.01)
print(*pool.pids, child.process.pid, flush=True)
sys.stdin.read()
"""


def _gone_within(pids: list[int], seconds: float) -> list[int]:
    """The pids still alive after ``seconds`` (polled: nothing signals another's death)."""
    deadline = time.monotonic() + seconds
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@pytest.mark.timeout(180)
def test_a_killed_parent_takes_its_compile_pool_and_measuring_child_along():
    proc = subprocess.Popen([sys.executable, "-c", _PARENT], cwd=ROOT, env=interpreter_env(),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    pids = [int(p) for p in proc.stdout.readline().split()]
    try:
        assert len(pids) == 3 and all(alive(p) for p in pids)
        proc.kill()
        proc.wait(timeout=30)
        assert _gone_within(pids, 5.0) == []
    finally:
        for pid in pids:
            _kill(pid)
        proc.stdin.close()
        proc.stdout.close()


#: a parent whose child arms only the watch thread (as where prctl is missing)
_WATCHED = """
import subprocess, sys
code = ("import os, sys; from tuner.backends import child; child._set_pdeathsig = lambda: None; "
        "os.setpgrp(); child.die_with_parent(int(sys.argv[1])); print(os.getpid(), flush=True); "
        "[child.time.sleep(60) for _ in iter(int, 1)]")  # busy forever: no EOF to notice
sub = subprocess.Popen([sys.executable, "-c", code, str(__import__("os").getpid())])
sub.wait()
"""


@pytest.mark.timeout(60)
def test_without_prctl_the_watch_thread_ends_a_child_whose_parent_died():
    proc = subprocess.Popen([sys.executable, "-c", _WATCHED], cwd=ROOT, env=interpreter_env(),
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    [pid] = [int(p) for p in proc.stdout.readline().split()]
    try:
        assert alive(pid)
        proc.kill()
        proc.wait(timeout=30)
        assert _gone_within([pid], 5.0) == []
    finally:
        _kill(pid)
        proc.stdout.close()


# -- 6. a worker's GPU is the one CUDA_VISIBLE_DEVICES lists at its index; workers report -------

_SMI = """GPU 0: NVIDIA H200 (UUID: GPU-0a1b2c3d-0000-0000-0000-000000000000)
GPU 1: NVIDIA H200 (UUID: GPU-9f8e7d6c-0000-0000-0000-000000000000)
  MIG 1g.18gb     Device  0: (UUID: MIG-5a5a5a5a-0000-0000-0000-000000000000)
"""


@pytest.mark.parametrize(("visible", "index", "expected"), [
    (None, 0, "0"), (None, 3, "3"), ("0,1", 1, "1"), ("3,2", 0, "3"), (" 2 , 5", 1, "5"),
    ("GPU-0a1b,GPU-9f8e", 1, "GPU-9f8e"), ("MIG-5a5a5a5a", 0, "MIG-5a5a5a5a"),
])
def test_a_workers_index_maps_into_the_visible_devices(visible, index, expected):
    from tuner.device import visible_device_for

    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    assert visible_device_for(index, env) == expected


@pytest.mark.parametrize(("visible", "index"), [("0,1", 2), ("", 0), ("1,-1,0", 1)])
def test_an_index_beyond_the_visible_devices_is_an_error(visible, index):
    from tuner.device import visible_device_for

    with pytest.raises(ValueError, match="makes"):
        visible_device_for(index, {"CUDA_VISIBLE_DEVICES": visible})


def _fake_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, visible: str | None) -> None:
    """An ``nvidia-smi`` on PATH listing ``_SMI`` (two GPUs, one MIG device), and
    ``CUDA_VISIBLE_DEVICES`` set to ``visible`` (None: unset)."""
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ncat <<'EOF'\n{_SMI}EOF\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)


@pytest.mark.parametrize(("visible", "count"), [
    (None, 2), ("0,1", 2), ("1", 1), ("0,7,1", 1), ("7", 0), ("", 0), ("-1", 0),
    ("GPU-9f8e7d6c", 1), ("GPU-0a1b,GPU-9f8e", 2), ("MIG-5a5a5a5a", 1), ("GPU-ffff", 0),
])
def test_the_gpu_count_honours_cuda_visible_devices(visible, count, tmp_path, monkeypatch):
    from tuner.device import count_gpus_without_init

    _fake_gpus(tmp_path, monkeypatch, visible)
    assert count_gpus_without_init(str(tmp_path / "no-dev")) == count


@pytest.mark.parametrize(("visible", "count"), [
    (None, 3), ("0,1", 2), ("2", 1), ("0,7,1", 1), ("", 0), ("GPU-9f8e7d6c", 1)])
def test_the_gpu_count_reads_the_device_files_where_it_can(visible, count, tmp_path,
                                                           monkeypatch):
    """Unset or indices: the GPU device files (three here, where nvidia-smi lists two, to
    tell which answered), without nvidia-smi; UUIDs need nvidia-smi's listing."""
    from tuner.device import count_gpus_without_init

    dev = tmp_path / "dev"
    dev.mkdir()
    for name in ("nvidia0", "nvidia1", "nvidia2", "nvidiactl", "nvidia-uvm"):
        (dev / name).write_text("")
    _fake_gpus(tmp_path, monkeypatch, visible)
    assert count_gpus_without_init(str(dev)) == count


@pytest.mark.timeout(300)
def test_a_worker_registers_reports_its_task_and_stops(any_db_url, tmp_path):
    factory = init_db(any_db_url)
    task_id = queue_task(factory, {"M": 64, "N": 64, "K": 64}, 2000)
    with open(tmp_path / "worker.log", "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "tuner.app.cli", "worker", "--backend",
                                 "interpret"], cwd=ROOT,
                                env=interpreter_env(TUNER_DATABASE_URL=any_db_url,
                                                    TUNER_STOP_CHANCE="0"),
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

        def row() -> Any:
            with factory() as session:
                rows = [w for w in repo.list_workers(session) if w.pid == proc.pid]
                return rows[0] if rows else None

        try:
            busy = wait_for(lambda: (w := row()) is not None and w.status == "busy" and w, proc)
            assert (busy.task_id, busy.kind, busy.device_key) == (task_id, "interpret",
                                                                  "interpret:cpu")
            assert busy.gpu_index is None and busy.gpu_uuid is None
            with factory() as session:
                assert repo.get_task(session, task_id).lease_owner == busy.id
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=120) == 0
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    stopped = row()
    assert stopped.status == "stopped" and stopped.task_id is None


# -- 7. the compile pool never builds full-size inputs of a large problem ----------------------

#: a large problem per built-in kernel (every built-in must be listed), with odd residues and
#: a dimension of 1 where the kernel has room for one
LARGE = {"matmul": {"M": 40963, "N": 1, "K": 65535}, "softmax": {"M": 1048575, "N": 4099}}
LARGE["moe_gemm"] = {"M": 40963, "N": 1, "K": 65535, "E": 8, "TOPK": 2}
LARGE["moe_gemm_variants"] = LARGE["moe_gemm"]
LARGE |= {f"matmul_epilogue_{act}{res}": LARGE["matmul"]  # matmul's dims, fused epilogues
          for act in ("none", "relu", "gelu", "silu") for res in ("", "_residual")}
LARGE |= {n: {"B": 1, "H": 72, "S": 4099, "D": 128}
          for n in ("flash_attention", "flash_attention_causal")}
LARGE["vector_add"] = {"N": 2147483647}
LARGE["add_layernorm"] = {"M": 1048575, "N": 4099}
LARGE |= {n: {"N": 1001, "C": 3, "H": 227, "W": 229, "K": 97, "R": 11, "S": 11, "STRIDE": 4,
              "PAD1": 3, "DIL": 1} for n in ("conv2d", "conv2d_nhwc")}


def _builtins() -> list[str]:
    from search_spaces import is_builtin, kernel_names

    return [n for n in kernel_names() if is_builtin(n)]


@pytest.mark.parametrize("name", _builtins())
def test_each_builtin_kernel_compiles_on_small_inputs_that_specialise_alike(name):
    import torch

    from tuner.kernel import MAX_FULL_COMPILE_BYTES, compile_shape_for

    kernel = get_kernel(name)
    shape = LARGE[name]
    small = compile_shape_for(kernel, shape, "float16")
    assert small is not None and small.keys() == shape.keys()
    for dim, size in shape.items():  # what Triton specialises integers on
        assert (small[dim] == 1) == (size == 1) and small[dim] % 16 == size % 16, dim
    assert kernel.bytes(shape, "float16") > MAX_FULL_COMPILE_BYTES
    inputs = kernel.make_inputs(small, "float16", "cpu", 0)
    assert sum(t.nbytes for t in inputs.values() if isinstance(t, torch.Tensor)) < 16 << 20
    config = kernel.default_config(shape, "float16")  # a config chosen for the large problem
    names = inputs.get("_outputs", ("out",))
    for out in names:
        inputs[out].fill_(float("nan"))
    kernel.launch(config, inputs)
    refs = kernel.reference(inputs)
    refs = refs if isinstance(refs, tuple) else (refs,)
    tol = kernel.tolerance("float16")
    for out, ref in zip(names, refs, strict=True):
        torch.testing.assert_close(inputs[out].float(), ref.float(), atol=tol.atol * max(
            1.0, float(ref.abs().max())), rtol=tol.rtol)


def test_without_a_hook_only_small_problems_are_compiled_ahead_at_full_size():
    from tests.fakes.faulty import FaultyKernel
    from tuner.kernel import MAX_FULL_COMPILE_BYTES, compile_shape_for

    class Sized(FaultyKernel):
        def __init__(self, size: float) -> None:
            self.size = size

        def bytes(self, shape: Any, dtype: str) -> float:
            return self.size

    assert compile_shape_for(Sized(1e6), {"N": 7}, "float32") == {"N": 7}
    assert compile_shape_for(Sized(MAX_FULL_COMPILE_BYTES + 1), {"N": 7}, "float32") is None
    assert compile_shape_for(Sized(0.0), {"N": 7}, "float32") is None  # unknown: no guess
