"""Request dependencies: the database session and API-key checks."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from sqlalchemy.orm import Session

from tuner.settings import Settings


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_db(request: Request) -> Iterator[Session]:
    with request.app.state.session_factory() as session:
        yield session


SessionDep = Annotated[Session, Depends(get_db)]
SettingsDep = Annotated[Settings, Depends(get_settings)]


def _presented_key(request: Request) -> str | None:
    key = request.headers.get("x-api-key")
    auth = request.headers.get("authorization", "")
    if not key and auth.lower().startswith("bearer "):
        key = auth[7:].strip()
    return key or None


def require_write(request: Request, settings: SettingsDep) -> None:
    keys = settings.parsed_api_keys()
    if not keys:
        return
    key = _presented_key(request)
    if key is None or key not in keys:
        raise HTTPException(401, "a valid API key is required (X-API-Key header or "
                                 "Authorization: Bearer)", headers={"WWW-Authenticate": "Bearer"})
    if keys[key] != "rw":
        raise HTTPException(403, "this API key is read-only")


def require_read(request: Request, settings: SettingsDep) -> None:
    keys = settings.parsed_api_keys()
    if not keys or not settings.auth_reads:
        return
    # a browser on the dashboard presents it as a cookie (set at /key); never for writes, so a
    # page of another site cannot make the browser write with it
    if (_presented_key(request) or request.cookies.get("tuner_api_key")) not in keys:
        raise HTTPException(401, "a valid API key is required to read",
                            headers={"WWW-Authenticate": "Bearer"})


WriteAccess = Depends(require_write)
ReadAccess = Depends(require_read)
