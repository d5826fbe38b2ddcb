"""SearchSpace: typed parameters plus constraints evaluated before anything is compiled."""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from tuner.config import KernelConfig
from tuner.dtypes import element_bytes
from tuner.errors import InvalidConfig

ParamKind = Literal["pow2", "ordinal", "categorical"]

#: Opt-in shared memory per block on sm_90 (H100/H200): 227 KiB. Used when the device is unknown.
DEFAULT_SMEM_LIMIT = 232_448


@dataclass(frozen=True)
class Param:
    """One tunable parameter.

    ``pow2`` and ``ordinal`` values are ordered: neighbours are similar, and samplers are told so
    (they see the index into ``values``). ``categorical`` values have no order.
    """

    name: str
    values: tuple[int, ...]
    kind: ParamKind = "ordinal"

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError(f"parameter {self.name} has no values")
        if self.kind != "categorical" and list(self.values) != sorted(set(self.values)):
            raise ValueError(f"ordinal parameter {self.name} needs strictly increasing values")

    @classmethod
    def pow2(cls, name: str, lo: int, hi: int) -> Param:
        if lo <= 0 or lo & (lo - 1) or hi & (hi - 1) or hi < lo:
            raise ValueError(f"{name}: pow2 bounds must be powers of two with lo <= hi")
        values = []
        v = lo
        while v <= hi:
            values.append(v)
            v *= 2
        return cls(name, tuple(values), "pow2")

    @classmethod
    def ints(cls, name: str, values: Iterable[int]) -> Param:
        return cls(name, tuple(values), "ordinal")

    def index(self, value: int) -> int:
        return self.values.index(value)


@dataclass(frozen=True)
class ProblemContext:
    """What constraints may look at: the problem and the device's limits."""

    shape: Mapping[str, int]
    dtype: str
    smem_limit: int = DEFAULT_SMEM_LIMIT
    #: streaming multiprocessors (wave quantisation in cost models); H100/H200 SXM: 132
    sm_count: int = 132
    #: compute capability as major * 10 + minor (which features a kernel may use, e.g. TMA
    #: loads from 90); unknown devices (the CPU interpreter, replay tables) count as sm_90,
    #: the device DEFAULT_SMEM_LIMIT describes
    capability: int = 90

    @staticmethod
    def capability_of(text: str | None) -> int:
        """``"9.0"`` (a device fingerprint's compute_capability) as 90; None as the default."""
        if not text:
            return ProblemContext.capability
        major, _, minor = text.partition(".")
        return int(major) * 10 + int(minor or 0)

    @property
    def elem_bytes(self) -> int:
        return element_bytes(self.dtype)


#: A constraint returns None when the config may run, else the reason it cannot.
Constraint = Callable[[KernelConfig, ProblemContext], str | None]


@dataclass(frozen=True)
class SearchSpace:
    params: tuple[Param, ...]
    constraints: tuple[Constraint, ...] = ()
    #: When set, only these configs are in the space (a replay table's measured configs).
    allowed: frozenset[KernelConfig] | None = field(default=None, compare=False)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)

    def size(self) -> int:
        if self.allowed is not None:
            return len(self.allowed)
        n = 1
        for p in self.params:
            n *= len(p.values)
        return n

    def __iter__(self) -> Iterator[KernelConfig]:
        if self.allowed is not None:
            yield from sorted(self.allowed, key=self.encode)
            return
        names = self.names
        if any(not isinstance(v, int) or isinstance(v, bool)
               for p in self.params for v in p.values):  # KernelConfig says which and why
            for combo in itertools.product(*(p.values for p in self.params)):
                yield KernelConfig(dict(zip(names, combo, strict=True)))
            return
        # the product's order, each config's items in name order without a sort of its own
        order = sorted(range(len(names)), key=names.__getitem__)
        sorted_names = tuple(names[i] for i in order)
        pick = operator.itemgetter(*order) if len(order) > 1 else (lambda combo: combo)
        for combo in itertools.product(*(p.values for p in self.params)):
            items = tuple(zip(sorted_names, pick(combo), strict=True))
            yield KernelConfig.of_sorted_items(items)

    def contains(self, config: Mapping[str, int]) -> bool:
        if set(config) != set(self.names):
            return False
        if any(config[p.name] not in p.values for p in self.params):
            return False
        return self.allowed is None or KernelConfig(config) in self.allowed

    def validate(self, config: Mapping[str, Any]) -> KernelConfig:
        """The config as a KernelConfig, or InvalidConfig naming what is wrong."""
        missing = [n for n in self.names if n not in config]
        extra = [k for k in config if k not in self.names]
        if missing or extra:
            raise InvalidConfig(f"config must have exactly {list(self.names)}; "
                                f"missing {missing}, unknown {extra}", field="config")
        for p in self.params:
            if config[p.name] not in p.values:
                raise InvalidConfig(f"config {p.name}={config[p.name]!r} is not one of "
                                    f"{list(p.values)}", field=f"config.{p.name}")
        return KernelConfig({n: int(config[n]) for n in self.names})

    def violation(self, config: KernelConfig, ctx: ProblemContext) -> str | None:
        """Why ``config`` cannot run on this problem, or None. Nothing is compiled."""
        for constraint in self.constraints:
            reason = constraint(config, ctx)
            if reason:
                return reason
        return None

    def feasible(self, ctx: ProblemContext) -> list[KernelConfig]:
        return [c for c in self if self.violation(c, ctx) is None]

    def encode(self, config: Mapping[str, int]) -> tuple[int, ...]:
        """Ordinal coordinates: the index of each value (the order samplers see)."""
        return tuple(p.index(config[p.name]) for p in self.params)

    def decode(self, coords: Sequence[int]) -> KernelConfig:
        pairs = zip(self.params, coords, strict=True)
        return KernelConfig({p.name: p.values[i] for p, i in pairs})

    def restricted_to(self, configs: Iterable[KernelConfig]) -> SearchSpace:
        """The same parameters, limited to ``configs`` (which must use only known values)."""
        allowed = frozenset(configs)
        for c in allowed:
            self.validate(c)
        return SearchSpace(self.params, self.constraints, allowed)

    def describe(self) -> list[dict[str, Any]]:
        return [{"name": p.name, "kind": p.kind, "values": list(p.values)} for p in self.params]
