"""``bench/install_cold_start.py`` on the CPU interpreter: a cold process benchmarks two
fla-core kernels under ``tuner.install()`` and exports its choices; a fresh process served from
that configs file launches each with the same config, from the file, without benchmarking."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.plugins import ROOT


@pytest.mark.timeout(300)
def test_the_served_process_takes_the_cold_process_choices_from_the_file(tmp_path):
    out = tmp_path / "install_cold_start.md"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "bench.install_cold_start", "--cpu",
                          "--kernels", "fla_l2norm_fwd", "fla_swiglu_fwd", "--calls", "3",
                          "--repeats", "1",
                          "--out", str(out)], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=280)
    assert run.returncode == 0, run.stderr[-3000:]
    text = out.read_text()
    rows = re.findall(r"^\| (fla_\w+) \| [^|]+ \| ([\d.]+) \| ([\d.]+) \| (\w+) \| (\w+) \|",
                      text, re.MULTILINE)
    assert [(r[0], r[3], r[4]) for r in rows] == [("fla_l2norm_fwd", "file", "yes"),
                                                  ("fla_swiglu_fwd", "file", "yes")]
    assert "2 kernels, 2 configs exported" in text
    hot = re.findall(r"^\| (fla_\w+) \| ([\d.]+) \| ([\d.]+) \| [-+][\d.]+ \|$", text,
                     re.MULTILINE)
    assert [h[0] for h in hot] == ["fla_l2norm_fwd", "fla_swiglu_fwd"]
