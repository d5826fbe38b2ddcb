"""Devices the workers have registered (their keys are what jobs and configs target), each with
its live workers (one per GPU: index, UUID, what it is doing)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from fastapi import APIRouter

from api.deps import ReadAccess, SessionDep, SettingsDep
from api.schemas import DevicePublic, DevicesPublic, WorkerPublic
from db import repo
from db.models import Device

router = APIRouter(prefix="/devices", tags=["devices"])


def _ago(moment: Any) -> float | None:
    ago = repo.seconds_since(moment)
    return round(ago, 1) if ago is not None else None


def worker_public(w: Any, lease_seconds: float) -> WorkerPublic:
    """A worker row (``repo.list_workers``); alive: it beat within one lease length."""
    ago = _ago(w.last_seen_at)
    return WorkerPublic(id=w.id, host=w.host, pid=w.pid, device=w.device_key, kind=w.kind,
                        gpu_index=w.gpu_index, gpu_uuid=w.gpu_uuid, status=w.status,
                        task_id=w.task_id, error=w.error, started_at=w.started_at,
                        last_seen_at=w.last_seen_at, seen_seconds_ago=ago,
                        alive=ago is not None and ago <= lease_seconds)


def device_public(d: Device, workers: list[WorkerPublic] | None = None) -> DevicePublic:
    return DevicePublic(key=d.key, kind=d.kind, name=d.name,
                        compute_capability=d.compute_capability, sm_count=d.sm_count,
                        memory_bytes=d.memory_bytes, triton_version=d.triton_version,
                        torch_version=d.torch_version, copy_gbps=d.copy_gbps,
                        matmul_tflops=d.matmul_tflops, copy_gbps_spread=d.copy_gbps_spread,
                        matmul_tflops_spread=d.matmul_tflops_spread,
                        calibration_runs=d.calibration_runs, calibrated_at=d.calibrated_at,
                        last_seen_at=d.last_seen_at,
                        seen_seconds_ago=_ago(d.last_seen_at), workers=workers or [])


@router.get("", response_model=DevicesPublic, dependencies=[ReadAccess])
def list_devices(session: SessionDep, settings: SettingsDep) -> DevicesPublic:
    """Every registered device, with its workers that beat within one lease length (by GPU
    index)."""
    live: dict[str, list[WorkerPublic]] = defaultdict(list)
    for w in repo.list_workers(session, seen_within_s=settings.lease_seconds):
        live[w.device_key].append(worker_public(w, settings.lease_seconds))
    for workers in live.values():
        workers.sort(key=lambda w: (w.gpu_index is None, w.gpu_index or 0, w.id))
    data = [device_public(d, live.get(d.key)) for d in repo.list_devices(session)]
    return DevicesPublic(data=data, count=len(data))
