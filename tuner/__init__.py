"""The tuning engine: configs, search spaces, the kernel protocol, measurement and search.

The engine core never imports ``api`` or ``db``; the worker, the CLI and the client sit on top
of it. For users' own kernels: ``tuner.Kernel`` describes one for tuning, ``tuner.autotune``
launches it with tuned configs (a drop-in for ``triton.autotune``), ``tuner.configure`` says
where configs come from; ``tuner.install`` serves every ``triton.autotune`` kernel of the
process, third-party ones included (``TUNER_INSTALL=1`` installs at ``import tuner``). Those
are imported on first use, so ``import tuner`` stays light.
"""

from __future__ import annotations

import os
from typing import Any

from tuner.config import KernelConfig
from tuner.measurement import Measurement, Outcome

__all__ = ["Kernel", "KernelConfig", "Measurement", "Outcome", "autotune", "configure",
           "forced_config", "install", "uninstall"]

_LAZY = {"Kernel": "tuner.user_kernel", "autotune": "tuner.autotuning",
         "configure": "tuner.autotuning", "forced_config": "tuner.autotuning",
         "install": "tuner.installing", "uninstall": "tuner.installing"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'tuner' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


if os.environ.get("TUNER_INSTALL", "") == "1":
    from tuner.installing import install as _install

    _install()
