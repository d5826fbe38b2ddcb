"""The conformance suite: every registered kernel, built-in or plugin, passes every check of
``tuner.testing`` (the module plugin authors run over theirs: the project runs exactly what it
ships). Parametrised over the registry itself (with the example plugins installed) and over
``tuner.testing.CHECKS``, so a new kernel or a new check is covered the moment it exists;
kernels run on Triton's CPU interpreter."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import search_spaces
from tests.plugins import all_kernel_names, registered
from tuner.kernel import TunableKernel, load_ref
from tuner.testing import CHECKS, Check


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "name" in metafunc.fixturenames:
        metafunc.parametrize("name", all_kernel_names())
    if "check" in metafunc.fixturenames:
        metafunc.parametrize("check", [c for _, c in CHECKS], ids=[n for n, _ in CHECKS])


@pytest.fixture(autouse=True)
def plugins() -> Iterator[None]:
    with registered():
        yield


@pytest.fixture
def kernel(name: str) -> Any:
    return search_spaces.get_kernel(name)


def test_the_kernel_passes_the_check(kernel: Any, check: Check) -> None:
    check(kernel)


# -- the registry ------------------------------------------------------------------------------

def test_the_registry_gives_a_whole_kernel_that_its_ref_imports(kernel: Any) -> None:
    assert isinstance(kernel, TunableKernel)  # optional members filled in
    assert load_ref(kernel.ref) is kernel  # what a measuring child process imports


def test_the_version_survives_a_registry_reload(kernel: Any) -> None:
    search_spaces.reload()
    assert search_spaces.get_kernel(kernel.name).version == kernel.version
