"""The goodput ledger: where a controller's wall seconds went.

Exactly one category is current at any moment, so the categories' seconds
add up to the ledger's wall time (from the controller process's start, or
what a previous controller of the job carried over, to now or to `stop`).

Categories (`CATEGORIES`):
  starting       process start to the first completed training step: JAX
                 start-up, waiting for the job's first slices, the first
                 compile, and a first step that failed and was retried.
  restoring      reading a checkpoint or host snapshot back.
  productive     training steps (and the loop around them) on every desired
                 slice.
  reduced        training steps on fewer slices than `spec.slices.count`
                 (replica resize).
  recovering     from a failure (the failed step's dispatch, or for a hang
                 that step's dispatch, so the deadline counts) to the end of
                 the next completed step (as `RecoveryRecord.seconds`
                 counts it: on a replaced slice that step includes the first
                 compile), except time paused; also the seconds of steps
                 that were done but lost (re-done after a restore).
  waiting        paused: blocked for lack of slices after training began.
  checkpointing  the training thread blocked on a checkpoint save.
  stalled        the training thread stuck in the controller's own code
                 (outside the slices' step: a blocking data read, a
                 deadlock in user code) for longer than a step may take
                 (`spec.elasticity.stepDeadlineSeconds`; before the first
                 step `firstStepDeadlineSeconds`), from when it left the
                 slices or the step began: never productive.

Goodput (`goodput`) = (productive + reduced x active/desired) / wall: a
step at reduced capacity processes the whole global batch on fewer slices,
which on accelerators takes about desired/active times as long, so only
that share of its seconds is what a full-size step would have cost. (On the
cpu backend the slices share one machine and a smaller mesh is not slower;
the weighting is the accelerator definition, kept the same everywhere.)
This is the usual "ML goodput" (e.g. Google Cloud's ml-goodput-measurement:
productive training time / elapsed time), with reduced capacity weighted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping

CATEGORIES = ("starting", "restoring", "productive", "reduced", "recovering", "waiting", "checkpointing", "stalled")


class GoodputLedger:
    """Wall seconds per category (thread-safe).

    Args:
      clock: seconds, monotonic (`time.monotonic`).
      carried: seconds per category from earlier controllers of the same job,
        added to this one's (a new controller continues the job's ledger).
      carried_equivalent: their seconds at reduced capacity x active/desired slices
        (`status.goodput.reducedEquivalentSeconds`).
      start: clock time booking starts ("starting"); None: now.

    Raises:
      ValueError: an unknown category in `carried`.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic, carried: Mapping[str, float] | None = None,
                 carried_equivalent: float = 0.0, start: float | None = None):
        self._clock = clock
        self._lock = threading.Lock()
        self._closed = {c: 0.0 for c in CATEGORIES}
        self._equivalent = float(carried_equivalent)  # reduced seconds x active/desired, closed intervals only
        for category, seconds in (carried or {}).items():
            self._check(category)
            self._closed[category] += float(seconds)
        self._current: str | None = "starting"
        self._capacity = 1.0
        self._since = clock() if start is None else start

    @property
    def current(self) -> str | None:
        """The category time now goes to (None once stopped)."""
        with self._lock:
            return self._current

    def switch(self, category: str, *, at: float | None = None, capacity: float = 1.0) -> None:
        """From `at` (default now), time goes to `category`.

        Args:
          category: one of `CATEGORIES`.
          at: clock time the switch took effect; earlier than the current
            interval's start is clamped to it (an interval never goes negative).
          capacity: for `reduced`, active/desired slices in (0, 1].

        Raises:
          ValueError: unknown category, or capacity outside (0, 1].
        """
        self._check(category)
        if not 0.0 < capacity <= 1.0:
            raise ValueError(f"capacity must be in (0, 1], got {capacity}")
        with self._lock:
            if self._current == category and self._capacity == capacity:
                return
            now = self._clock() if at is None else at
            self._close(now)
            self._current, self._capacity = category, capacity

    def move(self, seconds: float, src: str, dst: str) -> float:
        """Re-books up to `seconds` of closed time from `src` to `dst` (steps done, then lost).

        Returns:
          The seconds actually moved (no more than `src` holds).
        """
        self._check(src)
        self._check(dst)
        with self._lock:
            moved = max(0.0, min(seconds, self._closed[src]))
            self._closed[src] -= moved
            self._closed[dst] += moved
            return moved

    def stop(self) -> None:
        """Closes the current interval; later time is not booked."""
        with self._lock:
            self._close(self._clock())
            self._current = None

    def seconds(self) -> dict[str, float]:
        """Seconds per category, the open interval included."""
        with self._lock:
            out = dict(self._closed)
            if self._current is not None:
                out[self._current] += max(0.0, self._clock() - self._since)
            return out

    def goodput(self) -> float | None:
        """(productive + reduced x active/desired) / wall, in [0, 1]; None before any time was booked."""
        with self._lock:
            closed = dict(self._closed)
            equivalent = self._equivalent
            if self._current is not None:
                open_s = max(0.0, self._clock() - self._since)
                closed[self._current] += open_s
                if self._current == "reduced":
                    equivalent += open_s * self._capacity
        wall = sum(closed.values())
        if wall <= 0:
            return None
        return min(1.0, (closed["productive"] + equivalent) / wall)

    def _close(self, now: float) -> None:
        if self._current is None:
            self._since = now
            return
        elapsed = max(0.0, now - self._since)
        self._closed[self._current] += elapsed
        if self._current == "reduced":
            self._equivalent += elapsed * self._capacity
        self._since = max(self._since, now)

    @staticmethod
    def _check(category: str) -> None:
        if category not in CATEGORIES:
            raise ValueError(f"unknown goodput category {category!r}; one of {', '.join(CATEGORIES)}")
