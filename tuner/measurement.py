"""Measurement: what happened when one config was tried. A failure is an outcome, never an inf."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from tuner.config import KernelConfig


class Outcome(enum.StrEnum):
    OK = "ok"
    COMPILE_ERROR = "compile_error"
    OUT_OF_RESOURCES = "out_of_resources"
    WRONG_RESULT = "wrong_result"
    TIMEOUT = "timeout"
    CRASH = "crash"
    #: rejected by a static constraint before compiling; never counted against the trial budget.
    PRUNED = "pruned"

    @property
    def is_failure(self) -> bool:
        return self is not Outcome.OK

    @property
    def poisons(self) -> bool:
        """Outcomes that must never be retried for the same key (they kill or hang the child)."""
        return self in (Outcome.CRASH, Outcome.TIMEOUT)


@dataclass(frozen=True)
class Measurement:
    config: KernelConfig
    outcome: Outcome
    #: p20/p50/p80 of the timed runs in milliseconds; None unless outcome is OK.
    p20_ms: float | None = None
    p50_ms: float | None = None
    p80_ms: float | None = None
    error: str | None = None
    compile_s: float | None = None
    #: max abs error against the reference (verified runs only)
    max_error: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK

    @property
    def ms(self) -> float | None:
        return self.p50_ms

    @property
    def noise(self) -> float:
        """Relative spread of the timings ((p80 - p20) / p50); 0 when unknown."""
        if not self.ok or not self.p50_ms or self.p20_ms is None or self.p80_ms is None:
            return 0.0
        return (self.p80_ms - self.p20_ms) / self.p50_ms

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["config"] = self.config.to_dict()
        d["outcome"] = self.outcome.value
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Measurement:
        """The measurement of ``to_dict``'s dict (a stored trial's: ``repo.measurement_dict``);
        a field it lacks takes its default."""
        values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
        return cls(**{**values, "config": KernelConfig(data["config"]),
                      "outcome": Outcome(data["outcome"])})

    @classmethod
    def failure(cls, config: KernelConfig, outcome: Outcome, error: str) -> Measurement:
        return cls(config=config, outcome=outcome, error=error[:4000])
