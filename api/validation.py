"""Checking a request against the kernel registry; errors name the offending field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from search_spaces import get_kernel
from tuner.errors import InvalidRequest, InvalidShape, UnsupportedDtype
from tuner.kernel import TunableKernel
from tuner.shapes import validate_shape
from tuner.strategies import strategy_names

#: the device key of the CPU interpreter (tuner.device.DeviceFingerprint.key)
INTERPRETER_KEY = "interpret:cpu"


def kernel_or_error(name: str, field: str = "kernel") -> TunableKernel:
    try:
        return get_kernel(name)
    except InvalidRequest as exc:
        exc.field = field
        raise


def check_dtype(kernel: TunableKernel, dtype: str, field: str = "dtype") -> None:
    if dtype not in kernel.dtypes:
        raise UnsupportedDtype(f"dtype {dtype!r} is not supported by {kernel.name}; choose one "
                               f"of {', '.join(kernel.dtypes)}", field=field)


def check_interpreter_dtype(kernel: TunableKernel, dtype: str, backend: str,
                            device: str | None) -> None:
    """A job pinned to the CPU interpreter cannot verify dtypes the interpreter computes wrongly
    (it would only fail on the worker, minutes later)."""
    pinned = backend == "interpret" or device == INTERPRETER_KEY
    if pinned and dtype in getattr(kernel, "interpreter_unsupported_dtypes", ()):
        raise UnsupportedDtype(f"dtype {dtype!r} cannot be checked on the Triton CPU "
                               "interpreter (it computes it wrongly); target a GPU or use "
                               "another dtype", field="dtype")


def check_shape(kernel: TunableKernel, shape: Mapping[str, Any], field: str) -> dict[str, int]:
    """The validated shape; errors carry ``field.<dim>`` (or ``<dim>`` when field is "")."""
    try:
        return validate_shape(kernel.dims, shape)
    except InvalidShape as exc:
        dim = (exc.field or "").rpartition(".")[2]
        if dim and dim != "shape":
            exc.field = f"{field}.{dim}" if field else dim
        else:
            exc.field = field
        raise


def check_strategy(name: str) -> None:
    if name not in strategy_names():
        raise InvalidRequest(f"unknown strategy {name!r}; choose one of "
                             f"{', '.join(strategy_names())}", field="strategy")
