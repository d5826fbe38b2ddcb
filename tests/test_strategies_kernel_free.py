"""tuner/strategies/ holds strategies only (issue 31): no strategy imports a kernel module or
names a kernel's parameter. What a strategy knows of a kernel is its space, the problem and
the kernel's ``prior`` hook (``tuner.kernel.HasPrior``); the GEMM prior lives with the GEMM family
(``search_spaces/gemm/prior.py``)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STRATEGIES = sorted((ROOT / "tuner" / "strategies").glob("*.py"))
#: kernel parameters no strategy may name (matmul's and its family's)
KERNEL_PARAMS = ("VARIANT", "SPLIT_K", "ALIGN")


def imported_modules(tree: ast.AST) -> list[str]:
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


def test_the_strategies_are_found() -> None:
    assert {p.name for p in STRATEGIES} >= {"__init__.py", "base.py", "model_based.py"}


def test_no_strategy_imports_a_kernel_module() -> None:
    found = {p.name: [m for m in imported_modules(ast.parse(p.read_text()))
                      if m.split(".")[0] == "search_spaces"] for p in STRATEGIES}
    assert {name: mods for name, mods in found.items() if mods} == {}


def test_no_strategy_names_a_kernel_parameter() -> None:
    """Not as a name, an attribute, a string, nor in a comment or docstring."""
    found = {p.name: [w for w in KERNEL_PARAMS if w in p.read_text()] for p in STRATEGIES}
    assert {name: words for name, words in found.items() if words} == {}


def test_the_gemm_prior_is_the_family_s_and_reached_through_the_kernel() -> None:
    from search_spaces import get_kernel
    from search_spaces.gemm import prior
    from tuner.space import ProblemContext

    assert not (ROOT / "tuner" / "strategies" / "cost_model.py").exists()
    kernel = get_kernel("matmul")
    shape = {"M": 512, "N": 512, "K": 512}
    config = kernel.default_config(shape, "float16")
    ctx = ProblemContext(shape, "float16")
    assert kernel.prior(config, ctx) == prior.estimate(config, ctx)
