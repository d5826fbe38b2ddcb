"""Small CLI items of issue 32 (item 8): serve's --host/--port say their defaults, wait's and
cancel's --json say what they print, kernels takes --json, and a plugin that does not load is
reported once."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.support_processes import ROOT, interpreter_env
from tuner.app.cli import main


def _help(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
          command: str) -> str:
    monkeypatch.setenv("COLUMNS", "400")  # one line per option
    with pytest.raises(SystemExit):
        main([command, "--help"])
    return capsys.readouterr().out


def _option(text: str, option: str) -> str:
    return next(line for line in text.splitlines() if line.strip().startswith(option))


def test_serve_says_where_it_listens_by_default(capsys, monkeypatch):
    text = _help(capsys, monkeypatch, "serve")
    assert "default 127.0.0.1" in _option(text, "--host")
    assert "default 8000" in _option(text, "--port")


def test_each_service_commands_json_says_what_it_prints(capsys, monkeypatch):
    texts = {c: _option(_help(capsys, monkeypatch, c), "--json")
             for c in ("submit", "status", "wait", "cancel")}
    assert "without JOB" in texts["status"]
    for command in ("submit", "wait", "cancel"):
        assert "without JOB" not in texts[command], command
    assert len(set(texts.values())) == 4
    assert "finished job" in texts["wait"]


def test_kernels_takes_json(capsys):
    assert main(["kernels", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    matmul = next(k for k in listed["kernels"] if k["name"] == "matmul")
    assert [d["name"] for d in matmul["dims"]] == ["M", "N", "K"]
    assert matmul["plugin"] is None and "float16" in matmul["dtypes"]
    assert isinstance(listed["not_loaded"], list)


def test_a_plugin_that_does_not_load_is_reported_once(tmp_path):
    (tmp_path / "broken_plugin.py").write_text("raise RuntimeError('boom')\n")
    env = interpreter_env(TUNER_KERNELS="broken_plugin:KERNEL",
                          PYTHONPATH=f"{tmp_path}:{ROOT}")
    done = subprocess.run([sys.executable, "-m", "tuner.app.cli", "kernels"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("RuntimeError: boom") == 1, done.stderr
    assert "not loaded: broken_plugin:KERNEL (TUNER_KERNELS): RuntimeError: boom" in done.stderr
