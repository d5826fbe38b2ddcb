"""Triton cache keys that do not depend on what a process compiles first (tuner.triton_keys).

On the GPU machines (Triton 3.6) the compile trace found ``_matmul_kernel`` with two keys among
one worker's compile-pool processes, by which GEMM variant each had compiled first, and the GPU
child compiling again what the pool had compiled (bench/compile_trace/). The scenarios run in a
process without the CPU interpreter, with Triton 3.6's order of merging a callee's constants
(tests/support_triton_keys.py).
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from tests.support_processes import ROOT, interpreter_env


@pytest.fixture(scope="module")
def keys() -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "tests.support_triton_keys"], cwd=ROOT,
                          env=interpreter_env(TRITON_INTERPRET="0"), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_without_settling_the_first_compile_decides_the_keys(keys: dict[str, Any]) -> None:
    # the control: the order dependence the GPU machine showed
    tiled, split = keys["unsettled__matmul_kernel"], keys["unsettled__matmul_split_k_kernel"]
    assert tiled["_matmul_kernel"] != split["_matmul_kernel"]
    assert tiled["_matmul_split_k_kernel"] != split["_matmul_split_k_kernel"]


def test_settled_keys_are_the_same_whatever_is_compiled_first(keys: dict[str, Any]) -> None:
    assert keys["settled__matmul_kernel"] == keys["settled__matmul_split_k_kernel"]
    assert keys["settled_count__matmul_kernel"] >= 10  # matmul's kernels and the gemm helpers
    assert keys["round_tf32_in_tiled_key"]  # tile_dot's constant, in its caller's key


def test_settled_keys_are_those_of_callees_first(keys: dict[str, Any]) -> None:
    # the keys the installed Triton computes by itself (callee first): the complete ones
    assert keys["settled__matmul_kernel"] == keys["own_order"]


def test_load_ref_settles_a_module_once(keys: dict[str, Any]) -> None:
    assert keys["load_ref_computed"]
    assert keys["load_ref_again_computed"] == 0


def test_an_autotuned_kernel_and_its_closure_helper_are_settled(keys: dict[str, Any]) -> None:
    assert keys["autotuned_settled"] == 2
    assert keys["autotuned_helper_first"]


def test_an_installed_library_s_kernels_settle_to_their_complete_keys(keys: dict[str, Any]
                                                                      ) -> None:
    # Liger-Kernel's cross entropy and the helpers it reaches in its other modules
    library = keys["library"]
    assert library["functions"] >= 2 and library["settled"] == library["functions"]
    assert library["same"]
