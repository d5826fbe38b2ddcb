"""One Triton cache key per kernel in every process: callees' keys before their callers'.

Triton 3.6 (the GPU machines' version) merges a callee's global constants into its caller's key
before it computes the callee's key (``DependenciesFinder._update_hash``), so the first caller
to reach a helper whose key is not computed yet leaves that helper's ``tl.constexpr`` globals
out of its own key. Which caller is first depends on what the process compiled first: matmul's
``_matmul_kernel`` had one key in the compile-pool processes whose first compile was a tiled
config and another in those whose first was split-K (``tile_dot`` reads ``ROUND_TF32``), so the
GPU child compiled again most of what the pool had compiled for it (issue 33,
``bench/compile_trace/``; Triton 3.9 computes the callee's key first).

``settle_cache_keys`` computes the keys of every ``@triton.jit`` function reachable from a
module or object depth first, callees before callers: each key then takes its callees' whole
constants, whatever the process compiles first. The compile pool and the GPU child settle a
kernel's keys when they load it (``tuner.kernel.load_ref``), before they compile anything.
"""

from __future__ import annotations

import ast
import inspect
import logging
import sys
from types import ModuleType
from typing import Any

from tuner.code_hash import layers

log = logging.getLogger(__name__)

#: objects settled already (by id, holding a reference so that no id is reused): a kernel is
#: loaded by reference on every lookup, and its module's keys need computing once
_SETTLED: dict[int, Any] = {}


def _jit_function_type() -> type | None:
    try:
        from triton.runtime.jit import JITFunction
    except ImportError:  # pragma: no cover - triton is a dependency
        return None
    return JITFunction


def _unwrap(value: Any, jit_type: type) -> Any:
    """The JIT function under ``@triton.autotune`` / ``@triton.heuristics`` layers, or None."""
    try:
        return next((layer for layer in layers(value) if isinstance(layer, jit_type)), None)
    except Exception:  # noqa: BLE001 - an object whose attributes fail is no kernel
        return None


def _referenced(fn: Any) -> list[Any]:
    """The objects ``fn``'s source names: globals and closure variables, and attributes of
    them (``tiles.tile_dot``), in source order."""
    try:
        tree = fn.parse()
        scope = dict(fn.fn.__globals__)
        scope.update(inspect.getclosurevars(fn.fn).nonlocals)
    except Exception:  # noqa: BLE001 - no source: nothing to settle through
        return []
    found = []
    for node in ast.walk(tree):
        chain: list[str] = []
        while isinstance(node, ast.Attribute):
            chain.append(node.attr)
            node = node.value
        if not isinstance(node, ast.Name) or node.id not in scope:
            continue
        value = scope[node.id]
        found.append(value)
        for attr in reversed(chain):
            value = getattr(value, attr, None)
            if value is None:
                break
            found.append(value)
    return found


def _roots(obj: Any, jit_type: type) -> list[Any]:
    """The JIT functions ``obj`` holds: a module's globals, an object's module's globals and
    its attributes, or ``obj`` itself."""
    own = _unwrap(obj, jit_type)
    if own is not None:
        return [own]
    modules: list[ModuleType] = []
    if isinstance(obj, ModuleType):
        modules.append(obj)
    else:
        name = getattr(type(obj), "__module__", None)
        if name in sys.modules:
            modules.append(sys.modules[name])
    values = [v for m in modules for v in vars(m).values()]
    if not isinstance(obj, ModuleType):
        values += list(getattr(obj, "__dict__", {}).values())
    return [f for f in (_unwrap(v, jit_type) for v in values) if f is not None]


def settle_cache_keys(*objects: Any) -> int:
    """Compute the Triton cache key of every JIT function reachable from ``objects`` (modules,
    kernel objects, JIT functions), callees first; returns how many were computed here. Keys
    computed before (this process compiled something already) are left as they are."""
    jit_type = _jit_function_type()
    if jit_type is None:
        return 0
    seen: set[int] = set()
    settled = 0

    def visit(fn: Any) -> None:
        nonlocal settled
        if id(fn) in seen:
            return
        seen.add(id(fn))
        for value in _referenced(fn):
            callee = _unwrap(value, jit_type)
            if callee is not None:
                visit(callee)
        if getattr(fn, "hash", None) is None:
            try:
                fn.cache_key  # noqa: B018 - computed for its side effect: the key, now
                settled += 1
            except Exception as exc:  # noqa: BLE001 - Triton computes it again at compile
                log.debug("could not compute the cache key of %s: %s", fn, exc)

    for obj in objects:
        if id(obj) in _SETTLED:
            continue
        for fn in _roots(obj, jit_type):
            visit(fn)
        _SETTLED[id(obj)] = obj
    return settled
