"""The elastic training loop: one run of an `ElasticTrainingJob` inside the controller.

The loop owns the authoritative training state (parameters, optimizer state,
step, data position). Each step it asks the backend for the summed
loss and gradients of the global batch over the active slices, applies the
optimizer update (on pathways both in one program over the mesh,
`PathwaysBackend.step`), and checkpoints every `spec.checkpoint.intervalSteps`.
It is a caller of the library's `elastic_jax.Runtime`, as a user's own loop is:
the runtime's `elastic_retry` wraps the loop (a slice loss abandons the current
step, which is retried on the remaining slices, replica resize, or after the
slice returns, pause and resume), and its `restore`, `save`, `check_drain`,
`check_scale_up`, `check_finite` and `report_step` are the loop's. Because the state never left this process and batch `i`
is the same whatever the slice count, a worker loss costs no step and no
checkpoint restore.

Global batch rule: `spec.training.globalBatchSize` is kept constant when slices
leave or join; the per-slice batch is rescaled: the global batch is cut into
one fixed chunk per desired slice and the chunks are spread over the active
slices (`backend_cpu.CpuBackend.map_sum`). The gradient is therefore the
same as with all slices, and so is the loss curve.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Any

import jax
import numpy as np
import optax

from elastic_jax.api.control import ENDED_PHASES, ControllerStatus
from elastic_jax.api.job import ElasticTrainingJob
from elastic_jax.api.checkpoints import (ALLOW_DATA_CHANGE_FIELD, CheckpointMismatchError, data_change_problem,
                                         data_changes, describe_changes, run_data)
from elastic_jax.controller.backend import Backend
from elastic_jax.controller.backend_cpu import make_slice_step
from elastic_jax.controller.data import global_batches
from elastic_jax.controller.elastic.errors import (
    ElasticRuntimeError,
    StopRequested,
    UserCodeError,
    is_slice_down,
    one_line_reason,
)
from elastic_jax.controller.elastic.policy import RestartBudget
from elastic_jax.controller.elastic.slice_set import SliceSet
from elastic_jax.controller.metrics import ControllerMetrics
from elastic_jax.controller.numerics import all_finite
from elastic_jax.controller.run_record import RunSummary
from elastic_jax.controller.trainer import Trainer
from elastic_jax.exit_codes import ControllerExit
from elastic_jax.controller.runtime import HostParts, Runtime

_logger = logging.getLogger(__name__)


class TrainingRun:
    """Runs one job to completion through slice failures, as a caller of the library's `elastic_jax.Runtime`.

    The runtime (embedded over the host's parts, `HostParts`) holds the slice
    set, the elastic manager and retry, the stop rule, the run's books and
    watchdog, the checkpoints (restore, save schedule, drain) and the NaN/inf
    checks: the code a library-mode program runs. What stays here is the
    trainer's own: the optimizer update, the data position and tokens per second
    (on pathways the runtime's `recover` restores device state lost with a slice).

    Args:
      job: the validated manifest.
      trainer: the user's trainer.
      backend: the job's `Backend` (`CpuBackend`, `PathwaysBackend`); the
        runtime runs the trainer's per-slice step with its `map_sum`.
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
        self.checkpointer = checkpointer
        self.metrics = metrics
        self.runtime = Runtime(job, "", host_parts=HostParts(slice_set, metrics, backend, checkpointer, started_at))
        self.slice_set = self.runtime.slice_set
        self.manager = self.runtime.manager
        self.record = self.runtime.record
        self.ledger = self.record.ledger
        self.checkpoints = self.runtime.checkpoints
        self.watchdog = self.runtime.watchdog
        self.budget = RestartBudget(self.spec.elasticity.max_restarts, self.spec.elasticity.max_restarts_per_slice)
        self.batches = global_batches(trainer.dataset, self.spec.training.global_batch_size, self.spec.training.seed)
        self._lock = threading.Lock()
        self._init_program: Any = None  # `initial_state`'s jitted init, compiled once
        self.tokens_per_second: float | None = None
        # cpu backend: the state never leaves this process, a slice loss costs nothing.
        # pathways backend: device state on a lost slice is gone; the runtime keeps host snapshots
        # and restores it (`Runtime.recover`).
        self.keeps_state = self.runtime.keeps_state

        @jax.jit
        def apply_update(params, opt_state, grads_sum, weight):
            grads = jax.tree_util.tree_map(lambda g: g / weight, grads_sum)
            updates, opt_state = trainer.optimizer.update(grads, opt_state, params)
            params = optax.apply_updates(params, updates)
            return params, opt_state, all_finite((params, opt_state))

        self._apply_update = apply_update
        self._slice_step = make_slice_step(trainer)  # one object: its programs are cached by identity
        slice_step = self._slice_step

        def train_step(state, batch):
            """The pathways backend's one program per mesh: summed gradients and the optimizer update."""
            loss_sum, weight, grads_sum = slice_step(state["params"], batch)
            grads = jax.tree_util.tree_map(lambda g: g / weight, grads_sum)
            updates, opt_state = trainer.optimizer.update(grads, state["opt_state"], state["params"])
            new = {"params": optax.apply_updates(state["params"], updates), "opt_state": opt_state}
            return new, (loss_sum, weight, all_finite(new))

        #: The pathways step program's function, `(state, global batch) -> (new state, (loss_sum, weight,
        #: finite))`; one object for the run (as `_slice_step`), so each mesh compiles it once.
        self.train_step = train_step
        # pathways: the update runs inside the step's program (`PathwaysBackend.launch`); cpu: here, after the sum.
        self._fused = callable(getattr(backend, "launch", None))

    # -- what the runtime holds -----------------------------------------------

    @property
    def step(self) -> int:
        """Steps completed (the runtime's `step`: restored, then one per `report_step`)."""
        return self.runtime.step

    @property
    def loss(self) -> float | None:
        """The last step's loss (None before any)."""
        return self.runtime.loss

    @property
    def initial_loss(self) -> float | None:
        """The first loss of the run (the restored step's, when resumed)."""
        return self.runtime.initial_loss

    @property
    def steps_lost(self) -> int:
        """Steps whose state was lost with a slice and redone (the runtime's `recover` counts them)."""
        return self.runtime.steps_lost

    @property
    def restored_from_step(self) -> int | None:
        """The checkpoint step this run resumed from (None: started at 0)."""
        return self.runtime.restored_from_step

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
        return self.runtime.stall_reason()  # logged once, as the library's

    def status(self) -> ControllerStatus:
        """A consistent snapshot for `GET /v1/status`: the runtime's, with the trainer's own fields."""
        with self._lock:
            status = self.runtime.snapshot()
            update: dict[str, Any] = {"tokens_per_second": self.tokens_per_second}
        if status.phase in ENDED_PHASES:
            update.update(active_slices=[], inactive_slices=list(range(self.slice_set.total)))
        return status.model_copy(update=update)

    # -- the run --------------------------------------------------------------

    def initial_state(self) -> dict[str, Any]:
        """The state at step 0: `{"params": ..., "opt_state": ...}` from `training.seed` (jax arrays, on the
        default device; placed on a mesh by the backend's `place_state`)."""
        # Jitted (flax init op by op is slow: seconds for a small transformer on 2 cores), and one jitted
        # function for the run: a recovery's restore target then costs a run of the kept program, not a
        # compile of a new one (seconds on a v5e chip at examples/02's size: docs/benchmarks.md "TPU").
        if self._init_program is None:
            trainer = self.trainer

            @jax.jit
            def init(key):
                params = trainer.init_params(key)
                return {"params": params, "opt_state": trainer.optimizer.init(params)}

            self._init_program = init
        return self._init_program(jax.random.key(self.spec.training.seed))

    def _restore_target(self, active: list[int] | None = None) -> dict[str, Any]:
        """The initial state as a restore target, on the mesh of `active` (default: every slice with devices now)
        when the state lives on the slices (pathways): a checkpoint then restores into the mesh's `NamedSharding`
        arrays, which Orbax's Pathways array handler (persistence) requires, instead of onto one device (issue 29
        fault 2). The cpu backend keeps the state in this process: as is."""
        state = self.initial_state()
        if self.keeps_state:
            return state
        if active is None:
            active = sorted(self.backend.visible_slices() or ())
        return self.backend.place_state(state, active) if active else state

    def _restore_or_init(self) -> dict[str, Any]:
        state, step, saved = self.runtime.restore(self._restore_target())
        if self.restored_from_step is not None:
            self._check_data(saved, step)
            _logger.info("restored checkpoint step %d (data position: batch %d)", step, step)
        return state

    def _check_data(self, saved: dict[str, Any], step: int) -> None:
        """Refuses (or, with `spec.checkpoint.allowDataChange`, names in a warning) a restored step trained with
        another global batch size or seed. The controller's start refuses this before any worker starts
        (`Checkpointer.check_resume`); here for the step a fallback restore landed on instead.

        Raises:
          CheckpointMismatchError: a field changed and the spec does not allow it.
        """
        ckpt = self.spec.checkpoint
        problem = data_change_problem(saved, self._data(), step, ckpt.uri, ckpt.allow_data_change)
        if problem:
            raise CheckpointMismatchError(problem)
        changes = data_changes(saved, self._data())
        if changes:
            # (the run's own output says it too, not only this log: `elastic-jax run` prints setting warnings)
            self.runtime.warn_setting(f"{ALLOW_DATA_CHANGE_FIELD}: true: resumed from checkpoint step {step} with a "
                                      f"changed data order: {describe_changes(changes, step)}")
            _logger.warning("resuming with a changed data order, as %s allows: %s", ALLOW_DATA_CHANGE_FIELD,
                            describe_changes(changes, step),
                            extra={"event": "data_changed", "step": step,
                                   "changes": [{"field": f, "checkpoint": old, "spec": new} for f, old, new in changes]})

    def _data(self) -> dict[str, Any]:
        """What is saved with each step beside the runtime's step and losses (the batch index is the step)."""
        return run_data(self.spec.training.global_batch_size, self.spec.training.seed)

    def request_stop(self, reason: str, *, requested: bool) -> None:
        """Stops the run: the in-flight step is abandoned, the last completed one checkpointed.

        Safe to call from a signal handler or another thread. A stop request
        (`requested=True`: `POST /v1/stop`, sent for Ctrl-C of `elastic-jax run`
        or a suspend) ends the run as `STOPPED`; a bare signal
        (`requested=False`: a node's graceful shutdown, preemption, a stray
        kill) ends it as `RESTART`, a controller loss that its supervisor
        recovers by starting a new controller. A request overrides an earlier
        signal (the user's intent is known); a later signal never downgrades a
        request (`Runtime.request_stop`).

        Args:
          reason: for the summary and the log, e.g. "SIGTERM" or "suspend".
          requested: True for a stop request, False for a signal.
        """
        self.runtime.request_stop(reason, requested=requested)

    @property
    def stop_requested(self) -> bool:
        """True once `request_stop` was called (a stop request or a signal, not a failure of the job)."""
        return self.runtime.stop_requested.is_set()

    def run(self) -> RunSummary:
        """Trains to `spec.training.steps`; never raises for training failures.

        Returns:
          The summary; `succeeded` False with `failure_reason` on failure.
        """
        started = time.monotonic()
        stop = self.runtime.stop_state
        try:
            with self._on_a_visible_slice():
                self.state = self._restore_or_init()
            self.runtime.set_phase("Running")
            retry = self.runtime.elastic_retry(retry_policy=self.budget,
                                               on_elastic_event_callback=self._on_elastic_event)
            try:
                retry(self._train)()
            except StopRequested as e:
                _logger.info("stopping at step %d: %s", self.step, e)
            if not self.runtime.state_lost:  # never save state that went down with a slice
                self.runtime.save(self.step, self.state, self._data(), force=True)
            self.checkpointer.wait_until_finished()
            self.ledger.stop()
            if self.step >= self.spec.training.steps:
                phase, reason, exit_code = "Succeeded", None, ControllerExit.SUCCEEDED
            elif stop.kind == "requested":
                phase, exit_code = "Stopped", ControllerExit.STOPPED
                reason = f"stopped on request ({stop.reason}) at step {self.step}"
            else:
                phase, exit_code = "Interrupted", ControllerExit.RESTART
                reason = (f"controller interrupted by {stop.reason or 'a signal'} at step "
                          f"{self.step}; a new controller resumes from the last committed step")
            self.runtime.set_phase(phase, reason)
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
            self.runtime.set_phase("Failed", reason)
            try:
                self.checkpointer.wait_until_finished()
            except Exception:  # noqa: BLE001 - the failure above is the one to report
                _logger.exception("waiting for the last checkpoint failed")
        self.ledger.stop()
        final = self.runtime.snapshot()
        initial_loss, final_loss = self.record.losses(self.initial_loss, self.loss)
        return RunSummary(
            succeeded=final.phase == "Succeeded",
            steps=self.step,
            total_steps=self.spec.training.steps,
            initial_loss=initial_loss,
            final_loss=final_loss,
            recoveries=[r.model_dump(mode="json") for r in self.record.history()],
            steps_lost=self.steps_lost,
            goodput=self.goodput(),
            goodput_seconds=self.ledger.seconds(),
            restored_from_step=self.restored_from_step,
            last_committed_checkpoint_step=self.checkpoints.committed_step(),  # (the gauge: the Checkpointer's `on_commit`)
            failure_reason=final.failure_reason,
            wall_seconds=time.monotonic() - started,
            pid=os.getpid(),
            stop=stop.kind,
            exit_code=int(exit_code),
            resumed_from=self.checkpoints.resumed_from,
        )

    def _on_a_visible_slice(self) -> contextlib.AbstractContextManager:
        """Before the first attempt: `jax.default_device` on a slice the backend sees (pathways: not
        `jax.devices()[0]`, which may be on a missing slice); each attempt then runs on an active slice's
        device (the manager's `default_device` hook)."""
        pick = getattr(self.backend, "default_device", None)
        visible = None if pick is None else self.backend.visible_slices()  # (cpu: no hook, nothing asked)
        if not visible:
            return contextlib.nullcontext()
        return jax.default_device(pick((visible & self.slice_set.ready()) or visible))

    def _on_elastic_event(self, error: Exception) -> None:
        # Booked by the runtime as the library's (and whether it took device state with it).
        event = self.record.history()[-1]
        _logger.warning("elastic event at step %d: %s on slices %s", self.step, event.cause, event.slices)

    def _train(self) -> None:
        spec = self.spec
        active = sorted(self.slice_set.active)
        if not self.keeps_state:
            if self.runtime.state_lost:
                # The surviving slices' replicas (no step lost, nothing compiled or read from storage); only
                # when no slice of the old mesh survived, a host snapshot or checkpoint (not under the lock).
                replica = self.backend.recover_state(self.state, active) if self._fused else None
                state = self.runtime.recover(replica if replica is not None else self._restore_target(active),
                                             replica=replica).state
                with self._lock:
                    self.state = state
            self.state = self.backend.place_state(self.state, active)
        tokens_per_step = spec.training.global_batch_size * self.trainer.tokens_per_example
        window_start, window_steps = time.monotonic(), 0
        # pathways: step n+1 is launched on step n's (future) state before step n's outputs are read, so the
        # host's work between steps overlaps the chip's (`PathwaysBackend.launch`). A launch not waited for
        # (an elastic event, a stop, a non-finite step) is dropped: `self.state` is always a completed step's.
        launched = None
        while self.step < spec.training.steps and not self.stop_requested:
            self.runtime.check_scale_up()
            # Flow 4: a draining slice is let go after a save while every slice still exists.
            self.runtime.check_drain(self.step, self.state, self._data())
            # The step that completes a recovery is part of it (as RecoveryRecord.seconds counts it):
            # on a replaced slice it includes the first compile. The runtime books the ledger so.
            # The library's per-slice run-and-sum (`Runtime.map_sum`), over this attempt's slices.
            if self._fused:
                if launched is None:
                    launched = self.backend.launch(self.train_step, self.state, self.batches[self.step], active)
                ahead = None
                if self.step + 1 < spec.training.steps:
                    ahead = self.backend.launch(self.train_step, launched.outputs[0], self.batches[self.step + 1],
                                                active)
                new_state, outputs = self.backend.wait(launched)
                launched = ahead
                loss_sum, weight, finite = jax.device_get(outputs)
                loss_sum, weight, finite = float(loss_sum), float(weight), bool(finite)
            else:
                new_state, loss_sum, weight, finite = self._step_then_update(self.batches[self.step], active)
            loss = float(loss_sum / weight)
            self.runtime.check_finite(self.step + 1, loss, finite=finite)
            with self._lock:
                self.state = new_state
                self.runtime.report_step(self.step + 1, loss)
            now = time.monotonic()  # (the step's seconds and histogram: booked by `report_step`)
            window_steps += 1
            if window_steps >= spec.training.log_every_steps or self.step == spec.training.steps:
                self.tokens_per_second = window_steps * tokens_per_step / max(1e-9, now - window_start)
                self.metrics.tokens_per_second.set(self.tokens_per_second)
                _logger.info("step %d loss %.4f", self.step, self.loss, extra={
                    "event": "step", "step": self.step, "loss": round(self.loss, 4),
                    "tokens_per_s": round(self.tokens_per_second, 1), "active_slices": active})
                window_start, window_steps = now, 0
            self.runtime.take_host_snapshot(self.step, self.state, self._data())
            self.runtime.save(self.step, self.state, self._data())


    def _step_then_update(self, batch: dict[str, Any], active: list[int]) -> tuple[dict[str, Any], float, float, bool]:
        """cpu backend: the summed gradients from the slices, then the optimizer update here (its own program)."""
        loss_sum, weight, grads = self.runtime.map_sum(self._slice_step, self.state["params"], batch, active)
        loss_sum, weight = float(loss_sum), float(weight)
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
        return {"params": params, "opt_state": opt_state}, loss_sum, weight, finite


def _is_user_facing(error: Exception) -> bool:
    """Errors whose message says it all (no traceback in the log)."""
    return isinstance(error, (ElasticRuntimeError, UserCodeError, FloatingPointError, CheckpointMismatchError))
