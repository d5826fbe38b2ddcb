"""A corpus of real ``@triton.autotune`` kernels from published libraries, tuned by the service.

Each kernel is imported from a library installed as a test dependency (``fla-core``,
``liger-kernel``: the ``dev`` extra of pyproject.toml), never copied here, and adapted through
the documented path, ``tuner.Kernel(lib_kernel, grid=, make_inputs=, reference=, ...)``: the
library's autotuner brings its configs, key, hooks and pruning; the adapter says how to make a
problem's arguments and how to compute the expected outputs in plain torch. How many lines each
adaptation took is in its module's docstring. ``tests/test_corpus.py`` checks every kernel's
default config against its reference and tunes it end to end on the CPU interpreter.

One module per library (``fla_kernels``, ``liger_kernels``), each with:

- one module-level ``tuner.Kernel`` per library kernel (``L2NORM_FWD = tuner.Kernel(...)``);
- ``KERNELS``: name -> kernel, made by ``catalogue``, which also sets each kernel's ``ref``
  (``"tests.corpus.fla_kernels:L2NORM_FWD"``), what a measuring child process imports;
- ``SHAPES``: name -> a tiny problem the interpreter runs in seconds;
- ``GPU_SHAPES``: name -> realistic problems (thousands of tokens, hidden sizes of real models)
  for a benchmark on a GPU;

To add a kernel: import the library's autotuned object, write ``make_inputs(shape, dtype,
device, seed)`` (random tensors, never zeros; the key arguments from the shape) and a torch
``reference(args)``, describe it with ``tuner.Kernel``, and list it in ``catalogue(...)``,
``SHAPES`` and ``GPU_SHAPES``; the tests pick it up.
"""

from __future__ import annotations

from typing import Any

import torch


def catalogue(module: str, **kernels: Any) -> dict[str, Any]:
    """Name -> kernel for the module's kernels (given by attribute name), each with its ``ref``
    set to ``"module:ATTRIBUTE"``."""
    for attribute, kernel in kernels.items():
        kernel.ref = f"{module}:{attribute}"
    return {kernel.name: kernel for kernel in kernels.values()}


def randn(gen: torch.Generator, *size: int, dtype: str = "float32", device: str = "cpu",
          scale: float = 1.0) -> torch.Tensor:
    """Normal random numbers of ``size`` from ``gen``, drawn in fp32 and cast to ``dtype``."""
    x = scale * torch.randn(*size, generator=gen, device=device)
    return x.to(getattr(torch, dtype))


def generator(device: str, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)
