"""The operator's clock, injected (`OperatorState.clock`) rather than read from `time` in each module.

Every wait, hold and throttle the operator keeps per job (the consistency wait, the status-refusal hold,
the Events read throttle, the quiet window, a controller's unresponsive spell) and every timestamp it writes
(conditions, slice transitions, a finished job's TTL) read the one clock of the `OperatorState`, handed to
each job's `JobState` and `JobTracker`. A test drives time with a `FakeClock` instead of sleeping or
patching `time` (the way JobSet's controllers take an injected `clock.Clock`).
"""

from __future__ import annotations

import datetime as dt
import time
from typing import Protocol


class Clock(Protocol):
    """What the operator reads of time."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (only differences mean anything: waits, ages, deadlines)."""
        ...

    def now(self) -> dt.datetime:
        """The wall-clock time, an aware datetime in UTC (what is written into status and compared with the
        API server's timestamps)."""
        ...


class SystemClock:
    """The process's clocks: `time.monotonic()` and the system's UTC time."""

    def monotonic(self) -> float:
        """`time.monotonic()`, in seconds."""
        return time.monotonic()

    def now(self) -> dt.datetime:
        """`datetime.now(UTC)`."""
        return dt.datetime.now(dt.timezone.utc)


SYSTEM = SystemClock()


class FakeClock:
    """A clock that moves only when told (`advance`), for tests.

    Args:
      monotonic: its first `monotonic()` reading, in seconds.
      now: its first wall-clock time (aware; naive is read as UTC).
    """

    def __init__(self, monotonic: float = 1000.0,
                 now: dt.datetime = dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc)):
        self._monotonic = monotonic
        self._now = now if now.tzinfo is not None else now.replace(tzinfo=dt.timezone.utc)

    def monotonic(self) -> float:
        """The current reading, in seconds."""
        return self._monotonic

    def now(self) -> dt.datetime:
        """The current wall-clock time (UTC)."""
        return self._now

    def advance(self, seconds: float) -> None:
        """Moves both clocks `seconds` forward.

        Raises:
          ValueError: `seconds` is negative (a monotonic clock never goes back).
        """
        if seconds < 0:
            raise ValueError(f"a clock moves forward only, not {seconds} s")
        self._monotonic += seconds
        self._now += dt.timedelta(seconds=seconds)


def rfc3339(when: dt.datetime) -> str:
    """`when` as Kubernetes writes times (UTC, second precision, Z suffix)."""
    return when.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
