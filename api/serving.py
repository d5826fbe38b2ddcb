"""The serving index: each API process's in-memory copy of the stored best configs, so that a
lookup (``GET /configs``, each item of ``POST /configs/query``) costs no database query.

Candidates (``repo.serving_candidates``: the bests of one kernel, kernel version and dtype, on
every device, with their log2 shapes) are loaded per (kernel, kernel version, dtype) on first
use and kept, split by timing method (``tuner/timing.py``), with the pool each step of the
ladder (``repo.LADDER``) looks at for a caller (a device's rows of one Triton minor, a
device's rows, other real GPUs' rows), made on first use, each with a dict by shape key and a
matrix of log2 shapes. Answers come from the ladder's one implementation, ``repo.climb``, over
the few rows it can choose for the caller (of a step's pool, the exact shape's, else the
nearest shape's), which is exactly what ``repo.serve_best`` returns over all of them (see
``Ladder.serve``), for the method the caller asked for and, where that matches worse, the
others (``repo.serve_timed``).

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

Start-up (``load_all``, from the app's lifespan) loads every stored group in one query, and an
empty one for each registered kernel's dtypes at its version, when there are at most
``EAGER_LOAD_MAX_ROWS`` bests.

Database outages: when the version check or a group's load fails because the database cannot
be reached (``db.transient.is_unavailable``), lookups are answered from the latest copy of
every group this process loaded (at start, or since) without touching the database, and say
so (``X-Tuner-Database: unavailable``); a group never loaded is ``NotInMemory`` (a 503). A
thread tries the database again every ``retry_s`` (``OUTAGE_RETRY_S``) until it answers, so a
lookup never waits on it. Miss reports that cannot be written are kept (``report_miss``: at
most ``DEFERRED_MISSES_MAX``, the oldest dropped) and written once it answers, before lookups
read the database again.
"""

from __future__ import annotations

import logging
import math
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, fields
from itertools import chain
from typing import Any

from fastapi import FastAPI, Request
from sqlalchemy import event
from sqlalchemy.orm import ORMExecuteState, Session, sessionmaker
from starlette.types import Message, Receive, Scope, Send

from api.errors import NotInMemory
from api.middleware import HttpMiddleware
from db import repo
from db.engine import unreachable_reason
from db.models import BestConfig, Device
from db.transient import describe, is_unavailable
from tuner.identity import triton_minor
from tuner.kernel import TunableKernel
from tuner.shapes import ShapeTable
from tuner.timing import DEFAULT_TIMING

log = logging.getLogger(__name__)

#: default seconds between two version checks of one process's index
DEFAULT_REFRESH_S = 0.5
#: seconds between two attempts to reach the database while it is unreachable
OUTAGE_RETRY_S = 1.0
#: miss reports kept while the database is unreachable; beyond, the oldest is dropped
DEFERRED_MISSES_MAX = 1000
#: ``load_all`` loads every best when there are at most this many: a best costs about 80 us
#: and 4 KiB held (SQLite, 8 devices, a loaded 2-core machine), so 20,000 take 1.6 s at
#: start and 75 MiB, what lookups touching every group would load anyway
EAGER_LOAD_MAX_ROWS = 20_000
#: the header of an answer made while the database was unreachable: from memory (``Group``s
#: as last loaded), its misses deferred
DATABASE_HEADER = "X-Tuner-Database"
DATABASE_UNAVAILABLE = {DATABASE_HEADER: "unavailable"}

GroupKey = tuple[str, str, str]  # (kernel, kernel version, dtype)


class Pool:
    """Candidates that one step of the ladder looks at for a caller, by shape key and in a
    ``ShapeTable`` (their log2 shapes as a matrix): the exact shape's by a dict, the nearest
    shapes' with one vector operation instead of a distance per candidate in Python."""

    def __init__(self, candidates: list[repo.Candidate]) -> None:
        self.candidates = candidates
        self.by_key: dict[str, list[repo.Candidate]] = {}
        for c in candidates:
            self.by_key.setdefault(c.shape_key, []).append(c)
        self.table = ShapeTable(candidates, lambda c: c.log_shape)

    def nearest(self, key: str, logs: Mapping[str, float]) -> list[repo.Candidate]:
        """The candidates of the exact shape, else those of the nearest shape: ``_closest``
        picks among these whatever it would pick among all (distance ranks first)."""
        return self.by_key.get(key) or self.table.nearest(logs)


#: a caller's Triton minor that no candidate has: every such minor admits the same candidates
_OTHER_MINOR = object()


@dataclass(frozen=True)
class Ladder:
    """The candidates of one (kernel, kernel version, dtype) timed one way, and the ``Pool``
    each step of the ladder (``repo.LADDER``) looks at for a caller, made on first use."""

    candidates: list[repo.Candidate]
    devices: frozenset[str]
    minors: frozenset[str | None]
    #: (step, device, Triton minor) -> the candidates the step admits for such a caller
    pools: dict[tuple[str, str | None, object], Pool] = field(default_factory=dict)

    @classmethod
    def of(cls, candidates: list[repo.Candidate]) -> Ladder:
        return cls(candidates, frozenset(c.device_key for c in candidates),
                   frozenset(triton_minor(c.triton_version) for c in candidates))

    def serve(self, shape: Mapping[str, int], device_key: str | None,
              triton_version: str | None, timing: str = DEFAULT_TIMING) -> repo.Served | None:
        """``repo.climb`` over the pools (the ladder's answer over every candidate, all timed
        ``timing``: ``repo.serve_best``), each step looking at the candidates of the exact
        shape, else of the nearest shapes, among those it admits."""
        def members(step: repo.Step, key: str, logs: Mapping[str, float]
                    ) -> list[repo.Candidate]:
            return self._pool(step, device_key, triton_version).nearest(key, logs)

        return repo.climb(members, shape=shape, device_key=device_key,
                          triton_version=triton_version)

    def _pool(self, step: repo.Step, device_key: str | None,
              triton_version: str | None) -> Pool:
        """The candidates ``step`` admits for this caller (``Step.admits``), kept per what
        they depend on: the caller's device (one of the candidates', else none: a device they
        do not have admits what none does) and its Triton minor (one of theirs, else any
        other), so that callers naming devices and versions at will add at most a few."""
        minor = triton_minor(triton_version)
        key = (step.match, device_key if device_key in self.devices else None,
               minor if minor in self.minors or minor is None else _OTHER_MINOR)
        pool = self.pools.get(key)
        if pool is None:
            pool = self.pools[key] = Pool([c for c in self.candidates
                                           if step.admits(c, device_key, triton_version)])
        return pool


@dataclass(frozen=True)
class Group:
    """The candidates of one (kernel, kernel version, dtype): a ``Ladder`` per timing
    method."""

    candidates: list[repo.Candidate]
    by_timing: dict[str, Ladder]

    @classmethod
    def of(cls, candidates: list[repo.Candidate]) -> Group:
        by_timing: dict[str, list[repo.Candidate]] = {}
        for c in candidates:
            by_timing.setdefault(c.timing, []).append(c)
        return cls(candidates, {m: Ladder.of(rows) for m, rows in by_timing.items()})

    def serve(self, shape: Mapping[str, int], device_key: str | None,
              triton_version: str | None, timing: str = DEFAULT_TIMING) -> repo.Served | None:
        """``repo.serve_timed``: the ladder of the configs timed ``timing``, unless another
        method's matches better (its answer's row says which method)."""
        def serve(method: str) -> repo.Served | None:
            ladder = self.by_timing.get(method)
            return None if ladder is None else ladder.serve(shape, device_key, triton_version,
                                                            method)

        return repo.serve_timed(serve, timing)


@dataclass(frozen=True)
class DeferredMiss:
    """A miss report (``repo.report_miss``'s arguments) kept while the database is
    unreachable, written once it answers."""

    device_key: str | None
    kernel: str
    kernel_version: str
    #: None: a kernel no worker can tune (``api.validation.ExternalKernel``)
    registered_version: str | None
    dtype: str
    shape: dict[str, int]
    client: str
    limits: repo.MissLimits
    label: str | None
    may_queue: bool
    timing: str = DEFAULT_TIMING

    def write(self, session: Session) -> str:
        """Record it (``repo.report_miss``) and commit; what became of it."""
        outcome = repo.report_miss(session, **{f.name: getattr(self, f.name)
                                               for f in fields(self)})
        session.commit()  # one miss at a time: its row stays locked until this commit
        return outcome


@dataclass(frozen=True)
class Outage:
    """The database unreachable since ``since`` (``time.time()``), for ``reason``."""

    since: float
    reason: str


class ServingIndex:
    """One process's serving index over the store of ``factory`` (thread-safe: lookups run on
    the event loop and in the server's thread pool)."""

    def __init__(self, factory: sessionmaker[Session], refresh_s: float = DEFAULT_REFRESH_S,
                 clock: Callable[[], float] = time.monotonic,
                 retry_s: float = OUTAGE_RETRY_S,
                 misses_max: int = DEFERRED_MISSES_MAX) -> None:
        self.factory = factory
        self.refresh_s = refresh_s
        self.clock = clock
        self.retry_s = retry_s
        self.misses_max = misses_max
        self._lock = threading.Lock()
        self._groups: dict[GroupKey, Group] = {}
        #: the latest copy of every group ever loaded: what an outage serves
        self._last: dict[GroupKey, Group] = {}
        self._version: tuple[Any, ...] | None = None
        self._checked_at = -math.inf
        self._local_writes = _local_writes.count
        self._versions: dict[str, str] = {}  # a kernel's version hashes its source: once
        self._outage: Outage | None = None
        self._misses: deque[DeferredMiss] = deque()
        self._closed = threading.Event()
        self._recovery: threading.Thread | None = None
        #: version checks and group loads done (tests and the benchmark read them)
        self.checks = 0
        self.loads = 0
        #: miss reports deferred, written once the database answered, and dropped (the
        #: oldest beyond ``misses_max``, or refused when written)
        self.misses_deferred = 0
        self.misses_written = 0
        self.misses_dropped = 0

    @property
    def enabled(self) -> bool:
        return self.refresh_s > 0

    @property
    def outage(self) -> Outage | None:
        """Since when and why the database is unreachable; None while it answers."""
        return self._outage

    @property
    def deferred_misses(self) -> int:
        """Miss reports waiting for the database."""
        return len(self._misses)

    def registered_version(self, kernel: TunableKernel) -> str:
        if kernel.name not in self._versions:
            self._versions[kernel.name] = str(kernel.version)
        return self._versions[kernel.name]

    def group(self, kernel: str, kernel_version: str, dtype: str) -> Group:
        """The candidates of that kernel version and dtype, as of at most ``refresh_s`` ago
        (``lookup`` without saying where they came from)."""
        return self.lookup(kernel, kernel_version, dtype)[0]

    def lookup(self, kernel: str, kernel_version: str, dtype: str) -> tuple[Group, bool]:
        """The candidates of that kernel version and dtype, as of at most ``refresh_s`` ago,
        and False; while the database is unreachable, their copy in memory and True
        (``NotInMemory`` when there is none)."""
        key = (kernel, kernel_version, dtype)
        if not self.enabled:
            with self.factory() as session:
                return Group.of(repo.serving_candidates(
                    session, kernel=kernel, kernel_version=kernel_version, dtype=dtype)), False
        if self._outage is None:
            try:
                self._refresh_if_due()
                found = self._groups.get(key)
                if found is None:
                    with self._lock:
                        found = self._groups.get(key)
                        if found is None and self._outage is None:
                            found = self._load(key)
                if found is not None:
                    return found, False
            except Exception as exc:
                if not is_unavailable(exc):
                    raise
                self.database_failed(exc)
        return self._from_memory(key), True

    def cached(self, kernel: str, kernel_version: str, dtype: str) -> tuple[Group, bool] | None:
        """``lookup``'s answer when it can be had without the database (loaded and no version
        check due, or the database unreachable), else None: ``lookup`` then reads it."""
        if not self.enabled:
            return None
        key = (kernel, kernel_version, dtype)
        if self._outage is not None:
            return self._from_memory(key), True
        if _local_writes.count != self._local_writes \
                or self.clock() - self._checked_at >= self.refresh_s:
            return None
        found = self._groups.get(key)
        return None if found is None else (found, False)

    def load_all(self, registered: Iterable[TunableKernel] = ()) -> bool:
        """Load every stored group, and an empty one for each ``registered`` kernel's dtypes
        at its version that has no best, when there are at most ``EAGER_LOAD_MAX_ROWS`` bests:
        an outage then finds them all in memory. False when there were more, or the database
        failed (logged: lookups load groups on use then)."""
        if not self.enabled:
            return False
        local = _local_writes.count
        try:
            with self.factory() as session:
                version = repo.best_configs_version(session)
                if version[0] > EAGER_LOAD_MAX_ROWS:
                    log.info("serving index: %d stored bests, more than %d: groups are "
                             "loaded on first use", version[0], EAGER_LOAD_MAX_ROWS)
                    return False
                candidates = repo.all_serving_candidates(session)
        except Exception as exc:  # noqa: BLE001 - lookups load on use instead
            log.warning("serving index: the bests could not be loaded at start (%s); groups "
                        "are loaded on first use", describe(exc))
            return False
        groups = {key: Group.of(rows) for key, rows in candidates.items()}
        for kernel in registered:
            for dtype in kernel.dtypes:
                groups.setdefault((kernel.name, self.registered_version(kernel), dtype),
                                  Group.of([]))
        with self._lock:
            self._groups, self._version = groups, version
            self._last.update(groups)
            self._checked_at, self._local_writes = self.clock(), local
            self.checks += 1
            self.loads += len(candidates)
        return True

    def report_miss(self, session: Session, miss: DeferredMiss) -> str:
        """``miss`` written through ``session`` (``DeferredMiss.write``); "deferred" while the
        database is unreachable: kept in memory, written once it answers."""
        if self._defer(miss):
            return "deferred"
        try:
            return miss.write(session)
        except Exception as exc:
            if not is_unavailable(exc):
                raise
            _rollback(session)
            self.database_failed(exc, defer=miss)
            return "deferred"

    def database_failed(self, exc: BaseException, defer: DeferredMiss | None = None) -> None:
        """The database did not answer (``exc``): lookups are answered from memory, and
        ``defer`` kept, until a thread that tries it every ``retry_s`` reaches it."""
        with self._lock:
            if self._outage is None:
                self._outage = Outage(time.time(), unreachable_reason(exc))
                log.warning("the database is unreachable (%s): lookups are answered from the "
                            "serving index's memory, and miss reports are kept until it "
                            "answers", self._outage.reason)
                if not self._closed.is_set():
                    self._recovery = threading.Thread(target=self._recover, daemon=True,
                                                      name="serving-index-recovery")
                    self._recovery.start()
            if defer is not None:
                self._append(defer)

    def close(self) -> None:
        """Stop trying to reach the database (the app's shutdown); deferred misses are lost."""
        self._closed.set()
        if self._recovery is not None:
            self._recovery.join(timeout=10)
        if self._misses:
            log.warning("%d deferred miss reports were never written: the database did not "
                        "answer before shutdown", len(self._misses))

    def _refresh_if_due(self) -> None:
        local = _local_writes.count != self._local_writes
        if not local and self.clock() - self._checked_at < self.refresh_s:
            return
        with self._lock:
            now = self.clock()
            local = _local_writes.count != self._local_writes
            if self._outage is not None or (not local and now - self._checked_at < self.refresh_s):
                return  # another thread checked meanwhile
            count = _local_writes.count
            with self.factory() as session:
                version = repo.best_configs_version(session)
            self._local_writes = count
            self._update(version, local, now)

    def _update(self, version: tuple[Any, ...], local: bool, now: float) -> None:
        """A version check's result (under the lock)."""
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
        self._groups[key] = self._last[key] = group
        return group

    def _from_memory(self, key: GroupKey) -> Group:
        found = self._last.get(key)
        if found is None:
            kernel, kernel_version, dtype = key
            raise NotInMemory(f"the database is unavailable and the configs of {kernel} "
                              f"{dtype} (kernel version {kernel_version}) were not in this "
                              "API process's memory: retry once the database is back")
        return found

    # -- the outage -----------------------------------------------------------------------

    def _defer(self, miss: DeferredMiss) -> bool:
        """Keep ``miss`` when the database is unreachable (True), else False."""
        with self._lock:
            if self._outage is None:
                return False
            self._append(miss)
            return True

    def _append(self, miss: DeferredMiss) -> None:
        if len(self._misses) >= self.misses_max:
            self._misses.popleft()
            self.misses_dropped += 1
        self._misses.append(miss)
        self.misses_deferred += 1

    def _recover(self) -> None:
        while not self._closed.wait(self.retry_s):
            if self._probe():
                return

    def _probe(self) -> bool:
        """One try of the database: when it answers, the index is brought up to date, the
        deferred misses are written and the outage ends (True)."""
        try:
            with self.factory() as session:
                version = repo.best_configs_version(session)
        except Exception as exc:  # noqa: BLE001 - tried again in retry_s
            if not is_unavailable(exc):
                log.warning("the database failed while it was tried again (%s)", describe(exc))
            return False
        with self._lock:
            local = _local_writes.count != self._local_writes
            self._local_writes = _local_writes.count
            self._update(version, local, self.clock())
        return self._write_deferred()

    def _write_deferred(self) -> bool:
        """Write the deferred misses, oldest first; once none is left the outage ends (True).
        False when the database failed again (the miss being written is kept)."""
        written = 0
        with self.factory() as session:
            while True:
                with self._lock:
                    if not self._misses:
                        outage, self._outage = self._outage, None
                        break
                    miss = self._misses.popleft()
                try:
                    miss.write(session)
                    written += 1
                except Exception as exc:  # noqa: BLE001 - kept, or dropped when refused
                    _rollback(session)
                    with self._lock:
                        if is_unavailable(exc):
                            if len(self._misses) < self.misses_max:
                                self._misses.appendleft(miss)
                            else:
                                self.misses_dropped += 1
                            self.misses_written += written
                            return False
                        self.misses_dropped += 1
                    log.warning("a deferred miss report of %s could not be written (%s): "
                                "dropped", miss.kernel, describe(exc))
        self.misses_written += written
        since = outage.since if outage else time.time()
        log.warning("the database answers again after %.1f s: lookups read it again; %d "
                    "deferred miss reports written (%d dropped in all)",
                    time.time() - since, written, self.misses_dropped)
        return True


def _rollback(session: Session) -> None:
    """Roll back what failed; a connection that is gone cannot, and need not."""
    try:
        session.rollback()
    except Exception:  # noqa: BLE001, S110 - nothing was written
        pass


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
    the client's delayed ACK, 40 ms a lookup (``tuner serve`` names its subclass,
    ``api.connections.GuardedHTTP``)."""

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
