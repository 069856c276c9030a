"""The status version and the long poll behind `GET /v1/status?after=<version>&wait=<seconds>`.

A supervisor (the operator, one per job) used to poll every controller's status
every second, so its CPU grew with the number of healthy jobs that had nothing
new to say (issue 12 item 4). Now each status carries a `version` that moves up
when its content changes; a caller passes the version it has and a bounded wait,
and the answer comes at once when the version differs (moved, or another process:
a restarted controller starts at a new clock reading), else when it moves, else
when the wait ends. One implementation for every control API (the training
controller, serve-only, library mode): `create_app` owns the feed.

What moves the version: any field but `version` and the goodput ledger's ratio
and seconds (they tick with the clock, so they alone would move it always; the
answer at the end of a wait carries them fresh). Change is seen by building the
status again every `TICK_S` while a caller waits (the status callables read
in-memory state, no I/O), and at once after a slice report or a stop (`poke`).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable

from elastic_jax.api.control import MAX_STATUS_WAIT_S, ControllerStatus

# Seconds between two builds of the status while a caller waits for it to change.
TICK_S = 0.5
# Long polls held at once; more answer at once (a stuck caller that keeps opening them holds no more).
MAX_WAITERS = 8
# Fields whose change alone does not move the version (clock-driven).
_UNVERSIONED = frozenset({"version", "goodput", "goodput_seconds"})


class StatusFeed:
    """Versions a controller's status and answers long polls of it.

    Args:
      status: builds the current status (the control API's `status` callable; called per build).
      clock_ns: the version's first value (default `time.time_ns`, so a restarted controller's versions
        start above the previous process's: the caller's `after` then differs and is answered at once).
    """

    def __init__(self, status: Callable[[], ControllerStatus], clock_ns: Callable[[], int] = time.time_ns):
        self._status = status
        self._lock = threading.Lock()
        self._version = clock_ns()
        self._key: str | None = None
        self._waiters = 0
        self._poked: asyncio.Event | None = None

    def current(self) -> ControllerStatus:
        """Builds the status now and returns it with its version (moved if the content changed since the last build)."""
        snapshot = self._status()
        key = snapshot.model_dump_json(exclude=set(_UNVERSIONED))
        with self._lock:
            if key != self._key:
                self._key = key
                self._version += 1
            version = self._version
        return snapshot.model_copy(update={"version": version})

    def poke(self) -> None:
        """Something changed (a slice report, a stop): waiting callers build the status now. Call on the event loop."""
        if self._poked is not None:
            self._poked.set()

    async def answer(self, after: int | None, wait_s: float, build: Callable[[], Awaitable[ControllerStatus]],
                     disconnected: Callable[[], Awaitable[bool]]) -> ControllerStatus:
        """The status for `GET /v1/status`: at once, or when its version is no longer `after`, or when `wait_s` ends.

        Args:
          after: the version the caller has (None: answer at once).
          wait_s: seconds to wait at most, in [0, MAX_STATUS_WAIT_S] (validated by the route).
          build: `current` run off the event loop (the route's threadpool).
          disconnected: True once the caller went away (the wait ends, nothing is sent).

        Returns:
          The status with its version.
        """
        status = await build()
        if after is None or wait_s <= 0 or status.version != after:
            return status
        with self._lock:
            if self._waiters >= MAX_WAITERS:
                return status
            self._waiters += 1
        try:
            if self._poked is None:
                self._poked = asyncio.Event()
            deadline = time.monotonic() + min(wait_s, MAX_STATUS_WAIT_S)
            while True:
                left = deadline - time.monotonic()
                if left <= 0:
                    return await build()
                poked = self._poked
                try:
                    await asyncio.wait_for(poked.wait(), timeout=min(TICK_S, left))
                except asyncio.TimeoutError:
                    pass
                if poked.is_set():
                    self._poked = asyncio.Event()  # (every waiter woke on the old one)
                if await disconnected():
                    return status
                status = await build()
                if status.version != after:
                    return status
        finally:
            with self._lock:
                self._waiters -= 1
