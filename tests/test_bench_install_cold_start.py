"""``bench/install_cold_start.py`` on the CPU interpreter: a cold process benchmarks two
fla-core kernels under ``tuner.install()`` and sends what Triton measured to a real service that
registers neither; a fresh process served by it launches each with the same config, from the
service, without benchmarking; pinned processes choose alike with and without the store."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.plugins import ROOT


@pytest.mark.timeout(600)
def test_the_served_process_takes_the_cold_process_choices_from_the_service(tmp_path):
    out = tmp_path / "install_cold_start.md"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-m", "bench.install_cold_start", "--cpu",
                          "--kernels", "fla_l2norm_fwd", "fla_swiglu_fwd", "--calls", "3",
                          "--repeats", "1",
                          "--out", str(out)], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=580)
    assert run.returncode == 0, run.stderr[-3000:]
    text = out.read_text()
    rows = re.findall(r"^\| (fla_\w+) \| [^|]+ \| ([\d.]+) \| ([\d.]+) \| (\w+) \| (\w+) \|",
                      text, re.MULTILINE)
    assert [(r[0], r[3], r[4]) for r in rows] == [("fla_l2norm_fwd", "service", "yes"),
                                                  ("fla_swiglu_fwd", "service", "yes")]
    assert "2 kernels)" in text
    pinned = re.findall(r"^\| pinned A vs [^|]+ \| (\d+) \| (\d+) \|$", text, re.MULTILINE)
    assert pinned == [("2", "0")] * 3
    hot = re.findall(r"^\| (fla_\w+) \| ([\d.]+) \| ([\d.]+) \| [-+][\d.]+ \|$", text,
                     re.MULTILINE)
    assert [h[0] for h in hot] == ["fla_l2norm_fwd", "fla_swiglu_fwd"]
