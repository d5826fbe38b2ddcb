"""Measurement backends: ``cuda`` (a GPU child process), ``interpret`` (Triton's CPU interpreter in
a child process) and ``replay`` (answers from a recorded table)."""

from tuner.backends.base import Backend, TimingOptions
from tuner.backends.factory import open_backend, resolve_backend_kind

__all__ = ["Backend", "TimingOptions", "open_backend", "resolve_backend_kind"]
