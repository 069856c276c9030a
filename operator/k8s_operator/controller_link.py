"""One job's controller HTTP (status poll, slice reports) on a thread of its own, off kopf's handler threads.

A controller runs a tenant's program: it may never answer. When the 1 s timer
polled it and the pod-event handler reported to it on kopf's handler threads,
each such poll held a thread for its whole timeout, 16 such jobs slowed every
other job's failure handling to ~9 s, and a burst of 50 failures waited p95
56 s for a thread (issue 9, issue 12 item 4). Now the handlers only ask
(`request`, which never blocks); each job's `ControllerLink` thread does the
HTTP, so a job whose controller hangs delays no other job's reports. Requests
coalesce: a poll asked for while one runs is done once more after it, never
queued up. Reports go before the poll, so a Down waits at most for its own
job's poll in flight, never for another job's.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from typing import Callable

_logger = logging.getLogger(__name__)


class ControllerLink:
    """A daemon thread that runs one job's controller exchanges when asked.

    Created from a kopf handler (the timer's pass makes the job's tracker): the thread runs in a copy
    of that context, so `kopf.event` works from it.

    Args:
      name: the job (thread name, logs).
      report: sends the reports due (`JobTracker.notify`); called with the highest `retries` asked for.
      poll: one `GET /v1/status` (`JobTracker.poll_status`).
    """

    def __init__(self, name: str, report: Callable[[int], None], poll: Callable[[], object]):
        self._report, self._poll = report, poll
        self._wake = threading.Condition()
        self._report_retries: int | None = None
        self._poll_due = False
        self._closed = False
        # In a copy of the creator's context: kopf.event finds kopf's event queue through context
        # variables, which a plain thread does not have (the link posts ControllerNotified).
        context = contextvars.copy_context()
        self._thread = threading.Thread(target=context.run, args=(self._run,), name=f"controller-link {name}",
                                        daemon=True)
        self._thread.start()

    def request(self, report_retries: int | None = None, poll: bool = False) -> None:
        """Asks for the reports due (`report_retries`: retries per report; None: no reports) and/or a poll.

        Never blocks on HTTP: returns at once; the thread does the work.
        """
        with self._wake:
            if report_retries is not None:
                self._report_retries = max(report_retries, self._report_retries or 0)
            self._poll_due = self._poll_due or poll
            self._wake.notify()

    def close(self) -> None:
        """Stops the thread after its exchange in flight (bounded by the client's timeout); does not wait."""
        with self._wake:
            self._closed = True
            self._wake.notify()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not (self._closed or self._poll_due or self._report_retries is not None):
                    self._wake.wait()
                if self._closed:
                    return
                retries, self._report_retries = self._report_retries, None
                poll, self._poll_due = self._poll_due, False
            for due, work, arg in ((retries is not None, self._report, (retries,)), (poll, self._poll, ())):
                if not due:
                    continue
                try:
                    work(*arg)
                except Exception:  # noqa: BLE001 - a bug must not end the job's link: logged, the next ask retries
                    _logger.exception("controller exchange failed")
