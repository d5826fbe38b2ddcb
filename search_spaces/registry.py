"""The kernel registry: built-in kernels plus users' kernels, found without editing this project.

Three sources, one namespace of kernel names:

- built-ins: the modules of ``search_spaces/`` (``BUILTINS``), imported on first use;
- installed packages that declare an entry point in the group ``tuner.kernels``
  (``[project.entry-points."tuner.kernels"] rmsnorm = "my_pkg.kernels:KERNEL"``);
- ``TUNER_KERNELS``: comma-separated ``module:attribute`` references importable here (and on
  the worker's machine, whose measuring processes import the same reference).

Plugins are imported once, on the first lookup. One that fails to import, is not a
``TunableKernel`` or takes a name already registered is reported by ``plugin_errors()`` (its
source, reference and the error) and never stops the other kernels. Kernel source is never
accepted over HTTP: only code installed on this machine is loaded.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
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


def _load_plugins() -> _State:
    state = _State({}, [])
    sources = [*_entry_points(), *(("TUNER_KERNELS", ref) for ref in _env_refs())]
    for source, ref in sources:
        try:
            kernel = _load_plugin(ref)
        except Exception as exc:  # noqa: BLE001 - one broken plugin must not stop the rest
            state.errors.append(PluginError(source, ref, _one_line(exc)))
            log.error("kernel plugin %s (%s) not loaded: %s", ref, source, _one_line(exc))
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
