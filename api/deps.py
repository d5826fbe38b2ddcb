"""Request dependencies: the database session and API-key checks."""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterator, Mapping
from typing import Annotated, Any, cast

from fastapi import Depends, Request
from sqlalchemy.orm import Session

from api.errors import RequestRefused
from tuner.app.dispatch import Dispatcher
from tuner.settings import Settings


# The checks below do no I/O: async, so that they run on the event loop; a plain def costs a
# thread-pool hand-off each per request, more than a lookup (bench/NOTES.md, serving load).
async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_db(request: Request) -> Iterator[Session]:
    with request.app.state.session_factory() as session:
        yield session


def dispatcher_of(app: Any) -> Dispatcher:
    """The app's dispatcher (``tuner.app.dispatch``), set at start-up; the embedded one (which
    needs telling nothing) before that."""
    dispatcher = getattr(app.state, "dispatcher", None)
    if dispatcher is None:
        from tuner.app.dispatch.embedded import EmbeddedDispatcher

        return EmbeddedDispatcher(None, reap_interval_s=0)
    return cast(Dispatcher, dispatcher)


SessionDep = Annotated[Session, Depends(get_db)]
SettingsDep = Annotated[Settings, Depends(get_settings)]


def presented_key(headers: Mapping[str, str]) -> str | None:
    """The key in ``X-API-Key`` or ``Authorization: Bearer``, None without one."""
    key = headers.get("x-api-key")
    auth = headers.get("authorization", "")
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


def _no_key(msg: str) -> RequestRefused:
    return RequestRefused(401, msg, ["header", "x-api-key"], "api_key_missing",
                          headers={"WWW-Authenticate": "Bearer"})


def write_refusal(settings: Settings, headers: Mapping[str, str]) -> RequestRefused | None:
    """Why a request may not write (None: it may): no valid key (401), a read-only one (403).
    Without configured keys everyone may."""
    if not settings.parsed_api_keys():
        return None
    mode = key_mode(settings, _header_bytes(presented_key(headers)))
    if mode is None:
        return _no_key("a valid API key is required (X-API-Key header or Authorization: "
                       "Bearer)")
    if mode != "rw":
        return RequestRefused(403, "this API key is read-only", ["header", "x-api-key"],
                              "api_key_read_only")
    return None


def read_refusal(settings: Settings, headers: Mapping[str, str],
                 cookies: Mapping[str, str]) -> RequestRefused | None:
    """Why a request may not read (None: it may): no valid key while ``auth_reads``."""
    if not settings.parsed_api_keys() or not settings.auth_reads:
        return None
    # a browser on the dashboard presents it as a cookie (set at /key); never for writes, so a
    # page of another site cannot make the browser write with it
    presented = presented_key(headers) or cookies.get("tuner_api_key")
    if key_mode(settings, _header_bytes(presented)) is None:
        return _no_key("a valid API key is required to read")
    return None


#: set in the request's scope to the access the gate (``api.gate``) granted it, before routing
KEY_CHECKED = "tuner.key_checked"


async def require_write(request: Request, settings: SettingsDep) -> None:
    if request.scope.get(KEY_CHECKED) == "write":
        return
    refusal = write_refusal(settings, request.headers)
    if refusal is not None:
        raise refusal


async def require_read(request: Request, settings: SettingsDep) -> None:
    if request.scope.get(KEY_CHECKED) in ("read", "write"):
        return
    refusal = read_refusal(settings, request.headers, request.cookies)
    if refusal is not None:
        raise refusal


def caller_id(settings: Settings, request: Request) -> str:
    """Who is asking, for per-client limits: a digest of the API key presented when keys are
    configured (a key is a secret: it is never stored; without keys any header is the caller's
    choice), else the caller's address. Never a name the caller picks."""
    key = presented_key(request.headers)
    if key and settings.parsed_api_keys():
        return "key:" + hashlib.sha256(_header_bytes(key) or b"").hexdigest()[:16]
    return f"host:{request.client.host if request.client else 'unknown'}"


WriteAccess = Depends(require_write)
ReadAccess = Depends(require_read)
