"""elastic-jax as a library: the runtime a user's own training program runs on (library mode).

With `spec.controller.command` the controller pod (or `elastic-jax run`)
starts the user's program instead of the built-in trainer host. The program
calls `elastic_jax.connect()`, which serves the same control API the built-in
controller serves (routes, bearer token, metrics: `controller/control_api.py`)
from a background thread, so the operator's or launcher's slice reports
(`PUT /v1/slices/{i}`) feed the returned `Runtime`'s slice set. On it:

* `elastic_retry`: the elastic manager (`controller/elastic/manager.py`, the
  pathways-utils `Manager` semantics: wait for enough slices, pause and resume
  or replica resize, retry on a slice loss, the scale-up signal);
* `map_sum` (cpu backend): run a per-slice function on the active slices and
  add the results (`CpuBackend.map_sum`, what the built-in trainer's step uses);
* `check_scale_up` at a step boundary, `report_step` for status and metrics,
  `stop_requested` for `POST /v1/stop` and SIGTERM;
* `restore` / `save`: Orbax checkpoints of `spec.checkpoint` through the
  built-in trainer's own code (`controller/run_checkpoints.py`: writer checks,
  fallback to older steps, the save schedule, the committed step in status and
  the summary);
* `check_finite` (NaN/inf) and the no-progress watchdog behind `/healthz`
  (`stall_reason`), as the built-in trainer has them;
* `take_host_snapshot` / `state_lost` / `recover` (pathways): the restore of
  state lost with a slice from the newer of a host snapshot and the last
  committed checkpoint (`controller/snapshot.py`), counting `steps_lost`.

The API is documented in docs/bring-your-own-loop.md.
"""

from __future__ import annotations

import atexit
import collections
import dataclasses
import logging
import math
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

#: Elastic-event causes after which device state on the lost slice is gone (a drain saves first).
LOSES_DEVICE_STATE = frozenset({"slice_down", "step_deadline"})


class RuntimeConfigError(ValueError):
    """The runtime cannot start: a missing or bad manifest, token, digest or port (message names which)."""


class Restored(NamedTuple):
    """What `Runtime.restore` returns: unpack as `state, step, data = runtime.restore(initial_state)`.

    Attributes:
      state: the restored pytree (the target's structure, shapes, dtypes and shardings), or the target
        itself when nothing was committed.
      step: the step the state belongs to (steps completed), 0 when nothing was committed.
      data: the `data` dict given to `Runtime.save` with that step ({} when none).
    """

    state: Any
    step: int
    data: dict


@dataclasses.dataclass(frozen=True)
class HostParts:
    """What a host process gives the `Runtime` it embeds instead of letting it build its own.

    The built-in trainer host (`controller/main.py`) serves its own control API
    before the trainer is built (so `/readyz` can say not ready) and checks the
    checkpoint location and resume before ready; its `TrainingRun` then holds a
    `Runtime` over these parts, so both loops run one code path.

    Attributes:
      slice_set: the `SliceSet` the host's control API feeds.
      metrics: the host's `ControllerMetrics` (what its `/metrics` serves).
      backend: the job's `Backend` (`controller/backend.py`: `map_sum`, on pathways too); its `visible_slices`
        and `prepare` become the manager's hooks (pathways: only slices with devices; cpu: warm spares).
      checkpointer: the job's open `Checkpointer` (`run_checkpoints.job_checkpointer`).
      started_at: `time.monotonic()` when the host process started (the goodput ledger's `starting`); None: now.
    """

    slice_set: Any
    metrics: Any
    backend: Any
    checkpointer: Any
    started_at: float | None = None


class Runtime:
    """The elastic runtime of one job inside the user's program.

    Build it with `connect()` (reads the environment the operator or the
    launcher sets); the constructor is for tests and embedding.

    Args:
      job: the validated `ElasticTrainingJob`.
      token: the control API's bearer token (non-empty).
      host: control API bind address.
      port: control API TCP port (0 picks a free one; read `port`).
      summary_file: where `close()` writes the run summary JSON (`ELASTIC_JAX_SUMMARY_FILE`, which
        `elastic-jax run` sets; the built-in controller's `RunSummary`); None: not written.
      environ: the environment the checkpoints' writer identity is read from (the operator's job
        UID variables; `elastic_jax.api.identity.identity_from_env`); default `os.environ`.
      host_parts: the slice set, metrics, backend and checkpointer of a host that built them (the built-in
        trainer, `HostParts`); the runtime then serves nothing itself (`token` may be empty and `start`
        is refused). None: the runtime builds its own.

    Attributes:
      job: the manifest.
      slice_set: the slices, fed by the supervisor's reports (`SliceSet`).
      manager: the elastic manager (`Manager`) over `slice_set`.
      metrics: the Prometheus registry served at `/metrics`.
      stop_requested: set by `POST /v1/stop`, by SIGTERM/SIGINT/SIGHUP once
        `install_signal_handlers()` ran, or by `close()`; a wait for slices
        then ends with `StopRequested`.
      stop_exit_code: the exit code the program should end with once it
        stopped: 4 (`ControllerExit.STOPPED`) after `POST /v1/stop`, 75
        (`ControllerExit.RESTART`: a controller loss, restart me) after a
        signal; None while no stop was requested. A request overrides an earlier
        signal; a later signal never downgrades a request (as the built-in trainer).
      stop_state: the `StopState` (`controller/signals.py`): `kind` None, "requested" or "signal", `reason`.
      step: the last step given to `report_step` (0 before).
      initial_loss: the first loss given to `report_step` by this process (None before).
      record: the elastic events, recovery times, goodput ledger and steps run
        (`controller/run_record.py`, the same books the built-in trainer keeps).
      port: the control API's port once started.

    Raises:
      ValueError: empty token (without `host_parts`).
    """

    def __init__(self, job: Any, token: str, host: str = "127.0.0.1", port: int = 0,
                 summary_file: str | None = None, environ: Mapping[str, str] | None = None,
                 host_parts: HostParts | None = None):
        from elastic_jax.controller.elastic.manager import Manager
        from elastic_jax.controller.elastic.slice_set import SliceSet
        from elastic_jax.controller.metrics import ControllerMetrics
        from elastic_jax.controller.run_record import RunRecord
        from elastic_jax.controller.watchdog import ProgressWatchdog

        parts = host_parts
        self._started = time.monotonic() if parts is None or parts.started_at is None else parts.started_at

        if not token and parts is None:
            raise ValueError("the control API needs a non-empty bearer token")
        self.job = job
        self._token = token
        self._hosted = parts is not None
        if parts is None:
            self.slice_set = SliceSet(job.spec.slices.count, job.spec.slices.spares)
            self.metrics = ControllerMetrics()
        else:
            self.slice_set, self.metrics = parts.slice_set, parts.metrics
        self.metrics.desired_slices.set(self.slice_set.count)
        from elastic_jax.controller.signals import StopState

        self.stop_requested = threading.Event()
        self.stop_state = StopState()  # the built-in trainer's rule: a request overrides an earlier signal
        self._backend = self._build_backend() if parts is None else parts.backend
        from elastic_jax.controller.run_history import HISTORY_FILE, RunHistory

        # (the local launcher's run folder: the timeline picture's history; none on a cluster)
        from elastic_jax import contract

        run_dir = (os.environ if environ is None else environ).get(contract.ENV_RUN_DIR)
        self.record = RunRecord(self.metrics, self._started,
                                RunHistory(os.path.join(run_dir, HISTORY_FILE) if run_dir else None))
        self.metrics.bind_status(
            lambda: (self.record.live_phase(self._phase, self.manager.waiting),
                     [s.state for s in self.slice_set.statuses()]))
        # A host's backend brings its hooks (pathways: slices with devices; cpu: warm spares before a join).
        hooks = {} if parts is None else {"visible": parts.backend.visible_slices, "prepare": parts.backend.prepare,
                                          "default_device": getattr(parts.backend, "default_device", None)}
        self.manager = Manager(
            self.slice_set,
            health_check=self._backend.health_check if self._backend is not None else None,
            stop_event=self.stop_requested,
            # (the step and slice count for the history's pause line; a second slice found down while a loss
            # is recovered joins that loss's record: `RunRecord.slices_lost`)
            on_wait=lambda blocked, up: self.record.on_wait(blocked, up, self.step, self.slice_set.count),
            on_slices_lost=lambda slices: self.record.slices_lost(slices, self.step),
            **hooks,
        )
        self.step = 0
        self.loss: float | None = None
        # Device state lost with a slice (pathways: the arrays lived on its chips) is restored by
        # `recover` from the newer of a host snapshot and the last committed checkpoint; on the cpu
        # backend the state lives in this process and survives every slice loss.
        from elastic_jax.controller.snapshot import HostSnapshotter

        self.keeps_state = self._backend.keeps_state_on_slice_loss if self._backend is not None else False
        self._snapshots = HostSnapshotter(0 if self.keeps_state else job.spec.elasticity.host_snapshot_interval_steps,
                                          wait_s=job.spec.elasticity.step_deadline_seconds)
        self._state_lost = False
        self._recovered = False  # `recover` ran once: `steps_lost` is measured, not n/a
        self.steps_lost = 0
        # What the run itself found about its settings (`warn_setting`), before the backend's in the status.
        self._setting_warnings: list[str] = []
        # (step, seconds, ledger category) of each reported step: a rewind moves the lost ones' seconds.
        self._step_seconds: collections.deque[tuple[int, float, str]] = collections.deque(maxlen=100_000)
        self._step_t0 = time.monotonic()
        # Stall notice (issue 31 item 12): since when the training thread is in the controller's own code (the
        # step began, or the slices answered), whether it waits on the slices now, the category to book back to.
        self._outside_since = self._step_t0
        self._on_slices = 0
        self._step_capacity = 1.0
        self._stall_logged = False
        self._step_category = "starting"
        self.initial_loss: float | None = None
        self.restored_from_step: int | None = None
        self._attempt_slices: frozenset[int] | None = None  # set at each `elastic_retry` attempt
        self._environ = os.environ if environ is None else environ
        self._checkpoints = None  # RunCheckpoints, opened by the first restore() or save()
        self._checkpointer = None if parts is None else parts.checkpointer  # None: opened on first use
        self.watchdog = ProgressWatchdog(job.spec.elasticity.progress_timeout_seconds)
        self._lock = threading.Lock()
        self._phase = "Starting"
        self._failure_reason: str | None = None
        self._previous_excepthook: Callable[..., Any] | None = None  # `sys.excepthook` before `start`
        self._summary_file = summary_file
        self._closed = False
        self._host, self.port = host, port
        self._server = None
        from elastic_jax.controller.final_status import FinalStatusHandoff

        # A program that ends right after its last `report_step` would often exit before the
        # supervisor's next poll (1 s): its last step would never reach the summary or the job status.
        self._handoff = FinalStatusHandoff()

    def _build_backend(self):
        """The cpu backend (`map_sum` on the workers); None on pathways (the user's jitted step runs there)."""
        if self.job.spec.backend != "cpu":
            return None
        from elastic_jax.controller.backend import BACKENDS, BackendContext

        return BACKENDS["cpu"](BackendContext(self.job, self.slice_set, self._token))

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> Runtime:
        """Serves the control API from a background thread; returns self once it listens (then /readyz is 200).

        Raises:
          RuntimeConfigError: the port cannot be bound.
        """
        from elastic_jax.controller.control_api import ControlApiServer, create_app

        if self._hosted:
            raise RuntimeConfigError("this runtime is embedded in a host that serves the control API itself")
        app = create_app(self.slice_set, self.status, self.metrics, self._token, ready=lambda: True,
                         stop=self._on_stop, stalled=self.stall_reason)
        self._server = ControlApiServer(app, host=self._host, port=self.port)
        try:
            self._server.start()
        except RuntimeError as e:
            raise RuntimeConfigError(str(e)) from None
        self.port = self._server.port
        atexit.register(self.close)  # a program that never calls close() still writes its summary
        # An uncaught exception (one raised before `with runtime:`, e.g. by `restore`) is the run's failure:
        # closed at once with it, while the interpreter still runs (at atexit the checkpointer's threads
        # could not close: "cannot schedule new futures after interpreter shutdown").
        self._previous_excepthook = sys.excepthook
        sys.excepthook = self._on_uncaught
        return self

    def _on_uncaught(self, exc_type: Any, exc: BaseException, tb: Any) -> None:
        """`sys.excepthook` while the runtime runs: the traceback as before, then `close(exc)`."""
        previous = self._previous_excepthook or sys.__excepthook__
        previous(exc_type, exc, tb)
        self.close(exc)

    def install_signal_handlers(self) -> None:
        """Makes SIGTERM, SIGINT and SIGHUP set `stop_requested` (call from the main thread).

        As the built-in controller (`controller/signals.py`): the handler only
        wakes a helper thread, which sets the event and interrupts an in-flight
        `map_sum` (taking the backend's locks inside the handler could deadlock
        the main thread that holds them); the loop decides to checkpoint and
        exit (exit code 75 on a signal, 4 on `POST /v1/stop`:
        `elastic_jax.exit_codes`).

        Raises:
          ValueError: not called from the main thread.
        """
        from elastic_jax.controller.signals import forward_signals_to

        forward_signals_to(lambda _signum: self._on_stop("signal", requested=False))

    @property
    def stop_exit_code(self) -> int | None:
        """4 after a stop request (`POST /v1/stop`), 75 after a signal, None before; a request overrides an
        earlier signal, a later signal never downgrades a request (`controller/signals.py`'s `StopState`)."""
        return self.stop_state.exit_code

    def _on_stop(self, reason: str, requested: bool = True) -> bool:
        """The control API's `POST /v1/stop` callback: `request_stop`; True (accepted)."""
        self.request_stop(reason, requested=requested)
        return True

    def request_stop(self, reason: str, *, requested: bool) -> None:
        """Stops the run: sets `stop_requested` and interrupts an in-flight `map_sum` (thread-safe).

        Args:
          reason: for the summary and the log (e.g. "SIGTERM", "suspend").
          requested: True for a stop request (exit 4), False for a signal (75, a controller loss);
            a request overrides an earlier signal, a later signal never downgrades a request.
        """
        self.stop_state.note(reason, requested=requested)
        self.stop_requested.set()  # a wait for slices sees it within the manager's poll interval (1 s)
        if self._backend is not None:
            self._backend.interrupt()

    def close(self, error: BaseException | None = None, exit_code: int | None = None) -> None:
        """Ends the run: final phase, summary file, control API and worker connections (idempotent).

        The final phase is Succeeded once `report_step` reached
        `spec.training.steps`, else Stopped / Interrupted after a stop request
        / signal, else Failed (with `error`'s one-line reason when given; `with
        runtime:` passes the exception that left the block). With a summary
        file (`ELASTIC_JAX_SUMMARY_FILE`) it writes the built-in controller's
        `RunSummary` there: steps, initial and final loss, the elastic events
        with their recovery seconds, goodput. If a supervisor polled `GET
        /v1/status` within the last 5 s, it then waits (at most 10 s) until the
        final status was read once, as the built-in controller does
        (`controller/final_status.py`). Not after `POST /v1/stop`: whoever sent
        it waits for the exit without reading again.

        Args:
          error: the exception the program is ending with, if any.
          exit_code: the exit code the program ends with, when the caller knows it
            (`run_module`: the module's); it then decides the final phase (0
            Succeeded, 4 Stopped, 75 Interrupted, else Failed), for programs
            that never call `report_step`.
        """
        from elastic_jax.exit_codes import ControllerExit

        if self._closed:
            return
        self._closed = True
        self._snapshots.settle(5.0)  # (no copy left reading device buffers while the backends shut down)
        if sys.excepthook == self._on_uncaught:
            sys.excepthook = self._previous_excepthook or sys.__excepthook__
        self._finish(error, exit_code, self._close_checkpoints())
        if self._server is not None and self.stop_exit_code != ControllerExit.STOPPED:
            self._handoff.ended()
            self._handoff.wait()
        self.stop_requested.set()
        if self._backend is not None:
            self._backend.close()
        if self._server is not None:
            self._server.stop()
            self._server = None

    def __enter__(self) -> Runtime:
        return self if self._server is not None else self.start()

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> None:
        self.close(exc)

    def _close_checkpoints(self) -> str | None:
        """Waits for the in-flight save and closes the checkpointer; returns its failure as one line."""
        from elastic_jax.controller.elastic.errors import one_line_reason

        if self._checkpoints is None:
            return None
        try:
            self._checkpoints.checkpointer.close()
        except Exception as e:  # noqa: BLE001 - reported in the final phase and the summary
            logging.getLogger(__name__).error("the last checkpoint save failed: %s", one_line_reason(e))
            return one_line_reason(e)
        return None

    def _finish(self, error: BaseException | None, exit_code: int | None = None,
                checkpoint_error: str | None = None) -> None:
        """Sets the final phase and writes the summary file (see `close`)."""
        from elastic_jax.controller.elastic.errors import StopRequested, one_line_reason
        from elastic_jax.controller.run_record import RunSummary, write_summary
        from elastic_jax.exit_codes import ControllerExit

        self.record.ledger.stop()
        total = self.job.spec.training.steps
        if exit_code is not None:
            phases = {ControllerExit.SUCCEEDED: "Succeeded", ControllerExit.STOPPED: "Stopped",
                      ControllerExit.RESTART: "Interrupted"}
            phase, code = phases.get(exit_code, "Failed"), exit_code
            if phase != "Succeeded":
                self._failure_reason = f"the program exited with {exit_code} at step {self.step} of {total}"
        elif self.step >= total:
            phase, code = "Succeeded", ControllerExit.SUCCEEDED
        elif self.stop_exit_code is not None and (error is None or isinstance(error, StopRequested)):
            phase, code = ("Stopped" if self.stop_exit_code == ControllerExit.STOPPED else "Interrupted"), self.stop_exit_code
            self._failure_reason = f"stopped at step {self.step} of {total}"
        else:
            phase, code = "Failed", ControllerExit.FAILED
            self._failure_reason = (one_line_reason(error) if error is not None
                                    else f"the program ended at step {self.step} of {total}")
        if checkpoint_error and phase == "Succeeded":
            # The final save did not commit: the job is not done (as the built-in controller decides).
            phase, code = "Failed", ControllerExit.FAILED
            self._failure_reason = f"final checkpoint failed: {checkpoint_error}"
        self._phase = phase
        if not self._summary_file:
            return
        initial_loss, final_loss = self.record.losses(self.initial_loss, self.loss)
        summary = RunSummary(
            succeeded=phase == "Succeeded", steps=self.step, total_steps=total, initial_loss=initial_loss,
            final_loss=final_loss, recoveries=[r.model_dump(mode="json") for r in self.record.history()],
            steps_lost=self.steps_lost if self._recovered else None, goodput=self.record.goodput(), goodput_seconds=self.record.ledger.seconds(),
            restored_from_step=self.restored_from_step,
            last_committed_checkpoint_step=None if self._checkpoints is None else self._checkpoints.committed_step(),
            failure_reason=self._failure_reason, resumed_from=self._resumed_from(),
            wall_seconds=time.monotonic() - self._started, pid=os.getpid(),
            stop=self.stop_state.kind,
            exit_code=int(code))
        try:
            write_summary(self._summary_file, summary)
        except OSError as e:
            logging.getLogger(__name__).error("cannot write the run summary to %s: %s", self._summary_file, e)

    # -- elasticity ----------------------------------------------------------

    @property
    def active_slices(self) -> frozenset[int]:
        """Indices of the slices training now (0..count+spares-1)."""
        return self.slice_set.active

    def elastic_retry(self, minimum_slice_count: int | None = None, timeout_s: float | None = None,
                      retry_policy: Callable[[int, Exception], bool] | None = None,
                      on_elastic_event_callback: Callable[[Exception], Any] | None = None,
                      pre_callback: Callable[[], Any] | None = None) -> Callable:
        """Decorator: run the training function on the active slices, retrying through slice losses and scale-ups.

        pathways-utils `Manager.elastic_retry` semantics, with the built-in
        loop's settings (`job_retry_settings`): the first attempt waits up to
        30 s for every slice, then starts on the minimum; before each attempt
        wait until `minimum_slice_count` slices are Ready (and answer a ping on
        the cpu backend); equal to the desired count is pause and resume, lower
        is replica resize. A slice-down error (`is_slice_down`) or a
        `ScaleUpSignalError` from the function starts the next attempt; any
        other error propagates unchanged. The function must resume from its own
        state (the last completed step, or a checkpoint) on every call.

        Args:
          minimum_slice_count: fewest slices to train on; default
            `spec.slices.minSlices` (or `count`).
          timeout_s: seconds to wait for enough slices per attempt; default
            `spec.elasticity.sliceWaitTimeoutSeconds`.
          retry_policy: `(attempt, error) -> bool`; default the job's restart
            budget (`spec.elasticity.maxRestarts`, `maxRestartsPerSlice`).
          on_elastic_event_callback: called with each slice-down error or scale-up signal.
          pre_callback: called before each attempt, once `active_slices` is set.

        Returns:
          The decorator.

        Raises:
          ValueError: `minimum_slice_count` outside 1..`spec.slices.count`.
          (from the wrapped call) ElasticRuntimeError: budget spent or slices
            not back within `timeout_s`; StopRequested: stop requested while
            waiting for slices.
        """
        from elastic_jax.controller.elastic.manager import job_retry_settings
        from elastic_jax.controller.elastic.policy import RestartBudget

        e = self.job.spec.elasticity
        settings = job_retry_settings(self.job.spec)
        if minimum_slice_count is not None:
            settings["minimum_slice_count"] = minimum_slice_count
        if timeout_s is not None:
            settings["timeout_s"] = timeout_s
            settings["startup_grace_s"] = min(settings["startup_grace_s"], timeout_s)
        policy = retry_policy or RestartBudget(e.max_restarts, e.max_restarts_per_slice)

        def on_event(error: Exception) -> None:
            event = self.record.elastic_event_of(error, self.slice_set, self.step)  # as the built-in loop books it
            if not self.keeps_state and event.cause in LOSES_DEVICE_STATE:
                self._state_lost = True  # the next attempt calls `recover` (the device copies went with the slice)
            self.watchdog.restart()  # a recovery may restore a checkpoint before its next step
            if on_elastic_event_callback is not None:
                on_elastic_event_callback(error)

        def before() -> None:
            self._attempt_slices = self.slice_set.active  # `map_sum`'s default: this attempt's slices
            self.metrics.active_slices.set(len(self.slice_set.active))
            self._book_next_step()
            self._phase = "Running"
            if pre_callback is not None:
                pre_callback()

        return self.manager.elastic_retry(
            **settings, retry_policy=policy, pre_callback=before, on_elastic_event_callback=on_event,
            cleanup=self._backend.cleanup if self._backend is not None else None)

    def check_scale_up(self) -> None:
        """At a step boundary: raises `ScaleUpSignalError` when a Ready slice waits to join a short mesh.

        A slice of the current attempt reported Down since it began is that loss first (`SliceDownError`,
        as `map_sum` raises it), even when it is Ready again by now: a Down and the Ready of its replacement
        both applied between two steps (a frozen or starved controller takes the reports it held together)
        made a short mesh with a Ready slice outside, and the loss was booked as a planned scale-up: no
        recovery, nothing charged to the restart budget, the device state it took not marked lost.

        Raises:
          SliceDownError: a slice of this attempt was reported Down since it began (`elastic_retry` retries,
            on it too if it is Ready again).
          ScaleUpSignalError: fewer than `spec.slices.count` slices train and
            another is Ready (`elastic_retry` then starts an attempt on more).
        """
        from elastic_jax.controller.elastic.errors import ScaleUpSignalError, SliceDownError

        if self._attempt_slices is not None:
            gone = sorted(self._attempt_slices - self.slice_set.active)
            if gone:
                raise SliceDownError(f"slices {gone} went down since this attempt began on slices "
                                     f"{sorted(self._attempt_slices)}", gone)
        joining = self.manager.available_inactive_slices()
        if joining:
            raise ScaleUpSignalError(f"slices {sorted(joining)} are ready to join")

    def map_sum(self, fn: Callable[[Any, Mapping[str, Any]], Any], params: Any,
                batch: Mapping[str, Any], active: Sequence[int] | None = None) -> Any:
        """cpu backend: `fn(params, chunk)` on the active slices' workers, summed over the chunks of `batch`.

        The global batch (a dict of arrays, leading axis = global batch size,
        at least `spec.slices.count` examples) is cut into `spec.slices.count`
        fixed chunks spread round robin over the active slices, so the sum does
        not depend on how many slices are up. `fn` must be jit-traceable and
        return sums (see `CpuBackend.map_sum`); its outputs come back as numpy
        arrays of the same tree, shapes and dtypes. Embedded in the built-in
        trainer (`HostParts`) it is the host backend's `map_sum`, on pathways
        too (one program over the active slices' mesh, replicated jax arrays).

        Args:
          fn: `(params, chunk) -> pytree of arrays`, jit-traceable; pass the same object every step.
          params: the parameter pytree.
          batch: the global batch.
          active: the slices to run on; default the slices `elastic_retry` started the current attempt
            on (before the first attempt: the active slices now). A slice of them reported Down since is
            a `SliceDownError` of this call, never skipped: the sum would silently run on fewer slices
            and the attempt would go on without the recovery (`elastic_retry` starts the next one).

        Raises:
          RuntimeError: a library runtime not on the cpu backend (pathways: run your jitted step on
            `jax.devices()` inside `elastic_retry`).
          SliceDownError: a slice was lost during the call or since the attempt began (`elastic_retry` retries).
          UserCodeError: `fn` failed the same way on every slice (not retried).
          StopRequested: a stop was requested.
        """
        if self._backend is None:
            raise RuntimeError(f"map_sum runs on the cpu backend; this job's spec.backend is {self.job.spec.backend}")
        if active is None:
            active = self.slice_set.active if self._attempt_slices is None else self._attempt_slices
        self._end_outside()
        with self._lock:
            self._on_slices += 1
        try:
            return self._backend.map_sum(fn, params, batch, sorted(active))
        finally:
            with self._lock:
                self._on_slices -= 1
                self._outside_since = time.monotonic()

    def report_step(self, step: int, loss: float | None = None) -> None:
        """Records a completed optimizer step for `GET /v1/status` and `/metrics` (the operator shows it).

        Raises:
          ValueError: `step` lower than the last one reported.
        """
        if step < self.step:
            raise ValueError(f"step {step} is lower than the last reported step {self.step}")
        previous = self.step
        if step > self.step:
            self._end_outside()
            self.record.step_completed()  # ends a pending recovery (its seconds), as the built-in loop's step does
            seconds = time.monotonic() - self._step_t0
            self._step_seconds.append((step, seconds, self._step_category))
            self.metrics.step_seconds.observe(seconds)
        with self._lock:
            self.step, self.loss = step, loss
            if self.initial_loss is None and loss is not None:
                self.initial_loss = loss
        self.metrics.step.set(step)
        if loss is not None:
            self.metrics.loss.set(loss)
        self.metrics.goodput.set(self.record.goodput() or 0.0)
        if step > previous:
            active = self.slice_set.active if self._attempt_slices is None else self._attempt_slices
            self.record.run_history.step(step, loss, len(active), self.slice_set.count)
        self._book_next_step()

    def set_phase(self, phase: str, failure_reason: str | None = None) -> None:
        """Sets the phase `/v1/status` shows (a `ControllerStatus` phase) and the failure reason.

        For a host that decides the run's phases itself (the built-in trainer: `Running` from the
        restore on, so a first wait for slices reads `WaitingForSlices`; its own final phase).
        """
        with self._lock:
            self._phase, self._failure_reason = phase, failure_reason

    def rewind(self, step: int) -> int:
        """Sets the step back to `step`: the state of the later steps was lost (pathways: restored from an
        older host snapshot or checkpoint); `report_step` continues from there.

        Returns:
          The steps lost (the old step minus `step`, >= 0).

        Raises:
          ValueError: `step` negative or beyond the current step.
        """
        with self._lock:
            if not 0 <= step <= self.step:
                raise ValueError(f"cannot rewind to step {step}: must be 0..{self.step}")
            lost, self.step = self.step - step, step
        self._snapshots.forget_after(step)  # (a snapshot of a later step is of a state no longer trained on)
        return lost

    # -- state lost with a slice (pathways) ------------------------------------

    @property
    def state_lost(self) -> bool:
        """True from a slice loss that took device state with it until `recover` ran.

        Only on a backend whose state lives on the slices' devices (pathways, a library program's own
        jitted step there): the attempt `elastic_retry` starts next must call `recover` before it
        places the state on the new mesh. Never true on the cpu backend (the state is this process's).
        """
        return self._state_lost

    def take_host_snapshot(self, step: int, state: Any, data: Mapping[str, Any] | None = None) -> bool:
        """Copies `state` to host memory (`jax.device_get`, on a background thread): every step while a copy
        fits in a step, and at least every `spec.elasticity.hostSnapshotIntervalSteps` steps.

        Call after `report_step(step, ...)`. The newest snapshot is what `recover` restores when it is
        newer than the last committed checkpoint (memory in well under a second instead of a storage
        read). A no-op on the cpu backend and when the interval is 0. Blocks only when a copy is due and
        the previous one is still in flight (`controller/snapshot.py` has the rule).

        Args:
          step: the step `state` belongs to (steps completed).
          state: a pytree of `jax.Array`s (any shardings); read until its copy lands (about a step): do not
            donate or delete it meanwhile.
          data: a small JSON dict (your data position), returned by `recover` as `data`.

        Returns:
          True when a copy was started.

        Raises:
          ValueError: `step` is beyond the reported step, or older than the newest snapshot's (the state
            would be restored under the wrong step).
        """
        if step > self.step:
            raise ValueError(f"take_host_snapshot(step={step}): beyond the reported step {self.step}; call it "
                             "after report_step(step)")
        snapshots = self._snapshots
        slow_before = snapshots.slow_copy
        taken = snapshots.maybe_take(step, state, self._data_state(step, data))
        if taken:
            self._step_t0 = time.monotonic()  # a wait for the previous copy is not the next step's time
        # (no advice for a loop that does not wait for its steps: its calls come microseconds apart, and a
        # copy there also waits for the steps queued before it, so neither figure is a step's or a copy's)
        if snapshots.slow_copy is not None and slow_before is None and snapshots.slow_copy[1] >= 1e-3:
            copy_s, step_s = snapshots.slow_copy
            every = snapshots.every_steps
            self.warn_setting(
                f"spec.elasticity.hostSnapshotIntervalSteps ({every}): a host snapshot of the state takes "
                f"{copy_s:.2f} s, longer than a step ({step_s:.3f} s), and training waits for it every {every} "
                f"steps; set it to {math.ceil(10 * copy_s / max(step_s, 1e-9))} or more to keep that under a tenth "
                f"of the time (0: no snapshots)")
        if snapshots.failing is not None:
            self.warn_setting(
                f"spec.elasticity.hostSnapshotIntervalSteps ({snapshots.every_steps}): every host snapshot "
                f"fails ({snapshots.failing}); was the state passed to take_host_snapshot donated or deleted "
                f"before its copy landed? Until one lands, a slice loss goes back to the last committed "
                f"checkpoint (0: no snapshots)")
        return taken

    def recover(self, target: Any, replica: Any = None) -> Restored:
        """Restores the state lost with a slice: the surviving replica, else the newer of the host snapshot and
        the last committed checkpoint.

        The built-in trainer's recovery (flow 1 on pathways), now the library's: a tie goes to the
        snapshot; with neither, `target` itself at step 0. The step is rewound to the restored one
        (`steps_lost` counts the difference; `report_step` continues from there), the seconds of the
        lost steps move from their ledger category to `recovering` (progress that did not last), and
        `state_lost` is cleared. A committed step that does not restore is skipped for the next
        older one, as `restore` does, without changing `resumedFrom`; when none restores, or only one
        older than the snapshot, the snapshot is used.

        Args:
          target: the initial state (pytree of `jax.Array`s or `jax.ShapeDtypeStruct`s with the
            state's structure): the shapes, dtypes and shardings a checkpoint is restored onto, and
            the state returned when nothing was saved.
          replica: the state of the current step rebuilt from the replicas on the surviving slices
            (pathways: `PathwaysBackend.recover_state`), or None when none survived. When given it is
            returned as it is at the current step: nothing is read, no step is lost (`steps_lost` += 0),
            and `target` is not used.

        Returns:
          `Restored(state, step, data)` (`replica`, the current step and {} when `replica` is given).
          A snapshot's `state` holds host (numpy) arrays: put them on
          the new mesh's devices (`jax.device_put` with your shardings) before the next step.

        Raises:
          CheckpointMismatchError: no committed step restores onto `target` and there is no snapshot.
          CheckpointForeignError: the newest committed step is another job's.
        """
        from elastic_jax.api.checkpoints import CheckpointMismatchError
        from elastic_jax.controller.snapshot import choose_restore_source

        ledger = self.record.ledger
        if replica is not None:
            self._snapshots.drop()  # (a copy in flight reads the old mesh's state, maybe a lost slice's)
            ledger.switch("recovering")
            self._recovered = True
            self._state_lost = False
            logging.getLogger(__name__).warning(
                "recovered the state of step %d from the surviving slices' replicas (0 steps lost)", self.step,
                extra={"event": "state_recovered", "source": "replica", "step": self.step, "steps_lost": 0})
            return Restored(replica, self.step, {})
        ledger.switch("restoring")
        # A copy in flight may hold the newest step (the one just completed): waited for, briefly.
        snap = self._snapshots.settle_after_loss()
        committed = self._run_checkpoints().checkpointer.last_committed_step
        restored = None
        if choose_restore_source(None if snap is None else snap.step, committed) == "checkpoint":
            try:
                restored = self._run_checkpoints().restore(target, during_run=True)
            except CheckpointMismatchError as e:
                if snap is None:
                    raise
                # No committed step restores (corrupt, NaN): the older snapshot still beats starting over.
                logging.getLogger(__name__).warning("no committed checkpoint restores (%s); using the host snapshot", e)
            if restored is not None and snap is not None and snap.step >= restored[2]:
                restored = None  # the newest steps did not restore, and the snapshot is newer than the one that did
        if restored is not None:
            source, (state, data_state, step) = "checkpoint", restored
            data = dict(data_state.get("data") or {})
        elif snap is not None:
            source, state, step, data = "snapshot", snap.state, snap.step, dict(snap.data_state.get("data") or {})
        else:  # neither (or the committed steps went since): start over
            source, state, step, data = "init", target, 0, {}
        for done_step, seconds, category in self._step_seconds:
            if done_step > step and category in ("productive", "reduced"):  # progress that did not last
                ledger.move(seconds, category, "recovering")
        self._step_seconds = collections.deque((x for x in self._step_seconds if x[0] <= step), maxlen=100_000)
        ledger.switch("recovering")
        lost = self.rewind(step)
        self.steps_lost += lost
        self._recovered = True
        self.metrics.steps_lost.inc(lost)
        self._state_lost = False
        logging.getLogger(__name__).warning("restored lost state from %s at step %d (%d steps lost)", source, step, lost,
                                            extra={"event": "state_recovered", "source": source, "step": step,
                                                   "steps_lost": lost})
        return Restored(state, step, data)

    def _book_next_step(self) -> None:
        """The goodput ledger's category from now to the next `report_step`: productive, reduced or recovering."""
        active, desired = len(self.slice_set.active), self.slice_set.count
        self._step_t0 = time.monotonic()  # the next step's seconds count from here (after a save, not during it)
        self._outside_since = self._step_t0
        if active:
            self._step_category = self.record.category(active, desired)
            self._step_capacity = min(1.0, active / desired)
            self.record.ledger.switch(self._step_category, capacity=self._step_capacity)

    # -- stalls in the controller's own code (issue 31 item 12) ---------------

    def _stall_notice_s(self) -> float:
        """How long the loop may stay in its own code before it counts as stalled: a step's deadline
        (`spec.elasticity.stepDeadlineSeconds`; `firstStepDeadlineSeconds` before this controller's first step)."""
        e = self.job.spec.elasticity
        return e.step_deadline_seconds if self._step_seconds else e.first_step_deadline_seconds

    def _stalled(self, phase: str) -> str | None:
        """Why the training loop is stuck in the controller's own code (not waiting on a slice) for longer than a
        step may take; None while it is not (or not training: phase other than Running/Recovering)."""
        from elastic_jax.controller.watchdog import WATCHED_PHASES

        with self._lock:
            on_slices, since, step = self._on_slices, self._outside_since, self.step
        # (cpu backend only: there the slices' part of a step is `map_sum`, and what lies outside it is the
        # controller's own; on pathways the step runs on the devices from the controller's own code)
        if on_slices or phase not in WATCHED_PHASES or self.job.spec.backend != "cpu":
            return None
        idle, notice = time.monotonic() - since, self._stall_notice_s()
        if idle <= notice:
            return None
        field = "stepDeadlineSeconds" if self._step_seconds else "firstStepDeadlineSeconds"
        return (f"stalled: the training loop has been in the controller's own code for {idle:.0f} s after step {step} "
                f"(phase {phase}), not waiting on any slice, longer than a step may take "
                f"(spec.elasticity.{field}={notice:g} s): a blocking data read, a deadlock in user code?")

    def _book_stall(self, reason: str) -> None:
        """Books the stall's seconds (from when the loop left the slices) `stalled`, not productive; logs it once."""
        ledger = self.record.ledger
        with self._lock:  # (not if the loop moved on since `_stalled` looked)
            if self._on_slices or time.monotonic() - self._outside_since <= self._stall_notice_s():
                return
            if ledger.current in ("productive", "reduced"):
                ledger.switch("stalled", at=self._outside_since)
        if not self._stall_logged:
            self._stall_logged = True
            logging.getLogger(__name__).warning("%s", reason, extra={"event": "stall_noticed", "step": self.step})

    def _end_outside(self) -> None:
        """The loop leaves its own code (a `map_sum`, a completed step): time it spent there past the notice
        bound is booked `stalled`, and booking goes back to the step's category from now."""
        ledger = self.record.ledger
        with self._lock:
            now, since = time.monotonic(), self._outside_since
            if (self.job.spec.backend == "cpu" and now - since > self._stall_notice_s()
                    and ledger.current in ("productive", "reduced")):
                ledger.switch("stalled", at=since)
            ended = ledger.current == "stalled"
            if ended:
                ledger.switch(self._step_category, at=now, capacity=self._step_capacity)
            self._outside_since = now
        if ended:
            logging.getLogger(__name__).warning(
                "the training loop went on after %.0f s in the controller's own code", now - since,
                extra={"event": "stall_ended", "step": self.step, "seconds": round(now - since, 3)})
        self._stall_logged = False

    def status(self):
        """The `ControllerStatus` served at `GET /v1/status` (a read the final-status handoff counts)."""
        status = self.snapshot()
        self._handoff.served()
        return status

    def snapshot(self):
        """The current `ControllerStatus`, without counting as a supervisor's read (the watchdog's view)."""
        from elastic_jax.api.control import ControllerStatus

        active = sorted(self.slice_set.active)
        with self._lock:
            step, loss, initial_loss = self.step, self.loss, self.initial_loss
        phase = self.record.live_phase(self._phase, self.manager.waiting)
        stalled = self._stalled(phase)
        if stalled:
            self._book_stall(stalled)
        return ControllerStatus(
            phase=phase, step=step, total_steps=self.job.spec.training.steps,
            desired_slices=self.slice_set.count, min_slices=self.job.spec.slices.minimum, active_slices=active,
            inactive_slices=[i for i in range(self.slice_set.total) if i not in active],
            slices=self.slice_set.statuses(), loss=loss, initial_loss=initial_loss, pid=os.getpid(),
            recoveries=self.record.counts(), recovery_history=self.record.history(),
            goodput=self.record.goodput(), goodput_seconds=self.record.ledger.seconds(),
            failure_reason=self._failure_reason,
            last_committed_checkpoint_step=None if self._checkpoints is None else self._checkpoints.last_committed_step,
            resumed_from=self._resumed_from(), steps_lost=self.steps_lost,
            setting_warnings=self._all_setting_warnings(), stalled=stalled,
        )

    def warn_setting(self, line: str) -> None:
        """Adds `line` (one line naming the spec field it is about) to the status's `setting_warnings`, once:
        `elastic-jax run` prints it as a `warning:` line on the run's own output; the operator copies it to
        `status.settingWarnings` and posts it as a Warning Event. Kept for the rest of the run."""
        with self._lock:
            if line not in self._setting_warnings:
                self._setting_warnings.append(line)

    def _all_setting_warnings(self) -> list[str]:
        """`warn_setting`'s lines, then the backend's; at most the 8 the status holds (`ControllerStatus`)."""
        with self._lock:
            own = list(self._setting_warnings)
        return (own + list(getattr(self._backend, "setting_warnings", None) or []))[:8]

    def stall_reason(self) -> str | None:
        """None while the program makes progress, else why it is stuck; `/healthz` answers 503 with it.

        The built-in trainer's no-progress watchdog (`controller/watchdog.py`): in phase Running or
        Recovering (inside `elastic_retry`, not while waiting for slices), no `report_step` with a
        new step for `spec.elasticity.progressTimeoutSeconds` (0 disables) is a stall, logged once.
        """
        status = self.snapshot()  # a liveness probe is not the supervisor reading the final status
        return self.watchdog.stall_reason(status.phase, status.step)

    # -- checkpoints ---------------------------------------------------------

    def _resumed_from(self) -> dict | None:
        return None if self._checkpoints is None else self._checkpoints.resumed_from

    def _run_checkpoints(self):
        """The job's `RunCheckpoints`, opened on first use (`spec.checkpoint`: location checked, created)."""
        if self._checkpoints is None:
            from elastic_jax.api.identity import identity_from_env
            from elastic_jax.controller.run_checkpoints import RunCheckpoints, job_checkpointer

            checkpointer = self._checkpointer
            if checkpointer is None:
                writer = identity_from_env(self._environ, self.job.metadata.name, self.job.spec.checkpoint.uri)
                checkpointer = job_checkpointer(self.job, self.metrics, writer)
            self._checkpoints = RunCheckpoints(self.job.spec, checkpointer, self.record.ledger, self.metrics)
        return self._checkpoints

    @property
    def checkpoints(self):
        """The job's `RunCheckpoints` (`controller/run_checkpoints.py`), opened on first use.

        Raises:
          CheckpointUriError: `spec.checkpoint.uri` is unusable (first use only).
        """
        return self._run_checkpoints()

    @property
    def last_committed_checkpoint_step(self) -> int | None:
        """The newest checkpoint step known committed (None before any, or before `restore`/`save` was called)."""
        return None if self._checkpoints is None else self._checkpoints.last_committed_step

    def restore(self, target: Any) -> Restored:
        """Restores the newest committed checkpoint of `spec.checkpoint.uri` onto `target`; call before training.

        The built-in trainer's restore (`RunCheckpoints.restore`): a step another job wrote is refused
        unless `spec.checkpoint.resumeFrom` is Any; a step that does not restore (corrupt, other shapes,
        NaN/inf) is skipped for the next older one, named in `/v1/status`'s `resumedFrom`. The step,
        loss and initial loss saved with it become `step`, `loss`, `initial_loss` (so `report_step`
        continues from there), and `restored_from_step` is set.

        Args:
          target: the initial state: a pytree of `jax.Array`s (or `jax.ShapeDtypeStruct`s) with the
            saved state's structure; the restored arrays get its shapes, dtypes and shardings (a single
            device's as the same placement's `NamedSharding`). On pathways place it on your mesh with
            `NamedSharding`s: Orbax's Pathways array handler restores only onto those.

        Returns:
          `Restored(state, step, data)`; `Restored(target, 0, {})` when nothing is committed.

        Raises:
          CheckpointUriError: `spec.checkpoint.uri` is unusable (first use only).
          CheckpointForeignError: the step to resume from is another job's.
          CheckpointMismatchError: a committed step is beyond `spec.training.steps`, or no committed
            step restores onto `target`.
        """
        restored = self._run_checkpoints().restore(target)
        if restored is None:
            return Restored(target, 0, {})
        state, data_state, step = restored
        with self._lock:
            self.step, self.restored_from_step = step, step
            self.loss, self.initial_loss = data_state.get("loss"), data_state.get("initial_loss")
        self.metrics.step.set(step)
        logging.getLogger(__name__).info("restored checkpoint step %d", step)
        return Restored(state, step, dict(data_state.get("data") or {}))

    def save(self, step: int, state: Any, data: Mapping[str, Any] | None = None, force: bool = False) -> bool:
        """Saves `state` as checkpoint `step` when due: every `spec.checkpoint.intervalSteps`, or `force`.

        Asynchronous (Orbax; the built-in trainer's `RunCheckpoints.maybe_save`): returns once the arrays
        are copied off the device; its time is booked `checkpointing` in the goodput ledger. With
        `force` it saves whatever the interval and waits until the step committed: the final save
        (exit 0 only after it) and the save before a stop. A step not newer than the last saved one
        is skipped. `close()` waits for a save in flight; if that one failed, a run that reached
        `spec.training.steps` ends Failed ("final checkpoint failed: ...").

        Args:
          step: the step the state belongs to (steps completed, >= 0).
          state: a pytree of `jax.Array`s (any shapes, dtypes, shardings); do not donate or delete its
            arrays before the next `save` returns.
          data: a small JSON-serializable dict saved with the step (e.g. your data position),
            returned by `restore` as `data`.
          force: save now and wait for the commit.

        Returns:
          True when a save was started (and, with `force`, committed).

        Raises:
          CheckpointUriError: `spec.checkpoint.uri` is unusable (first use only).
          CheckpointSaveError: this forced save or the previous background save failed.
        """
        checkpoints = self._run_checkpoints()
        data_state = self._data_state(step, data)
        if force:
            started = checkpoints.save_and_wait(step, state, data_state)
        else:
            started = checkpoints.maybe_save(step, state, data_state)
        self._book_next_step()  # back from `checkpointing` to the step's category
        return started

    def _data_state(self, step: int, data: Mapping[str, Any] | None) -> dict[str, Any]:
        """What is saved beside the state: the step, the losses `restore` gives back, the user's `data`."""
        return {"next_batch_index": step, "initial_loss": self.initial_loss, "loss": self.loss,
                "data": dict(data or {})}

    def check_drain(self, step: int, state: Any, data: Mapping[str, Any] | None = None) -> None:
        """Flow 4 at a step boundary: a slice reported Draining (about to be preempted) is let go after a save.

        When an active slice drains, saves `state` as `step` (with `data`, as `save(..., force=True)`)
        while every slice still exists, waits for the commit, then raises; `elastic_retry` continues
        on the other slices (or waits for them), as the built-in trainer does
        (`RunCheckpoints.drain`). Does nothing (and opens no checkpointer) while no active slice drains.

        Raises:
          SliceDownError: cause `draining`, naming the draining slices (`elastic_retry` retries).
          CheckpointUriError, CheckpointSaveError: as `save`.
        """
        if self.slice_set.draining_active():
            self._run_checkpoints().drain(self.slice_set, step, state, self._data_state(step, data))

    def check_finite(self, step: int, loss: float | None = None, state: Any = None,
                     finite: bool | None = None) -> None:
        """Stops a run whose loss or state turned NaN/inf, as the built-in trainer does (before saving it).

        Args:
          step: the step just computed (for the message).
          loss: its loss (a Python or numpy scalar), or None.
          state: the new state (a pytree), or None; every floating-point leaf is checked.
          finite: `bool(all_finite(new_state))` when the loop computed it already (inside its jitted
            update, as the built-in trainer does); `state` is then not checked again.

        Raises:
          FloatingPointError: the loss or a state leaf is NaN or inf (message names the step and the
            last committed checkpoint step); `elastic_retry` does not retry it.
        """
        from elastic_jax.controller.numerics import all_finite, check_step_finite

        if finite is None and state is not None:
            finite = bool(all_finite(state))
        check_step_finite(step, loss, finite, self.last_committed_checkpoint_step)


def connect(environ: Mapping[str, str] | None = None) -> Runtime:
    """Builds the job's `Runtime` from the environment and starts its control API.

    Reads what the operator sets in the controller pod and `elastic-jax run`
    sets locally: `ELASTIC_JAX_MANIFEST` (required), `ELASTIC_JAX_TOKEN_FILE`
    or `ELASTIC_JAX_TOKEN` (required), `ELASTIC_JAX_HOST` (default 0.0.0.0),
    `ELASTIC_JAX_PORT` (default 8080), `ELASTIC_JAX_MANIFEST_SHA256` (checked
    when set), `ELASTIC_JAX_SUMMARY_FILE` (where `close()` writes the run
    summary; `elastic-jax run` sets it, the operator does not).

    Args:
      environ: the environment (default `os.environ`).

    Returns:
      The started runtime (close it, or use it as a context manager).

    On the pathways backend it first registers Pathways with JAX and connects
    to the proxy (`controller/pathways_connect.initialize`: persistence on,
    `pathwaysutils.initialize()`, `jax.devices()`), before anything touches a
    JAX backend; calling `pathwaysutils.initialize()` again afterwards (MaxText
    does) is a no-op.

    Raises:
      RuntimeConfigError: a variable missing or bad, a manifest that does not
        validate or does not match its digest, a port that cannot be bound,
        or pathwaysutils missing on the pathways backend; the message names which.
      SystemExit: code 75 (`ControllerExit.RESTART`) when the Pathways proxy
        did not answer within its client's connection timeout: a controller
        loss (the operator starts the controller again), not a failure of the job.
    """
    from elastic_jax.api.manifest import ManifestError, load_manifest
    from elastic_jax.api.manifest_digest import check_digest
    from elastic_jax.controller.settings import ControllerSettings, pin_host_devices

    env = os.environ if environ is None else environ
    try:
        settings = ControllerSettings.build(env)  # (the built-in controller's reader of the same variables)
        job = load_manifest(settings.manifest)
        check_digest(job, settings.manifest_sha256, settings.manifest)
        token = settings.token()
    except (ManifestError, ValueError) as e:  # (SettingsError is a ValueError)
        raise RuntimeConfigError(str(e)) from None
    # As the built-in controller does (effective only before jax loads).
    pin_host_devices(job.spec.backend, job.spec.slices.devices_per_host)
    if job.spec.backend == "pathways":
        _initialize_pathways()
    return Runtime(job, token, host=settings.host, port=settings.port, summary_file=settings.summary_file,
                   environ=env).start()


def _initialize_pathways() -> None:
    """`pathways_connect.initialize`, with its failures as `connect` reports them (see there)."""
    from elastic_jax.controller import pathways_connect
    from elastic_jax.exit_codes import ControllerExit

    try:
        pathways_connect.initialize()
    except ImportError as e:
        raise RuntimeConfigError(f"spec.backend pathways: {e}") from None
    except pathways_connect.ProxyUnavailableError as e:
        logging.getLogger(__name__).error("controller lost: %s", e, extra={"event": "controller_lost", "reason": str(e)})
        raise SystemExit(int(ControllerExit.RESTART)) from e
