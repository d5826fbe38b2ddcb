"""Request dependencies: the database session and API-key checks."""

from __future__ import annotations

import hmac
from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from sqlalchemy.orm import Session

from tuner.settings import Settings


# The checks below do no I/O: async, so that they run on the event loop; a plain def costs a
# thread-pool hand-off each per request, more than a lookup (bench/NOTES.md, serving load).
async def get_settings(request: Request) -> Settings:
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


def _secret_bytes(secret: str | bytes) -> bytes:
    # compare_digest takes any bytes but only ASCII text; configured keys (and form fields)
    # are text, compared as UTF-8 (surrogates from the environment included)
    return secret if isinstance(secret, bytes) else secret.encode("utf-8", "surrogatepass")


def _header_bytes(text: str | None) -> bytes | None:
    """A header's value as the client sent it (Starlette decodes headers, and the cookies in
    them, as latin-1): a client sends a non-ASCII key as its UTF-8 bytes."""
    if not text:
        return None
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:
        return _secret_bytes(text)


def key_mode(settings: Settings, presented: str | bytes | None) -> str | None:
    """The mode ("rw" or "ro") of the presented key, None for none or an unknown one.

    Compared in constant time with every configured key, matched or not, so that response
    times tell nothing about how much of a key was right or which key matched."""
    if not presented:
        return None
    given = _secret_bytes(presented)
    found = None
    for key, mode in settings.parsed_api_keys().items():
        if hmac.compare_digest(given, _secret_bytes(key)) and found is None:
            found = mode
    return found


async def require_write(request: Request, settings: SettingsDep) -> None:
    if not settings.parsed_api_keys():
        return
    mode = key_mode(settings, _header_bytes(_presented_key(request)))
    if mode is None:
        raise HTTPException(401, "a valid API key is required (X-API-Key header or "
                                 "Authorization: Bearer)", headers={"WWW-Authenticate": "Bearer"})
    if mode != "rw":
        raise HTTPException(403, "this API key is read-only")


async def require_read(request: Request, settings: SettingsDep) -> None:
    if not settings.parsed_api_keys() or not settings.auth_reads:
        return
    # a browser on the dashboard presents it as a cookie (set at /key); never for writes, so a
    # page of another site cannot make the browser write with it
    presented = _presented_key(request) or request.cookies.get("tuner_api_key")
    if key_mode(settings, _header_bytes(presented)) is None:
        raise HTTPException(401, "a valid API key is required to read",
                            headers={"WWW-Authenticate": "Bearer"})


WriteAccess = Depends(require_write)
ReadAccess = Depends(require_read)
