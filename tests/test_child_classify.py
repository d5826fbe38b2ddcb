"""How the measuring child names a config's failure (``tuner.backends.child.classify_exception``):
by Triton's own exception types, raised here for real; by the text only where a failure has no
type of its own (CUDA errors, a Triton error re-raised inside another exception)."""

from __future__ import annotations

import ast

import pytest
from triton.compiler.errors import (
    CompilationError,
    CompileTimeAssertionFailure,
    UnsupportedLanguageConstruct,
)
from triton.runtime.errors import OutOfResources, PTXASError

from tuner.backends.child import classify_exception, triton_error_types
from tuner.errors import InvalidConfig
from tuner.measurement import Outcome

SRC = "def kernel(X, BLOCK: tl.constexpr):\n    tl.static_assert(BLOCK <= 128)\n"


def _node() -> ast.AST:
    """A node of ``SRC`` with a line and column, as Triton's code generator gives its errors."""
    return ast.parse(SRC).body[0].body[0]  # type: ignore[attr-defined]


def _raised(exc: BaseException) -> BaseException:
    """``exc`` as the child catches it: raised, with its traceback."""
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001
        return caught


@pytest.mark.parametrize(("exc", "outcome"), [
    (OutOfResources(262144, 232448, "shared memory"), Outcome.OUT_OF_RESOURCES),
    (CompilationError(SRC, _node(), "BLOCK must be a power of two"), Outcome.COMPILE_ERROR),
    (CompileTimeAssertionFailure(SRC, _node(), "BLOCK <= 128"), Outcome.COMPILE_ERROR),
    (UnsupportedLanguageConstruct(SRC, _node(), "unsupported AST node type: With"),
     Outcome.COMPILE_ERROR),
    (PTXASError("`ptxas` failed with error code 255"), Outcome.COMPILE_ERROR),
], ids=["OutOfResources", "CompilationError", "CompileTimeAssertionFailure",
        "UnsupportedLanguageConstruct", "PTXASError"])
def test_tritons_own_errors_are_classified_by_their_type(exc, outcome):
    assert classify_exception(_raised(exc)) is outcome


def test_the_types_are_tritons():
    out_of_resources, compile_errors = triton_error_types()
    assert out_of_resources == (OutOfResources,)
    assert set(compile_errors) == {CompilationError, PTXASError}


def test_a_subclass_of_a_triton_error_is_classified_as_it():
    class SmemOverflow(OutOfResources):
        pass

    class BadTile(CompilationError):
        pass

    assert classify_exception(SmemOverflow(1, 0, "shared memory")) is Outcome.OUT_OF_RESOURCES
    assert classify_exception(BadTile(SRC, _node(), "no")) is Outcome.COMPILE_ERROR


def test_an_error_only_named_like_tritons_is_not_one():
    class CompilationError(Exception):  # noqa: N818 - a lookalike, not Triton's
        pass

    class OutOfResourcesError(Exception):
        pass

    assert classify_exception(CompilationError("BLOCK must be a power of two")) is Outcome.CRASH
    assert classify_exception(OutOfResourcesError("smem")) is Outcome.CRASH


def test_the_text_decides_where_there_is_no_type():
    # CUDA's errors reach Python as RuntimeError: sticky ones are crashes
    sticky = RuntimeError("CUDA error: an illegal memory access was encountered")
    assert classify_exception(sticky) is Outcome.CRASH
    # a Triton error re-raised inside another exception (a kernel's own launch code) keeps
    # only its text
    wrapped = RuntimeError(f"launch failed: {OutOfResources(262144, 232448, 'shared memory')}")
    assert classify_exception(wrapped) is Outcome.OUT_OF_RESOURCES
    ptxas = RuntimeError(str(PTXASError("`ptxas` failed with error code 255")))
    assert classify_exception(ptxas) is Outcome.COMPILE_ERROR
    assert classify_exception(ValueError("BLOCK_N=192 is not supported")) is Outcome.CRASH


def test_the_kernels_own_pruning_is_pruned():
    assert classify_exception(InvalidConfig("num_ctas=2 is not tuned here")) is Outcome.PRUNED
