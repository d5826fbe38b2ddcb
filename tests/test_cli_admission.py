"""``tuner tune`` applies the service's admission estimate (POST /jobs'
``check_interpreter_size``): a shape the CPU interpreter cannot run one trial of within
``TUNER_INTERPRETER_TRIAL_LIMIT_S`` is refused before any job is created."""

from __future__ import annotations

from pathlib import Path

from tuner.app.cli import main

HUGE = "M=4096,N=4096,K=4096"  # matmul fp16: at least ~670 s a trial on the interpreter


def test_tune_refuses_a_shape_the_interpreter_cannot_run_a_trial_of(tmp_path: Path, capsys,
                                                                     monkeypatch):
    monkeypatch.delenv("TUNER_INTERPRETER_TRIAL_LIMIT_S", raising=False)
    db = tmp_path / "cli.db"
    status = main(["--db", f"sqlite:///{db}", "tune", "matmul", "--shape", HUGE, "--dtype",
                   "float16", "--backend", "interpret", "--no-progress", "--trials", "1",
                   "--seconds", "1"])
    assert status == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "too large for the Triton CPU interpreter" in line and "670 s" in line, line
    assert "TUNER_INTERPRETER_TRIAL_LIMIT_S" in line  # the override, as for the service
    assert not db.exists()  # no job was created


def test_the_service_limit_setting_overrides_the_refusal(monkeypatch):
    from search_spaces import get_kernel
    from tuner.app.cli_commands import check_interpreter_shape

    matmul = get_kernel("matmul")
    monkeypatch.setenv("TUNER_INTERPRETER_TRIAL_LIMIT_S", "1000")
    check_interpreter_shape(matmul, {"M": 4096, "N": 4096, "K": 4096}, "float16")
