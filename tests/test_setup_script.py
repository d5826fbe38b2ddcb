"""scripts/setup.sh's decisions (issue 32, item 6), with stand-ins for python and pip: serving
installs the runtime only, once (a warm start installs nothing, a changed pyproject.toml
installs again); the test set-up installs the test tools from nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from tests.support_processes import ROOT

#: a python that logs its arguments (pip installs included) and has no torch
_FAKE_PYTHON = """#!/bin/sh
echo "$*" >> "$SETUP_LOG"
case "$1" in
  -c) exit 1 ;;
  -m) if [ "$2" = venv ]; then
        mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && cp "$0" "$3/bin/tuner"
      fi ;;
esac
exit 0
"""


def _tree(tmp_path: Path) -> Path:
    """A copy of the scripts and pyproject.toml, without a .venv, and the fake python."""
    tree = tmp_path / "tree"
    (tree / "scripts").mkdir(parents=True)
    for name in ("setup.sh", "serve.sh", "test.sh"):
        shutil.copy2(ROOT / "scripts" / name, tree / "scripts" / name)
    shutil.copy2(ROOT / "pyproject.toml", tree / "pyproject.toml")
    fake = tmp_path / "fake-python"
    fake.write_text(_FAKE_PYTHON)
    fake.chmod(0o755)
    return tree


def _run(tmp_path: Path, *argv: str) -> tuple[int, list[str], str]:
    """The exit status, the fake python's calls (pip installs, tuner) and stdout."""
    log = tmp_path / "calls.log"
    log.write_text("")
    env = {**os.environ, "SETUP_LOG": str(log), "PYTHON": str(tmp_path / "fake-python")}
    env.pop("TUNER_TORCH_SPEC", None)
    env.pop("TUNER_SETUP_FORCE", None)
    done = subprocess.run(["bash", *argv], cwd=tmp_path / "tree", env=env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, log.read_text().splitlines(), done.stdout


def _installs(calls: list[str]) -> list[str]:
    return [c for c in calls if c.startswith("-m pip install -q -e")]


def test_serving_installs_the_runtime_once(tmp_path):
    tree = _tree(tmp_path)
    _rc, calls, _out = _run(tmp_path, "scripts/serve.sh", "--port", "8001")
    assert _installs(calls) == ["-m pip install -q -e .[postgres]"]  # no test or lint tools
    assert calls[-1] == "serve --port 8001"
    _rc, calls, _out = _run(tmp_path, "scripts/serve.sh")
    assert calls == ["serve"]  # warm: nothing installed, pip not even asked
    assert _run(tmp_path, "scripts/setup.sh", "--runtime", "--check")[0] == 0
    # the tests' set-up is another one: the runtime's stamp does not stand for it
    rc, calls, out = _run(tmp_path, "scripts/setup.sh", "--check", "playwright")
    assert (rc, calls) == (1, []) and "would install: .[dev] playwright" in out
    with open(tree / "pyproject.toml", "a") as f:
        f.write("\n# a changed dependency\n")
    assert _run(tmp_path, "scripts/setup.sh", "--runtime", "--check")[0] == 1
    _rc, calls, _out = _run(tmp_path, "scripts/serve.sh")
    assert _installs(calls) == ["-m pip install -q -e .[postgres]"]


def test_the_test_set_up_installs_everything_from_nothing(tmp_path):
    _tree(tmp_path)
    _rc, calls, _out = _run(tmp_path, "scripts/setup.sh", "playwright")
    assert calls[0].startswith("-m venv .venv")
    assert "-m pip install -q torch==2.13.0" in calls
    assert _installs(calls) == ["-m pip install -q -e .[dev] playwright"]
    _rc, calls, _out = _run(tmp_path, "scripts/setup.sh", "playwright")
    assert calls == []
