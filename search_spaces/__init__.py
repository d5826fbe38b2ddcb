"""Kernel families and the registry that names them.

Each built-in module defines one ``@triton.jit`` kernel, its launcher and its space; users'
kernels come from installed packages (entry-point group ``tuner.kernels``) and from
``TUNER_KERNELS`` (see ``search_spaces.registry``). Built-in modules are imported on first use,
so listing built-ins never imports Triton.
"""

from __future__ import annotations

from search_spaces.registry import (
    BUILTINS,
    PluginError,
    get_kernel,
    is_builtin,
    kernel_names,
    plugin_errors,
    reload,
)

__all__ = ["BUILTINS", "PluginError", "get_kernel", "is_builtin", "kernel_names",
           "plugin_errors", "reload"]
