"""The kernel registry: built-in kernels plus users' kernels, found without editing this project.

Three sources, one namespace of kernel names:

- built-ins: the modules of ``search_spaces/`` (``BUILTINS``), imported on first use;
- installed packages that declare an entry point in the group ``tuner.kernels``
  (``[project.entry-points."tuner.kernels"] rmsnorm = "my_pkg.kernels:KERNEL"``);
- ``TUNER_KERNELS``: comma-separated ``module:attribute`` references importable here (and on
  the worker's machine, whose measuring processes import the same reference).

Plugins are imported once, on the first lookup, each in a thread of its own for at most
``TUNER_PLUGIN_IMPORT_TIMEOUT_S`` seconds (default 30). One that fails to import (whatever it
raises, ``sys.exit`` included), hangs while importing (its thread is left behind), is not a
``TunableKernel`` or takes a name already registered is reported by ``plugin_errors()`` (its
source, reference and the error) and never stops the other kernels, nor the process. Kernel
source is never accepted over HTTP: only code installed on this machine is loaded.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import math
import os
import sys
import threading
import traceback
from dataclasses import dataclass

from tuner.errors import UnknownKernel
from tuner.kernel import TunableKernel, load_ref, missing_members

log = logging.getLogger(__name__)

#: the entry-point group installed packages register kernels under
ENTRY_POINT_GROUP = "tuner.kernels"
#: the environment variable listing ``module:attribute`` references
ENV_VAR = "TUNER_KERNELS"
#: the environment variable bounding each plugin's import, in seconds
TIMEOUT_VAR = "TUNER_PLUGIN_IMPORT_TIMEOUT_S"
DEFAULT_IMPORT_TIMEOUT_S = 30.0

BUILTINS: dict[str, str] = {
    "matmul": "search_spaces.matmul:KERNEL",
    "moe_gemm": "search_spaces.moe_gemm:KERNEL",
    "moe_gemm_variants": "search_spaces.moe_gemm:VARIANTS_KERNEL",
    **{f"matmul_epilogue_{v}": f"search_spaces.matmul_epilogue:{v.upper()}" for v in (
        "none", "relu", "gelu", "silu",
        "none_residual", "relu_residual", "gelu_residual", "silu_residual")},
    "conv2d": "search_spaces.conv2d:NCHW",
    "conv2d_nhwc": "search_spaces.conv2d:NHWC",
    "softmax": "search_spaces.softmax:KERNEL",
    "flash_attention": "search_spaces.flash_attention:KERNEL",
    "flash_attention_causal": "search_spaces.flash_attention:CAUSAL",
    "vector_add": "search_spaces.vector_add:KERNEL",
    "add_layernorm": "search_spaces.add_layernorm:KERNEL",
}


@dataclass(frozen=True)
class PluginError:
    """A plugin that could not be registered."""

    source: str  # "entry point rmsnorm" | "TUNER_KERNELS"
    ref: str  # the module:attribute that was loaded
    error: str  # one line: what went wrong

    def to_dict(self) -> dict[str, str]:
        return {"source": self.source, "ref": self.ref, "error": self.error}


@dataclass
class _State:
    plugins: dict[str, TunableKernel]
    errors: list[PluginError]


_lock = threading.Lock()
_state: _State | None = None


def _env_refs() -> list[str]:
    # The one place TUNER_KERNELS is read: every process (API, worker, CLI) builds the same
    # registry from its own environment, and measuring children inherit it.
    return [r.strip() for r in os.environ.get(ENV_VAR, "").split(",") if r.strip()]


def _entry_points() -> list[tuple[str, str]]:
    return [(f"entry point {ep.name}", ep.value)
            for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)]


def _one_line(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip().splitlines()[-1]


def _load_plugin(ref: str) -> TunableKernel:
    """Import ``ref`` and check it; ValueError says what is wrong with it."""
    if ":" not in ref:
        raise ValueError(f"{ref!r} is not a module:attribute reference")
    kernel = load_ref(ref)
    missing = missing_members(kernel)
    if missing:
        raise ValueError(f"{ref} is not a TunableKernel: it lacks {', '.join(missing)}")
    if not getattr(kernel, "ref", None):
        kernel.ref = ref  # how measuring child processes import it
    return kernel


def import_timeout_s() -> float:
    """``TUNER_PLUGIN_IMPORT_TIMEOUT_S``, else 30 (a value that is no positive number: 30 and
    a warning; ``Settings`` refuses it at a service's start)."""
    text = os.environ.get(TIMEOUT_VAR, "").strip()
    try:
        value = float(text) if text else DEFAULT_IMPORT_TIMEOUT_S
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        log.warning("%s must be a positive number of seconds; using %g", TIMEOUT_VAR,
                    DEFAULT_IMPORT_TIMEOUT_S)
        return DEFAULT_IMPORT_TIMEOUT_S
    return value


class PluginImportFailed(Exception):
    """A plugin's import hung or raised what no plugin may (``SystemExit``, any other
    BaseException): the message says which, as a sentence."""


def _load_bounded(ref: str, timeout_s: float) -> TunableKernel:
    """``_load_plugin(ref)`` in a thread of its own, given up after ``timeout_s`` (the thread,
    a daemon, is left where it hangs). What the plugin raised is raised here: an Exception as
    it is, any other BaseException (``sys.exit``) and a hang as PluginImportFailed."""
    outcome: list[TunableKernel | BaseException] = []

    def load() -> None:
        try:
            outcome.append(_load_plugin(ref))
        except BaseException as exc:  # noqa: BLE001 - a plugin must not stop the process
            outcome.append(exc)

    thread = threading.Thread(target=load, daemon=True, name=f"import {ref}")
    thread.start()
    thread.join(timeout_s)
    if not outcome:
        raise PluginImportFailed(f"its import did not finish within {timeout_s:g} s"
                                 f"{_where(thread)} ({TIMEOUT_VAR}); skipped")
    [result] = outcome
    if isinstance(result, Exception):
        raise result
    if isinstance(result, SystemExit):
        raise PluginImportFailed(f"it called sys.exit({result.code!r}) while importing")
    if isinstance(result, BaseException):
        raise PluginImportFailed(f"it raised {_one_line(result)} while importing")
    return result


def _where(thread: threading.Thread) -> str:
    """`` (stuck at file.py:3)``: the line a hung import thread is at, or ``""``."""
    frame = sys._current_frames().get(thread.ident or -1)
    return "" if frame is None else f" (stuck at {frame.f_code.co_filename}:{frame.f_lineno})"


def _load_plugins() -> _State:
    state = _State({}, [])
    sources = [*_entry_points(), *(("TUNER_KERNELS", ref) for ref in _env_refs())]
    timeout_s = import_timeout_s()
    for source, ref in sources:
        try:
            kernel = _load_bounded(ref, timeout_s)
        except Exception as exc:  # noqa: BLE001 - one broken plugin must not stop the rest
            error = str(exc) if isinstance(exc, PluginImportFailed) else _one_line(exc)
            state.errors.append(PluginError(source, ref, error))
            log.error("kernel plugin %s (%s) not loaded: %s", ref, source, error)
            continue
        taken = kernel.name in BUILTINS or kernel.name in state.plugins
        if taken and state.plugins.get(kernel.name) is not kernel:
            state.errors.append(PluginError(source, ref, f"the name {kernel.name!r} is "
                                            "already registered; rename the kernel"))
            continue
        state.plugins[kernel.name] = kernel
    return state


def _plugins() -> _State:
    global _state
    with _lock:
        if _state is None:
            _state = _load_plugins()
        return _state


def reload() -> None:
    """Forget loaded plugins (the next lookup reads the entry points and TUNER_KERNELS
    again); for tests and long-lived tools whose environment changed."""
    global _state
    with _lock:
        _state = None
    importlib.invalidate_caches()


def kernel_names() -> list[str]:
    """Every registered kernel's name, built-in and plugin, sorted."""
    return sorted({*BUILTINS, *_plugins().plugins})


def get_kernel(name: str) -> TunableKernel:
    """The kernel registered as ``name``, or UnknownKernel listing the known ones."""
    ref = BUILTINS.get(name)
    if ref is not None:
        kernel: TunableKernel = load_ref(ref)
        return kernel
    plugin = _plugins().plugins.get(name)
    if plugin is None:
        raise UnknownKernel(f"unknown kernel {name!r}; known kernels: "
                            f"{', '.join(kernel_names())}", field="kernel")
    return plugin


def is_builtin(name: str) -> bool:
    return name in BUILTINS


def plugin_errors() -> list[PluginError]:
    """Plugins that could not be registered (empty when all loaded)."""
    return list(_plugins().errors)
