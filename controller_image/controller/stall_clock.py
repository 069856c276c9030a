"""How long this process was not running: a ticking thread's late ticks.

A controller that is SIGSTOPped, frozen with its cgroup or VM, or starved of
CPU sees every deadline it set before the stall expire at once when it runs
again (`time.monotonic` advances while the process does not). A step deadline
that expired that way says nothing about the workers, which answered while the
controller could not read them; blaming them replaced healthy slices and
spent their restart budgets (new-user trial: SIGSTOP of the controller for
50 s with `stepDeadlineSeconds: 20`). `StallClock` measures those gaps so the
backend can tell the two apart.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

TICK_S = 0.2
"""Seconds between ticks."""
GAP_S = 1.0
"""A tick later than this after the one before is a stall (the whole gap counts)."""


class StallClock:
    """Records the intervals in which this process's ticking thread did not run.

    Args:
      tick_s: seconds between ticks.
      gap_s: a gap between ticks longer than this is a stall.
      keep: stalls remembered (the oldest are dropped).
      clock: monotonic seconds (tests pass their own).
    """

    def __init__(self, tick_s: float = TICK_S, gap_s: float = GAP_S, keep: int = 256,
                 clock: Callable[[], float] = time.monotonic):
        self._tick_s = tick_s
        self._gap_s = gap_s
        self._clock = clock
        self._stalls: collections.deque[tuple[float, float]] = collections.deque(maxlen=keep)
        self._last = clock()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> StallClock:
        """Starts the ticking thread (a daemon); returns self."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="stall-clock", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """Stops the ticking thread."""
        self._stop.set()

    def tick(self) -> None:
        """One tick: a gap longer than `gap_s` since the last one is recorded as a stall."""
        now = self._clock()
        with self._lock:
            if now - self._last > self._gap_s:
                self._stalls.append((self._last, now))
            self._last = now

    def _run(self) -> None:
        while not self._stop.wait(self._tick_s):
            self.tick()

    def stalled_seconds(self, since: float, now: float | None = None) -> float:
        """Seconds of [since, now] (monotonic) in which the process did not run, including a stall not yet
        ended by a tick (the check may run before the ticking thread after a SIGCONT)."""
        now = self._clock() if now is None else now
        with self._lock:
            stalls = list(self._stalls)
            if now - self._last > self._gap_s:
                stalls.append((self._last, now))
        return sum(max(0.0, min(end, now) - max(start, since)) for start, end in stalls)
