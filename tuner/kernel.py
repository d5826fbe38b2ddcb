"""The TunableKernel protocol: what a kernel family module in ``search_spaces/`` provides."""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol, runtime_checkable

from tuner.config import KernelConfig
from tuner.space import SearchSpace


@dataclass(frozen=True)
class Dim:
    """A named problem dimension with inclusive bounds."""

    name: str
    lo: int = 1
    hi: int = 65536
    doc: str = ""


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float


@runtime_checkable
class TunableKernel(Protocol):
    """One kernel family. Implementations live one per module in ``search_spaces/``.

    ``make_inputs`` returns a dict of tensors: random data (never zeros) plus the output buffer
    under ``"out"``. ``launch`` writes into ``inputs["out"]``; ``reference`` returns the expected
    output computed another way (torch), compared at ``tolerance(dtype)``.
    """

    name: str
    dims: tuple[Dim, ...]
    dtypes: tuple[str, ...]
    #: dtypes whose results the Triton CPU interpreter gets wrong (bf16 ``tl.dot``)
    interpreter_unsupported_dtypes: tuple[str, ...]

    @property
    def version(self) -> str: ...

    def space(self) -> SearchSpace: ...

    def default_config(self, shape: Mapping[str, int], dtype: str) -> KernelConfig: ...

    def known_good_configs(self, shape: Mapping[str, int], dtype: str) -> list[KernelConfig]: ...

    def make_inputs(
        self, shape: Mapping[str, int], dtype: str, device: str, seed: int
    ) -> dict[str, Any]: ...

    def launch(self, config: KernelConfig, inputs: dict[str, Any]) -> None: ...

    def reference(self, inputs: dict[str, Any]) -> Any: ...

    def tolerance(self, dtype: str) -> Tolerance: ...

    def flops(self, shape: Mapping[str, int]) -> float: ...

    def bytes(self, shape: Mapping[str, int], dtype: str) -> float: ...


def source_version(module: ModuleType) -> str:
    """A short hash of a kernel module's source: a stored config is only valid for this code."""
    source = inspect.getsource(module)
    return hashlib.sha256(source.encode()).hexdigest()[:12]


def load_ref(ref: str) -> Any:
    """Import ``"package.module:ATTR"``: how child processes find the kernel they measure."""
    import importlib

    module_name, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module_name), attr or "KERNEL")
