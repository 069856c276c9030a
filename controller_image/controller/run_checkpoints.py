"""The checkpoints of one run, for both loops: the built-in trainer's and the library's.

`TrainingRun` (controller/loop.py) and `elastic_jax.Runtime` (library mode,
the user's own loop) checkpoint through one `RunCheckpoints` over the job's
`Checkpointer` (controller/checkpointing.py, Orbax): the restore that checks
each step's writer (`spec.checkpoint.resumeFrom`) and falls back to older
committed steps when newer ones do not restore (`resumed_from`), the save
schedule (`spec.checkpoint.intervalSteps`) with its time booked as
`checkpointing` in the goodput ledger, the final save, and the newest
committed step for status and the summary.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from elastic_jax.api.checkpoints import (CheckpointForeignError, CheckpointMismatchError, CheckpointUnreadableError,
                                         beyond_steps_problem, short_reason, writer_problem)
from elastic_jax.api.identity import JobIdentity
from elastic_jax.controller.checkpointing import Checkpointer, CheckpointUnfitError
from elastic_jax.controller.elastic.errors import one_line_reason
from elastic_jax.controller.numerics import all_finite

_logger = logging.getLogger(__name__)

# The most steps a fallback reason or a "no step restores" error names (maxToKeep can keep many).
_MAX_STEPS_NAMED = 5


def _does_not_fit(error: BaseException) -> bool:
    """True when `error` says the step's state does not fit the restore target (a shape or tree structure
    mismatch: a changed model, another job's state); False for a step that could not be read (a truncated or
    missing file, unreadable metadata, NaN/inf)."""
    if isinstance(error, CheckpointUnfitError):
        return True
    text = str(error).lower()
    return isinstance(error, (ValueError, KeyError, TypeError)) and "tree" in text and "structure" in text


def _named(reasons: list[str]) -> str:
    shown = reasons[:_MAX_STEPS_NAMED]
    more = len(reasons) - len(shown)
    return "; ".join(shown) + (f"; and {more} more" if more else "")


def _fallback_reason(reasons: list[str]) -> str:
    """`resumedFrom.fallbackReason`: the newer steps skipped and a short reason each, e.g.
    `newer committed steps could not be restored: step 218: ValueError: OUT_OF_RANGE: ...`."""
    return "newer committed steps could not be restored: " + _named(reasons)


def no_step_restores_message(uri: str, reasons: list[str]) -> str:
    """The one-line error when every committed step failed to read: names `spec.checkpoint.uri`, each step
    tried with its short reason (`step N: Type: first line`), and the way out."""
    tried = _named([r.removeprefix("step ") for r in reasons])
    return (f"spec.checkpoint.uri {uri!r}: no committed checkpoint step could be restored ({tried}); "
            "delete them or use --fresh")


def job_checkpointer(job: Any, metrics: Any, writer: JobIdentity | None) -> Checkpointer:
    """Opens `job`'s checkpoint location (`spec.checkpoint`) with the committed step mirrored into `metrics`.

    Raises:
      CheckpointUriError: `spec.checkpoint.uri` is unusable (the message names it).
    """
    ckpt = job.spec.checkpoint
    return Checkpointer(ckpt.uri, ckpt.interval_steps, ckpt.max_to_keep,
                        on_commit=lambda step: _committed(metrics, step), writer=writer)


class RunCheckpoints:
    """Restore, save schedule and committed step of one run over `checkpointer`.

    Args:
      spec: the job's spec (`spec.checkpoint`, `spec.training.steps`).
      checkpointer: the job's `Checkpointer`.
      ledger: the run's `GoodputLedger` (restores are booked `restoring`, saves `checkpointing`).
      metrics: the `ControllerMetrics` (restore and save seconds).

    Attributes:
      resumed_from: `{"step", "fallbackReason", "writer"}` once `restore` resumed from a step, else None.
    """

    def __init__(self, spec: Any, checkpointer: Checkpointer, ledger: Any, metrics: Any):
        self.spec = spec
        self.checkpointer = checkpointer
        self.ledger = ledger
        self.metrics = metrics
        self.resumed_from: dict[str, Any] | None = None

    @property
    def last_committed_step(self) -> int | None:
        """The newest step seen committed (no storage read: cheap enough for every status request)."""
        return self.checkpointer.last_committed_step

    def restore(self, target: Any, during_run: bool = False) -> tuple[Any, dict[str, Any], int] | None:
        """Restores the newest committed step that is this job's and restores cleanly onto `target`.

        A step that fails to restore (corrupt, another shape, NaN/inf in it) is
        skipped for the next older one; the skipped ones are set aside
        (`Checkpointer.set_aside`) and named in `resumed_from["fallbackReason"]`.

        Args:
          target: the state's pytree (`jax.Array`s or `jax.ShapeDtypeStruct`s): the structure,
            shapes, dtypes and shardings to restore onto.
          during_run: a restore of state lost mid-run (`Runtime.recover`), not the run's resume:
            `resumed_from` keeps the step the run resumed from, and the ledger stays `restoring`
            (the caller books what follows as `recovering`, not `starting`).

        Returns:
          `(state, data_state, step)`, or None when no step is committed.

        Raises:
          CheckpointMismatchError: the newest committed step is beyond `spec.training.steps`, or no
            committed step restores and one of them does not fit `target` (a shape mismatch: "does not fit
            this trainer's state").
          CheckpointUnreadableError: no committed step restores, each because it could not be read
            (truncated or missing data, unreadable metadata, NaN/inf); the message names every step tried.
          CheckpointForeignError: a step is another job's and `spec.checkpoint.resumeFrom` is not Any.
        """
        latest = self.checkpointer.latest_committed_step()
        if latest is None:
            return None
        uri = self.spec.checkpoint.uri
        # Never "succeed" by restoring past the end: these are another job's checkpoints.
        beyond = beyond_steps_problem(latest, self.spec.training.steps, uri)
        if beyond:
            raise CheckpointMismatchError(beyond)
        self.ledger.switch("restoring")
        t0 = time.perf_counter()
        unreadable: list[int] = []
        reasons: list[str] = []  # "step N: Type: first line", one per step that failed
        unfit: list[str] = []  # the same, for the steps whose state does not fit the trainer's
        writer = None
        for candidate in reversed(self.checkpointer.committed_steps()):
            try:
                writer = self.check_writer(candidate)
                restored, data_state, step = self.checkpointer.restore(target, candidate)
                if not bool(all_finite(restored)):
                    raise FloatingPointError("the state holds NaN or inf")
            except CheckpointForeignError:
                raise  # not corrupt: another job's, and the spec does not allow taking it
            except Exception as e:  # noqa: BLE001 - a corrupt or unfit step: try the next older one
                unreadable.append(candidate)
                reasons.append(f"step {candidate}: {short_reason(e, 200)}")
                if _does_not_fit(e):
                    unfit.append(f"step {candidate}: {one_line_reason(e, 300)}")
                _logger.warning("checkpoint step %d cannot be restored: %s", candidate, reasons[-1],
                                extra={"event": "checkpoint_unreadable", "step": candidate, "reason": reasons[-1]})
                continue
            break
        else:
            if unfit:  # the genuine case: the state itself is not this trainer's
                raise CheckpointMismatchError(
                    f"spec.checkpoint.uri {uri!r}: checkpoint step {latest} does not fit this trainer's state "
                    f"(another job's checkpoints, or a changed model?), and no older committed step restores "
                    f"either; {unfit[0]}")
            raise CheckpointUnreadableError(no_step_restores_message(uri, reasons))
        fallback = _fallback_reason(reasons) if unreadable else None
        if unreadable:
            # Keep the unreadable steps for inspection; a good save of the same number replaces one.
            self.checkpointer.set_aside(unreadable, step)
        self.metrics.checkpoint_restore_seconds.observe(time.perf_counter() - t0)
        if during_run:
            if unreadable:
                _logger.warning("recovered from checkpoint step %d (%s)", step, fallback,
                                extra={"event": "recovered_from_checkpoint", "step": step, "fallback_reason": fallback})
            return restored, data_state, step
        self.resumed_from = {"step": step, "fallbackReason": fallback,
                             "writer": None if writer is None else writer.model_dump(by_alias=True)}
        written_by = "an unknown job" if writer is None else writer.describe()
        (_logger.warning if unreadable else _logger.info)(
            "resumed from checkpoint step %d written by %s%s", step, written_by, f" ({fallback})" if unreadable else "",
            extra={"event": "resumed", "step": step, "fallback_reason": fallback, "writer": self.resumed_from["writer"]})
        self.ledger.switch("starting")  # what follows until the first step: slices, placement, compile
        return restored, data_state, step

    def check_writer(self, step: int) -> JobIdentity | None:
        """The writer of committed `step`; refuses another job's step unless `spec.checkpoint.resumeFrom` is Any.

        The rule is `elastic_jax.api.checkpoints.writer_problem`, the one the CLI applies before starting.

        Raises:
          CheckpointForeignError: the step is not this job's and the spec does not allow that.
        """
        writer = self.checkpointer.writer_of(step)
        problem = writer_problem(step, writer, self.checkpointer.writer, self.spec.checkpoint.resume_from,
                                 self.spec.checkpoint.uri)
        if problem:
            raise CheckpointForeignError(problem)
        return writer

    def maybe_save(self, step: int, state: Any, data_state: Mapping[str, Any], force: bool = False) -> bool:
        """Starts an async save when due (`Checkpointer.maybe_save`); books its blocking time `checkpointing`.

        When a save started, the ledger is left in `checkpointing`: the caller switches back to its
        step category.

        Returns:
          True when a save was started.

        Raises:
          CheckpointSaveError: the previous background save failed.
        """
        t_save, t_save_mono = time.perf_counter(), time.monotonic()
        if not self.checkpointer.maybe_save(step, state, data_state, force=force):
            return False
        self.metrics.checkpoint_save_seconds.observe(time.perf_counter() - t_save)
        self.ledger.switch("checkpointing", at=t_save_mono)
        return True

    def save_and_wait(self, step: int, state: Any, data_state: Mapping[str, Any]) -> bool:
        """Saves `step` now, whatever the schedule, and waits until it committed (the final save; a drain).

        Skipped when `step` was saved already. The ledger is left in `checkpointing`.

        Returns:
          True when this call saved `step` (False: saved before).

        Raises:
          CheckpointSaveError: this save or the previous one failed.
        """
        self.ledger.switch("checkpointing")
        started = self.checkpointer.maybe_save(step, state, data_state, force=True)
        self.checkpointer.wait_until_finished()
        return started

    def drain(self, slice_set: Any, step: int, state: Any, data_state: Mapping[str, Any]) -> None:
        """Flow 4 at a step boundary: when an active slice is Draining, saves `step` while every slice still
        exists, waits for the commit, then lets the slice go.

        Raises:
          SliceDownError: cause `draining`, naming the draining slices (the elastic retry continues
            without them); nothing is raised while no active slice drains.
          CheckpointSaveError: the save failed.
        """
        from elastic_jax.controller.elastic.errors import SliceDownError

        draining = slice_set.draining_active()
        if draining:
            self.save_and_wait(step, state, data_state)
            raise SliceDownError(f"slices {sorted(draining)} are draining", draining, cause="draining")

    def committed_step(self) -> int | None:
        """The newest committed step, from storage when it answers, else the last one seen committed.

        A full or read-only disk (or an unreachable bucket) can make listing
        the steps fail too; the summary must still say what is committed.
        """
        try:
            return self.checkpointer.latest_committed_step()
        except Exception as e:  # noqa: BLE001 - any storage error; the known step is the answer
            _logger.warning("cannot list committed checkpoints (%s); reporting the last step seen committed",
                            one_line_reason(e))
            return self.checkpointer.last_committed_step


def _committed(metrics, step: int) -> None:
    """The gauges of a committed checkpoint `step`: the step and when (its age on a dashboard)."""
    metrics.checkpoint_committed_step.set(step)
    metrics.checkpoint_committed_time.set_to_current_time()
