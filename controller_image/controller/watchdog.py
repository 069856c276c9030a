"""No-progress watchdog: a controller that stopped making steps must not look healthy (issue 9 item 3).

`GET /healthz` answers 503 with `ProgressWatchdog.check`'s reason once no
training step completed for `spec.elasticity.progressTimeoutSeconds` while
the controller is supposed to be training. The controller pod's livenessProbe
then has the kubelet kill the container; with restartPolicy Never the pod
fails and the operator replaces it, counted (or fails the job once
`elasticity.maxRestarts` is spent), with the log's last line as the reason.

Which phases are watched:

- `Starting` (building the trainer, restoring a checkpoint, first compile
  before the loop): not watched; the clock starts when training does.
- `Running` and `Recovering`: watched. A step needs at most
  `firstStepDeadlineSeconds` (`stepDeadlineSeconds` after the first) before
  the backend turns a hang into a slice loss, so the default bound is well
  above both; a slice loss (an elastic event) restarts the clock, since a
  recovery may restore a checkpoint.
- `WaitingForSlices`: not watched (paused on purpose, bounded by
  `sliceWaitTimeoutSeconds`); the clock restarts when waiting ends.
- finished phases: not watched (the process is exiting).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

_logger = logging.getLogger(__name__)

WATCHED_PHASES = frozenset({"Running", "Recovering"})


class ProgressWatchdog:
    """Reports a controller that made no training step for too long while it should have.

    Args:
      timeout_s: seconds without a completed step before the controller is stalled; 0 disables.
      clock: monotonic seconds (tests pass a fake).
    """

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic):
        self.timeout_s = timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self._since = clock()
        self._step: int | None = None
        self._stall_logged = False

    def restart(self) -> None:
        """Restarts the clock (an elastic event: a recovery may restore a checkpoint first)."""
        with self._lock:
            self._since = self._clock()

    def check(self, phase: str, step: int) -> str | None:
        """None while healthy, else why the controller is stalled.

        Args:
          phase: the controller's phase as `/v1/status` reports it.
          step: the last completed step (any change, a restore included, is progress).
        """
        with self._lock:
            now = self._clock()
            if not self.timeout_s or phase not in WATCHED_PHASES or step != self._step:
                self._since, self._step = now, step
                return None
            idle_s = now - self._since
            if idle_s <= self.timeout_s:
                return None
            return (f"no training step completed for {idle_s:.0f} s in phase {phase} after step {step} "
                    f"(spec.elasticity.progressTimeoutSeconds={self.timeout_s:g}): the controller is stuck "
                    "(a blocking data read, a deadlock in user code?)")

    def stall_reason(self, phase: str, step: int) -> str | None:
        """`check`, and the first reason of a stall logged once as an `error:` line (event `stalled`).

        What `/healthz` calls through the loops' `stall_reason()` (the built-in
        trainer's and the library's): the kubelet probes every few seconds, so
        one stall is logged once; a step (or another healthy answer) re-arms it.
        """
        reason = self.check(phase, step)
        with self._lock:
            first, self._stall_logged = bool(reason) and not self._stall_logged, bool(reason)
        if first:
            _logger.error("error: %s", reason, extra={"event": "stalled", "step": step})
        return reason
