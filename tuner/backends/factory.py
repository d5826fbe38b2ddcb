"""Choosing and opening a backend by name."""

from __future__ import annotations

from typing import Any

from tuner.backends.base import Backend, TimingOptions
from tuner.device import cuda_available_without_init
from tuner.errors import BackendUnavailable
from tuner.kernel import TunableKernel

BACKEND_KINDS = ("auto", "cuda", "interpret", "replay")


def resolve_backend_kind(kind: str) -> str:
    """``auto`` is ``cuda`` where a GPU is visible, else ``interpret``."""
    if kind not in BACKEND_KINDS:
        raise BackendUnavailable(f"unknown backend {kind!r}; choose one of {BACKEND_KINDS}")
    if kind == "auto":
        return "cuda" if cuda_available_without_init() else "interpret"
    if kind == "cuda" and not cuda_available_without_init():
        raise BackendUnavailable("backend 'cuda' needs an NVIDIA GPU and none is visible; "
                                 "use --backend interpret to run on the CPU interpreter")
    return kind


def open_backend(kind: str, kernel: TunableKernel, shape: dict[str, int], dtype: str, *,
                 seed: int = 0,
                 replay_table: Any = None, device_index: int = 0,
                 timing: TimingOptions | None = None,
                 compile_workers: int | None = None) -> Backend:
    from tuner.backends.process import ProcessBackend
    from tuner.backends.replay import ReplayBackend

    kind = resolve_backend_kind(kind)
    if kind == "replay":
        if replay_table is None:
            raise BackendUnavailable("backend 'replay' needs a replay table (--replay FILE)")
        return ReplayBackend(replay_table)
    return ProcessBackend(kind, kernel.ref, shape, dtype, seed=seed, device_index=device_index,
                          timing=timing, compile_workers=compile_workers)
