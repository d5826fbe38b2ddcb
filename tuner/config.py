"""KernelConfig: one point of a search space, in the flat format vLLM's config files use."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from typing import Any

#: Launch options that are not kernel meta-parameters.
LAUNCH_OPTIONS = ("num_warps", "num_stages", "num_ctas", "maxnreg")


def config_key(config: Mapping[str, int]) -> str:
    """The string identity of a config, ``BLOCK_K=32,BLOCK_M=64,...,num_warps=4`` (sorted
    name=value pairs): the one spelling of ``KernelConfig.key()`` and of the store's
    ``trials.config_key``, so a config is found again whichever wrote it."""
    return ",".join(f"{k}={config[k]}" for k in sorted(config))


class KernelConfig(Mapping[str, int]):
    """A frozen, hashable mapping of parameter name to value.

    ``{"BLOCK_M": 128, ..., "num_warps": 8, "num_stages": 3}``. Keys are kept sorted so that two
    configs with the same items are equal, hash the same and serialise to the same JSON.
    """

    __slots__ = ("_items", "_hash", "_map")

    def __init__(self, values: Mapping[str, int] | None = None, **kwargs: int) -> None:
        merged = dict(values or {}, **kwargs)
        for key, value in merged.items():
            if not isinstance(key, str):
                raise TypeError(f"config keys must be strings, got {key!r}")
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"config value {key}={value!r} must be an int")
        self._items: tuple[tuple[str, int], ...] = tuple(sorted(merged.items()))
        self._hash = hash(self._items)
        self._map = dict(self._items)

    @classmethod
    def of_sorted_items(cls, items: tuple[tuple[str, int], ...]) -> KernelConfig:
        """The config of ``items``, already sorted by name with int values (a search space's
        enumeration, whose values its parameters checked): no checks, no sort. A space of a
        few hundred thousand configs is enumerated for each problem (``SearchSpace.feasible``)."""
        config = cls.__new__(cls)
        config._items, config._hash, config._map = items, hash(items), dict(items)
        return config

    def __getitem__(self, key: str) -> int:
        return self._map[key]

    def __iter__(self) -> Iterator[str]:
        return (name for name, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, KernelConfig):
            return self._items == other._items
        if isinstance(other, Mapping):
            return dict(self._items) == dict(other)
        return NotImplemented

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v}" for k, v in self._items)
        return f"KernelConfig({inner})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (KernelConfig, (dict(self._items),))

    @property
    def meta(self) -> dict[str, int]:
        """The kernel's constexpr meta-parameters (everything but launch options)."""
        return {k: v for k, v in self._items if k not in LAUNCH_OPTIONS}

    @property
    def num_warps(self) -> int:
        return self.get("num_warps", 4)

    @property
    def num_stages(self) -> int:
        return self.get("num_stages", 3)

    def to_dict(self) -> dict[str, int]:
        return dict(self._items)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> KernelConfig:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise ValueError("a config must be a JSON object of name -> int")
        return cls(data)

    def key(self) -> str:
        """A short, stable string identity (used in the database and in logs)."""
        return config_key(self)

    def to_triton(self) -> Any:
        """The one place a ``triton.Config`` is built."""
        import triton

        return triton.Config(self.meta, num_warps=self.num_warps, num_stages=self.num_stages)

    def triton_repr(self) -> str:
        """``triton.Config({...}, num_warps=.., num_stages=..)`` (``triton_config_text``)."""
        return triton_config_text(self)


def triton_config_text(config: Mapping[str, int]) -> str:
    """The one rendering of a config as a ``triton.Config`` expression, pasteable into
    ``@triton.autotune(configs=[...])`` (the dashboard's copy buttons, ``triton_repr``): the
    constexprs as a dict, then the launch options as keywords. ``num_warps`` and ``num_stages``
    are always given, with the defaults the config was launched with (``to_triton``) where it
    does not name them, so the pasted config runs as the measured one did."""
    meta = ", ".join(f"{k!r}: {v!r}" for k, v in config.items() if k not in LAUNCH_OPTIONS)
    launch = {"num_warps": config.get("num_warps", 4), "num_stages": config.get("num_stages", 3)}
    launch.update((k, config[k]) for k in LAUNCH_OPTIONS if k in config)
    keywords = "".join(f", {k}={v!r}" for k, v in launch.items())
    return f"triton.Config({{{meta}}}{keywords})"
