"""The elastic training loop: one run of an `ElasticTrainingJob` inside the controller.

The loop owns the authoritative training state (parameters, optimizer state,
step, data position). Each step it asks the backend for the summed
loss and gradients of the global batch over the active slices, applies the
optimizer update, and checkpoints every `spec.checkpoint.intervalSteps`.
The `Manager` wraps the loop: a slice loss abandons the current step, which is
retried on the remaining slices (replica resize) or after the slice returns
(pause and resume). Because the state never left this process and batch `i`
is the same whatever the slice count, a worker loss costs no step and no
checkpoint restore.

Global batch rule: `spec.training.globalBatchSize` is kept constant when slices
leave or join; the per-slice batch is rescaled: the global batch is cut into
one fixed chunk per desired slice and the chunks are spread over the active
slices (`backend_cpu.CpuBackend.grad_step`). The gradient is therefore the
same as with all slices, and so is the loss curve.
"""

from __future__ import annotations

import collections
import logging
import os
import threading
import time
from typing import Any

import jax
import numpy as np
import optax

from elastic_jax.api.control import ControllerStatus
from elastic_jax.api.job import ElasticTrainingJob
from elastic_jax.api.checkpoints import CheckpointMismatchError
from elastic_jax.controller.backend import Backend
from elastic_jax.controller.data import global_batches
from elastic_jax.controller.elastic.errors import (
    ElasticRuntimeError,
    ScaleUpSignalError,
    StopRequested,
    UserCodeError,
    is_slice_down,
    one_line_reason,
)
from elastic_jax.controller.elastic.manager import Manager, job_retry_settings
from elastic_jax.controller.elastic.policy import RestartBudget
from elastic_jax.controller.elastic.slice_set import SliceSet
from elastic_jax.controller.metrics import ControllerMetrics
from elastic_jax.controller.numerics import all_finite, check_step_finite
from elastic_jax.controller.run_checkpoints import RunCheckpoints
from elastic_jax.controller.run_record import RunRecord, RunSummary  # noqa: F401 - RunSummary: re-exported
from elastic_jax.controller.signals import StopState
from elastic_jax.controller.snapshot import HostSnapshotter, choose_restore_source
from elastic_jax.controller.trainer import Trainer
from elastic_jax.controller.watchdog import ProgressWatchdog
from elastic_jax.exit_codes import ControllerExit

_logger = logging.getLogger(__name__)


class TrainingRun:
    """Runs one job to completion through slice failures.

    Args:
      job: the validated manifest.
      trainer: the user's trainer.
      backend: an object with `grad_step(params, batch, active)`,
        `health_check(indices)`, `cleanup()` (e.g. `CpuBackend`).
      slice_set: the slices (fed by the control API).
      checkpointer: a `checkpointing.Checkpointer`.
      metrics: the Prometheus metrics.
      started_at: `time.monotonic()` when the controller process started (the
        goodput ledger's "starting" begins there); None: now.
    """

    def __init__(self, job: ElasticTrainingJob, trainer: Trainer, backend: Backend, slice_set: SliceSet, checkpointer: Any,
                 metrics: ControllerMetrics, started_at: float | None = None):
        self.job = job
        self.spec = job.spec
        self.trainer = trainer
        self.backend = backend
        self.slice_set = slice_set
        self.checkpointer = checkpointer
        self.metrics = metrics
        self._stop = threading.Event()
        self._stop_state = StopState()  # the library's Runtime follows the same rule
        # recoveries, their times, goodput ledger, steps run: the same books as the library's Runtime
        self.record = RunRecord(metrics, started_at)
        self.ledger = self.record.ledger
        # restore with the writer checks and fallback, save schedule: the same code as the library's Runtime
        self.checkpoints = RunCheckpoints(self.spec, checkpointer, self.ledger, metrics)
        self._step_seconds: collections.deque[tuple[int, float, str]] = collections.deque(maxlen=100_000)
        self.manager = Manager(slice_set, health_check=backend.health_check, stop_event=self._stop,
                               visible=backend.visible_slices, on_wait=self.record.on_wait, prepare=backend.prepare)
        self.budget = RestartBudget(self.spec.elasticity.max_restarts, self.spec.elasticity.max_restarts_per_slice)
        self.batches = global_batches(trainer.dataset, self.spec.training.global_batch_size, self.spec.training.seed)
        self._lock = threading.Lock()
        self.phase = "Starting"
        self.step = 0
        self.loss: float | None = None
        self.initial_loss: float | None = None
        self.tokens_per_second: float | None = None
        self.steps_lost = 0
        self.failure_reason: str | None = None
        self.restored_from_step: int | None = None
        # cpu backend: the state never leaves this process, a slice loss costs nothing.
        # pathways backend: device state on a lost slice is gone; keep host snapshots.
        self.keeps_state = backend.keeps_state_on_slice_loss
        self.snapshotter = HostSnapshotter(0 if self.keeps_state else self.spec.elasticity.host_snapshot_interval_steps)
        self._state_lost = False
        self.watchdog = ProgressWatchdog(self.spec.elasticity.progress_timeout_seconds)
        metrics.desired_slices.set(slice_set.count)

        @jax.jit
        def apply_update(params, opt_state, grads_sum, weight):
            grads = jax.tree_util.tree_map(lambda g: g / weight, grads_sum)
            updates, opt_state = trainer.optimizer.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            return params, opt_state, all_finite((params, opt_state))

        self._apply_update = apply_update

    # -- status ---------------------------------------------------------------

    def goodput(self) -> float | None:
        """The goodput ledger's ratio for this controller, in [0, 1] (`goodput.GoodputLedger.goodput`).

        None when it does not apply: before training began, and when this run
        completed no step (e.g. a finished job run again: it resumed at its last
        step and had nothing to do), rather than a misleading 0.0.
        """
        return self.record.goodput()

    def stall_reason(self) -> str | None:
        """None while the controller makes progress, else why it is stuck (see `watchdog`); `/healthz` serves it."""
        status = self.status()
        return self.watchdog.stall_reason(status.phase, status.step)  # logged once, as the library's

    def status(self) -> ControllerStatus:
        """A consistent snapshot for `GET /v1/status`."""
        with self._lock:
            phase = self.record.live_phase(self.phase, self.manager.waiting)
            active = sorted(self.slice_set.active) if phase not in ("Succeeded", "Failed", "Stopped", "Interrupted") else []
            return ControllerStatus(
                phase=phase,
                step=self.step,
                total_steps=self.spec.training.steps,
                desired_slices=self.slice_set.count,
                min_slices=self.spec.slices.minimum,
                active_slices=active,
                inactive_slices=sorted(set(range(self.slice_set.total)) - set(active)),
                slices=self.slice_set.statuses(),
                loss=self.loss,
                initial_loss=self.initial_loss,
                tokens_per_second=self.tokens_per_second,
                last_committed_checkpoint_step=self.checkpointer.last_committed_step,
                recoveries=self.record.counts(),
                recovery_history=self.record.history(),
                steps_lost=self.steps_lost,
                goodput=self.goodput(),
                goodput_seconds=self.ledger.seconds(),
                failure_reason=self.failure_reason,
                pid=os.getpid(),
                resumed_from=self.checkpoints.resumed_from,
            )

    # -- the run --------------------------------------------------------------

    def _initial_state(self) -> dict[str, Any]:
        # Jitted: flax init op by op is slow (seconds for a small transformer on 2 cores).
        @jax.jit
        def init(key):
            params = self.trainer.init_params(key)
            return {"params": params, "opt_state": self.trainer.optimizer.init(params)}

        return init(jax.random.key(self.spec.training.seed))

    def _restore_or_init(self) -> dict[str, Any]:
        state = self._initial_state()
        restored = self.checkpoints.restore(state)
        if restored is None:
            return state
        state, data_state, step = restored
        self.step = int(data_state.get("next_batch_index", step))
        self.restored_from_step = self.step
        self.initial_loss = data_state.get("initial_loss")
        self.loss = data_state.get("loss")
        _logger.info("restored checkpoint step %d (data position: batch %d)", step, self.step)
        return state

    def _data_state(self) -> dict[str, Any]:
        return {
            "next_batch_index": self.step,
            "global_batch_size": self.spec.training.global_batch_size,
            "seed": self.spec.training.seed,
            "initial_loss": self.initial_loss,
            "loss": self.loss,
        }

    def request_stop(self, reason: str, *, requested: bool) -> None:
        """Stops the run: the in-flight step is abandoned, the last completed one checkpointed.

        Safe to call from a signal handler or another thread. A stop request
        (`requested=True`: `POST /v1/stop`, sent for Ctrl-C of `elastic-jax run`
        or a suspend) ends the run as `STOPPED`; a bare signal
        (`requested=False`: a node's graceful shutdown, preemption, a stray
        kill) ends it as `RESTART`, a controller loss that its supervisor
        recovers by starting a new controller. A request overrides an earlier
        signal (the user's intent is known); a later signal never downgrades a
        request.

        Args:
          reason: for the summary and the log, e.g. "SIGTERM" or "suspend".
          requested: True for a stop request, False for a signal.
        """
        self._stop_state.note(reason, requested=requested)
        self._stop.set()
        self.backend.interrupt()  # abandon a step that may hang until its deadline

    @property
    def stop_requested(self) -> bool:
        """True once `request_stop` was called (a stop request or a signal, not a failure of the job)."""
        return self._stop.is_set()

    def run(self) -> RunSummary:
        """Trains to `spec.training.steps`; never raises for training failures.

        Returns:
          The summary; `succeeded` False with `failure_reason` on failure.
        """
        started = time.monotonic()
        try:
            self.state = self._restore_or_init()
            self.phase = "Running"
            retry = self.manager.elastic_retry(
                **job_retry_settings(self.spec),  # the same settings as the library's (elastic_jax.runtime)
                retry_policy=self.budget,
                on_elastic_event_callback=self._on_elastic_event,
                cleanup=self.backend.cleanup,
            )
            try:
                retry(self._train)()
            except StopRequested as e:
                _logger.info("stopping at step %d: %s", self.step, e)
            if not self._state_lost:  # never save state that went down with a slice
                self.checkpoints.save_and_wait(self.step, self.state, self._data_state())
            self.checkpointer.wait_until_finished()
            self.ledger.stop()
            with self._lock:
                if self.step >= self.spec.training.steps:
                    self.phase, exit_code = "Succeeded", ControllerExit.SUCCEEDED
                elif self._stop_state.kind == "requested":
                    self.phase, exit_code = "Stopped", ControllerExit.STOPPED
                    self.failure_reason = f"stopped on request ({self._stop_state.reason}) at step {self.step}"
                else:
                    self.phase, exit_code = "Interrupted", ControllerExit.RESTART
                    self.failure_reason = (f"controller interrupted by {self._stop_state.reason or 'a signal'} at step "
                                           f"{self.step}; a new controller resumes from the last committed step")
        except (Exception, SystemExit) as e:  # noqa: BLE001 - every failure ends the run with a reason
            if isinstance(e, SystemExit):
                # User code called sys.exit() mid-training: exiting 0 would read as "trained every
                # step" (the controller pod Succeeded with the job unfinished). It is a failure.
                e = UserCodeError(f"the trainer called sys.exit({e.code!r}) at step {self.step} of "
                                  f"{self.spec.training.steps}; training did not finish")
            reason = one_line_reason(e) if not _is_user_facing(e) else f"{type(e).__name__}: {e}"
            _logger.error("training failed: %s", e if _is_user_facing(e) else reason, exc_info=not _is_user_facing(e),
                          extra={"event": "training_failed", "reason": reason, "step": self.step})
            exit_code = ControllerExit.FAILED
            with self._lock:
                self.phase = "Failed"
                self.failure_reason = reason
            try:
                self.checkpointer.wait_until_finished()
            except Exception:  # noqa: BLE001 - the failure above is the one to report
                _logger.exception("waiting for the last checkpoint failed")
        self.ledger.stop()
        committed = self.checkpoints.committed_step()  # (the gauge is the Checkpointer's `on_commit`)
        return RunSummary(
            succeeded=self.phase == "Succeeded",
            steps=self.step,
            total_steps=self.spec.training.steps,
            initial_loss=self.initial_loss,
            final_loss=self.loss,
            recoveries=[r.model_dump(mode="json") for r in self.record.history()],
            steps_lost=self.steps_lost,
            goodput=self.goodput(),
            goodput_seconds=self.ledger.seconds(),
            restored_from_step=self.restored_from_step,
            last_committed_checkpoint_step=committed,
            failure_reason=self.failure_reason,
            wall_seconds=time.monotonic() - started,
            pid=os.getpid(),
            stop=self._stop_state.kind,
            exit_code=int(exit_code),
            resumed_from=self.checkpoints.resumed_from,
        )

    def _on_elastic_event(self, error: Exception) -> None:
        self.watchdog.restart()
        # Booked as the library's Runtime books it; a hang's recovery counts from when the stuck step was sent.
        event = self.record.elastic_event_of(error, self.slice_set, self.step)
        if not self.keeps_state and event.cause in ("slice_down", "step_deadline"):
            self._state_lost = True
        _logger.warning("elastic event at step %d: %s on slices %s", self.step, event.cause, event.slices)

    def _recover_lost_state(self) -> None:
        """Restores state lost with a slice: the newer of the host snapshot and the last committed checkpoint."""
        self.ledger.switch("restoring")
        snap = self.snapshotter.latest
        committed = self.checkpointer.last_committed_step
        source = choose_restore_source(None if snap is None else snap.step, committed)
        t0 = time.perf_counter()
        if source == "snapshot":
            state, step = snap.state, snap.step
        elif source == "checkpoint":
            state, data_state, _ = self.checkpointer.restore(self._initial_state(), committed)
            step = int(data_state.get("next_batch_index", committed))
            self.metrics.checkpoint_restore_seconds.observe(time.perf_counter() - t0)
        else:
            state, step = self._initial_state(), 0
        lost = self.step - step
        # Steps done but lost: their seconds were progress that did not last.
        for done_step, seconds, category in self._step_seconds:
            if done_step > step:
                self.ledger.move(seconds, category, "recovering")
        self._step_seconds = collections.deque((x for x in self._step_seconds if x[0] <= step), maxlen=100_000)
        self.ledger.switch("recovering")
        with self._lock:
            self.state, self.step = state, step
            self.steps_lost += lost
        self.metrics.steps_lost.inc(lost)
        _logger.warning("restored lost state from %s at step %d (%d steps lost)", source, step, lost)

    def _train(self) -> None:
        spec = self.spec
        active = sorted(self.slice_set.active)
        if not self.keeps_state:
            if self._state_lost:
                self._recover_lost_state()
                self._state_lost = False
            self.state = self.backend.place_state(self.state, active)
        self.metrics.active_slices.set(len(active))
        tokens_per_step = spec.training.global_batch_size * self.trainer.tokens_per_example
        window_start, window_steps = time.monotonic(), 0
        while self.step < spec.training.steps and not self._stop.is_set():
            joining = self.manager.available_inactive_slices()
            if joining:
                raise ScaleUpSignalError(f"slices {sorted(joining)} ready to join")
            # Flow 4: a draining slice is let go after a save while every slice still exists.
            self.checkpoints.drain(self.slice_set, self.step, self.state, self._data_state())
            batch = self.batches[self.step]
            t0 = time.monotonic()
            # The step that completes a recovery is part of it (as RecoveryRecord.seconds counts it):
            # on a replaced slice it includes the first compile.
            category = self.record.category(len(active), self.slice_set.count)
            capacity = min(1.0, len(active) / self.slice_set.count)
            self.ledger.switch(category, at=t0, capacity=capacity)
            loss_sum, weight, grads = self.backend.grad_step(self.state["params"], batch, active)
            try:
                params, opt_state, finite = self._apply_update(
                    self.state["params"], self.state["opt_state"], grads, np.float32(weight))
                finite = bool(finite)
            except Exception as e:  # noqa: BLE001 - jax raises JaxRuntimeError or (when read back) ValueError
                if is_slice_down(e) or isinstance(e, StopRequested):
                    raise
                # Runs on the controller: no slice can have caused it (a host callback in
                # the optimizer that raised, a bad shape): the user's error, not retried.
                raise UserCodeError(f"the optimizer update of step {self.step + 1} failed: {one_line_reason(e)}") from None
            loss = loss_sum / weight
            check_step_finite(self.step + 1, loss, finite, self.checkpoints.last_committed_step)
            now = time.monotonic()
            with self._lock:
                self.state = {"params": params, "opt_state": opt_state}
                self.step += 1
                self.loss = float(loss)
                if self.initial_loss is None:
                    self.initial_loss = self.loss
                self.record.step_completed(now)
            self._step_seconds.append((self.step, now - t0, category))
            self.metrics.step.set(self.step)
            self.metrics.step_seconds.observe(now - t0)
            self.metrics.loss.set(self.loss)
            window_steps += 1
            if window_steps >= spec.training.log_every_steps or self.step == spec.training.steps:
                self.tokens_per_second = window_steps * tokens_per_step / max(1e-9, now - window_start)
                self.metrics.tokens_per_second.set(self.tokens_per_second)
                self.metrics.goodput.set(self.goodput() or 0.0)
                _logger.info("step %d loss %.4f", self.step, self.loss, extra={
                    "event": "step", "step": self.step, "loss": round(self.loss, 4),
                    "tokens_per_s": round(self.tokens_per_second, 1), "active_slices": active})
                window_start, window_steps = now, 0
            self.snapshotter.maybe_take(self.step, self.state, self._data_state())
            if self.checkpoints.maybe_save(self.step, self.state, self._data_state()):
                self.ledger.switch(category, capacity=capacity)


def _is_user_facing(error: Exception) -> bool:
    """Errors whose message says it all (no traceback in the log)."""
    return isinstance(error, (ElasticRuntimeError, UserCodeError, FloatingPointError, CheckpointMismatchError))
