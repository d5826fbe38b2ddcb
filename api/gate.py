"""What is refused before a route runs and before its body is read (``RequestGate``): any
request whose ``Host`` header names a host this service does not answer for (400,
``TUNER_ALLOWED_HOSTS``: a page of another site reaching a service on this machine through a
name of its own, DNS rebinding, is refused so); a request that changes state is checked for the
key its route needs first, so that a caller
without one costs no memory (eight 100 MB bodies without a key once took an API process from
384 to 1,087 MB); then its body is limited to ``TUNER_MAX_BODY_BYTES``.

Browsers are kept from changing state for another site: a cross-site request (the browser's
``Sec-Fetch-Site``, else an ``Origin`` that is not this host) is refused, and so is a content
type an HTML form can send (a form, ``text/plain``) to an API route that needs write access,
which a JSON client never sends. Without API keys those are the only defence of cancel."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from fastapi import APIRouter
from fastapi.routing import APIRoute
from starlette.datastructures import Headers
from starlette.requests import Request
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.deps import KEY_CHECKED, read_refusal, require_read, require_write, write_refusal
from api.errors import RequestRefused, refused_response
from api.middleware import HttpMiddleware
from tuner.settings import Settings

Access = Literal["write", "read", "open"]

#: methods that change nothing: passed through untouched (lookups stay as fast as before)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: the content types an HTML form (or a no-CORS fetch) can send without asking the server
FORM_TYPES = frozenset({"application/x-www-form-urlencoded", "multipart/form-data",
                        "text/plain"})


@dataclass(frozen=True)
class RouteAccess:
    """The access one route needs (from its ``WriteAccess`` or ``ReadAccess`` dependency)."""

    path: re.Pattern[str]
    methods: frozenset[str]
    access: Access


def access_table(prefix: str, routers: Iterable[APIRouter]) -> tuple[RouteAccess, ...]:
    """The access each route of ``routers`` (included under ``prefix``) needs, for the gate:
    it runs before routing, so it matches paths itself."""
    table = []
    for router in routers:
        for route in router.routes:
            if isinstance(route, APIRoute):
                calls = {d.call for d in route.dependant.dependencies}
                access: Access = ("write" if require_write in calls else
                                  "read" if require_read in calls else "open")
                table.append(RouteAccess(compile_path(prefix + route.path)[0],
                                         frozenset(route.methods or ()), access))
    return tuple(table)


def route_access(table: tuple[RouteAccess, ...], scope: Scope) -> Access:
    for route in table:
        if scope["method"] in route.methods and route.path.match(scope["path"]):
            return route.access
    return "open"  # routes outside the table check their own keys, after the body limit


class RequestGate(HttpMiddleware):
    """Refuses, with ``api.errors.refused_response``: a host not in ``hosts`` (400; None: any
    host), a cross-site request (403), one without the key its route needs (401/403;
    ``routes``: the table of ``access_table``), a form type on a write route (415), a body
    larger than ``TUNER_MAX_BODY_BYTES`` (413: by its ``Content-Length`` before it is read,
    else as soon as the body read so far passes the limit). Requests with a safe method are
    checked for their host alone."""

    def __init__(self, app: ASGIApp, routes: tuple[RouteAccess, ...],
                 hosts: tuple[str, ...] | None = None) -> None:
        super().__init__(app)
        self.routes = routes
        self.hosts = hosts

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.hosts is not None:
            refusal = host_refusal(scope, self.hosts)
            if refusal is not None:
                await refused_response(refusal)(scope, receive, send)
                return
        if scope["method"] in SAFE_METHODS:
            await self.app(scope, receive, send)
            return
        settings: Settings = scope["app"].state.settings
        started = False

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            check_head(scope, settings, route_access(self.routes, scope))
            await self.app(scope, limited(receive, settings.max_body_bytes), tracked_send)
        except RequestRefused as exc:
            if started:
                raise
            await refused_response(exc)(scope, receive, send)


def check_head(scope: Scope, settings: Settings, access: Access) -> None:
    """Everything that can be refused from the request line and headers alone."""
    headers = Headers(scope=scope)
    check_same_site(headers)
    refusal = (write_refusal(settings, headers) if access == "write" else
               read_refusal(settings, headers, Request(scope).cookies) if access == "read"
               else None)
    if refusal is not None:
        raise refusal
    scope[KEY_CHECKED] = access  # the route's dependency need not compare the keys again
    if access == "write":
        check_not_form(headers)
    check_length(headers, settings.max_body_bytes)


def host_refusal(scope: Scope, hosts: tuple[str, ...]) -> RequestRefused | None:
    """A 400 for a request whose Host header (with HTTP/1.0, perhaps none) names no host of
    ``hosts`` (``Settings.parsed_allowed_hosts``: names, ``*.suffix`` for subdomains)."""
    header = next((v for k, v in scope["headers"] if k == b"host"), None)
    host = host_name(header.decode("latin-1")) if header is not None else None
    if host is not None and any(host == h or (h.startswith("*.") and host.endswith(h[1:]))
                                for h in hosts):
        return None
    what = "without a Host header" if header is None else "for a host it does not serve"
    return RequestRefused(400, f"this service refuses requests {what}; it answers for "
                          f"{', '.join(hosts)} (TUNER_ALLOWED_HOSTS)", ["header", "host"],
                          "host_not_allowed")


def host_name(header: str) -> str:
    """The host of a Host header: lower case, without its port or a trailing dot, an IPv6
    address without its brackets (``[::1]:8000`` -> ``::1``)."""
    text = header.strip().lower()
    if text.startswith("["):
        text = text[1:].partition("]")[0]
    elif text.count(":") == 1:
        text = text.partition(":")[0]
    return text.rstrip(".")


def check_same_site(headers: Headers) -> None:
    """A browser names the site that made a request: refuse requests another site made (this
    service answers no CORS request, so no other site's page has a reason to send one)."""
    site = headers.get("sec-fetch-site")
    origin = headers.get("origin")
    if site is not None:
        cross = site in ("cross-site", "same-site")
    else:  # older browsers: the Origin header, when there is one
        cross = origin is not None and urlsplit(origin).netloc != headers.get("host")
    if cross:
        raise RequestRefused(403, "a request from another site's page is refused: call the "
                             "API from a program, or use the dashboard on this host",
                             ["header", "origin"], "cross_site")


def check_not_form(headers: Headers) -> None:
    kind = headers.get("content-type", "").split(";")[0].strip().lower()
    if kind in FORM_TYPES:
        raise RequestRefused(415, f"content type {kind} is refused on a route that changes "
                             "state; send application/json (or no body)",
                             ["header", "content-type"], "unsupported_media_type")


def too_large(limit: int) -> RequestRefused:
    return RequestRefused(413, f"the request body is larger than this service's limit of "
                          f"{limit:,} bytes (TUNER_MAX_BODY_BYTES)", ["body"],
                          "body_too_large")


def check_length(headers: Headers, limit: int) -> None:
    length = headers.get("content-length")
    if length is not None and length.strip().isdigit() and int(length) > limit:
        raise too_large(limit)


def limited(receive: Receive, limit: int) -> Receive:
    """``receive`` that raises a 413 once the body received passes ``limit`` bytes (a chunked
    body has no length to check beforehand)."""
    seen = 0

    async def receive_limited() -> Message:
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise too_large(limit)
        return message

    return receive_limited
