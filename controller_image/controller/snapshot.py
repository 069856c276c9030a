"""In-memory host snapshots of the training state (pathways backend).

On Pathways a lost slice takes the device copies of the state with it. A host
snapshot (a `jax.device_get` into the controller's RAM) lets the controller
restore from memory in well under a second instead of reading the last Orbax
checkpoint from gs://, whenever the snapshot is newer.

The copy runs on a background thread while it fits in a step, so the training
thread does not wait for it: a snapshot is then taken every step, and a loss of
the only slice costs no step (measured on a TPU v5e: docs/benchmarks.md). A
state whose copy outlasts a step (GiBs against a sub-second step) is copied
only every `every_steps` steps and waited for at once, as before copies moved
off the training thread: a copy in flight holds its state's device buffers,
and a slow one left running beside the training would keep an extra state in
device memory.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any, Callable

import jax

from elastic_jax.controller.elastic.errors import one_line_reason

_logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """One host copy of the state.

    Attributes:
      step: the step the state belongs to (steps completed).
      state: pytree of numpy arrays.
      data_state: the data position (JSON dict, as saved in checkpoints).
    """

    step: int
    state: Any
    data_state: dict


FAILING_AFTER = 3
"""Copies failed in a row after which `HostSnapshotter.failing` is set (one failure is expected: the copy in
flight when a slice is lost reads that slice)."""


class _Copy:
    """One copy to host memory on its own daemon thread (daemon: a copy hung on a lost slice must not hold
    the process at exit)."""

    def __init__(self, step: int, state: Any, data_state: dict, copy: Callable[[Any], Any],
                 clock: Callable[[], float]):
        self.step, self.started, self.seconds = step, clock(), None
        self.snapshot: Snapshot | None = None
        self.error: BaseException | None = None
        self._done = threading.Event()

        def run() -> None:
            try:
                self.snapshot = Snapshot(step, copy(state), data_state)
            except Exception as e:  # noqa: BLE001 - kept for the training thread to report
                self.error = e
            finally:
                self.seconds = clock() - self.started
                self._done.set()

        threading.Thread(target=run, name=f"host-snapshot-{step}", daemon=True).start()

    def done(self) -> bool:
        return self._done.is_set()

    def wait(self, timeout_s: float | None) -> bool:
        return self._done.wait(timeout_s)


class HostSnapshotter:
    """Keeps the newest host snapshot, copied off the training thread.

    Rule, at each step's `maybe_take` ("fits": the last copy took no longer than the time between the last
    two calls, about a step, or none has been measured yet):
    - a copy is due at every multiple of `every_steps`, so a loss never costs more than `every_steps - 1`
      steps. It starts then, after the copy still in flight (if any) lands; one that does not fit is
      waited for at once (the training waits, as for a synchronous `jax.device_get`).
    - between due steps (`fill_in`), while copies fit, a copy starts whenever the previous one has landed:
      every step when copying fits in a step.

    Args:
      every_steps: a copy at least every this many steps (0 disables snapshots).
      copy: device pytree -> host pytree; `jax.device_get` (a parameter for unit tests of the rule).
      clock: monotonic seconds; `time.monotonic`.
      fill_in: whether copies start between due steps; False: exactly every `every_steps` steps, for
        tests that need to know which step a snapshot holds.
      wait_s: the longest the training thread waits for one copy (seconds; None: no limit). A copy
        that does not land by then is dropped, with a warning: it may be reading a lost slice.

    Raises:
      ValueError: `every_steps` < 0.
    """

    def __init__(self, every_steps: int, copy: Callable[[Any], Any] = jax.device_get,
                 clock: Callable[[], float] = time.monotonic, fill_in: bool = True,
                 wait_s: float | None = None):
        if every_steps < 0:
            raise ValueError("every_steps must be >= 0")
        self.every_steps, self.fill_in, self.wait_s = every_steps, fill_in, wait_s
        self._copy, self._clock = copy, clock
        self._latest: Snapshot | None = None
        self._pending: _Copy | None = None
        self._last_call: float | None = None
        self._last_copy_s: float | None = None
        self._warned = False
        self._failed_in_a_row = 0
        self.failing: str | None = None
        """Set, to the last error's one-line reason, once `FAILING_AFTER` copies in a row failed (a state donated
        or deleted before its copy landed fails every copy): no snapshot lands, so a slice loss goes back to
        the last committed checkpoint. Cleared by a copy that lands."""
        self.slow_copy: tuple[float, float] | None = None
        """Set at the first copy that kept the training waiting for more than a tenth of the steps between
        two due copies: (the copy's seconds, the seconds between the last two steps)."""

    @property
    def latest(self) -> Snapshot | None:
        """The newest snapshot that has landed (a copy still in flight is not waited for: see `settle`)."""
        self._collect()
        return self._latest

    def maybe_take(self, step: int, state: Any, data_state: dict) -> bool:
        """Starts a copy of `state` (step `step`) when the rule above says so; returns whether it did.

        `state` (a pytree of `jax.Array`s) is read until its copy lands (about a step): the caller must not
        donate or delete it meanwhile. Blocks only on a due step: for a copy still in flight, or for this
        copy when copies do not fit in a step.

        Raises:
          ValueError: `step` is older than the newest snapshot's (landed or in flight).
        """
        now, interval = self._clock(), None
        if self._last_call is not None:
            interval = now - self._last_call
        try:
            return self._maybe_take(step, state, data_state, interval)
        finally:
            self._last_call = self._clock()  # (the next interval is the step's own: no wait of this call in it)

    def _maybe_take(self, step: int, state: Any, data_state: dict, interval: float | None) -> bool:
        if not self.every_steps:
            return False
        newest = max((x.step for x in (self._pending, self._latest) if x is not None), default=None)
        if newest is not None and step < newest:
            raise ValueError(f"take_host_snapshot(step={step}): older than the newest snapshot (step {newest})")
        self._collect()
        due = step % self.every_steps == 0
        fits = self._last_copy_s is None or interval is None or self._last_copy_s <= interval
        if not due and (self._pending is not None or not (self.fill_in and fits)):
            return False
        self.settle(self.wait_s)  # (due: the copy in flight first; one at a time)
        self._pending = _Copy(step, state, dict(data_state), self._copy, self._clock)
        if not fits:
            self.settle(self.wait_s)
            copy_s = self._last_copy_s or 0.0
            if self.slow_copy is None and interval and copy_s > 0.1 * self.every_steps * interval:
                self.slow_copy = (copy_s, interval)
        return True

    def settle_after_loss(self) -> Snapshot | None:
        """`settle` for a recovery: waits for the copy in flight up to 3 times the last copy's seconds (at
        least 1 s, at most `wait_s`), since after a loss it may be reading the lost slice and never land."""
        bound = max(1.0, 3 * (self._last_copy_s or 0.0))
        return self.settle(bound if self.wait_s is None else min(self.wait_s, bound))

    def forget_after(self, step: int) -> None:
        """Forgets snapshots (landed or in flight) of steps after `step`: the run went back to `step`."""
        if self._pending is not None and self._pending.step > step:
            self._pending = None
        if self._latest is not None and self._latest.step > step:
            self._latest = None

    def drop(self) -> None:
        """Forgets the copy in flight, if any (it reads a state the caller no longer restores from)."""
        self._pending = None

    def settle(self, timeout_s: float | None) -> Snapshot | None:
        """Waits up to `timeout_s` seconds (None: no limit) for the copy in flight; returns the newest snapshot.

        A copy that failed (its state's slice was lost, say) or did not land in time is dropped: the last
        landed snapshot stays the newest, with a warning naming why.
        """
        pending = self._pending
        if pending is not None and not pending.wait(timeout_s):
            self._pending = None
            _logger.warning("the host snapshot of step %d did not land within %.0f s; using the one before it",
                            pending.step, timeout_s or 0.0)
        self._collect()
        return self._latest

    def _collect(self) -> None:
        pending = self._pending
        if pending is None or not pending.done():
            return
        self._pending = None
        self._last_copy_s = pending.seconds
        if pending.snapshot is not None:
            self._latest = pending.snapshot
            self._failed_in_a_row, self.failing = 0, None
            return
        # (one failure is a lost slice's copy; several in a row are the caller's state itself)
        self._failed_in_a_row += 1
        if self._failed_in_a_row >= FAILING_AFTER:
            self.failing = one_line_reason(pending.error)
        # Once as a warning, then quietly: a state donated or deleted before its copy landed fails every copy.
        (_logger.debug if self._warned else _logger.warning)(
            "the host snapshot of step %d failed (%s); the newest snapshot stays step %s (a lost slice's "
            "state, or a state donated or deleted before its copy landed, fails so)", pending.step,
            one_line_reason(pending.error), None if self._latest is None else self._latest.step)
        self._warned = True


def choose_restore_source(snapshot_step: int | None, committed_step: int | None) -> str:
    """Where to restore lost state from: the newer of the host snapshot and the last committed checkpoint.

    Returns:
      "snapshot", "checkpoint", or "init" (neither exists: start over).
      A tie goes to the snapshot (memory is faster than storage).
    """
    if snapshot_step is None and committed_step is None:
        return "init"
    if committed_step is None or (snapshot_step is not None and snapshot_step >= committed_step):
        return "snapshot"
    return "checkpoint"
