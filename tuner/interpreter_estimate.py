"""How long the Triton CPU interpreter takes: a lower bound on one trial (the API's admission
check, ``api/validation.py``) and the wall-time bound of a task that has no time budget of its
own (``tuner/app/worker.py``): a small interpreter job must not hold the only worker for many
minutes (softmax 256x4096 once took 12, three of its configs hanging 60 s each)."""

from __future__ import annotations

from collections.abc import Mapping

from tuner.kernel import TunableKernel

#: launches of the kernel in one interpreter trial: one verified against the reference, three
#: timed (tuner/backends/child.py)
INTERPRETER_LAUNCHES_PER_TRIAL = 4
#: the Triton 3.9 CPU interpreter's fastest rates measured on a 2-core x86 machine: matmul
#: 512^3 fp16 at BLOCK 256x256x128 ran at 0.82 GFLOP/s (the default 64x64x32 tiles: 0.09),
#: softmax 1024x4096 fp16 moved 5 MB/s; the byte rate is taken 2x faster than measured so that
#: the estimate stays a lower bound on other machines and kernels
INTERPRETER_FLOP_PER_S = 0.82e9
INTERPRETER_BYTES_PER_S = 10e6
#: a trial's share of a task's default wall time: the lower bound times this (slower tiles,
#: compiles, the finalists' re-timing) ...
INTERPRETER_TRIAL_SLACK = 4.0
#: ... but at least this many seconds (a tiny problem's compile, child restarts)
INTERPRETER_MIN_TRIAL_S = 5.0


def interpreter_trial_seconds(kernel: TunableKernel, shape: Mapping[str, int],
                              dtype: str) -> float:
    """A lower bound on one trial's time on the CPU interpreter, from the kernel's flop and
    byte counts (0 where the kernel gives none)."""
    launch = max(kernel.flops(shape) / INTERPRETER_FLOP_PER_S,
                 kernel.bytes(shape, dtype) / INTERPRETER_BYTES_PER_S)
    return INTERPRETER_LAUNCHES_PER_TRIAL * launch


def interpreter_time_budget_s(kernel: TunableKernel, shape: Mapping[str, int], dtype: str,
                              trials: int) -> float:
    """The wall-time budget of an interpreter task whose job set none: ``trials`` trials of
    the admission estimate with slack, each at least ``INTERPRETER_MIN_TRIAL_S``."""
    per_trial = max(INTERPRETER_MIN_TRIAL_S,
                    INTERPRETER_TRIAL_SLACK * interpreter_trial_seconds(kernel, shape, dtype))
    return trials * per_trial
