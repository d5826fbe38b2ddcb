"""Domain errors mapped to HTTP responses, in one place.

Every error body has FastAPI's validation shape, so clients parse one format:
``{"detail": [{"loc": [...], "msg": "...", "type": "..."}]}``.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from db.repo import NotFound
from tuner.errors import InvalidRequest, TunerError


def _body(loc: list[str | int], msg: str, kind: str) -> dict[str, object]:
    return {"detail": [{"loc": loc, "msg": msg, "type": kind}]}


def field_loc(field: str | None, root: str = "body") -> list[str | int]:
    parts: list[str | int] = [root]
    for part in (field or "").split("."):
        if part:
            parts.append(int(part) if part.isdigit() else part)
    return parts


async def invalid_request(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, InvalidRequest)
    root = getattr(exc, "root", "body")
    return JSONResponse(_body(field_loc(exc.field, root), str(exc), "value_error"), 422)


async def not_found(_request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(_body(["path"], str(exc), "not_found"), 404)


async def tuner_error(_request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(_body(["body"], str(exc), "tuner_error"), 400)


def install(app: FastAPI) -> None:
    app.add_exception_handler(InvalidRequest, invalid_request)
    app.add_exception_handler(NotFound, not_found)
    app.add_exception_handler(TunerError, tuner_error)
