"""Devices the workers have registered (their keys are what jobs and configs target)."""

from __future__ import annotations

from fastapi import APIRouter

from api.deps import ReadAccess, SessionDep
from api.schemas import DevicePublic, DevicesPublic
from db import repo
from db.models import Device

router = APIRouter(prefix="/devices", tags=["devices"])


def device_public(d: Device) -> DevicePublic:
    ago = repo.seconds_since(d.last_seen_at)
    return DevicePublic(key=d.key, kind=d.kind, name=d.name,
                        compute_capability=d.compute_capability, sm_count=d.sm_count,
                        memory_bytes=d.memory_bytes, triton_version=d.triton_version,
                        torch_version=d.torch_version, copy_gbps=d.copy_gbps,
                        matmul_tflops=d.matmul_tflops, last_seen_at=d.last_seen_at,
                        seen_seconds_ago=round(ago, 1) if ago is not None else None)


@router.get("", response_model=DevicesPublic, dependencies=[ReadAccess])
def list_devices(session: SessionDep) -> DevicesPublic:
    data = [device_public(d) for d in repo.list_devices(session)]
    return DevicesPublic(data=data, count=len(data))
