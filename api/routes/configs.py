"""Tuned configs for clients: exact key, else nearest tuned shape, else the kernel's default."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import JSONResponse
from sqlalchemy.orm import Session

from api.deps import ReadAccess, SessionDep
from api.errors import QueryError, as_query_error
from api.schemas import DEVICE_KEY_MAX, ConfigPublic, ConfigQuery, ConfigsPublic
from api.validation import check_dtype, check_shape, kernel_or_error
from db import repo
from db.models import BestConfig
from tuner.errors import InvalidRequest

router = APIRouter(prefix="/configs", tags=["configs"])

#: query parameters of GET /configs that are not problem dimensions
_NON_DIMS = {"kernel", "dtype", "device"}


def _candidate_devices(session: Session, device: str | None) -> list[str]:
    """The device asked for, or every real GPU known (the interpreter's and replayed results
    are never served unless asked for by key)."""
    if device:
        return [device]
    return [d.key for d in repo.list_devices(session) if d.kind == "cuda"]


def _public(match: str, kernel: Any, dtype: str, shape: dict[str, int], row: BestConfig,
            distance: float | None = None) -> ConfigPublic:
    return ConfigPublic(match=match, kernel=kernel.name, dtype=dtype, shape=shape,  # type: ignore[arg-type]
                        device=row.device_key, config=row.config, ms=row.p50_ms,
                        tflops=row.tflops, tuned_shape=row.shape, distance=distance,
                        kernel_version=row.kernel_version, triton_version=row.triton_version)


def resolve(session: Session, kernel: Any, dtype: str, shape: dict[str, int],
            device: str | None) -> ConfigPublic:
    devices = _candidate_devices(session, device)
    key = repo.shape_key_of(shape)
    for dev in devices:
        row = repo.get_best(session, device_key=dev, kernel=kernel.name, dtype=dtype,
                            shape_key=key, kernel_version=kernel.version)
        if row is not None:
            return _public("exact", kernel, dtype, shape, row)
    near = [n for dev in devices if (n := repo.nearest_best(
        session, device_key=dev, kernel=kernel.name, dtype=dtype, shape=shape,
        kernel_version=kernel.version))]
    if near:
        row, distance = min(near, key=lambda n: n[1])
        return _public("nearest", kernel, dtype, shape, row, round(distance, 4))
    default = kernel.default_config(shape, dtype).to_dict()
    return ConfigPublic(match="default", kernel=kernel.name, dtype=dtype, shape=shape,
                        device=device, config=default)


def _query_shape(request: Request, kernel: Any) -> dict[str, int]:
    """The problem shape given as query parameters (``M=4096&N=4096&K=4096``)."""
    raw: dict[str, Any] = {}
    for name, value in request.query_params.items():
        if name in _NON_DIMS:
            continue
        try:
            raw[name] = int(value)
        except ValueError:
            raise QueryError(f"{name}={value!r} must be an integer", field=name) from None
    try:
        return check_shape(kernel, raw, "")
    except InvalidRequest as exc:
        raise as_query_error(exc) from None


@router.get("", response_model=ConfigPublic, dependencies=[ReadAccess],
            responses={404: {"model": ConfigPublic,
                             "description": "nothing tuned: the body carries the default"}})
def get_config(request: Request, session: SessionDep,
               kernel: str = Query(max_length=100), dtype: str = Query(max_length=20),
               device: str | None = Query(None, max_length=DEVICE_KEY_MAX)) -> Any:
    """The best config for kernel/dtype/device and the shape given as dimension parameters
    (``?kernel=matmul&dtype=float16&M=4096&N=4096&K=4096``): ``match`` is ``exact``, else
    ``nearest`` (with its ``tuned_shape`` and log2 ``distance``), else 404 with ``default``.
    Without ``device``, only real GPUs' results are considered."""
    try:
        k = kernel_or_error(kernel, "kernel")
        check_dtype(k, dtype)
    except InvalidRequest as exc:
        raise as_query_error(exc) from None
    result = resolve(session, k, dtype, _query_shape(request, k), device)
    if result.match == "default":
        return JSONResponse(result.model_dump(), status_code=404)
    return result


@router.post("/query", response_model=ConfigsPublic, dependencies=[ReadAccess])
def query_configs(body: ConfigQuery, session: SessionDep) -> ConfigsPublic:
    """Many lookups in one request (model start-up): 200 with one answer per item, in order,
    each saying how it matched (``exact``, ``nearest`` or ``default``: never a 404). A
    malformed item is a 422 naming it (``["body", "items", i, ...]``)."""
    data = []
    for i, item in enumerate(body.items):
        k = kernel_or_error(item.kernel, f"items.{i}.kernel")
        check_dtype(k, item.dtype, f"items.{i}.dtype")
        shape = check_shape(k, item.shape, f"items.{i}.shape")
        data.append(resolve(session, k, item.dtype, shape, item.device))
    return ConfigsPublic(data=data, count=len(data))
