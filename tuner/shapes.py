"""Parsing and validating problem shapes against a kernel's dimensions."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Generic, TypeVar

from tuner.errors import InvalidShape
from tuner.kernel import Dim

#: the largest dimension any kernel takes, whatever its bounds say: Triton indexes with 32-bit
#: integers, and a larger value sent to the API is a typo, not a problem to tune
MAX_DIM = 2**31 - 1


def parse_shape(text: str) -> dict[str, int]:
    """``"M=4096,N=4096,K=4096"`` -> ``{"M": 4096, "N": 4096, "K": 4096}``."""
    shape: dict[str, int] = {}
    if not text.strip():
        raise InvalidShape("shape is empty: write it as M=4096,N=4096,K=4096", field="shape")
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        name = name.strip()
        if not sep or not name:
            raise InvalidShape(f"shape part {part.strip()!r} is not NAME=VALUE "
                               "(write it as M=4096,N=4096,K=4096)", field="shape")
        try:
            shape[name] = int(value.strip())
        except ValueError:
            raise InvalidShape(f"shape {name}={value.strip()!r}: the value must be an integer",
                               field=f"shape.{name}") from None
        if list(shape).count(name) > 1:
            raise InvalidShape(f"shape names {name} twice", field=f"shape.{name}")
    return shape


def validate_shape(dims: Sequence[Dim], shape: Mapping[str, Any]) -> dict[str, int]:
    """The shape with every dimension checked, in the kernel's dimension order."""
    names = [d.name for d in dims]
    missing = [n for n in names if n not in shape]
    if missing:
        raise InvalidShape(f"shape is missing dimension {', '.join(missing)}: "
                           f"this kernel needs {', '.join(names)}", field=f"shape.{missing[0]}")
    extra = [k for k in shape if k not in names]
    if extra:
        raise InvalidShape(f"shape has unknown dimension {', '.join(map(str, extra))}: "
                           f"this kernel takes {', '.join(names)}", field=f"shape.{extra[0]}")
    out: dict[str, int] = {}
    for d in dims:
        value = shape[d.name]
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidShape(f"shape {d.name}={value!r}: must be an integer",
                               field=f"shape.{d.name}")
        hi = min(d.hi, MAX_DIM)
        if not d.lo <= value <= hi:
            raise InvalidShape(f"shape {d.name}={value}: every dimension must be between "
                               f"{d.lo} and {hi}", field=f"shape.{d.name}")
        out[d.name] = value
    return out


#: the range of a non-integer key value's number (``key_value``)
KEY_HASH_RANGE = 1 << 30


def key_value(value: Any) -> int:
    """A launch's key argument as a problem dimension. Triton keys on any value; problems are
    integers: an int is itself, a bool 0 or 1, anything else (a string, a float, a dtype,
    None) a stable number in [0, 2**30) from its ``repr``, the same in every process (the
    tuning side's ``make_inputs`` and the serving side's launch agree on it)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    digest = hashlib.sha256(repr(value).encode()).digest()
    return int.from_bytes(digest[:8], "big") % KEY_HASH_RANGE


def shape_key(shape: Mapping[str, int]) -> str:
    """Normalised identity of a shape: ``"K=4096,M=4096,N=4096"`` (sorted names)."""
    return ",".join(f"{k}={shape[k]}" for k in sorted(shape))


def shape_label(shape: Mapping[str, int]) -> str:
    return "x".join(str(v) for v in shape.values())


def log_shape(shape: Mapping[str, int]) -> dict[str, float]:
    """log2 of each dimension (at least 1): the terms of ``shape_distance``, computed once for
    shapes compared many times."""
    return {k: math.log2(max(1, v)) for k, v in shape.items()}


def log_distance(a: Mapping[str, float], b: Mapping[str, float]) -> float:
    """``shape_distance`` of two ``log_shape`` results."""
    return math.sqrt(sum((a.get(k, 0.0) - b.get(k, 0.0)) ** 2 for k in {*a, *b}))


def shape_distance(a: Mapping[str, int], b: Mapping[str, int]) -> float:
    """How far apart two shapes are: the Euclidean distance over log2 of each dimension (2x in
    one dimension counts 1); a dimension missing from one shape counts as 1 there. The one
    measure of "nearest shape" (serving the nearest tuned config, warm-starting a search):
    ``nearest``, ``nearest_logs``, ``nearest_first`` and ``ShapeTable`` find by it."""
    return log_distance(log_shape(a), log_shape(b))


T = TypeVar("T")


def nearest(items: Iterable[T], shape: Mapping[str, int],
            shape_of: Callable[[T], Mapping[str, int]],
            then: Callable[[T], Any] | None = None) -> tuple[T, float] | None:
    """The item whose shape (``shape_of``) is nearest to ``shape`` (``shape_distance``), with
    its distance; on a tie the least by ``then``, else the first. None without items."""
    return nearest_logs(items, log_shape(shape), lambda item: log_shape(shape_of(item)), then)


def nearest_logs(items: Iterable[T], logs: Mapping[str, float],
                 logs_of: Callable[[T], Mapping[str, float]],
                 then: Callable[[T], Any] | None = None) -> tuple[T, float] | None:
    """``nearest`` for shapes given as their ``log_shape`` (computed once for shapes compared
    many times)."""
    scored = [(log_distance(logs_of(item), logs), item) for item in items]
    if not scored:
        return None
    if then is None:
        distance, best = min(scored, key=lambda s: s[0])
    else:
        rank = then
        distance, best = min(scored, key=lambda s: (s[0], rank(s[1])))
    return best, distance


def nearest_first(items: Iterable[T], shape: Mapping[str, int],
                  shape_of: Callable[[T], Mapping[str, int]]) -> list[T]:
    """The items by how near their shapes (``shape_of``) are to ``shape`` (``shape_distance``),
    nearest first; items at the same distance in their order."""
    logs = log_shape(shape)
    return sorted(items, key=lambda item: log_distance(log_shape(shape_of(item)), logs))


class ShapeTable(Generic[T]):
    """Items with their shapes' log2 as a matrix, so that the items of the nearest shapes are
    found with one vector operation instead of a distance per item in Python (many lookups
    against the same items: the serving index)."""

    #: items this much (squared log2 distance) farther than the nearest are left out; far
    #: above float rounding, far below any real difference of two shapes
    TOLERANCE = 1e-9

    def __init__(self, items: Sequence[T], logs_of: Callable[[T], Mapping[str, float]]) -> None:
        import numpy as np  # only the serving index needs it: not every importer of shapes

        self._np = np
        self.items = list(items)
        self.dims = sorted({d for item in self.items for d in logs_of(item)})
        # a dimension missing from a shape counts as 1 there (log2 0), as in shape_distance
        self.logs = np.array([[logs_of(item).get(d, 0.0) for d in self.dims]
                              for item in self.items],
                             dtype=np.float64).reshape(len(self.items), len(self.dims))

    def nearest(self, logs: Mapping[str, float]) -> list[T]:
        """The items of the nearest shape (every one within ``TOLERANCE`` of it), in their
        order: ``nearest_logs`` picks among these whatever it would pick among all (distance
        ranks first). A dimension of ``logs`` that no item has adds the same to every
        distance."""
        if not self.items:
            return []
        np = self._np
        query = np.array([logs.get(d, 0.0) for d in self.dims], dtype=np.float64)
        squared = ((self.logs - query) ** 2).sum(axis=1)
        close = np.flatnonzero(squared <= squared.min() + self.TOLERANCE)
        return [self.items[i] for i in close]
