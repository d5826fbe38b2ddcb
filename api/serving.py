"""The serving index: each API process's in-memory copy of the stored best configs, so that a
lookup (``GET /configs``, each item of ``POST /configs/query``) costs no database query.

Candidates (``repo.serving_candidates``: the bests of one kernel, kernel version and dtype, on
every device, with their log2 shapes) are loaded per (kernel, kernel version, dtype) on first
use and kept, split into the pools the ladder ranks (a device's rows of one Triton minor, a
device's rows, other real GPUs' rows), each with a dict by shape key and a matrix of log2
shapes. Answers come from ``repo.serve_best`` over the few rows it can choose for the caller
(the exact shape's, else the nearest shape's, of the first pool with any row), which is
exactly what it returns over all of them (see ``Group.serve``).

Freshness: at most every ``refresh_s`` seconds (``TUNER_SERVING_REFRESH_S``, default 0.5) a
lookup asks the database for ``repo.best_configs_version`` (one aggregate query: count, largest
id and latest ``updated_at`` of the bests, and the number of devices); when it changed, every
group is dropped and reloaded on its next use. So a best stored by another process (a worker,
another API replica or uvicorn worker) is served at most ``refresh_s`` after its commit. A
write made through this process (a session of this process committing an INSERT, UPDATE or
DELETE of a best or a device) drops the groups at once. ``refresh_s = 0`` turns the index off:
every lookup reads the database, as before the index (``bench/serving_load.py``'s "before").
What the version does not see: a replaced best whose new ``updated_at`` is older than the
newest one stored (a writer whose clock lags the others') shows up at the next other change.
"""

from __future__ import annotations

import math
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from sqlalchemy import event
from sqlalchemy.orm import ORMExecuteState, Session, sessionmaker
from starlette.types import Message, Receive, Scope, Send

from api.middleware import HttpMiddleware
from db import repo
from db.models import BestConfig, Device
from tuner.identity import triton_minor
from tuner.kernel import TunableKernel
from tuner.shapes import shape_key

#: default seconds between two version checks of one process's index
DEFAULT_REFRESH_S = 0.5

GroupKey = tuple[str, str, str]  # (kernel, kernel version, dtype)


class Pool:
    """Candidates that one step of the ladder ranks, with their shapes' log2 as a matrix, so
    that the nearest shapes are found with one vector operation instead of a distance per
    candidate in Python."""

    #: candidates this much (squared log2 distance) farther than the nearest are not ranked;
    #: far above float rounding, far below any real difference of two shapes
    TOLERANCE = 1e-9

    def __init__(self, candidates: list[repo.Candidate]) -> None:
        self.candidates = candidates
        self.by_key: dict[str, list[repo.Candidate]] = {}
        for c in candidates:
            self.by_key.setdefault(c.shape_key, []).append(c)
        self.dims = sorted({d for c in candidates for d in c.log_shape})
        # a dimension missing from a shape counts as 1 there (log2 0), as in shape_distance
        self.logs = np.array([[c.log_shape.get(d, 0.0) for d in self.dims] for c in candidates],
                             dtype=np.float64).reshape(len(candidates), len(self.dims))

    def nearest(self, key: str, logs: Mapping[str, float]) -> list[repo.Candidate]:
        """The candidates of the exact shape, else those of the nearest shape: ``_closest``
        picks among these whatever it would pick among all (distance ranks first). A
        dimension of the caller's that no candidate has adds the same to every distance."""
        exact = self.by_key.get(key)
        if exact:
            return exact
        query = np.array([logs.get(d, 0.0) for d in self.dims], dtype=np.float64)
        squared = ((self.logs - query) ** 2).sum(axis=1)
        close = np.flatnonzero(squared <= squared.min() + self.TOLERANCE)
        return [self.candidates[i] for i in close]


@dataclass(frozen=True)
class Group:
    """The candidates of one (kernel, kernel version, dtype), in the pools the ladder of
    ``repo.serve_best`` ranks: a device's rows under one Triton minor, a device's rows, and
    the rows of real GPUs other than a device."""

    candidates: list[repo.Candidate]
    #: (device, Triton minor) -> the device's rows of that minor and those without a version;
    #: (device, None) -> those without a version alone (for a minor it has no row of)
    same_minor: dict[tuple[str, str | None], Pool]
    by_device: dict[str, Pool]
    #: rows tuned on real GPUs, and those of each device's others ("" : all of them)
    gpus_except: dict[str, Pool]

    @classmethod
    def of(cls, candidates: list[repo.Candidate]) -> Group:
        by_minor: dict[tuple[str, str | None], list[repo.Candidate]] = {}
        by_device: dict[str, list[repo.Candidate]] = {}
        for c in candidates:
            by_minor.setdefault((c.device_key, triton_minor(c.triton_version)), []).append(c)
            by_device.setdefault(c.device_key, []).append(c)
        gpus = [c for c in candidates if c.device_kind == "cuda"]
        gpus_except = {device: Pool([c for c in gpus if c.device_key != device])
                       for device in ("", *by_device)}
        same_minor: dict[tuple[str, str | None], Pool] = {
            (device, minor): Pool(rows + by_minor.get((device, None), []))
            for (device, minor), rows in by_minor.items() if minor is not None}
        same_minor.update({(device, None): Pool(by_minor.get((device, None), []))
                           for device in by_device})
        return cls(candidates, same_minor, {d: Pool(rows) for d, rows in by_device.items()},
                   gpus_except)

    def serve(self, shape: Mapping[str, int], device_key: str | None,
              triton_version: str | None) -> repo.Served | None:
        """``repo.serve_best`` over the few candidates it can choose for this caller: the
        ladder's first step with any row (the caller's device under its Triton minor, its
        device, other real GPUs), and of that step's rows only those of the exact shape or
        of the nearest shape. Its answer is the one it gives over all candidates."""
        key, logs = shape_key(shape), {d: math.log2(max(1, v)) for d, v in shape.items()}
        pools: list[Pool] = []
        if device_key and device_key in self.by_device:
            pools += [self._same_minor(device_key, triton_version), self.by_device[device_key]]
        pools.append(self.gpus_except.get(device_key or "", self.gpus_except[""]))
        for pool in pools:
            if pool.candidates:
                return repo.serve_best(pool.nearest(key, logs), shape=shape,
                                       device_key=device_key, triton_version=triton_version)
        return None

    def _same_minor(self, device_key: str, triton_version: str | None) -> Pool:
        """The device's rows of the caller's Triton minor (``same_triton_minor``: a row or a
        caller without a version matches every minor)."""
        minor = triton_minor(triton_version)
        if minor is None:
            return self.by_device[device_key]
        return self.same_minor.get((device_key, minor)) or self.same_minor[(device_key, None)]


class ServingIndex:
    """One process's serving index over the store of ``factory`` (thread-safe: lookups run on
    the event loop and in the server's thread pool)."""

    def __init__(self, factory: sessionmaker[Session], refresh_s: float = DEFAULT_REFRESH_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.factory = factory
        self.refresh_s = refresh_s
        self.clock = clock
        self._lock = threading.Lock()
        self._groups: dict[GroupKey, Group] = {}
        self._version: tuple[Any, ...] | None = None
        self._checked_at = -math.inf
        self._local_writes = _local_writes.count
        self._versions: dict[str, str] = {}  # a kernel's version hashes its source: once
        #: version checks and group loads done (tests and the benchmark read them)
        self.checks = 0
        self.loads = 0

    @property
    def enabled(self) -> bool:
        return self.refresh_s > 0

    def registered_version(self, kernel: TunableKernel) -> str:
        if kernel.name not in self._versions:
            self._versions[kernel.name] = str(kernel.version)
        return self._versions[kernel.name]

    def group(self, kernel: str, kernel_version: str, dtype: str) -> Group:
        """The candidates of that kernel version and dtype, as of at most ``refresh_s`` ago."""
        if not self.enabled:
            with self.factory() as session:
                return Group.of(repo.serving_candidates(
                    session, kernel=kernel, kernel_version=kernel_version, dtype=dtype))
        self._refresh_if_due()
        key = (kernel, kernel_version, dtype)
        found = self._groups.get(key)
        if found is None:
            with self._lock:
                found = self._groups.get(key) or self._load(key)
        return found

    def cached_group(self, kernel: str, kernel_version: str, dtype: str) -> Group | None:
        """The group when it can be had without the database (loaded, and no version check
        due), else None: ``group`` then reads the database."""
        if not self.enabled or _local_writes.count != self._local_writes \
                or self.clock() - self._checked_at >= self.refresh_s:
            return None
        return self._groups.get((kernel, kernel_version, dtype))

    def _refresh_if_due(self) -> None:
        local = _local_writes.count != self._local_writes
        if not local and self.clock() - self._checked_at < self.refresh_s:
            return
        with self._lock:
            now = self.clock()
            local = _local_writes.count != self._local_writes
            if not local and now - self._checked_at < self.refresh_s:
                return  # another thread checked meanwhile
            self._local_writes = _local_writes.count
            with self.factory() as session:
                version = repo.best_configs_version(session)
            self.checks += 1
            if local or version != self._version:
                self._groups = {}  # groups loaded from here on see at least ``version``
                self._version = version
            self._checked_at = now

    def _load(self, key: GroupKey) -> Group:
        kernel, kernel_version, dtype = key
        with self.factory() as session:
            group = Group.of(repo.serving_candidates(
                session, kernel=kernel, kernel_version=kernel_version, dtype=dtype))
        self.loads += 1
        self._groups[key] = group
        return group


async def serving_index(request: Request) -> ServingIndex:
    """The app's index, made on first use from its settings and database."""
    state = request.app.state
    index: ServingIndex | None = getattr(state, "serving_index", None)
    if index is None:
        with _MAKE_LOCK:
            index = getattr(state, "serving_index", None)
            if index is None:
                index = ServingIndex(state.session_factory, state.settings.serving_refresh_s)
                state.serving_index = index
    return index


_MAKE_LOCK = threading.Lock()


# -- writes through this process ---------------------------------------------------------------

class _Writes:
    """Counts commits of this process that wrote bests or devices."""

    count = 0


_local_writes = _Writes()
_SERVED_TABLES = (BestConfig, Device)


def _note_statement(state: ORMExecuteState) -> None:
    if (state.is_insert or state.is_update or state.is_delete) and state.bind_mapper is not None \
            and state.bind_mapper.class_ in _SERVED_TABLES:
        state.session.info["serving_stale"] = True


def _note_flush(session: Session, _context: Any) -> None:
    if any(isinstance(o, _SERVED_TABLES)
           for o in chain(session.new, session.dirty, session.deleted)):
        session.info["serving_stale"] = True


def _after_commit(session: Session) -> None:
    if session.info.pop("serving_stale", False):
        _local_writes.count += 1


def _after_rollback(session: Session) -> None:
    session.info.pop("serving_stale", None)


event.listen(Session, "do_orm_execute", _note_statement)
event.listen(Session, "after_flush", _note_flush)
event.listen(Session, "after_commit", _after_commit)
event.listen(Session, "after_soft_rollback", lambda session, _previous: _after_rollback(session))


# -- HTTP -----------------------------------------------------------------------------------------

def _http_protocol() -> type[Any]:
    """The protocol uvicorn's ``http="auto"`` picks: httptools' when installed, else h11's."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
        return HttpToolsProtocol
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol
        return H11Protocol


class NoDelayHTTP(_http_protocol()):  # type: ignore[misc]
    """uvicorn's HTTP protocol with ``TCP_NODELAY`` on every connection. With several worker
    processes uvicorn binds the socket itself without naming the protocol, so asyncio does not
    see TCP and leaves Nagle's algorithm on: a response written as head then body waited for
    the client's delayed ACK, 40 ms a lookup (``tuner serve`` names this class)."""

    def connection_made(self, transport: Any) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None and sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        super().connection_made(transport)


# -- Server-Timing ------------------------------------------------------------------------------

class ServerTiming(HttpMiddleware):
    """Adds ``Server-Timing: app;dur=<ms>`` to every response: the time from the request
    reaching the app to its response starting (routing, validation, the handler, serialising
    the body), without the HTTP server's parsing and writing."""

    async def http(self, scope: Scope, receive: Receive, send: Send) -> None:
        start = time.perf_counter()

        async def timed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                ms = (time.perf_counter() - start) * 1e3
                message["headers"] = [*message.get("headers", ()),
                                      (b"server-timing", f"app;dur={ms:.3f}".encode())]
            await send(message)

        await self.app(scope, receive, timed_send)


def install(app: FastAPI) -> None:
    app.add_middleware(ServerTiming)
