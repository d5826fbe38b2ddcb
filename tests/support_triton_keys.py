"""Run by tests/test_triton_keys.py in a process of its own without ``TRITON_INTERPRET`` (the
tests' own process has the CPU interpreter on, whose kernels have no cache keys; computing a
key compiles nothing, so no GPU is needed). Prints one JSON object: each scenario's keys.

Triton 3.6 (the GPU machines') merges a callee's global constants into its caller's key before
computing the callee's key; the Triton installed here computes the callee's key first.
``_triton36_update_hash`` is that one method in 3.6's order (a small fake of the other
version), so that the order dependence the GPU machine showed can show here.
"""

from __future__ import annotations

import json
import os
from typing import Any

assert os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), "run without the interpreter"

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
import triton.runtime.jit as jit  # noqa: E402

from search_spaces import matmul  # noqa: E402
from search_spaces.gemm import tiles  # noqa: E402
from tuner import triton_keys  # noqa: E402
from tuner.kernel import load_ref  # noqa: E402

KERNELS = ("_matmul_kernel", "_matmul_split_k_kernel", "_matmul_persistent_kernel")
OWN_ORDER = jit.DependenciesFinder._update_hash


def _triton36_update_hash(self: Any, func: Any) -> None:
    # the callee's globals merged before its key is computed: empty where this caller is the
    # first to reach it
    self.used_global_vals.update(func.used_global_vals)
    func_key = func.cache_key + str(getattr(func, "noinline", False))
    self.hasher.update(func_key.encode("utf-8"))


def _functions() -> list[Any]:
    return [v for m in (matmul, tiles) for v in vars(m).values()
            if isinstance(v, jit.JITFunction)]


def fresh(order: Any = _triton36_update_hash) -> None:
    """As a process that has computed no key and settled nothing, merging in ``order``."""
    for f in _functions():
        f.hash, f.used_global_vals = None, {}
    triton_keys._SETTLED.clear()
    jit.DependenciesFinder._update_hash = order


def keys_after(first: str) -> dict[str, str]:
    """The kernels' keys in a process whose first compile was ``first``'s."""
    getattr(matmul, first).cache_key  # noqa: B018 - Triton computes it at the first compile
    return {k: getattr(matmul, k).cache_key for k in KERNELS}


def main() -> None:
    out: dict[str, Any] = {}
    for settle in (False, True):
        for first in ("_matmul_kernel", "_matmul_split_k_kernel"):
            fresh()
            if settle:
                out[f"settled_count_{first}"] = triton_keys.settle_cache_keys(matmul,
                                                                              matmul.KERNEL)
            out[f"{'settled' if settle else 'unsettled'}_{first}"] = keys_after(first)
    out["round_tf32_in_tiled_key"] = any(
        name == "ROUND_TF32" for name, _ in matmul._matmul_kernel.used_global_vals)
    fresh(OWN_ORDER)
    out["own_order"] = keys_after("_matmul_kernel")

    fresh()
    load_ref("search_spaces.matmul:KERNEL")
    out["load_ref_computed"] = all(f.hash is not None for f in _functions())
    for f in _functions():
        f.hash = None
    load_ref("search_spaces.matmul:KERNEL")  # settled already: nothing computed again
    out["load_ref_again_computed"] = sum(f.hash is not None for f in _functions())

    @triton.jit
    def helper(x):
        return x + 1

    @triton.autotune(configs=[triton.Config({}, num_warps=4)], key=["n"])
    @triton.jit
    def kernel(x_ptr, n, B: tl.constexpr):
        tl.store(x_ptr, helper(tl.load(x_ptr)))

    out["autotuned_settled"] = triton_keys.settle_cache_keys(kernel)
    out["autotuned_helper_first"] = helper.hash is not None and kernel.fn.hash is not None
    out["library"] = _library_keys()
    print(json.dumps(out))


def _reachable(module: Any) -> list[Any]:
    """Every JIT function reachable from ``module`` (as ``settle_cache_keys`` walks it)."""
    found: dict[int, Any] = {}
    todo = list(triton_keys._roots(module, jit.JITFunction))
    while todo:
        fn = todo.pop()
        if id(fn) in found:
            continue
        found[id(fn)] = fn
        todo += [c for c in (triton_keys._unwrap(v, jit.JITFunction)
                             for v in triton_keys._referenced(fn)) if c is not None]
    return list(found.values())


def _library_keys() -> dict[str, Any]:
    """An installed library's kernels (Liger-Kernel's cross entropy, written by others, as
    the user-kernel path loads them): settled under Triton 3.6's merge order, each key is the
    one this Triton computes by itself (callees first)."""
    import importlib

    module = importlib.import_module("liger_kernel.ops.cross_entropy")
    functions = _reachable(module)

    def keys() -> dict[str, str]:
        return {f"{f.fn.__module__}.{f.fn.__qualname__}": f.cache_key for f in functions}

    for f in functions:
        f.hash, f.used_global_vals = None, {}
    triton_keys._SETTLED.clear()
    jit.DependenciesFinder._update_hash = OWN_ORDER
    own = keys()
    for f in functions:
        f.hash, f.used_global_vals = None, {}
    triton_keys._SETTLED.clear()
    jit.DependenciesFinder._update_hash = _triton36_update_hash
    settled = triton_keys.settle_cache_keys(module)
    return {"functions": len(functions), "settled": settled, "same": keys() == own}


if __name__ == "__main__":
    main()
