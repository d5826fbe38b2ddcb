"""Best configs and serving: writing and reading the stored bests (``write_best`` from a
worker's side-by-side decision, ``store_best`` keeping the faster beyond the noise), and the
match ladder that serves a lookup (exact, nearest shape, other Triton, other device)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, func, select, update
from sqlalchemy.orm import Session

from db.models import BASES, BestConfig, Device, utcnow
from db.repo._common import _changed, _insert_ignoring_conflicts
from tuner.identity import DeviceKind, Match, same_triton_minor
from tuner.shapes import log_shape, nearest, nearest_logs, shape_key
from tuner.timing import DEFAULT_TIMING, TIMING_METHODS, check_timing

# -- best configs -----------------------------------------------------------------------------

def _best_key(device_key: str, kernel: str, kernel_version: str, dtype: str, shape_key: str,
              triton_version: str, timing: str) -> dict[str, str]:
    return dict(device_key=device_key, kernel=kernel, kernel_version=kernel_version,
                dtype=dtype, shape_key=shape_key, triton_version=triton_version,
                timing=check_timing(timing))


def _matching(model: type[Any], values: Mapping[str, Any]) -> list[ColumnElement[bool]]:
    return [getattr(model, name) == value for name, value in values.items()]


@dataclass(frozen=True, slots=True)
class BestTimes:
    """One config's timing as a best config row records it: ``measured`` says which
    measurement it is (``MEASURED``; None: unknown, e.g. an imported file's)."""

    config: Mapping[str, int]
    p20_ms: float
    p50_ms: float
    p80_ms: float
    tflops: float | None = None
    gbps: float | None = None
    measured: str | None = None
    #: against the kernel's default (``BestConfig.basis``; None: not compared), with the
    #: default's and the search's best p50 re-timed beside it and the noise margin used
    basis: str | None = None
    default_ms: float | None = None
    search_ms: float | None = None
    noise_margin: float | None = None


def _best_values(shape: Mapping[str, int], times: BestTimes, torch_version: str | None,
                 cuda_version: str | None, task_id: int | None) -> dict[str, Any]:
    if times.basis is not None and times.basis not in BASES:
        raise ValueError(f"basis {times.basis!r}: expected one of {', '.join(BASES)}")
    return dict(shape=dict(shape), config=dict(times.config), p20_ms=times.p20_ms,
                p50_ms=times.p50_ms, p80_ms=times.p80_ms, tflops=times.tflops, gbps=times.gbps,
                measured=times.measured, basis=times.basis, default_ms=times.default_ms,
                search_ms=times.search_ms, noise_margin=times.noise_margin,
                torch_version=torch_version,
                cuda_version=cuda_version, task_id=task_id, client_state=None,
                updated_at=utcnow())


def write_best(session: Session, *, device_key: str, kernel: str, kernel_version: str,
               dtype: str, shape: Mapping[str, int], triton_version: str, times: BestTimes,
               revision: int | None, torch_version: str | None, cuda_version: str | None,
               task_id: int | None, timing: str = DEFAULT_TIMING) -> tuple[BestConfig, bool]:
    """Write the best config of its key as a compare-and-set on the row's revision, after the
    caller decided from timings taken side by side in one process (the worker re-times the
    stored config beside its finalists): ``revision`` None inserts it only where the key has
    no row; a revision replaces the row only while it is still at that revision (the row whose
    config the caller re-timed), and counts it up. Returns the row as stored now and whether
    this call wrote it; False: another writer changed the key meanwhile and its row stands
    (nothing here was timed against it). Safe when workers store the same key at once. The key
    includes ``timing``, the method the times were taken with (``tuner/timing.py``)."""
    key = _best_key(device_key, kernel, kernel_version, dtype, shape_key(shape), triton_version,
                    timing)
    values = _best_values(shape, times, torch_version, cuda_version, task_id)
    if revision is None:
        written = _insert_ignoring_conflicts(session, BestConfig,
                                             {**key, **values, "revision": 1}, list(key))
    else:
        written = _changed(session, update(BestConfig).where(
            *_matching(BestConfig, key), BestConfig.revision == revision)
            .values(**values, revision=BestConfig.revision + 1))
    return _best_row(session, key), written


def store_best(session: Session, *, device_key: str, kernel: str, kernel_version: str,
               dtype: str, shape: Mapping[str, int], triton_version: str,
               config: Mapping[str, int], p20_ms: float, p50_ms: float, p80_ms: float,
               tflops: float | None, gbps: float | None, torch_version: str | None,
               cuda_version: str | None, task_id: int | None,
               noise_margin: float = 0.0, measured: str | None = None,
               timing: str = DEFAULT_TIMING, replaces_only: str | None = None,
               client_state: Mapping[str, Any] | None = None) -> tuple[BestConfig, bool]:
    """Insert the best config for its key, or replace the stored one only when the new p50 is
    below the stored p50 * (1 - ``noise_margin``) (and, with ``replaces_only``, only while the
    stored one's ``measured`` is that: a client's timings never replace a worker's best, even
    one written since the caller looked). For times that cannot be re-timed side by side
    (``tuner import``: a file carries one time per config): a worker decides by re-timing and
    writes with ``write_best`` instead. Returns the stored row and whether this call wrote it.
    Safe when two workers store the same key at once."""
    key = _best_key(device_key, kernel, kernel_version, dtype, shape_key(shape), triton_version,
                    timing)
    values = {**_best_values(shape, BestTimes(config, p20_ms, p50_ms, p80_ms, tflops, gbps,
                                              measured), torch_version, cuda_version, task_id),
              "client_state": dict(client_state) if client_state is not None else None}
    written = _insert_ignoring_conflicts(session, BestConfig, {**key, **values, "revision": 1},
                                         list(key))
    if not written:
        only = [BestConfig.measured == replaces_only] if replaces_only is not None else []
        written = _changed(session, update(BestConfig).where(
            *_matching(BestConfig, key), BestConfig.p50_ms * (1 - noise_margin) > p50_ms,
            *only).values(**values, revision=BestConfig.revision + 1))
    return _best_row(session, key), written


def _best_row(session: Session, key: Mapping[str, str]) -> BestConfig:
    return session.scalars(select(BestConfig).where(*_matching(BestConfig, key))
                           .execution_options(populate_existing=True)).one()


def _best_query(kernel: str | None = None, device_key: str | None = None,
                dtype: str | None = None) -> Select[BestConfig]:
    query = select(BestConfig)
    if kernel:
        query = query.where(BestConfig.kernel == kernel)
    if device_key:
        query = query.where(BestConfig.device_key == device_key)
    if dtype:
        query = query.where(BestConfig.dtype == dtype)
    return query


def get_best(session: Session, *, device_key: str, kernel: str, dtype: str, shape_key: str,
             kernel_version: str | None = None,
             triton_version: str | None = None,
             timing: str | None = DEFAULT_TIMING) -> BestConfig | None:
    """The stored best for an exact shape on a device timed with ``timing`` (None: any
    method); among several kernel or Triton versions (when not given), the most recently
    updated."""
    query = _best_query(kernel, device_key, dtype).where(BestConfig.shape_key == shape_key)
    if timing is not None:
        query = query.where(BestConfig.timing == timing)
    if kernel_version:
        query = query.where(BestConfig.kernel_version == kernel_version)
    if triton_version:
        query = query.where(BestConfig.triton_version == triton_version)
    order = (BestConfig.updated_at.desc(), BestConfig.id.desc())
    return session.scalar(query.order_by(*order).limit(1))


def list_best(session: Session, kernel: str | None = None, device_key: str | None = None,
              dtype: str | None = None) -> list[BestConfig]:
    """Stored bests, filtered, by kernel, dtype, device and shape."""
    order = (BestConfig.kernel, BestConfig.dtype, BestConfig.device_key, BestConfig.shape_key,
             BestConfig.id)
    return list(session.scalars(_best_query(kernel, device_key, dtype).order_by(*order)))


def nearest_best(session: Session, *, device_key: str, kernel: str, dtype: str,
                 shape: Mapping[str, int], kernel_version: str | None = None
                 ) -> tuple[BestConfig, float] | None:
    """The stored best of the same device, kernel and dtype (and kernel version, if given)
    whose shape is nearest to ``shape`` (``shape_distance``; ties: most recently updated),
    with its distance; None if there is none. An exact match has distance 0."""
    rows: Iterable[BestConfig] = list_best(session, kernel=kernel, device_key=device_key,
                                           dtype=dtype)
    if kernel_version:
        rows = [r for r in rows if r.kernel_version == kernel_version]
    return nearest(rows, shape, lambda r: r.shape,
                   then=lambda r: (-r.updated_at.timestamp(), r.id))


def shape_key_of(shape: Mapping[str, int]) -> str:
    """The normalised shape key the store uses (``tuner.shapes.shape_key``)."""
    return shape_key(shape)


def seconds_since(moment: datetime | None, now: datetime | None = None) -> float | None:
    """Seconds from ``moment`` to ``now`` (None stays None); naive datetimes are UTC."""
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=utcnow().tzinfo)
    return ((now or utcnow()) - moment).total_seconds()


# -- serving configs: the match ladder --------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Candidate:
    """A stored best that may be served, with its device's kind (``cuda``, ``interpret``,
    ``replay``; None when no worker registered the device) and plain copies of what ranking
    reads (reading ORM attributes took most of a 10,000-item bulk query's time)."""

    row: BestConfig
    device_kind: str | None
    device_key: str
    shape_key: str
    triton_version: str
    #: the timing method of its times (``tuner/timing.py``)
    timing: str
    #: log2 of each dimension (``shape_distance``'s terms)
    log_shape: dict[str, float]
    updated: float


@dataclass(frozen=True, slots=True)
class Served:
    """The stored best chosen for a caller: how it matches the caller's identity (``exact``,
    ``nearest``, ``other-triton`` or ``other-device``) and the log2 distance of its shape."""

    match: Match
    row: BestConfig
    distance: float


def serving_candidates(session: Session, *, kernel: str, kernel_version: str,
                       dtype: str) -> list[Candidate]:
    """Every stored best of that kernel source version and dtype, on any device. A config of
    another kernel version is never a candidate: it was tuned for other code."""
    rows = session.execute(
        select(BestConfig, Device.kind).outerjoin(Device, Device.key == BestConfig.device_key)
        .where(BestConfig.kernel == kernel, BestConfig.kernel_version == kernel_version,
               BestConfig.dtype == dtype).order_by(BestConfig.id))
    return [Candidate(row, kind, row.device_key, row.shape_key, row.triton_version, row.timing,
                      log_shape(row.shape), row.updated_at.timestamp()) for row, kind in rows]


def all_serving_candidates(session: Session) -> dict[tuple[str, str, str], list[Candidate]]:
    """Every stored best as ``serving_candidates`` gives it, by (kernel, kernel version, dtype),
    in one query (the serving index loads them all at start)."""
    groups: dict[tuple[str, str, str], list[Candidate]] = {}
    rows = session.execute(select(BestConfig, Device.kind).outerjoin(
        Device, Device.key == BestConfig.device_key).order_by(BestConfig.id))
    for row, kind in rows:
        groups.setdefault((row.kernel, row.kernel_version, row.dtype), []).append(Candidate(
            row, kind, row.device_key, row.shape_key, row.triton_version, row.timing,
            log_shape(row.shape), row.updated_at.timestamp()))
    return groups


@dataclass(frozen=True, slots=True)
class Step:
    """A step of the serving ladder: the match it answers (``nearest``: ``exact`` for the
    caller's own shape) and which candidates it looks at for a caller, ``admits(candidate,
    device_key, triton_version)``."""

    match: Match
    admits: Callable[[Candidate, str | None, str | None], bool]


def _on_device_same_minor(c: Candidate, device_key: str | None,
                          triton_version: str | None) -> bool:
    return bool(device_key) and c.device_key == device_key \
        and same_triton_minor(c.triton_version, triton_version)


def _on_device(c: Candidate, device_key: str | None, _triton_version: str | None) -> bool:
    return bool(device_key) and c.device_key == device_key


def _on_other_gpu(c: Candidate, device_key: str | None, _triton_version: str | None) -> bool:
    # the interpreter's and replayed results are never served for another device
    return c.device_kind == DeviceKind.CUDA and c.device_key != device_key


#: The serving ladder, best first: on the caller's device with its Triton minor version
#: (``exact``, else ``nearest``), on its device with another Triton minor (``other-triton``),
#: on another real GPU (``other-device``). Without a device only ``other-device`` can match
#: (the caller's GPU is unknown); without a Triton version every version counts as the
#: caller's. ``climb`` is its one implementation: ``serve_best`` over a list of candidates,
#: the serving index (``api/serving.py``) over its pools.
LADDER = (Step(Match.NEAREST, _on_device_same_minor), Step(Match.OTHER_TRITON, _on_device),
          Step(Match.OTHER_DEVICE, _on_other_gpu))

#: ``members(step, shape key, log shape)``: the candidates a step admits for the caller, or of
#: them at least those of the exact shape, else those of the nearest shapes
Members = Callable[[Step, str, Mapping[str, float]], Sequence[Candidate]]


def climb(members: Members, *, shape: Mapping[str, int], device_key: str | None,
          triton_version: str | None) -> Served | None:
    """Down the ``LADDER`` for a caller: the first step with a candidate (``members``), and
    its candidate of the exact shape else of the nearest (``_closest``). None: serve the
    kernel's default."""
    key, logs = shape_key(shape), log_shape(shape)
    for step in LADDER:
        if found := _closest(members(step, key, logs), key, logs, triton_version):
            row, distance = found
            exact = step is LADDER[0] and row.shape_key == key
            return Served(Match.EXACT if exact else step.match, row, distance)
    return None


def serve_best(candidates: Iterable[Candidate], *, shape: Mapping[str, int],
               device_key: str | None, triton_version: str | None,
               timing: str = DEFAULT_TIMING) -> Served | None:
    """The config to serve a caller from ``serving_candidates`` (its kernel version and
    dtype), down the ``LADDER`` (``climb``) over every candidate timed with ``timing``
    (``serve_timed`` falls back to the other methods). None: serve the kernel's default."""
    timed = [c for c in candidates if c.timing == timing]

    def members(step: Step, _key: str, _logs: Mapping[str, float]) -> list[Candidate]:
        return [c for c in timed if step.admits(c, device_key, triton_version)]

    return climb(members, shape=shape, device_key=device_key, triton_version=triton_version)


def _closest(candidates: Sequence[Candidate], key: str, logs: Mapping[str, float],
             triton_version: str | None) -> tuple[BestConfig, float] | None:
    """The candidate of the exact shape, else of the nearest shape (``nearest_logs``: a
    dimension missing from one shape counts as 1 there), then of the caller's Triton minor,
    then of its very version, then the most recently updated; with its distance."""
    def then(c: Candidate) -> tuple[bool, bool, float, int]:
        return (not same_triton_minor(c.triton_version, triton_version),
                bool(triton_version) and c.triton_version != triton_version,
                -c.updated, -c.row.id)

    exact = [c for c in candidates if c.shape_key == key]  # distance 0
    found = nearest_logs(exact or candidates, logs, lambda c: c.log_shape, then)
    return None if found is None else (found[0].row, found[1])


#: how good each match is, best first (``serve_timed`` compares answers of two methods)
MATCH_RANK = {Match.EXACT: 0, Match.NEAREST: 1, Match.OTHER_TRITON: 2, Match.OTHER_DEVICE: 3}


def serve_timed(serve: Callable[[str], Served | None], timing: str) -> Served | None:
    """The answer for a caller who asked for configs timed with ``timing``: ``serve(method)``
    is the ladder's answer among the configs timed with ``method`` (``serve_best``). The asked
    method's answer, unless another method's matches better (``MATCH_RANK``: the exact shape on
    the caller's device timed ``eager-flushed`` beats a nearest shape timed ``cuda-graph``);
    among other methods, the default's first. The caller sees the method in the answer."""
    best = serve(timing)
    if best is not None and best.match == Match.EXACT:
        return best
    for other in sorted((m for m in TIMING_METHODS if m != timing),
                        key=lambda m: m != DEFAULT_TIMING):
        found = serve(other)
        if found is not None and (best is None
                                  or MATCH_RANK[found.match] < MATCH_RANK[best.match]):
            best = found
    return best


def best_configs_version(session: Session) -> tuple[Any, ...]:
    """A fingerprint of what ``serving_candidates`` reads, in one aggregate query: the number
    of bests, their largest id and latest ``updated_at`` (a best stored, replaced or removed
    changes one), and the number of devices (a device's kind decides what is served to
    others). The serving index (``api/serving.py``) reloads when it changes."""
    devices = select(func.count()).select_from(Device).scalar_subquery()
    row = session.execute(select(func.count(BestConfig.id), func.max(BestConfig.id),
                                 func.max(BestConfig.updated_at), devices)).one()
    return tuple(row)
