"""Checking a request against the kernel registry; errors name the offending field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from search_spaces import get_kernel
from tuner.errors import InvalidRequest, InvalidShape, UnsupportedDtype
from tuner.shapes import validate_shape
from tuner.strategies import strategy_names


def kernel_or_error(name: str, field: str = "kernel") -> Any:
    try:
        return get_kernel(name)
    except InvalidRequest as exc:
        exc.field = field
        raise


def check_dtype(kernel: Any, dtype: str, field: str = "dtype") -> None:
    if dtype not in kernel.dtypes:
        raise UnsupportedDtype(f"dtype {dtype!r} is not supported by {kernel.name}; choose one "
                               f"of {', '.join(kernel.dtypes)}", field=field)


def check_shape(kernel: Any, shape: Mapping[str, Any], field: str) -> dict[str, int]:
    """The validated shape; errors carry ``field.<dim>``."""
    try:
        return validate_shape(kernel.dims, shape)
    except InvalidShape as exc:
        dim = (exc.field or "").rpartition(".")[2]
        exc.field = f"{field}.{dim}" if dim and dim != "shape" else field
        raise


def check_strategy(name: str) -> None:
    if name not in strategy_names():
        raise InvalidRequest(f"unknown strategy {name!r}; choose one of "
                             f"{', '.join(strategy_names())}", field="strategy")
