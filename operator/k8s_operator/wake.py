"""When a job's reconcile pass runs: its `Waker` (set by whatever may have changed) and the pass schedule.

Each job's reconcile daemon (`handlers.reconcile_job`) sleeps until one of these wakes it:
the job object changed (spec, status, annotations, deletion: kopf's watch), one of its pods or
JobSets changed (the watches behind the indexes), the set of not-Ready nodes changed, its
controller link brought news (a status answer that differs from the last, or a failed exchange:
`JobTracker.on_news`), or a timeout: PASS_INTERVAL_S while the job is not quiet, the rest of its
quiet window while it is (`tracker.resync_window_s`: 30 s, doubled by each resync pass that finds
nothing moved, up to 4 min). A 1 s timer per job woke kopf's timer machinery 60 times a
minute per healthy job (~0.055 s of CPU per job per minute at 50 jobs, issue 12 item 4); a sleeping
daemon costs nothing until something happens.

A wake is a hint, never a command: the woken pass still skips itself when nothing it reads moved
(`JobTracker.quiet`), so a spurious wake costs one comparison on the event loop.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Awaitable

# The kopf ids of the handlers that only wake jobs (`handlers.job_event` ...): one call per watch event, so the
# operator drops their "succeeded" log lines (`logs.TimerSuccessFilter`).
WAKE_HANDLERS = ("job_event", "job_pod_event", "job_jobset_event", "node_event")

# Seconds between two passes of a job that is not quiet (what the per-job timer's interval was): the
# pass retries what it could not finish (a create, a read of Events, a body not back from the watch).
PASS_INTERVAL_S = 1.0
# Seconds at least from the end of one pass to the start of the next, however often the job is woken:
# a burst of pod events (a job's start, a slice replaced) costs a few passes, not one per event.
MIN_PASS_GAP_S = 0.2


class Waker:
    """One job's wake-up signal: `wake` from any thread, `wait` on the event loop (one waiter).

    Wakes coalesce: any number of `wake` calls before a `wait` make that `wait` return once.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._woken = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event: asyncio.Event | None = None

    def wake(self) -> None:
        """Asks for a pass soon. Thread-safe, never blocks; a no-op while a wake is already pending."""
        with self._lock:
            if self._woken:
                return
            self._woken = True
            loop, event = self._loop, self._event
        if loop is not None and event is not None:
            try:
                loop.call_soon_threadsafe(event.set)
            except RuntimeError:  # the loop is closed (the operator is exiting): nobody waits any more
                pass

    async def wait(self, timeout_s: float, stop: Awaitable | None = None) -> bool:
        """Waits for a `wake` (one already pending returns at once), at most `timeout_s` seconds, or until
        `stop` completes (kopf's `stopped.wait()`).

        Args:
          timeout_s: seconds (<= 0: only a pending wake counts).
          stop: an awaitable that completes when the waiter must stop waiting (None: none).

        Returns:
          True when woken (the wake is consumed), False on the timeout or the stop.
        """
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._event is None or self._loop is not loop:
                self._event = asyncio.Event()  # (an asyncio.Event serves one loop)
            self._loop = loop
            if self._woken:
                self._woken = False
                return True
            self._event.clear()
            event = self._event
        if timeout_s > 0:
            waits = [asyncio.ensure_future(event.wait())]
            if stop is not None:
                waits.append(asyncio.ensure_future(stop))
            try:
                await asyncio.wait(waits, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in waits:
                    task.cancel()
        elif stop is not None and asyncio.iscoroutine(stop):
            stop.close()  # (never awaited: no "coroutine was never awaited" warning)
        with self._lock:
            woken, self._woken = self._woken, False
            return woken


def next_pass_delay(now: float, last_pass_end: float | None, quiet_until: float | None) -> float:
    """Seconds the job's daemon sleeps (unless woken) before its next pass; all times are the operator's monotonic
    clock's (`OperatorState.clock`), in seconds.

    Args:
      now: the current time.
      last_pass_end: when the last pass (full or skipped) ended; None: no pass yet.
      quiet_until: when the last quiet pass's skip window ends (`JobTracker.quiet_until`); None: the
        last pass was not quiet (or there is no tracker yet).

    Returns:
      PASS_INTERVAL_S from the last pass for a job that is not quiet; the time left of its quiet window
      for a quiet one; never below 0.
    """
    if quiet_until is not None:
        return max(0.0, quiet_until - now)
    if last_pass_end is None:
        return 0.0
    return max(0.0, last_pass_end + PASS_INTERVAL_S - now)


def woken_pass_delay(now: float, last_pass_end: float | None) -> float:
    """Seconds a woken daemon still waits before its pass: what is left of MIN_PASS_GAP_S since the last."""
    if last_pass_end is None:
        return 0.0
    return max(0.0, last_pass_end + MIN_PASS_GAP_S - now)
