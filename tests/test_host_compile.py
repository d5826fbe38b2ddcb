"""Compiling GPU binaries from host tensors (``tuner.host_compile``): in a GPU worker's compile
pool process a host tensor stands in for a GPU one, so the built-in kernels' host code decides
as it would on the GPU; elsewhere (the measuring child, the interpreter) a host tensor is the
interpreter's. The binaries themselves are compared on a GPU (tests/gpu/test_compile_pool.py)."""

from __future__ import annotations

import torch

from search_spaces import get_kernel, kernel_names
from tuner.backends.compile_pool import compile_device
from tuner.host_compile import HOST_COMPILE_ENV, compiles_on_host, device_on_gpu, on_gpu
from tuner.user_kernel import Kernel


def test_a_host_tensor_stands_in_for_a_gpu_one_only_in_a_host_compiling_process(monkeypatch):
    x = torch.zeros(4)
    monkeypatch.delenv(HOST_COMPILE_ENV, raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not on_gpu(x) and not device_on_gpu(torch.device("cpu"))
    monkeypatch.setenv(HOST_COMPILE_ENV, "1")
    assert on_gpu(x) and device_on_gpu(torch.device("cpu"))
    assert not device_on_gpu(torch.device("meta"))
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # the interpreter's host tensors are its own
    assert not on_gpu(x)


def test_the_softmax_interpreter_path_follows_the_stand_in(monkeypatch):
    from search_spaces.softmax import _interpreting

    x = torch.zeros(2, 8)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv(HOST_COMPILE_ENV, raising=False)
    assert _interpreting(x)
    monkeypatch.setenv(HOST_COMPILE_ENV, "1")
    assert not _interpreting(x)  # compiled as the GPU runs it: the SYNC kernel too


def test_every_built_in_kernel_with_a_compile_hook_compiles_from_host_tensors():
    """A built-in kernel's host code asks ``on_gpu``, never ``is_cuda``: each declares it, so
    a GPU worker's pool makes its inputs in host memory; a user's kernel keeps them on the
    GPU (its host code may decide by the device in ways we cannot see)."""
    names = [n for n in kernel_names() if hasattr(get_kernel(n), "compile")]
    assert len(names) >= 8
    for name in names:
        kernel = get_kernel(name)
        assert compiles_on_host(kernel), name
        assert compile_device("cuda", kernel) == "cpu"
        assert compile_device("interpret", kernel) == "cpu"
    user = Kernel.__new__(Kernel)
    assert not compiles_on_host(user)
    assert compile_device("cuda", user) == "cuda"
    assert compile_device("interpret", user) == "cpu"


def test_the_built_in_kernels_host_code_never_asks_a_tensor_whether_it_is_on_cuda():
    """``x.is_cuda`` deciding a compile would give the pool's host tensors another binary than
    the child's launch (the child would compile it again: slow, not wrong)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "search_spaces"
    offenders = [f"{f.name}:{i}" for f in sorted(root.rglob("*.py"))
                 for i, line in enumerate(f.read_text().splitlines(), 1) if ".is_cuda" in line]
    assert not offenders, offenders
