"""What one controller's run records, for both loops: the built-in trainer's and the library's.

`TrainingRun` (controller/loop.py) and `elastic_jax.Runtime` (library mode,
the user's own loop) keep the same books through one `RunRecord`: the
elastic events with their recovery time (`status.recoveryHistory`, the
summary's `recoveries` and `recovery_seconds`), the goodput ledger and its
categories, the steps this process ran; and they end with the same
`RunSummary`, written where the launcher reads it (`write_summary`).
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from pathlib import Path
from typing import Any

from elastic_jax.api.control import RecoveryRecord
from elastic_jax.controller.goodput import GoodputLedger
from elastic_jax.controller.run_history import RunHistory
from elastic_jax.exit_codes import ControllerExit


@dataclasses.dataclass
class RunSummary:
    """What a finished (or failed) run reports; `SUMMARY` JSON is built from it."""

    succeeded: bool
    steps: int
    total_steps: int
    initial_loss: float | None
    final_loss: float | None
    recoveries: list[dict[str, Any]]
    steps_lost: int | None
    """Steps redone or lost to recoveries; None when not measured (library mode: the user's loop owns its state)."""
    goodput: float | None
    goodput_seconds: dict[str, float]
    """Wall seconds of this controller per `goodput.CATEGORIES` category."""
    restored_from_step: int | None
    last_committed_checkpoint_step: int | None
    failure_reason: str | None
    wall_seconds: float
    pid: int
    stop: str | None = None
    """None, "requested" (a stop request: Ctrl-C, suspend) or "signal" (the process was signalled: a controller loss)."""
    exit_code: int = ControllerExit.FAILED
    """The `ControllerExit` the process ends with."""
    resumed_from: dict[str, Any] | None = None
    """`{"step", "fallbackReason", "writer"}` when the run resumed from a checkpoint (fallbackReason: why newer
    steps were skipped; writer: `{"namespace", "name", "uid"}` of the job that wrote the step, None when unknown)."""


def write_summary(path: str | Path, summary: RunSummary) -> str:
    """Writes `summary` as one JSON object to `path` (the launcher's `summary.json`); returns the JSON.

    Raises:
      OSError: the file cannot be written.
    """
    from elastic_jax.local.processes import write_private_file

    payload = json.dumps(summary.__dict__)
    write_private_file(Path(path), payload)  # (0600, atomic: a link planted at `path` is replaced, not followed)
    return payload


class RunRecord:
    """Elastic events, recovery times, goodput and steps run of one controller process (thread-safe).

    Args:
      metrics: the `ControllerMetrics` (recoveries by cause, recovery seconds; the ledger is bound for goodput).
      started_at: `time.monotonic()` when the process started (the ledger's "starting"); None: now.
      run_history: where the steps and elastic events are appended for the timeline picture (`RunHistory`);
        None: nowhere.
    """

    def __init__(self, metrics: Any, started_at: float | None = None, run_history: RunHistory | None = None):
        self.metrics = metrics
        self.run_history = RunHistory(None) if run_history is None else run_history
        self.ledger = GoodputLedger(start=started_at)
        metrics.bind_ledger(self.ledger)
        self._lock = threading.Lock()
        self._history: list[RecoveryRecord] = []
        # The recoveries no step has completed since: (record, since monotonic s); the next step ends them all.
        self._open: list[tuple[RecoveryRecord, float]] = []
        self._paused_since: float | None = None  # monotonic s, while the manager waits for slices
        self.steps_run = 0  # steps completed by this process (not restored ones)

    @property
    def recovering(self) -> bool:
        """An elastic event happened and no step completed since."""
        with self._lock:
            return bool(self._open)

    def category(self, active: int, desired: int) -> str:
        """The ledger category of a step on `active` of `desired` slices (the step ending a recovery is part of it).

        Until this process completed a step it is `starting`, whatever failed before: the first step
        compiles the step program, and a first step that failed and was retried made no progress to book
        (it booked `productive` seconds before any step completed, then `recovering` for a recovery that
        had nothing to recover).
        """
        if self.steps_run == 0:
            return "starting"
        return "recovering" if self.recovering else "productive" if active >= desired else "reduced"

    def on_wait(self, blocked: bool, up: int, at_step: int = 0, desired: int = 0) -> None:
        """The manager blocks for lack of slices (True) or stopped blocking (False); before the first step it is
        start-up. `up`: the healthy slices it found (blocking) or the fewest it saw while blocked (ending);
        `at_step`, `desired`: the step the run paused at and the job's slice count, for the history line.

        The open recoveries get the pause: `fewest_slices` and `paused_seconds` (a pause of several waits adds up).
        """
        now = time.monotonic()
        if blocked and self.steps_run > 0:
            self.ledger.switch("waiting")
        elif not blocked and self.ledger.current == "waiting":
            self.ledger.switch("recovering")
        if self.steps_run == 0:
            return
        with self._lock:
            since, self._paused_since = self._paused_since, (now if blocked else None)
            for record, _ in self._open:
                record.fewest_slices = up if record.fewest_slices is None else min(record.fewest_slices, up)
                if not blocked and since is not None:
                    record.paused_seconds = (record.paused_seconds or 0.0) + (now - since)
        self.run_history.wait(blocked, up, at_step, desired)

    def elastic_event(self, cause: str, slices: list[int], at_step: int, since: float | None = None) -> RecoveryRecord:
        """Records a slice loss, deadline, drain or scale-up at `at_step`; its recovery runs from `since` (monotonic s,
        default now) to the next `step_completed`."""
        since = time.monotonic() if since is None else since
        record = RecoveryRecord(cause=cause, slices=slices, at_step=at_step)
        if self.steps_run > 0:  # before any step, all of it is start-up
            self.ledger.switch("recovering", at=since)
        with self._lock:
            self._history.append(record)
            self._open.append((record, since))
        self.metrics.recoveries.labels(cause=cause).inc()
        self.run_history.event(cause, slices, at_step)
        return record

    def elastic_event_of(self, error: Exception, slice_set: Any, at_step: int) -> RecoveryRecord:
        """Records the elastic event `error` stands for: a `ScaleUpSignalError` (cause `scale_up`, the Ready
        inactive slices of `slice_set`) or a slice-down error (its `cause`, default `slice_down`, and
        `slice_indices`). A hang's recovery counts from when the stuck step was sent (`failed_since`).
        """
        from elastic_jax.controller.elastic.errors import ScaleUpSignalError

        if isinstance(error, ScaleUpSignalError):
            cause, slices = "scale_up", sorted(slice_set.available_inactive())
        else:
            cause, slices = getattr(error, "cause", "slice_down"), list(getattr(error, "slice_indices", ()))
        return self.elastic_event(cause, slices, at_step, getattr(error, "failed_since", None))

    def slices_lost(self, slices: frozenset[int] | list[int], at_step: int) -> None:
        """Slices of the last attempt found down while a recovery waits for slices (the manager's
        `on_slices_lost`): the error that ended the attempt named only the first one lost.

        A slice not in an open recovery joins the open slice-loss recovery's `slices` (one recovery handles both:
        its record, its seconds, the history's event with `"joins": true`); with none open (a scale-up's or a
        hang's recovery), it is a `slice_down` record of its own at `at_step`.
        """
        with self._lock:
            named = {i for record, _ in self._open for i in record.slices}
            new = sorted(set(slices) - named)
            joined = next((record for record, _ in reversed(self._open) if record.cause == "slice_down"), None)
            if joined is not None and new:
                joined.slices = sorted(set(joined.slices) | set(new))
        if not new:
            return
        if joined is None:
            self.elastic_event("slice_down", new, at_step)
            return
        self.run_history.event(joined.cause, new, joined.at_step, joins=True)

    def live_phase(self, phase: str, waiting: bool) -> str:
        """The phase `/v1/status` shows: `Running` reads `WaitingForSlices` while the manager `waiting` for
        slices, `Recovering` between an elastic event and the next step; any other `phase` as is."""
        if phase == "Running" and waiting:
            return "WaitingForSlices"
        if phase == "Running" and self.recovering:
            return "Recovering"
        return phase

    def step_completed(self, now: float | None = None) -> None:
        """A training step completed at `now` (monotonic s): it ends a pending recovery."""
        now = time.monotonic() if now is None else now
        with self._lock:
            self.steps_run += 1
            ended, self._open = self._open, []
            for record, since in ended:
                record.seconds = now - since
        for record, _ in ended:
            self.metrics.recovery_seconds.observe(record.seconds)

    def history(self) -> list[RecoveryRecord]:
        """The elastic events so far, oldest first."""
        with self._lock:
            return list(self._history)

    def counts(self) -> dict[str, int]:
        """Elastic events by cause (`status.recoveries`)."""
        counts: dict[str, int] = {}
        for r in self.history():
            counts[r.cause] = counts.get(r.cause, 0) + 1
        return counts

    def losses(self, initial: float | None, final: float | None) -> tuple[float | None, float | None]:
        """The summary's `(initial_loss, final_loss)`: `(initial, final)`, or `(None, None)` when this process
        completed no step. A run that trained nothing measured no loss; the losses a restore brought back
        belong to the run that made them (a finished job run again printed them as its own)."""
        return (initial, final) if self.steps_run > 0 else (None, None)

    def goodput(self) -> float | None:
        """The ledger's ratio in [0, 1]; None before this process completed a step (not applicable, rather than 0)."""
        return None if self.steps_run == 0 else self.ledger.goodput()
