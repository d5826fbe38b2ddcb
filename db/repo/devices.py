"""Devices (one row per GPU fingerprint, with its calibration) and workers (one row per
worker process, refreshed by its beats), and why a queued job waits for one."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from db.models import WORKER_STATUSES, Device, Job, WorkerRow, utcnow
from db.repo._common import NotFound, _changed, _changed_row, _insert_ignoring_conflicts, _reloaded
from db.repo.bests import seconds_since
from tuner.identity import DeviceKind
from tuner.lifecycle import Status

# -- devices ----------------------------------------------------------------------------------

_DEVICE_FIELDS = ("kind", "name", "compute_capability", "sm_count", "memory_bytes",
                  "smem_per_block", "triton_version", "torch_version", "cuda_version",
                  "driver_version")


def upsert_device(session: Session, fingerprint: Mapping[str, Any]) -> Device:
    """The device row for ``fingerprint["key"]``, created or refreshed: the fields of
    ``_DEVICE_FIELDS`` present in ``fingerprint`` are written and ``last_seen_at`` is now.
    Other keys are ignored. A new device needs ``kind`` and ``name``: ValueError otherwise."""
    key = fingerprint.get("key")
    if not key:
        raise ValueError(f"device fingerprint has no 'key': {dict(fingerprint)!r}")
    fields = {f: fingerprint[f] for f in _DEVICE_FIELDS if f in fingerprint}
    now = utcnow()
    if {"kind", "name"} <= fields.keys():
        _insert_ignoring_conflicts(session, Device, {"key": key, **fields, "created_at": now,
                                                     "last_seen_at": now}, ["key"])
    if not _changed(session, update(Device).where(Device.key == key)
                    .values(**fields, last_seen_at=now)):
        raise ValueError(f"device {key!r} is new: its fingerprint needs 'kind' and 'name'")
    device = session.scalars(select(Device).where(Device.key == key)
                             .execution_options(populate_existing=True)).one()
    return device


def touch_device(session: Session, device_key: str) -> bool:
    """Mark a device as seen now (a worker's presence beat); False if there is no such row."""
    return _changed(session, update(Device).where(Device.key == device_key)
                    .values(last_seen_at=utcnow()))


def get_device(session: Session, device_key: str) -> Device | None:
    return session.scalar(select(Device).where(Device.key == device_key))


def list_devices(session: Session) -> list[Device]:
    """Every known device, by key."""
    return list(session.scalars(select(Device).order_by(Device.key)))


def set_calibration(session: Session, device_key: str, copy_gbps: float | None,
                    matmul_tflops: float | None, *, copy_gbps_spread: float | None = None,
                    matmul_tflops_spread: float | None = None,
                    runs: int | None = None) -> Device:
    """Record a device's measured limits (the roofline's ceilings): the medians of ``runs``
    repeated runs and their spreads ((max - min) / median). NotFound if unknown."""
    device = session.scalar(select(Device).where(Device.key == device_key))
    if device is None:
        raise NotFound(f"no device {device_key!r}")
    device.copy_gbps, device.matmul_tflops = copy_gbps, matmul_tflops
    device.copy_gbps_spread, device.matmul_tflops_spread = copy_gbps_spread, matmul_tflops_spread
    device.calibration_runs = runs
    device.calibrated_at = utcnow()
    session.flush()
    return device


def single_gpu_device_key(session: Session) -> str | None:
    """The one real GPU device this service knows, when there is exactly one."""
    keys = list(session.scalars(select(Device.key).where(Device.kind == DeviceKind.CUDA)))
    return keys[0] if len(keys) == 1 else None


# -- workers: one row per worker process, refreshed by its beats --------------------------------

def register_worker(session: Session, *, worker_id: str, host: str, pid: int, device_key: str,
                    kind: str, gpu_index: int | None, gpu_uuid: str | None) -> WorkerRow:
    """The worker's row, created or reset for a (re)start: ``idle``, no task or error,
    started and seen now."""
    now = utcnow()
    fields = dict(host=host, pid=pid, device_key=device_key, kind=kind, gpu_index=gpu_index,
                  gpu_uuid=gpu_uuid, status="idle", task_id=None, error=None, started_at=now,
                  last_seen_at=now)
    if not _insert_ignoring_conflicts(session, WorkerRow, {"id": worker_id, **fields}, ["id"]):
        _changed(session, update(WorkerRow).where(WorkerRow.id == worker_id).values(**fields))
    return cast(WorkerRow, _reloaded(session, WorkerRow, worker_id))


def beat_worker(session: Session, worker_id: str, *, status: str | None = None,
                task_id: int | None = None, error: str | None = None) -> bool:
    """The worker is alive: ``last_seen_at`` is now. With ``status``, the beat says everything
    the worker is doing, so ``task_id`` and ``error`` are written as given (None clears them);
    without, only those given are written. False if the worker has no row (never registered).
    ValueError for a status not in ``WORKER_STATUSES``."""
    values: dict[str, Any] = {"last_seen_at": utcnow()}
    if status is not None:
        if status not in WORKER_STATUSES:
            raise ValueError(f"worker status {status!r}: expected one of "
                             f"{', '.join(WORKER_STATUSES)}")
        values.update(status=status, task_id=task_id, error=error)
    else:
        values.update({k: v for k, v in (("task_id", task_id), ("error", error))
                       if v is not None})
    return _changed_row(session, WorkerRow, worker_id,
                        update(WorkerRow).where(WorkerRow.id == worker_id).values(**values))


def stop_worker(session: Session, worker_id: str) -> None:
    """The worker exited cleanly: ``stopped``, holding no task."""
    _changed_row(session, WorkerRow, worker_id, update(WorkerRow).where(WorkerRow.id == worker_id)
                 .values(status="stopped", task_id=None, last_seen_at=utcnow()))


def _seen_since(seen_within_s: float, now: datetime | None = None) -> datetime:
    return (now or utcnow()) - timedelta(seconds=seen_within_s)


def list_workers(session: Session, seen_within_s: float | None = None) -> list[WorkerRow]:
    """Workers (seen within ``seen_within_s`` seconds, if given) by device, GPU index (the
    interpreter's none last) and id."""
    query = select(WorkerRow)
    if seen_within_s is not None:
        query = query.where(WorkerRow.last_seen_at >= _seen_since(seen_within_s))
    return list(session.scalars(query.order_by(WorkerRow.device_key,
                                               WorkerRow.gpu_index.asc().nulls_last(),
                                               WorkerRow.id)))


def live_device_keys(session: Session, seen_within_s: float,
                     now: datetime | None = None) -> set[str]:
    """Devices with a worker that beat within ``seen_within_s`` seconds and is not stopped."""
    return set(session.scalars(select(WorkerRow.device_key).distinct().where(
        WorkerRow.last_seen_at >= _seen_since(seen_within_s, now),
        WorkerRow.status != "stopped")))


def waiting_note(session: Session, job: Job, *, now: datetime | None = None, after_s: float,
                 seen_within_s: float) -> str | None:
    """Why a job has been queued for over ``after_s`` seconds, when it is because no worker
    serves its target device (or, with no target, no worker at all) within ``seen_within_s``
    seconds: a sentence naming the device and the devices known. None otherwise (not queued,
    not waiting that long yet, or a live worker could claim it)."""
    now = now or utcnow()
    if job.status != Status.QUEUED or (seconds_since(job.created_at, now) or 0.0) < after_s:
        return None
    live = live_device_keys(session, seen_within_s, now)
    if (job.device_key in live) if job.device_key else bool(live):
        return None
    known = sorted(set(session.scalars(select(Device.key))) | live)
    devices = ", ".join(f"{k} (live)" if k in live else k for k in known) or "none"
    missing = (f"no worker has served device {job.device_key!r}" if job.device_key
               else "no worker has been seen")
    return f"{missing} in the last {seen_within_s:g} s; known devices: {devices}"
