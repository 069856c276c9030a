"""One job's controller HTTP (slice reports, the status watch) on threads of its own, off kopf's handler threads.

A controller runs a tenant's program: it may never answer. When the 1 s timer
polled it and the pod-event handler reported to it on kopf's handler threads,
each such poll held a thread for its whole timeout, 16 such jobs slowed every
other job's failure handling to ~9 s, and a burst of 50 failures waited p95
56 s for a thread (issue 9, issue 12 item 4). Now the handlers only ask
(`request`, which never blocks); each job's `ControllerLink` threads do the
HTTP, so a job whose controller hangs delays no other job's reports. Reports
coalesce: reports asked for while some are sent are sent once more after, never
queued up.

Status is watched, not polled per timer pass: the watch thread holds one long
poll (`GET /v1/status?after=<version>&wait=WATCH_WAIT_S`) at a time and hands
each answer to `poll`'s caller (`JobTracker.poll_status` keeps it for the timer),
so a healthy job whose controller has nothing new costs one request per
WATCH_WAIT_S, not one a second. Answers are at least MIN_POLL_INTERVAL_S apart
(a training controller's step moves all the time; a controller without versions
answers at once: both cost what the 1 s poll did). A report never waits for the
watch: they run on two threads.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from elastic_jax.api.control import ControllerStatus

_logger = logging.getLogger(__name__)

# Seconds a status long poll may wait for a change (the controller holds it at most control.MAX_STATUS_WAIT_S).
WATCH_WAIT_S = 25.0
# Seconds at least between two status answers (and after a failed exchange, before the next).
MIN_POLL_INTERVAL_S = 1.0


class ControllerLink:
    """Two daemon threads: one sends one job's slice reports when asked, one watches its controller's status.

    Created from a kopf handler (the timer's pass makes the job's tracker): the threads run in copies
    of that context, so `kopf.event` works from them.

    Args:
      name: the job (thread names, logs).
      report: sends the reports due (`JobTracker.notify`); called with the highest `retries` asked for.
      poll: one `GET /v1/status` (`JobTracker.poll_status`), called as `poll(after, wait_s)` with the
        last answer's version (None: none, or a controller without versions) and the seconds it may
        wait; returns the answer, or None (failed, or no controller to ask).
      wait_s, min_interval_s: WATCH_WAIT_S and MIN_POLL_INTERVAL_S (tests pass smaller ones).
    """

    def __init__(self, name: str, report: Callable[[int], None],
                 poll: Callable[[int | None, float], "ControllerStatus | None"],
                 wait_s: float = WATCH_WAIT_S, min_interval_s: float = MIN_POLL_INTERVAL_S):
        self._report, self._poll = report, poll
        self._wait_s, self._min_interval_s = wait_s, min_interval_s
        self._wake = threading.Condition()
        self._report_retries: int | None = None
        self._poll_due = False
        self._closed = False
        self._start(f"controller-link {name}", self._run_reports)
        self._start(f"controller-watch {name}", self._run_watch)

    @staticmethod
    def _start(name: str, target: Callable[[], None]) -> None:
        # In a copy of the creator's context: kopf.event finds kopf's event queue through context
        # variables, which a plain thread does not have (the link posts ControllerNotified).
        context = contextvars.copy_context()
        threading.Thread(target=context.run, args=(target,), name=name, daemon=True).start()

    def request(self, report_retries: int | None = None, poll: bool = False) -> None:
        """Asks for the reports due (`report_retries`: retries per report; None: no reports) and/or a poll now.

        `poll`: the controller changed (a new client): the watch asks it without waiting out its pause,
        and without the last controller's version. Never blocks on HTTP: returns at once.
        """
        with self._wake:
            if report_retries is not None:
                self._report_retries = max(report_retries, self._report_retries or 0)
            self._poll_due = self._poll_due or poll
            self._wake.notify_all()

    def close(self) -> None:
        """Stops the threads after their exchange in flight (bounded by the client's timeout); does not wait."""
        with self._wake:
            self._closed = True
            self._wake.notify_all()

    def _run_reports(self) -> None:
        while True:
            with self._wake:
                self._wake.wait_for(lambda: self._closed or self._report_retries is not None)
                if self._closed:
                    return
                retries, self._report_retries = self._report_retries, None
            self._guarded(self._report, retries)

    def _run_watch(self) -> None:
        version: int | None = None
        while True:
            with self._wake:
                if self._closed:
                    return
                if self._poll_due:
                    self._poll_due, version = False, None
            status = self._guarded(self._poll, version, self._wait_s)
            version = (status.version or None) if status is not None else None
            with self._wake:  # the pause: woken early by a new controller (`request(poll=True)`) or close
                self._wake.wait_for(lambda: self._closed or self._poll_due, self._min_interval_s)

    @staticmethod
    def _guarded(work: Callable, *args):
        try:
            return work(*args)
        except Exception:  # noqa: BLE001 - a bug must not end the job's link: logged, the next ask retries
            _logger.exception("controller exchange failed")
            return None
