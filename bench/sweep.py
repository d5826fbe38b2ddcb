"""Shared by the GPU benchmarks: sweep a list of configs through the pipeline, and watch how
busy the GPU is while it happens."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Sequence
from typing import Any

from tuner.backends import TimingOptions
from tuner.backends.process import ProcessBackend
from tuner.config import KernelConfig
from tuner.measurement import Measurement


class GpuBusy:
    """Samples ``nvidia-smi`` utilisation every 100 ms (a fraction of time a kernel ran)."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        proc = subprocess.Popen(["nvidia-smi", "--query-gpu=utilization.gpu",
                                 "--format=csv,noheader,nounits", "-lms", "100"],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            if self._stop.is_set():
                break
            try:
                self.samples.append(float(line.strip().split(",")[0]) / 100)
            except ValueError:
                pass
        proc.terminate()

    def __enter__(self) -> GpuBusy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()

    @property
    def fraction(self) -> float:
        return sum(self.samples) / len(self.samples) if self.samples else float("nan")


def sweep(kernel: Any, shape: dict[str, int], dtype: str, configs: Sequence[KernelConfig],
          timing: TimingOptions, compile_workers: int | None = None,
          batch: int = 64) -> tuple[list[Measurement], float, float, Any]:
    """Measure every config through the pipeline. Returns measurements, wall seconds (from
    before the child and pool start), GPU busy fraction, and the device fingerprint."""
    t0 = time.monotonic()
    with GpuBusy() as busy:
        backend = ProcessBackend("cuda", kernel.ref, shape, dtype, timing=timing,
                                 compile_workers=compile_workers)
        try:
            out: list[Measurement] = []
            for i in range(0, len(configs), batch):
                out += backend.measure(list(configs[i:i + batch]))
        finally:
            backend.close()
    return out, time.monotonic() - t0, busy.fraction, backend.fingerprint
