"""Domain errors mapped to HTTP responses, in one place.

Every error body has FastAPI's validation shape, so clients parse one format:
``{"detail": [{"loc": [...], "msg": "...", "type": "..."}]}``.

=====================================  ======  ==============================================
exception                              status  loc
=====================================  ======  ==============================================
``tuner.errors.InvalidRequest``        422     ``["body", *field]`` (``field`` split on dots)
``QueryError`` (an InvalidRequest)     422     ``["query", *field]``
``db.repo.NotFound``                   404     ``["path"]``
``db.repo.ShortJobId``                 422     ``["path", "job_id"]``
``db.repo.AmbiguousJobId``             409     ``["path", "job_id"]``, with ``candidates``
other ``tuner.errors.TunerError``      400     ``["body"]``
``sqlalchemy.exc.OperationalError``    503     ``["database"]`` (locked, unreachable: retry)
``NotInMemory``                        503     ``["database"]`` (unreachable, and a lookup's
                                               configs not in the serving index)
``RequestRefused``                     its     ``["header", name]`` or ``["body"]``:
                                               401/403 key, 413 too large, 415 form type,
                                               403 cross-site
=====================================  ======  ==============================================

``RequestRefused`` is also answered before any route runs (``api.gate.RequestGate``): the
same response either way (``refused_response``).
"""

from __future__ import annotations

import logging

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from sqlalchemy.exc import DBAPIError, OperationalError

from db.repo import AmbiguousJobId, NotFound, ShortJobId
from db.transient import is_unavailable
from tuner.errors import InvalidRequest, TunerError

log = logging.getLogger(__name__)


class RequestRefused(HTTPException):
    """A request refused for what it is, not what it asks: a missing or read-only key (401,
    403), a body over the limit (413), a content type a browser form can send to a route that
    changes state (415), a cross-site browser request (403). An HTTPException so that FastAPI's
    body parsing lets it through when reading the body raises it (``api.gate``)."""

    def __init__(self, status: int, message: str, loc: list[str | int], kind: str,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(status, message, headers)
        self.message = message
        self.status = status
        self.loc = loc
        self.kind = kind
        self.headers = headers or {}


class QueryError(InvalidRequest):
    """An InvalidRequest about a query parameter (``field`` names the parameter)."""


class NotInMemory(Exception):
    """A lookup the serving index cannot answer while the database is unreachable: its
    configs were never loaded into this process's memory (``api.serving``). The message is
    the sentence the 503 shows."""


def error_body(loc: list[str | int], msg: str, kind: str) -> dict[str, object]:
    return {"detail": [{"loc": loc, "msg": msg, "type": kind}]}


def field_loc(field: str | None, root: str = "body") -> list[str | int]:
    parts: list[str | int] = [root]
    for part in (field or "").split("."):
        if part:
            parts.append(int(part) if part.isdigit() else part)
    return parts


def as_query_error(exc: InvalidRequest, field: str | None = None) -> QueryError:
    """The same complaint, located in the query string."""
    return QueryError(str(exc), field=exc.field if field is None else field)


async def invalid_request(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, InvalidRequest)
    root = "query" if isinstance(exc, QueryError) else "body"
    return JSONResponse(error_body(field_loc(exc.field, root), str(exc), "value_error"), 422)


async def not_found(_request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(error_body(["path"], str(exc), "not_found"), 404)


async def short_job_id(_request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(error_body(["path", "job_id"], str(exc), "job_id_too_short"), 422)


async def ambiguous_job_id(_request: Request, exc: Exception) -> JSONResponse:
    """A 409 listing the full ids of the jobs the prefix matches (``candidates``), so the
    caller can pick one."""
    assert isinstance(exc, AmbiguousJobId)
    detail = {"loc": ["path", "job_id"], "msg": str(exc), "type": "job_id_ambiguous",
              "candidates": exc.candidates}
    return JSONResponse({"detail": [detail]}, 409)


async def tuner_error(_request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(error_body(["body"], str(exc), "tuner_error"), 400)


async def database_unavailable(_request: Request, exc: Exception) -> JSONResponse:
    log.warning("database error: %s", exc)
    return JSONResponse(error_body(["database"], "the database is unavailable or busy; retry "
                                   "shortly", "database_unavailable"), 503,
                        headers={"Retry-After": "5"})


async def database_error(request: Request, exc: Exception) -> JSONResponse:
    """A driver error that is not an OperationalError but transient all the same (e.g. a
    transaction the server aborted for idling, SQLSTATE 25P03, raised as InternalError): 503
    like the others; anything else is the 500 it is."""
    if is_unavailable(exc):
        return await database_unavailable(request, exc)
    raise exc


async def not_in_memory(_request: Request, exc: Exception) -> JSONResponse:
    return JSONResponse(error_body(["database"], str(exc), "database_unavailable"), 503,
                        headers={"Retry-After": "5"})


def refused_response(exc: RequestRefused) -> JSONResponse:
    return JSONResponse(error_body(exc.loc, exc.message, exc.kind), exc.status,
                        headers=exc.headers)


async def request_refused(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestRefused)
    return refused_response(exc)


def install(app: FastAPI) -> None:
    app.add_exception_handler(RequestRefused, request_refused)
    app.add_exception_handler(InvalidRequest, invalid_request)
    app.add_exception_handler(NotFound, not_found)
    app.add_exception_handler(ShortJobId, short_job_id)
    app.add_exception_handler(AmbiguousJobId, ambiguous_job_id)
    app.add_exception_handler(TunerError, tuner_error)
    app.add_exception_handler(OperationalError, database_unavailable)
    app.add_exception_handler(DBAPIError, database_error)
    app.add_exception_handler(NotInMemory, not_in_memory)
