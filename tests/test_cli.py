"""The ``tuner`` CLI end to end: real subprocesses, a real SQLite file, the interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "tests/data/replay/matmul_4096x4096x4096_float16_h200.json"


def tuner(*args: str, db: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "tuner.app.cli", "--db", db, *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture
def db(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'cli.db'}"


def test_tune_on_the_interpreter_stores_a_verified_best_that_configs_lists(db):
    tuned = tuner("tune", "matmul", "--shape", "M=17,N=33,K=65", "--dtype", "float16",
                  "--trials", "4", "--backend", "interpret", "--json", db=db)
    assert tuned.returncode == 0, tuned.stderr
    summary = json.loads(tuned.stdout)
    assert summary["device"] == "interpret:cpu" and summary["stored"] is True
    assert summary["best_config"]["BLOCK_M"] in (16, 32, 64, 128, 256)
    assert summary["best_ms"] > 0 and summary["trials"] == 4
    listed = tuner("configs", "--kernel", "matmul", "--json", db=db)
    rows = json.loads(listed.stdout)
    assert len(rows) == 1
    # the search's best, or the kernel's default where nothing beat it beyond noise
    assert rows[0]["config"] == summary["stored_config"]
    assert summary["stored_config"] == summary["best_config"] or (
        "stored the kernel's default" in summary["stored_note"])
    assert rows[0]["device_key"] == "interpret:cpu"
    assert rows[0]["shape"] == {"M": 17, "N": 33, "K": 65}


def test_tune_sweep_tunes_every_value_as_one_job_and_stores_each_best(db):
    swept = tuner("tune", "vector_add", "--sweep", "N=33,17", "--dtype", "float32",
                  "--trials", "2", "--backend", "interpret", "--json", db=db)
    assert swept.returncode == 0, swept.stderr
    summary = json.loads(swept.stdout)
    assert summary["sweep"] == "N" and summary["shapes"] == 2
    assert [t["shape"] for t in summary["tasks"]] == [{"N": 17}, {"N": 33}]  # increasing
    assert summary["backends_opened"] == 1  # one child for the whole sweep
    listed = json.loads(tuner("configs", "--kernel", "vector_add", "--json", db=db).stdout)
    assert sorted(r["shape"]["N"] for r in listed) == [17, 33]
    bad = tuner("tune", "vector_add", "--sweep", "N=", "--backend", "interpret", db=db)
    assert bad.returncode == 2 and "expected DIM=V1,V2" in bad.stderr


def test_the_settings_stop_rule_default_is_the_search_s():
    from tuner.search import DEFAULT_STOP_CHANCE
    from tuner.settings import Settings

    assert Settings().stop_chance == DEFAULT_STOP_CHANCE


def test_tune_with_a_replay_table_prints_a_summary(db):
    out = tuner("tune", "matmul", "--replay", str(TABLE), "--trials", "20", db=db)
    assert out.returncode == 0, out.stderr
    assert "best" in out.stdout and "TFLOP/s" in out.stdout
    assert "replay:NVIDIA H200" in out.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["tune", "nosuchkernel", "--shape", "M=1,N=1,K=1"],
     "unknown kernel 'nosuchkernel'; known kernels: "),
    (["configs", "--kernel", "nope"], "unknown kernel 'nope'; known kernels: "),
    (["export", "--kernel", "nope"], "unknown kernel 'nope'; known kernels: "),
    (["tune", "matmul", "--shape", "M=4096,N=4096"], "missing dimension K"),
    (["tune", "matmul", "--shape", "M=1,N=1,K=1,Q=2"], "unknown dimension Q"),
    (["tune", "matmul", "--shape", "M:1,N=1,K=1"], "is not NAME=VALUE"),
    (["tune", "matmul", "--shape", "M=x,N=1,K=1"], "must be an integer"),
    (["tune", "matmul", "--shape", "M=0,N=1,K=1"], "between 1 and 65536"),
    (["tune", "matmul", "--shape", "M=1,N=1,K=100000"], "between 1 and 65536"),
    (["tune", "matmul", "--shape", "M=1,N=1,K=1", "--dtype", "int7"], "dtype 'int7'"),
    (["tune", "matmul", "--shape", "M=16,N=16,K=16", "--dtype", "bfloat16",
      "--backend", "interpret"], "interpret backend"),
    (["tune", "matmul", "--replay", "/nonexistent/table.json"], "does not exist"),
    (["tune", "matmul", "--shape", "M=1,N=1,K=1", "--trials", "0"], "at least 1"),
])
def test_bad_input_gives_one_clear_line_and_a_nonzero_exit(db, args, message):
    out = tuner(*args, db=db)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], out.stderr


def test_an_unknown_kernel_lists_the_known_ones(db):
    line = tuner("configs", "--kernel", "nope", db=db).stderr
    assert "matmul" in line.split("known kernels: ")[1]


def test_configs_of_a_kernel_not_installed_here_are_still_listed(db):
    from db import repo
    from db.engine import init_db

    with init_db(db)() as session:
        repo.store_best(session, device_key="interpret:cpu", kernel="elsewhere",
                        kernel_version="v1", dtype="float16", shape={"N": 8},
                        triton_version="3.6.0", config={"BLOCK": 8}, p20_ms=1.0, p50_ms=1.0,
                        p80_ms=1.0, tflops=None, gbps=None, torch_version=None,
                        cuda_version=None, task_id=None)
        session.commit()
    listed = tuner("configs", "--kernel", "elsewhere", "--json", db=db)
    assert listed.returncode == 0 and json.loads(listed.stdout)[0]["kernel"] == "elsewhere"


def test_a_replay_file_that_does_not_parse_is_refused(db, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    out = tuner("tune", "matmul", "--replay", str(bad), db=db)
    assert out.returncode == 2 and "is not valid JSON" in out.stderr


def test_tuner_patience_stops_a_search_that_stopped_improving(db):
    env_trials = ["tune", "matmul", "--replay", str(TABLE), "--trials", "48", "--json"]
    full = json.loads(tuner(*env_trials, db=db).stdout)
    os.environ["TUNER_PATIENCE"] = "3"
    try:
        early = tuner(*env_trials, db=db.replace("cli.db", "patience.db"))
    finally:
        del os.environ["TUNER_PATIENCE"]
    assert early.returncode == 0, early.stderr
    summary = json.loads(early.stdout)
    # without patience the model's "no expected gain" stop (or the budget) ends the search;
    # patience 3 fires before it, which waits for 6 trials without an improvement
    assert full["stop_reason"] in ("no expected gain", "budget")
    assert summary["trials"] < full["trials"] <= 48
    assert summary["stop_reason"] == "converged"
