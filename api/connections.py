"""Bounds on how slowly a client may talk to ``tuner serve`` (a slowloris holds connections
open by sending almost nothing): the HTTP protocol ``tuner serve`` names, ``GuardedHTTP``.

uvicorn times out only the wait between a response and the next request
(``timeout_keep_alive``) and restarts even that timer with every byte received: a connection
that never sent a byte, or sent a header byte a second, stayed open for good. Here:

- a connection idle before its first request is closed after ``timeout_keep_alive`` seconds
  too (``TUNER_KEEP_ALIVE_S``, as between requests);
- a request whose head and body have not all arrived ``TUNER_REQUEST_READ_TIMEOUT_S`` seconds
  after its first byte is answered 408 (one sentence, unless its response has begun) and its
  connection closed, however steadily the bytes trickle in.

Header size stays bounded by uvicorn (h11: 16 KiB, else 400); body size by ``api.gate``.
"""

from __future__ import annotations

import asyncio
import functools
import json
from typing import Any

from api.serving import NoDelayHTTP
from tuner.settings import Settings


@functools.cache
def request_read_timeout_s() -> float:
    """``TUNER_REQUEST_READ_TIMEOUT_S`` of this process (read once)."""
    return Settings().request_read_timeout_s


def timeout_response(seconds: float) -> bytes:
    """The 408 a request too slow to arrive gets, in the API's error shape."""
    body = json.dumps({"detail": [{
        "loc": ["request"], "type": "request_timeout",
        "msg": f"the request did not arrive within {seconds:g} s of its first byte "
               "(TUNER_REQUEST_READ_TIMEOUT_S); the connection is closed"}]}).encode()
    return (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: application/json\r\n"
            b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))


class GuardedHTTP(NoDelayHTTP):
    """``NoDelayHTTP`` that closes idle and trickling connections (see the module docstring).

    A request is being read from its first byte until uvicorn has made its cycle (the head is
    parsed) and the cycle's body is complete (``more_body`` false); the deadline armed at the
    first byte is cancelled then. Works on both of uvicorn's protocols (h11's and httptools'),
    through the attributes they share."""

    _read_deadline: asyncio.TimerHandle | None = None
    #: the request cycle current when the deadline was armed: a request read is one whose
    #: cycle is another, complete one
    _cycle_at_arming: Any = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        # idle before the first request: the timer uvicorn arms only after a response
        self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive,
                                                            self.timeout_keep_alive_handler)

    def data_received(self, data: bytes) -> None:
        if self._read_deadline is None:
            self._arm(request_read_timeout_s())
        super().data_received(data)
        cycle = self.cycle
        if (self._read_deadline is not None and cycle is not None
                and cycle is not self._cycle_at_arming and not cycle.more_body):
            self._read_deadline.cancel()
            self._read_deadline = None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
            self._read_deadline = None
        super().connection_lost(exc)

    def _arm(self, seconds: float) -> None:
        self._cycle_at_arming = self.cycle
        self._read_deadline = self.loop.call_later(seconds, self._too_slow, seconds)

    def _too_slow(self, seconds: float) -> None:
        self._read_deadline = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle is not None and cycle is self._cycle_at_arming and not cycle.response_complete:
            # bytes of a pipelined request, unread while the one before is being answered:
            # its own time starts when it is read
            self._arm(seconds)
            return
        if cycle is None or cycle is self._cycle_at_arming or not cycle.response_started:
            self.transport.write(timeout_response(seconds))
        self.transport.close()
