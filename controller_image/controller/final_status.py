"""Hands the controller's last status to whoever polls it before the process exits.

A controller stopped by a signal (a suspend deletes its pod) checkpoints the
last completed step and exits at once: the operator's 1 s poll would
often miss that final status, and the job's status kept the step of the
last poll before the stop (issue 11, "status truth"). So, when someone was
polling `GET /v1/status` lately, the control API stays up after the run
ended until that final status was served once, or a bound passes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

# A poller read the status this recently (seconds) when the run ended: it is expected to read again.
RECENT_READ_S = 5.0
# At most this long (seconds) the exit waits for that read (within the pod's grace period, 60 s).
FINAL_READ_WAIT_S = 10.0


class FinalStatusHandoff:
    """Records status reads; after the run ended, waits for one read of the final status.

    Args:
      clock: seconds, monotonic.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self._last_read: float | None = None
        self._ended = False
        self._final_read = threading.Event()

    def served(self) -> None:
        """Call after each `GET /v1/status` answer was built (from the control API's thread)."""
        with self._lock:
            self._last_read = self._clock()
            if self._ended:
                self._final_read.set()

    def ended(self) -> None:
        """Call once the run's final status is in place (phase, step, last committed checkpoint step)."""
        with self._lock:
            self._ended = True

    def wait(self, recent_s: float = RECENT_READ_S, timeout_s: float = FINAL_READ_WAIT_S) -> bool:
        """After `ended`: blocks until the final status was served, if a poller read within `recent_s`.

        Returns:
          True when the final status was served (or no one polls: nothing to wait for), False when
          `timeout_s` seconds passed without that read.
        """
        with self._lock:
            last = self._last_read
            recent = last is not None and self._clock() - last <= recent_s
        if not recent:
            return True
        return self._final_read.wait(timeout_s)
