"""Stored best configs as rows (``GET /configs/stored``): what ``tuner configs`` lists and
``tuner export`` writes, read from a running service instead of a local database file."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field

from api.deps import ReadAccess, SessionDep
from api.schemas import DEVICE_KEY_MAX
from db import repo
from db.models import BestConfig

router = APIRouter(prefix="/configs", tags=["configs"])

_ROW_EXAMPLE: dict[str, Any] = {
    "kernel": "matmul", "kernel_version": "3f2b9c0e1d4a", "dtype": "float16",
    "shape": {"M": 4096, "N": 4096, "K": 4096}, "device_key": "cuda:NVIDIA H200:sm90",
    "triton_version": "3.6.0",
    "config": {"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8,
               "num_stages": 3},
    "p50_ms": 0.139, "tflops": 988.0, "gbps": 723.0, "torch_version": "2.8.0",
    "cuda_version": "12.8", "timing": "eager-flushed"}


class StoredConfigPublic(BaseModel):
    """One stored best: its whole identity (kernel, kernel version, dtype, shape, device,
    Triton version, timing method), its config and its times."""

    model_config = ConfigDict(json_schema_extra={"examples": [_ROW_EXAMPLE]})

    kernel: str
    kernel_version: str
    dtype: str
    shape: dict[str, int]
    device_key: str
    triton_version: str
    config: dict[str, int]
    p50_ms: float
    tflops: float | None = None
    gbps: float | None = None
    torch_version: str | None = None
    cuda_version: str | None = None
    timing: str
    measured: str | None = Field(default=None, description="retimed, trial or client-measured")
    client_state: dict[str, Any] | None = Field(
        default=None, description="a client-measured best's timer, GPU state and Triton key")


class StoredConfigsPublic(BaseModel):
    """Every stored best that matches the filters, by kernel, dtype, device and shape."""

    model_config = ConfigDict(json_schema_extra={"examples": [
        {"data": [_ROW_EXAMPLE], "count": 1}]})

    data: list[StoredConfigPublic]
    count: int


def stored_public(row: BestConfig) -> StoredConfigPublic:
    return StoredConfigPublic(
        kernel=row.kernel, kernel_version=row.kernel_version, dtype=row.dtype,
        shape=dict(row.shape), device_key=row.device_key, triton_version=row.triton_version,
        config=dict(row.config), p50_ms=row.p50_ms, tflops=row.tflops, gbps=row.gbps,
        torch_version=row.torch_version, cuda_version=row.cuda_version, timing=row.timing,
        measured=row.measured, client_state=row.client_state)


@router.get("/stored", response_model=StoredConfigsPublic, dependencies=[ReadAccess])
def stored_configs(session: SessionDep,
                   kernel: str | None = Query(None, max_length=100, examples=["matmul"]),
                   dtype: str | None = Query(None, max_length=20, examples=["float16"]),
                   device: str | None = Query(None, max_length=DEVICE_KEY_MAX,
                                              examples=["cuda:NVIDIA H200:sm90"]),
                   ) -> StoredConfigsPublic:
    """Every stored best config (of ``kernel``, ``dtype``, ``device`` where given), with its
    whole identity: what ``tuner configs --url`` lists and ``tuner export --url`` writes."""
    rows = repo.list_best(session, kernel=kernel, device_key=device, dtype=dtype)
    return StoredConfigsPublic(data=[stored_public(r) for r in rows], count=len(rows))
