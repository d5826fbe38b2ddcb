"""Read-only queries behind the stale-config and comparison views (``GET /api/v1/configs/stale``,
``/dashboard/stale``, ``/dashboard/compare``): stored bests tuned for code or a Triton that is no
longer what runs, one shape's results across devices, Triton versions and jobs, and a kernel's
best time against M.

Kept apart from ``db/repo/`` (the write paths and the serving ladder): nothing here writes."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from db import repo
from db.models import BestConfig, Device, Job, Task
from tuner.identity import DeviceKind, same_triton_minor

#: why a stored best is stale: its kernel's source changed since (the registered kernel's
#: version differs), or its device now runs another Triton minor version
STALE_REASONS = ("kernel-version", "triton-version")
#: the device kind whose results come from recorded tables: the service cannot re-tune them
REPLAY_KIND = DeviceKind.REPLAY
#: job results listed on a comparison page (the most recent)
MAX_TASKS_COMPARED = 200

_Identity = tuple[str, str, str, str, str]  # device, kernel, dtype, shape key, timing


@dataclass(frozen=True, slots=True)
class StaleBest:
    """A stored best that would no longer be served ``exact`` to a caller running what runs
    now: ``reasons`` from ``STALE_REASONS``; ``budget_trials``: the trials of the job that
    tuned it (None: stored without a job, e.g. imported)."""

    row: BestConfig
    current_kernel_version: str
    current_triton_version: str | None
    reasons: tuple[str, ...]
    device_kind: str | None
    budget_trials: int | None

    @property
    def retunable(self) -> bool:
        """Whether the service's workers can tune it again (not a recorded table's)."""
        return self.device_kind != REPLAY_KIND


def device_triton_versions(session: Session, installed: str | None) -> dict[str, str | None]:
    """Each device's Triton now: as its workers last registered it; ``installed`` (this
    process's) where a device row does not say."""
    return {d.key: d.triton_version or installed for d in repo.list_devices(session)}


def stale_bests(session: Session, *, kernel_versions: Mapping[str, str],
                installed_triton: str | None, kernel: str | None = None) -> list[StaleBest]:
    """Stored bests tuned for another version of their kernel's source than the registered one
    (``kernel_versions``: kernel -> its version now) or under another Triton minor version than
    their device runs now (``device_triton_versions``), one per (device, kernel, dtype, shape,
    timing method): the most recently updated. An identity already tuned for the current
    kernel version and Triton minor (re-tuned since) is not stale, nor is a kernel that is not
    registered here (nothing to re-tune it with). Ordered by kernel, dtype, device and
    shape."""
    tritons = device_triton_versions(session, installed_triton)
    kinds = dict(session.execute(select(Device.key, Device.kind)).all())
    rows = [r for r in repo.list_best(session, kernel=kernel) if r.kernel in kernel_versions]
    current: set[_Identity] = set()
    stale: dict[_Identity, tuple[BestConfig, tuple[str, ...]]] = {}
    for r in rows:
        identity = (r.device_key, r.kernel, r.dtype, r.shape_key, r.timing)
        reasons = _reasons(r, kernel_versions[r.kernel], tritons.get(r.device_key,
                                                                        installed_triton))
        if not reasons:
            current.add(identity)
        elif identity not in stale or _newer(r, stale[identity][0]):
            stale[identity] = (r, reasons)
    budgets = _budgets(session, [r.task_id for r, _ in stale.values() if r.task_id])
    return [StaleBest(r, kernel_versions[r.kernel], tritons.get(r.device_key, installed_triton),
                      reasons, kinds.get(r.device_key), budgets.get(r.task_id or -1))
            for identity, (r, reasons) in stale.items() if identity not in current]


def _reasons(row: BestConfig, kernel_version: str, triton: str | None) -> tuple[str, ...]:
    reasons = []
    if row.kernel_version != kernel_version:
        reasons.append("kernel-version")
    # the service serves a config as exact across Triton patch releases (tuner/identity.py):
    # only another minor version makes one stale
    if not same_triton_minor(row.triton_version, triton):
        reasons.append("triton-version")
    return tuple(reasons)


def _newer(a: BestConfig, b: BestConfig) -> bool:
    return (a.updated_at, a.id) > (b.updated_at, b.id)


def _budgets(session: Session, task_ids: list[int]) -> dict[int, int]:
    """Task id -> the trials per shape of its job."""
    if not task_ids:
        return {}
    rows = session.execute(select(Task.id, Job.budget_trials).join(Job, Task.job_id == Job.id)
                           .where(Task.id.in_(task_ids)))
    return dict(rows.all())


# -- one shape compared --------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class StoredShape:
    """A (kernel, dtype, shape) with stored bests: what a comparison page can be asked for."""

    kernel: str
    dtype: str
    shape: dict[str, Any]
    shape_key: str
    bests: int


def stored_shapes(session: Session, kernel: str | None = None) -> list[StoredShape]:
    """Every (kernel, dtype, shape) with a stored best and how many bests it has (devices,
    Triton and kernel versions), by kernel, dtype and shape."""
    query = (select(BestConfig.kernel, BestConfig.dtype, BestConfig.shape_key,
                    func.min(BestConfig.id), func.count())
             .group_by(BestConfig.kernel, BestConfig.dtype, BestConfig.shape_key)
             .order_by(BestConfig.kernel, BestConfig.dtype, BestConfig.shape_key))
    if kernel:
        query = query.where(BestConfig.kernel == kernel)
    groups = session.execute(query).all()
    first_ids = [g[3] for g in groups]
    rows = session.execute(select(BestConfig.id, BestConfig.shape)
                           .where(BestConfig.id.in_(first_ids)))
    shapes: dict[int, dict[str, Any]] = dict(rows.all())
    return [StoredShape(k, d, shapes[first], key, n) for k, d, key, first, n in groups]


def shape_bests(session: Session, *, kernel: str, dtype: str,
                shape_key: str) -> list[BestConfig]:
    """The stored bests of one shape on every device, Triton and kernel version, fastest
    first."""
    return list(session.scalars(
        select(BestConfig).where(BestConfig.kernel == kernel, BestConfig.dtype == dtype,
                                 BestConfig.shape_key == shape_key)
        .order_by(BestConfig.p50_ms, BestConfig.id)))


def shape_tasks(session: Session, *, kernel: str, dtype: str,
                shape_key: str) -> list[tuple[Task, Job]]:
    """The tasks of every job that tuned one shape (the most recent ``MAX_TASKS_COMPARED``),
    newest first, each with its job."""
    rows = session.execute(
        select(Task, Job).join(Job, Task.job_id == Job.id)
        .where(Job.kernel == kernel, Job.dtype == dtype, Task.shape_key == shape_key)
        .order_by(Job.created_at.desc(), Task.id.desc()).limit(MAX_TASKS_COMPARED))
    return list(rows.all())


@dataclass(frozen=True, slots=True)
class Series:
    """One line of the time-against-M chart: the bests of one device, Triton version and
    kernel version, by M."""

    device: str
    triton_version: str
    kernel_version: str
    m: list[int]
    ms: list[float]


def m_sweep(session: Session, *, kernel: str, dtype: str, shape: Mapping[str, int],
            dim: str = "M") -> list[Series]:
    """The stored bests of the shapes that differ from ``shape`` only in ``dim`` (the token
    count), ``shape`` included, as one series per (device, Triton version, kernel version)
    ordered by ``dim``; empty when the shape has no such dimension."""
    if dim not in shape:
        return []
    others = {k: v for k, v in shape.items() if k != dim}
    points: dict[tuple[str, str, str], dict[int, float]] = defaultdict(dict)
    for r in repo.list_best(session, kernel=kernel, dtype=dtype):
        if dim not in r.shape or {k: v for k, v in r.shape.items() if k != dim} != others:
            continue
        line = points[(r.device_key, r.triton_version, r.kernel_version)]
        m = int(r.shape[dim])
        line[m] = min(line.get(m, r.p50_ms), r.p50_ms)
    return [Series(device, triton, version, sorted(line), [line[m] for m in sorted(line)])
            for (device, triton, version), line in sorted(points.items())]
