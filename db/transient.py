"""Database errors that pass: telling them apart, retrying them, and saying what went wrong in a
sentence.

A worker's writes (trials, lease renewals, its task's best and finish) go through
``retry_transient``: an error that passes on its own (a terminated PostgreSQL connection, a
lock wait past PostgreSQL's ``lock_timeout`` or SQLite's busy timeout, a serialization failure)
is retried with a bounded back-off instead of failing a task whose measured trials are sound.
Once the window is spent it raises ``StoreUnavailable`` (the worker re-queues the task, never
fails it). Every database error that ends up in a task's or job's error goes through
``describe``: one line, never the SQL statement (SQLAlchemy's message carries the statement and
its parameters: a job error of 1,029 characters once).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

log = logging.getLogger(__name__)

T = TypeVar("T")

#: seconds a worker retries a write that failed transiently before it gives its task back
DEFAULT_WINDOW_S = 60.0
#: SQLSTATEs that pass: serialization failure, deadlock, a lock not granted within the
#: connection's ``lock_timeout`` (55P03: its holder may be a frozen process, whose transaction
#: the server aborts), the session ended by ``idle_in_transaction_session_timeout`` (25P03: this
#: process was the frozen one) or ``idle_session_timeout`` (57P05), and the server going away
#: (admin_shutdown is what ``pg_terminate_backend`` sends), or not yet accepting connections.
#: Work tried again runs in a fresh session, and a worker's writes are fenced by its lease.
_TRANSIENT_SQLSTATES = frozenset({"40001", "40P01", "55P03", "25P03", "57P05", "57P01", "57P02",
                                  "57P03"})
#: message fragments of transient errors where the driver gives no SQLSTATE (sqlite3 never does)
_TRANSIENT_TEXT = ("database is locked", "database table is locked", "could not serialize",
                   "deadlock detected", "server closed the connection", "connection refused",
                   "terminating connection", "could not connect", "connection is closed",
                   "consuming input failed", "the database system is", "lock timeout")


class StoreUnavailable(Exception):
    """A write kept failing transiently for the whole retry window: ``doing`` (e.g. "storing
    trial 31") was not done. The message is the sentence a task's error shows."""

    def __init__(self, doing: str, seconds: float) -> None:
        self.doing, self.seconds = doing, seconds
        super().__init__(f"the database was unreachable for {seconds:.0f} s while {doing}")

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.doing, self.seconds))


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is a database error that may pass if the work is tried again."""
    if isinstance(exc, PoolTimeout):  # every pooled connection busy: they come back
        return True
    if not isinstance(exc, DBAPIError):
        return False
    if exc.connection_invalidated:  # SQLAlchemy saw a disconnect
        return True
    orig = exc.orig
    if getattr(orig, "sqlstate", None) in _TRANSIENT_SQLSTATES or str(
            getattr(orig, "sqlstate", "") or "").startswith("08"):  # 08: connection exception
        return True
    text = str(orig).lower()
    return any(fragment in text for fragment in _TRANSIENT_TEXT)


def is_unavailable(exc: BaseException) -> bool:
    """Whether ``exc`` says the database cannot be reached or read now: a transient error
    (``is_transient``) or any OperationalError, the class drivers raise for a server or file
    that cannot be opened (SQLite's "unable to open database file") and that the API answers
    503 (``api.errors``). The serving index answers lookups from memory then."""
    return isinstance(exc, OperationalError) or is_transient(exc)


def backoff_delays(window_s: float) -> tuple[float, ...]:
    """Waits between attempts that add up to ``window_s``, doubling from 1 s (from an eighth
    of the window when it is shorter than 8 s): 60 s gives 1, 2, 4, 8, 16 and 29 s, seven
    attempts in all."""
    if window_s <= 0:
        return ()
    delay, left, delays = min(1.0, window_s / 8), window_s, []
    while left > 1e-9:
        delays.append(min(delay, left))
        left -= delays[-1]
        delay *= 2
    if len(delays) > 1 and delays[-1] < delays[-2] / 2:  # fold a short tail into the last wait
        tail = delays.pop()
        delays[-1] += tail
    return tuple(delays)


def retry_transient(doing: str, work: Callable[[], T], delays_s: Sequence[float],
                    sleep: Callable[[float], None] = time.sleep) -> T:
    """``work()``, tried again after each of ``delays_s`` while it fails transiently
    (``is_transient``); other errors are raised at once. ``work`` must open its own session
    (a session whose connection died cannot go on). ``StoreUnavailable`` once the waits are
    spent."""
    started = time.monotonic()
    for delay in (*delays_s, None):
        try:
            return work()
        except Exception as exc:
            if not is_transient(exc):
                raise
            if delay is None:
                raise StoreUnavailable(doing, time.monotonic() - started) from exc
            log.warning("%s: the database failed transiently (%s); trying again in %.1f s",
                        doing, _driver_message(exc), delay)
            sleep(delay)
    raise AssertionError("unreachable")


def retry_within(work: Callable[[], T], window_s: float,
                 sleep: Callable[[float], None] = time.sleep) -> T:
    """``work()``, tried again while it fails transiently and ``window_s`` has not passed since
    the first try (waits doubling from 0.25 s to 2 s); then its last error is raised as it is
    (the API answers an OperationalError with 503). For a request that a lock held by a frozen
    process fails: ``DatabaseBounds.frozen_holder_s`` outlasts the holder. ``work`` must roll
    its session back when it fails."""
    deadline = time.monotonic() + window_s
    delay = 0.25
    while True:
        try:
            return work()
        except Exception as exc:
            if not is_transient(exc) or time.monotonic() + delay > deadline:
                raise
            log.warning("the database failed transiently (%s); trying again in %.2f s",
                        _driver_message(exc), delay)
            sleep(delay)
            delay = min(delay * 2, 2.0)


def describe(exc: BaseException, doing: str | None = None) -> str:
    """One line for an error that ends a task: a database error's driver message (first line,
    at most 200 characters), never its SQL statement; others as ``Type: message``."""
    if isinstance(exc, StoreUnavailable):
        return str(exc)
    if isinstance(exc, DBAPIError):
        where = f" while {doing}" if doing else ""
        return f"the database refused the work{where} ({_driver_message(exc)})"
    return f"{type(exc).__name__}: {exc}"


def _driver_message(exc: BaseException) -> str:
    """The driver's error, ``Type: first line`` (at most 200 characters), without the SQL."""
    orig = exc.orig if isinstance(exc, DBAPIError) else exc
    first = (str(orig).strip().splitlines() or [""])[0][:200]
    return f"{type(orig).__name__}: {first}"
