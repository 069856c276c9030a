"""The operator's clock, injected (`OperatorState.clock`) rather than read from `time` in each module.

Every wait, hold and throttle the operator keeps per job (the consistency wait, the status-refusal hold,
the Events read throttle, the quiet window, a controller's unresponsive spell) and every timestamp it writes
(conditions, slice transitions, a finished job's TTL) read the one clock of the `OperatorState`, handed to
each job's `JobState` and `JobTracker`. A test drives time with a fake clock (`tests/support/fake_clock.py`) instead of sleeping or
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


def rfc3339(when: dt.datetime) -> str:
    """`when` as Kubernetes writes times (UTC, second precision, Z suffix)."""
    return when.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
