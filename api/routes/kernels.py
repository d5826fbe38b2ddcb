"""Registered kernels and known devices."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from api.deps import ReadAccess, SessionDep
from db import repo
from search_spaces import get_kernel, kernel_names

router = APIRouter(tags=["kernels"])


def kernel_public(name: str) -> dict[str, Any]:
    k = get_kernel(name)
    return {"name": k.name, "version": k.version, "description": getattr(k, "description", ""),
            "dims": [{"name": d.name, "min": d.lo, "max": d.hi, "doc": d.doc} for d in k.dims],
            "dtypes": list(k.dtypes), "space": k.space().describe(),
            "space_size": k.space().size()}


@router.get("/kernels", dependencies=[ReadAccess])
def list_kernels() -> dict[str, Any]:
    data = [kernel_public(n) for n in kernel_names()]
    return {"data": data, "count": len(data)}


@router.get("/devices", dependencies=[ReadAccess])
def list_devices(session: SessionDep) -> dict[str, Any]:
    data = [{"key": d.key, "kind": d.kind, "name": d.name,
             "compute_capability": d.compute_capability, "sm_count": d.sm_count,
             "memory_bytes": d.memory_bytes, "triton_version": d.triton_version,
             "torch_version": d.torch_version, "copy_gbps": d.copy_gbps,
             "matmul_tflops": d.matmul_tflops, "last_seen_at": d.last_seen_at}
            for d in repo.list_devices(session)]
    return {"data": data, "count": len(data)}
