"""A `Clock` (`elastic_jax.k8s_operator.clock`) that moves only when a test says so."""

from __future__ import annotations

import datetime as dt


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
