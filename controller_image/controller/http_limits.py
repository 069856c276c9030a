"""Bounds on what a client of the control API may hold before it has sent a whole request.

uvicorn has a keep-alive timeout (idle between requests) and `limit_concurrency` (a 503 once a request is
read), but no deadline for reading a request and no cap on open connections: the first byte of a request
cancels its only timer. A security review held 2000 half-sent requests open for 42 s and more, and 20,200
connections took the controller to 19,943 of its 20,000 file descriptors until `/healthz` failed.

`BoundedH11Protocol` is uvicorn's own h11 protocol (`uvicorn.Config(http=...)` takes a protocol class) with
the two bounds uvicorn lacks: a request (headers and body) must arrive within `read_timeout_s` of its first
byte (of the connection, for a new one) or the connection is closed; and past `max_connections` open
connections, the one that has waited longest on an incomplete request is closed to make room (so a new
`/healthz` still gets in), or the new connection itself when every connection carries a complete request.
"""

from __future__ import annotations

import asyncio
import time

from uvicorn.protocols.http.h11_impl import H11Protocol

# Seconds a client has to send one whole request (the operator's and the probes' requests are a few hundred
# bytes, sent at once).
READ_TIMEOUT_S = 10.0
# Open connections at most (the operator and kubelet probes use a handful).
MAX_CONNECTIONS = 256


class BoundedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a request read deadline and a connection cap (see the module docstring).

    Attributes (class-level settings; `bounded_protocol` makes a subclass with other values):
      read_timeout_s: seconds from a request's first byte (a connection's opening) to its last.
      max_connections: open connections at most.
    """

    read_timeout_s: float = READ_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self._read_deadline: asyncio.TimerHandle | None = None
        self._reading_since: float | None = None
        self._cycle_at_arm = None
        super().connection_made(transport)
        self._arm()
        # (a connection closed here stays in `connections` until the loop reports it lost: not counted)
        open_now = [c for c in self.connections if not c.transport.is_closing()]
        if len(open_now) > self.max_connections:
            waiting = [c for c in open_now if c is not self and getattr(c, "_reading_since", None) is not None]
            victim = min(waiting, key=lambda c: c._reading_since) if waiting else self
            victim._disarm()
            victim.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._read_deadline is None:  # the first byte of the next request on a kept-alive connection
            self._arm()
        super().data_received(data)
        cycle = self.cycle
        if cycle is not None and cycle is not self._cycle_at_arm and not cycle.more_body:
            self._disarm()  # the whole request is in: the app may take as long as it answers

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def _arm(self) -> None:
        self._disarm()
        self._reading_since = time.monotonic()
        self._cycle_at_arm = self.cycle
        self._read_deadline = self.loop.call_later(self.read_timeout_s, self._read_timed_out)

    def _disarm(self) -> None:
        if self._read_deadline is not None:
            self._read_deadline.cancel()
        self._read_deadline = None
        self._reading_since = None

    def _read_timed_out(self) -> None:
        self._read_deadline = None
        self._reading_since = None
        self.transport.close()


def bounded_protocol(read_timeout_s: float = READ_TIMEOUT_S,
                     max_connections: int = MAX_CONNECTIONS) -> type[BoundedH11Protocol]:
    """A `BoundedH11Protocol` subclass with these settings, for `uvicorn.Config(http=...)`.

    Args:
      read_timeout_s: seconds a client has to send a whole request (> 0).
      max_connections: open connections at most (>= 1).

    Raises:
      ValueError: a setting out of range.
    """
    if not read_timeout_s > 0 or max_connections < 1:
        raise ValueError(f"read_timeout_s={read_timeout_s} must be > 0 and max_connections={max_connections} >= 1")
    return type("BoundedH11Protocol", (BoundedH11Protocol,),
                {"read_timeout_s": float(read_timeout_s), "max_connections": int(max_connections)})
