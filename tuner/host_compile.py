"""Compiling GPU binaries from inputs in host memory: a compile pool without CUDA contexts.

Triton compiles a kernel for a target (``GPUTarget("cuda", 90, 32)``) and a specialisation
(the arguments' dtypes, 16-byte alignment of pointers, divisibility by 16 and == 1 of
integers, constexprs); a launch's ``warmup`` never reads the tensors' memory nor their
device. A compile pool process that makes its stand-in inputs on the GPU starts a CUDA
context for nothing: 15 of them started together took 2-2.5 s of an H100 machine's start
beside the measuring child (``bench/NOTES.md``, issue 33) and hold a context's memory each.

So a pool process of a GPU worker sets ``HOST_COMPILE_ENV`` and, for a kernel that says its
compile hook is the same from host tensors (``compiles_on_host``: the built-in kernels), makes
its compile inputs in host memory. The kernel's host code then asks ``on_gpu(tensor)`` /
``device_on_gpu(device)`` where it would ask ``tensor.is_cuda``: a host tensor in such a
process stands in for a GPU one (the same SM count, descriptors, assembly), so that the binary
and its cache key are the ones the measuring child's launch looks for. A kernel without the
flag (a user's) keeps inputs on the GPU in the pool, as before: its host code may branch on
the device in ways we cannot see, and a binary compiled for another specialisation would only
be compiled again by the child (never wrong, but slow).
"""

from __future__ import annotations

import functools
import os
from typing import Any

#: set (to "1") in a compile-pool process of a GPU worker: host tensors stand in for GPU ones
HOST_COMPILE_ENV = "TUNER_COMPILE_ON_HOST"


def compiling_on_host() -> bool:
    """Whether this process compiles GPU binaries from host tensors (a GPU worker's compile
    pool process; never the measuring child, never the interpreter)."""
    return os.environ.get(HOST_COMPILE_ENV) == "1" and os.environ.get("TRITON_INTERPRET") != "1"


def device_on_gpu(device: Any) -> bool:
    """Whether work on ``device`` (a ``torch.device``) is for the GPU: a CUDA device, or the
    host standing in for it in a pool process compiling on the host."""
    return device.type == "cuda" or (device.type == "cpu" and compiling_on_host())


def on_gpu(tensor: Any) -> bool:
    """``device_on_gpu`` of a tensor's device."""
    return device_on_gpu(tensor.device)


def gpu_index(device: Any) -> int:
    """The CUDA device index work on ``device`` is for: its own, else the current device
    (the host standing in for the GPU)."""
    import torch

    if device.type == "cuda" and device.index is not None:
        return int(device.index)
    return int(torch.cuda.current_device())


@functools.cache
def _sm_count(index: int) -> int:
    import torch

    return int(torch.cuda.get_device_properties(index).multi_processor_count)


def gpu_sm_count(device: Any) -> int:
    """The SM count of the GPU work on ``device`` is for (``device_on_gpu`` must hold): a
    device property, read without a CUDA context."""
    return _sm_count(gpu_index(device))


def gpu_capability(device: Any) -> tuple[int, int]:
    """The compute capability of the GPU work on ``device`` is for (``device_on_gpu``)."""
    import torch

    major, minor = torch.cuda.get_device_capability(gpu_index(device))
    return int(major), int(minor)


def quiet_driver() -> None:
    """Make Triton's active driver answer the current device and stream without asking torch
    (device 0: the pool process sees only its worker's GPU; the default stream): a compile's
    ``warmup`` asks for both, and torch's current-stream lookup starts a CUDA context
    (``bench/host_compile_probe.py``). A compile never launches; a user kernel's wrapper that
    runs helper kernels on the pool's GPU inputs (a library's routing) launches them on the
    default stream, which is torch's too in that process (it never sets another). Only for a
    compile pool's process: the measuring child launches on torch's current stream."""
    from triton.runtime import driver

    active = driver.active
    active.get_current_device = lambda: 0
    active.get_current_stream = lambda device=None: 0


def build_launchers() -> None:
    """Have every binary this process compiles also build its launcher: Triton 3.6 makes a
    C launcher per kernel signature (built with the host compiler, cached on disk beside the
    binaries) at a binary's first launch, which cost the measuring child ~200 ms at the first
    config of each kernel function on a cold cache (``bench/results/trial_cost_cold_h100/``).
    A compile pool process builds it instead (no CUDA context needed), so the child finds it
    in the cache. Triton 3.9's launcher is generic (nothing is built). Best effort: a launcher
    that cannot be built here is built by the child at its first launch."""
    from triton.compiler import compiler
    from triton.runtime import driver

    original = compiler.CompiledKernel.__init__
    if getattr(original, "builds_launcher", False):
        return

    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        try:
            driver.active.launcher_cls(self.src, self.metadata)
        except Exception:  # noqa: BLE001 - an optimisation only (see above)
            pass

    init.builds_launcher = True  # type: ignore[attr-defined]
    compiler.CompiledKernel.__init__ = init  # type: ignore[method-assign]


def compiles_on_host(kernel: Any) -> bool:
    """Whether ``kernel``'s compile hook builds the same binaries from host tensors
    (its ``compiles_on_host`` attribute; False without one)."""
    return bool(getattr(kernel, "compiles_on_host", False))
