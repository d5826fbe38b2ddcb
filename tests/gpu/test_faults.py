"""Faulting Triton kernels through the real pipeline (bench/gpu_faults.py): an illegal address
(a sticky CUDA error) is recorded as a crash and a spin loop as a timeout; each time the GPU
child is killed and replaced, its context leaves the GPU, and a good config still measures."""

from __future__ import annotations

import time

import pytest

from bench.gpu_faults import KERNEL as FAULTY
from tests.gpu.smi import Gpu, alive, compute_pids
from tuner.backends import TimingOptions
from tuner.backends.process import ProcessBackend
from tuner.config import KernelConfig
from tuner.measurement import Outcome

pytestmark = pytest.mark.gpu

GOOD, ILLEGAL, SPIN = (KernelConfig(MODE=mode, BLOCK=1024, num_warps=4, num_stages=2)
                       for mode in (0, 1, 2))
#: a spinning kernel is given up on after RUN_TIMEOUT_S
RUN_TIMEOUT_S = 5.0


def off_the_gpu(pids: set[int], within_s: float = 5.0) -> set[int]:
    """The ``pids`` still alive or holding a context after ``within_s`` (polled)."""
    deadline = time.monotonic() + within_s
    while True:
        left = {p for p in pids if alive(p)} | (pids & compute_pids())
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def test_an_illegal_address_and_a_spin_loop_are_recorded_and_the_child_restarted(
        cuda_machine: list[Gpu]):
    timing = TimingOptions(warmup_ms=2, rep_ms=10, compile_timeout_s=60,
                           run_timeout_s=RUN_TIMEOUT_S, max_consecutive_deaths=8)
    backend = ProcessBackend("cuda", FAULTY.ref, {"N": 1 << 20}, "float32", timing=timing,
                             compile_workers=2)
    try:
        first_child = backend.child_pids[-1]
        assert first_child in compute_pids()  # the child holds the GPU: what we look for below

        [crash] = backend.measure([ILLEGAL])
        assert crash.outcome is Outcome.CRASH, crash
        assert "illegal memory access" in (crash.error or "").lower(), crash.error
        assert backend.restarts == 1 and len(backend.child_pids) == 2
        assert off_the_gpu({first_child}) == set()

        t0 = time.monotonic()
        [hang] = backend.measure([SPIN])
        waited = time.monotonic() - t0
        assert hang.outcome is Outcome.TIMEOUT, hang
        assert (hang.error or "").startswith("run timed out"), hang.error
        assert RUN_TIMEOUT_S <= waited < RUN_TIMEOUT_S + 60, waited  # the restart included
        assert backend.restarts == 2 and len(set(backend.child_pids)) == 3
        assert off_the_gpu(set(backend.child_pids[:2])) == set()

        [ok] = backend.measure([GOOD])
        assert ok.ok and ok.p50_ms is not None and ok.p50_ms > 0, ok
        assert backend.healthy and backend.consecutive_deaths == 0
        assert backend.child_pids[-1] in compute_pids()
    finally:
        backend.close()
    assert off_the_gpu(set(backend.child_pids)) == set()
