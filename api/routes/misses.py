"""Misses: lookups that clients reported as not served exactly (``report_misses`` of
POST /configs/query), with what became of each."""

from __future__ import annotations

from typing import Annotated, cast

from fastapi import APIRouter, Query

from api.deps import ReadAccess, SessionDep
from api.routes.jobs import job_url
from api.schemas import INT32_MAX, MissesPublic, MissPublic, MissStatus, Timing
from db import repo
from db.models import Miss

router = APIRouter(prefix="/misses", tags=["misses"])


def miss_public(miss: Miss) -> MissPublic:
    return MissPublic(id=miss.id, kernel=miss.kernel, kernel_version=miss.kernel_version,
                      dtype=miss.dtype, shape=miss.shape, device=miss.device_key or None,
                      count=miss.count, first_seen_at=miss.first_seen_at,
                      last_seen_at=miss.last_seen_at, last_client=miss.last_client,
                      status=miss.status, job_id=miss.job_id,
                      job_url=job_url(miss.job_id) if miss.job_id else None, note=miss.note,
                      timing=cast(Timing, miss.timing))


@router.get("", response_model=MissesPublic, dependencies=[ReadAccess])
def list_misses(session: SessionDep,
                kernel: str | None = Query(None, max_length=100, examples=["matmul"]),
                status: Annotated[MissStatus | None, Query(examples=["queued"])] = None,
                limit: int = Query(50, ge=1, le=500, examples=[50]),
                offset: int = Query(0, ge=0, le=INT32_MAX, examples=[0])) -> MissesPublic:
    """Recorded misses, most recently reported first (``count``: how many match in all).
    ``status`` is the status of the miss's tuning job (``queued``, ``running``, ``tuned``,
    ``failed``), else why none was queued (``rate-limited``, ``capped``,
    ``kernel-version-mismatch``, ``no-device``); ``note`` says more. ``device`` is null for
    callers that gave none."""
    misses, total = repo.list_misses(session, kernel=kernel, status=status, limit=limit,
                                     offset=offset)
    return MissesPublic(data=[miss_public(m) for m in misses], count=total)
