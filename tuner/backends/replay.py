"""The replay backend: answers from a recorded ``replay-v1`` table (shared/replay/README.md).

Noise: an entry may carry its recorded spread, ``"p20_ms"`` and ``"p80_ms"`` beside its
``"ms"`` (the p50); every measurement of that config (trial and re-timing alike) returns those
three, so a replayed decision sees the same ``Measurement.noise`` ((p80 - p20) / p50) each
time: deterministic, like the rest of a replay. An entry without them has no spread (p20 = p50
= p80).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tuner.backends.base import MeasuredCallback
from tuner.config import KernelConfig
from tuner.device import DeviceFingerprint, replay_fingerprint
from tuner.errors import ReplayTableError
from tuner.measurement import Measurement, Outcome
from tuner.space import SearchSpace
from tuner.timing import DEFAULT_TIMING, TIMING_METHODS, check_timing


@dataclass(frozen=True)
class ReplayTable:
    """A recorded table. It may say how it was timed (``"timing_method"``: ``eager-flushed``,
    the default, ``cuda-graph`` or ``eager-hot``; ``tuner/timing.py``): a replayed task's
    results are stored as timed that way, whatever the task asked for."""

    kernel: str
    device: str
    shape: dict[str, int]
    dtype: str
    params: tuple[str, ...]
    results: dict[KernelConfig, float | str]  # ms, or the recorded error
    reference_ms: dict[str, float]
    triton_version: str | None = None
    torch_version: str | None = None
    #: the timing method the table was recorded with (``tuner/timing.py``)
    timing: str = DEFAULT_TIMING
    #: the recorded (p20, p80) of the configs whose entry has them (keyed as ``results``)
    spread: dict[KernelConfig, tuple[float, float]] = field(default_factory=dict)

    @property
    def best_ms(self) -> float:
        return min(v for v in self.results.values() if isinstance(v, float))

    def ok_times(self) -> list[float]:
        return sorted(v for v in self.results.values() if isinstance(v, float))


def load_table(path: str | Path) -> ReplayTable:
    """Parse a replay table, or raise ReplayTableError saying what is wrong with it."""
    p = Path(path)
    if not p.is_file():
        raise ReplayTableError(f"replay file {str(p)!r} does not exist")
    try:
        data = json.loads(p.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ReplayTableError(f"replay file {str(p)!r} is not valid JSON: {exc}") from None
    return parse_table(data, str(p))


def parse_table(data: Any, where: str = "replay table") -> ReplayTable:
    if not isinstance(data, dict) or data.get("format") != "replay-v1":
        raise ReplayTableError(f"{where}: not a replay-v1 table "
                               "(\"format\" must be \"replay-v1\")")
    try:
        results: dict[KernelConfig, float | str] = {}
        spread: dict[KernelConfig, tuple[float, float]] = {}
        for entry in data["results"]:
            config = KernelConfig({k: int(v) for k, v in entry["config"].items()})
            results[config] = float(entry["ms"]) if "ms" in entry else str(entry["error"])
            if "ms" in entry and ("p20_ms" in entry or "p80_ms" in entry):
                spread[config] = _spread(float(entry["p20_ms"]), float(entry["ms"]),
                                         float(entry["p80_ms"]))
        table = ReplayTable(
            kernel=str(data["kernel"]), device=str(data["device"]),
            shape={k: int(v) for k, v in data["shape"].items()}, dtype=str(data["dtype"]),
            params=tuple(data["params"]), results=results,
            reference_ms={k: float(v) for k, v in data.get("reference_ms", {}).items()},
            triton_version=data.get("triton_version"), torch_version=data.get("torch_version"),
            spread=spread,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ReplayTableError(f"{where}: malformed entry ({type(exc).__name__}: {exc})") from None
    if not any(isinstance(v, float) for v in results.values()):
        raise ReplayTableError(f"{where}: no config in the table has a time")
    # ("timing" is the recording's description in words)
    timing = data.get("timing_method", DEFAULT_TIMING)
    if timing not in TIMING_METHODS:
        raise ReplayTableError(f"{where}: \"timing_method\" {timing!r} is not a timing method "
                               f"({', '.join(TIMING_METHODS)})")
    return replace(table, timing=timing)


def _spread(p20: float, p50: float, p80: float) -> tuple[float, float]:
    """A recorded (p20, p80), checked to bracket the entry's p50."""
    if not p20 <= p50 <= p80:
        raise ValueError(f"p20_ms {p20} <= ms {p50} <= p80_ms {p80} does not hold")
    return p20, p80


def added_params(table: ReplayTable, space: SearchSpace) -> dict[str, int]:
    """The parameters of ``space`` that the table's configs lack (the kernel gained them after
    the recording), each with its first value: the one that runs the code the table measured
    (matmul's VARIANT=0, the tiled kernel, and SPLIT_K=1)."""
    return {p.name: p.values[0] for p in space.params if p.name not in table.params}


def with_added_params(table: ReplayTable, space: SearchSpace) -> ReplayTable:
    """The table as if recorded with every parameter of ``space`` (see ``added_params``): its
    configs as a search of ``space`` names them."""
    added = added_params(table, space)
    if not added:
        return table
    results = {KernelConfig({**c, **added}): v for c, v in table.results.items()}
    spread = {KernelConfig({**c, **added}): v for c, v in table.spread.items()}
    return replace(table, params=(*table.params, *added), results=results, spread=spread)


def _outcome_of(error: str) -> Outcome:
    """A recorded failure's outcome. A table holds only the error's text (no exception whose
    type could be checked: ``child.classify_exception`` does that where one was raised)."""
    return Outcome.OUT_OF_RESOURCES if "OutOfResources" in error else Outcome.COMPILE_ERROR


class ReplayBackend:
    """Answers each config with its recorded time; the space is the table's configs."""

    def __init__(self, table: ReplayTable) -> None:
        self.table = table
        self.fingerprint: DeviceFingerprint = replay_fingerprint(
            table.device, table.triton_version, table.torch_version)
        self.calls = 0
        #: parameters of the searched space that the table's configs lack, with the value
        #: they stand for (restrict sets them)
        self._added: dict[str, int] = {}

    @property
    def healthy(self) -> bool:
        return True

    @property
    def timing_method(self) -> str:
        """The method the table was timed with: what every answer of it was timed with."""
        return self.table.timing

    def use_timing(self, method: str) -> str:
        """A table answers with the times it recorded, whatever a task asks for: its own
        method (``timing_method``), what the results are stored as."""
        check_timing(method)
        return self.table.timing

    def restrict(self, space: SearchSpace) -> SearchSpace:
        """The space limited to the table's configs. A parameter the kernel gained after the
        table was recorded takes its first value, alone: the one that runs the code the table
        measured (matmul's VARIANT=0, the tiled kernel, and SPLIT_K=1), so that samplers
        never propose the others."""
        self._added = added_params(self.table, space)
        params = tuple(replace(p, values=p.values[:1]) if p.name in self._added else p
                       for p in space.params)
        allowed = frozenset(KernelConfig({**c, **self._added}) for c in self.table.results)
        return SearchSpace(params, space.constraints, allowed)

    def _recorded(self, config: KernelConfig) -> KernelConfig | None:
        """The table's key for ``config`` (None: a value of an added parameter the table never
        ran; a config without the added parameters is one of the table's own)."""
        if not self._added:
            return config
        if any(config.get(name, value) != value for name, value in self._added.items()):
            return None
        return KernelConfig({k: v for k, v in config.items() if k not in self._added})

    def _one(self, config: KernelConfig) -> Measurement:
        self.calls += 1
        key = self._recorded(config)
        value = None if key is None else self.table.results.get(key)
        if value is None:
            return Measurement.failure(config, Outcome.COMPILE_ERROR,
                                       "config is not in the replay table")
        if isinstance(value, str):
            return Measurement.failure(config, _outcome_of(value), value)
        assert key is not None
        p20, p80 = self.table.spread.get(key, (value, value))
        return Measurement(config, Outcome.OK, p20_ms=p20, p50_ms=value, p80_ms=p80,
                           compile_s=0.0, max_error=0.0)

    def measure(self, configs: Sequence[KernelConfig],
                on_result: MeasuredCallback | None = None) -> list[Measurement]:
        by_config: dict[KernelConfig, Measurement] = {}
        for config in dict.fromkeys(configs):
            by_config[config] = self._marked(self._one(config), "trial")
            if on_result is not None:
                on_result(by_config[config])
        return [by_config[c] for c in configs]

    def retime(self, configs: Sequence[KernelConfig], rounds: int,
               baseline: bool = False) -> list[Measurement]:
        """The recorded times again; with ``baseline``, the table's recorded baseline time
        (its first ``reference_ms``) is appended when it holds one."""
        out = [self._marked(self._one(c), "retimed") for c in configs]
        if baseline and self.table.reference_ms:
            label, ms = next(iter(self.table.reference_ms.items()))
            out.append(Measurement(KernelConfig({}), Outcome.OK, p20_ms=ms, p50_ms=ms,
                                   p80_ms=ms, extra={"baseline": "torch", "label": label,
                                                     "measured": "retimed"}))
        return out

    def _marked(self, m: Measurement, measured: str) -> Measurement:
        return replace(m, extra={**m.extra, "measured": measured, "timing": self.table.timing})

    def close(self) -> None:
        pass
