"""Liveness and readiness."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy import text

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz(request: Request) -> dict[str, Any]:
    """The process answers; workers' health as they last reported it."""
    workers = getattr(request.app.state, "worker_health", {})
    return {"status": "ok", "workers": workers}


@router.get("/readyz")
def readyz(request: Request) -> Any:
    try:
        with request.app.state.session_factory() as session:
            session.execute(text("SELECT 1"))
    except Exception as exc:  # noqa: BLE001 - any database failure means not ready
        return JSONResponse({"status": "unavailable", "error": str(exc)[:500]}, 503)
    return {"status": "ready"}
