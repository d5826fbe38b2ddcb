"""What a tuning job was submitted for, one value: the API's route, the CLI and the store's
repository build it, the store keeps it as the job's columns and its tasks' shapes, and the
worker reads it back (``JobSpec.of``) for the search's options. Imports only value modules
(the store may import it)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from tuner.shapes import shape_key
from tuner.timing import DEFAULT_TIMING


class JobColumns(Protocol):
    """A stored job's columns (``db.models.Job``), as ``JobSpec.of`` reads them."""

    kernel: str
    kernel_version: str
    dtype: str
    budget_trials: int
    budget_seconds: float | None
    strategy: str
    force: bool
    seed: int
    backend: str
    device_key: str | None
    timing: str


@dataclass(frozen=True)
class JobSpec:
    """A job's submission: the kernel (and the version of its code the job is for), the
    dtype, the shapes (one task each, in this order), the budget, the strategy, ``force``
    (tune again where a config is stored), the seed, the backend, the target device (None:
    any) and the timing method (``tuner/timing.py``)."""

    kernel: str
    kernel_version: str
    dtype: str
    shapes: Sequence[Mapping[str, int]]  # kept as a tuple of dicts (copies)
    budget_trials: int
    budget_seconds: float | None
    strategy: str
    force: bool
    seed: int
    backend: str
    device_key: str | None
    timing: str = DEFAULT_TIMING

    def __post_init__(self) -> None:
        object.__setattr__(self, "shapes", tuple(dict(s) for s in self.shapes))

    @classmethod
    def of(cls, job: JobColumns, shapes: Sequence[Mapping[str, int]] = ()) -> JobSpec:
        """The spec a stored job was submitted with; ``shapes``: those wanted (a worker reads
        only its task's)."""
        return cls(kernel=job.kernel, kernel_version=job.kernel_version, dtype=job.dtype,
                   shapes=tuple(shapes), budget_trials=job.budget_trials,
                   budget_seconds=job.budget_seconds, strategy=job.strategy, force=job.force,
                   seed=job.seed, backend=job.backend, device_key=job.device_key,
                   timing=job.timing)

    def request_key(self) -> str:
        """sha256 (hex) of what makes two submissions the same; shape order does not matter.
        ``seed`` and ``force`` are left out: a resubmission differing only in them is a
        duplicate. ``timing`` counts only when it is not the default (the keys of jobs
        submitted before it existed stay what they were)."""
        fields: list[Any] = [self.kernel, self.kernel_version, self.dtype,
                             sorted(shape_key(s) for s in self.shapes), self.budget_trials,
                             self.budget_seconds, self.strategy, self.backend, self.device_key]
        if self.timing != DEFAULT_TIMING:
            fields.append(self.timing)
        return hashlib.sha256(json.dumps(fields).encode()).hexdigest()

    def job_columns(self) -> dict[str, Any]:
        """The job row's columns it fills (the shapes are its tasks')."""
        return dict(kernel=self.kernel, kernel_version=self.kernel_version, dtype=self.dtype,
                    device_key=self.device_key, backend=self.backend, strategy=self.strategy,
                    budget_trials=self.budget_trials, budget_seconds=self.budget_seconds,
                    force=self.force, seed=self.seed, timing=self.timing)

    def search_options(self) -> dict[str, Any]:
        """The search's options the job sets (``tuner.search.SearchOptions``): its budget, seed
        and strategy."""
        return dict(trials=self.budget_trials, seed=self.seed, strategy=self.strategy,
                    time_budget_s=self.budget_seconds)
