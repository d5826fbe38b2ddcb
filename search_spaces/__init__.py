"""Kernel families. Each module defines one ``@triton.jit`` kernel, its launcher and its space.

``KERNELS`` maps a kernel's public name to the module path of its ``KERNEL`` object; modules are
imported on first use so that listing kernels never imports Triton.
"""

from __future__ import annotations

from typing import Any

from tuner.errors import UnknownKernel
from tuner.kernel import load_ref

KERNELS: dict[str, str] = {
    "matmul": "search_spaces.matmul:KERNEL",
    "softmax": "search_spaces.softmax:KERNEL",
}


def kernel_names() -> list[str]:
    return sorted(KERNELS)


def get_kernel(name: str) -> Any:
    """The TunableKernel registered as ``name``, or UnknownKernel listing the known ones."""
    ref = KERNELS.get(name)
    if ref is None:
        raise UnknownKernel(f"unknown kernel {name!r}; known kernels: {', '.join(kernel_names())}",
                            field="kernel")
    return load_ref(ref)
