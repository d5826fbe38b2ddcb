"""The tuning engine: configs, search spaces, the kernel protocol, measurement and search.

The engine core never imports ``api`` or ``db``; the worker, the CLI and the client sit on top
of it. For users' own kernels: ``tuner.Kernel`` describes one for tuning, ``tuner.autotune``
launches it with tuned configs (a drop-in for ``triton.autotune``), ``tuner.configure`` says
where configs come from. Those are imported on first use, so ``import tuner`` stays light.
"""

from __future__ import annotations

from typing import Any

from tuner.config import KernelConfig
from tuner.measurement import Measurement, Outcome

__all__ = ["Kernel", "KernelConfig", "Measurement", "Outcome", "autotune", "configure",
           "forced_config"]

_LAZY = {"Kernel": "tuner.user_kernel", "autotune": "tuner.autotuning",
         "configure": "tuner.autotuning", "forced_config": "tuner.autotuning"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tuner' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
