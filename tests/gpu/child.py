"""What the GPU tests run outside the pytest process (which never initialises CUDA): a check
script in a fresh Python on the GPU, and one config through the product's measuring pipeline."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tuner.backends import TimingOptions
from tuner.backends.process import ProcessBackend
from tuner.config import KernelConfig

ROOT = Path(__file__).resolve().parents[2]


def run_check(code: str, timeout_s: float = 300) -> str:
    """Run ``code`` with ``python -c`` from the repository root on the GPU (the interpreter
    off); its stdout, after asserting that it exited 0 (the assertion shows both streams)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    env.pop("TRITON_INTERPRET", None)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def measure_one(kernel_ref: str, shape: Mapping[str, int], dtype: str,
                config: KernelConfig) -> Any:
    """One config measured (compiled, verified, timed briefly) by the product's measuring
    child on the GPU; its Measurement."""
    backend = ProcessBackend("cuda", kernel_ref, dict(shape), dtype,
                             timing=TimingOptions(warmup_ms=2, rep_ms=10,
                                                  compile_timeout_s=90, run_timeout_s=30))
    try:
        [m] = backend.measure([config])
    finally:
        backend.close()
    return m
