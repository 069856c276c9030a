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
  `stop_requested` for `POST /v1/stop` and SIGTERM.

The API is documented in docs/bring-your-own-loop.md.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from elastic_jax import contract


class RuntimeConfigError(ValueError):
    """The runtime cannot start: a missing or bad manifest, token, digest or port (message names which)."""


def _read_token(token_file: str | None, token: str | None) -> str:
    if token_file:
        try:
            value = Path(token_file).read_text().strip()
        except OSError as e:
            raise RuntimeConfigError(f"{contract.ENV_TOKEN_FILE} {token_file}: {e.strerror}") from None
    else:
        value = (token or "").strip()
    if not value:
        raise RuntimeConfigError(f"no control-API token: set {contract.ENV_TOKEN_FILE} or {contract.ENV_TOKEN}")
    return value


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
        signal; None while no stop was requested.
      step: the last step given to `report_step` (0 before).
      initial_loss: the first loss given to `report_step` by this process (None before).
      record: the elastic events, recovery times, goodput ledger and steps run
        (`controller/run_record.py`, the same books the built-in trainer keeps).
      port: the control API's port once started.

    Raises:
      ValueError: empty token.
    """

    def __init__(self, job: Any, token: str, host: str = "127.0.0.1", port: int = 0,
                 summary_file: str | None = None):
        from elastic_jax.controller.elastic.manager import Manager
        from elastic_jax.controller.elastic.slice_set import SliceSet
        from elastic_jax.controller.metrics import ControllerMetrics
        from elastic_jax.controller.run_record import RunRecord

        self._started = time.monotonic()

        if not token:
            raise ValueError("the control API needs a non-empty bearer token")
        self.job = job
        self._token = token
        self.slice_set = SliceSet(job.spec.slices.count, job.spec.slices.spares)
        self.metrics = ControllerMetrics()
        self.metrics.desired_slices.set(self.slice_set.count)
        self.stop_requested = threading.Event()
        self.stop_exit_code: int | None = None
        self._backend = self._build_backend()
        self.record = RunRecord(self.metrics, self._started)
        self.manager = Manager(
            self.slice_set,
            health_check=self._backend.health_check if self._backend is not None else None,
            stop_event=self.stop_requested,
            on_wait=self.record.on_wait,
        )
        self.step = 0
        self.loss: float | None = None
        self.initial_loss: float | None = None
        self._lock = threading.Lock()
        self._phase = "Starting"
        self._failure_reason: str | None = None
        self._summary_file = summary_file
        self._closed = False
        self._host, self.port = host, port
        self._server = None
        from elastic_jax.controller.final_status import FinalStatusHandoff

        # A program that ends right after its last `report_step` would often exit before the
        # supervisor's next poll (1 s): its last step would never reach the summary or the job status.
        self._handoff = FinalStatusHandoff()

    def _build_backend(self):
        if self.job.spec.backend != "cpu":
            return None
        from elastic_jax.controller.backend_cpu import CpuBackend

        e = self.job.spec.elasticity
        return CpuBackend(None, self.slice_set, devices_per_host=self.job.spec.slices.devices_per_host,
                          step_deadline_s=e.step_deadline_seconds,
                          first_step_deadline_s=e.first_step_deadline_seconds, token=self._token)

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> Runtime:
        """Serves the control API from a background thread; returns self once it listens (then /readyz is 200).

        Raises:
          RuntimeConfigError: the port cannot be bound.
        """
        from elastic_jax.controller.control_api import ControlApiServer, create_app

        app = create_app(self.slice_set, self.status, self.metrics, self._token, ready=lambda: True,
                         stop=self._on_stop)
        self._server = ControlApiServer(app, host=self._host, port=self.port)
        try:
            self._server.start()
        except RuntimeError as e:
            raise RuntimeConfigError(str(e)) from None
        self.port = self._server.port
        atexit.register(self.close)  # a program that never calls close() still writes its summary
        return self

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

    def _on_stop(self, reason: str, requested: bool = True) -> bool:
        from elastic_jax.exit_codes import ControllerExit

        del reason
        if self.stop_exit_code is None:
            self.stop_exit_code = int(ControllerExit.STOPPED if requested else ControllerExit.RESTART)
        self.stop_requested.set()  # a wait for slices sees it within the manager's poll interval (1 s)
        if self._backend is not None:
            self._backend.interrupt()
        return True

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
        self._finish(error, exit_code)
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

    def _finish(self, error: BaseException | None, exit_code: int | None = None) -> None:
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
        self._phase = phase
        if not self._summary_file:
            return
        summary = RunSummary(
            succeeded=phase == "Succeeded", steps=self.step, total_steps=total, initial_loss=self.initial_loss,
            final_loss=self.loss, recoveries=[r.model_dump(mode="json") for r in self.record.history()],
            steps_lost=None, goodput=self.record.goodput(), goodput_seconds=self.record.ledger.seconds(),
            restored_from_step=None, last_committed_checkpoint_step=None, failure_reason=self._failure_reason,
            wall_seconds=time.monotonic() - self._started, pid=os.getpid(),
            stop={ControllerExit.STOPPED: "requested", ControllerExit.RESTART: "signal"}.get(self.stop_exit_code),
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
            from elastic_jax.controller.elastic.errors import ScaleUpSignalError

            if isinstance(error, ScaleUpSignalError):
                cause, slices = "scale_up", sorted(self.slice_set.available_inactive())
            else:
                cause, slices = getattr(error, "cause", "slice_down"), list(getattr(error, "slice_indices", ()))
            # as the built-in loop: a hang's recovery counts from when the stuck step was sent
            self.record.elastic_event(cause, slices, self.step, getattr(error, "failed_since", None))
            if on_elastic_event_callback is not None:
                on_elastic_event_callback(error)

        def before() -> None:
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

        Raises:
          ScaleUpSignalError: fewer than `spec.slices.count` slices train and
            another is Ready (`elastic_retry` then starts an attempt on more).
        """
        from elastic_jax.controller.elastic.errors import ScaleUpSignalError

        joining = self.manager.available_inactive_slices()
        if joining:
            raise ScaleUpSignalError(f"slices {sorted(joining)} are ready to join")

    def map_sum(self, fn: Callable[[Any, Mapping[str, Any]], Any], params: Any,
                batch: Mapping[str, Any]) -> Any:
        """cpu backend: `fn(params, chunk)` on the active slices' workers, summed over the chunks of `batch`.

        The global batch (a dict of arrays, leading axis = global batch size,
        at least `spec.slices.count` examples) is cut into `spec.slices.count`
        fixed chunks spread round robin over the active slices, so the sum does
        not depend on how many slices are up. `fn` must be jit-traceable and
        return sums (see `CpuBackend.map_sum`); its outputs come back as numpy
        arrays of the same tree, shapes and dtypes.

        Raises:
          RuntimeError: not the cpu backend (pathways: run your jitted step on
            `jax.devices()` inside `elastic_retry`).
          SliceDownError: a slice was lost during the call (`elastic_retry` retries).
          UserCodeError: `fn` failed the same way on every slice (not retried).
          StopRequested: a stop was requested.
        """
        if self._backend is None:
            raise RuntimeError(f"map_sum runs on the cpu backend; this job's spec.backend is {self.job.spec.backend}")
        return self._backend.map_sum(fn, params, batch, sorted(self.slice_set.active))

    def report_step(self, step: int, loss: float | None = None) -> None:
        """Records a completed optimizer step for `GET /v1/status` and `/metrics` (the operator shows it).

        Raises:
          ValueError: `step` lower than the last one reported.
        """
        if step < self.step:
            raise ValueError(f"step {step} is lower than the last reported step {self.step}")
        if step > self.step:
            self.record.step_completed()  # ends a pending recovery (its seconds), as the built-in loop's step does
        with self._lock:
            self.step, self.loss = step, loss
            if self.initial_loss is None and loss is not None:
                self.initial_loss = loss
        self.metrics.step.set(step)
        if loss is not None:
            self.metrics.loss.set(loss)
        self.metrics.goodput.set(self.record.goodput() or 0.0)
        self._book_next_step()

    def _book_next_step(self) -> None:
        """The goodput ledger's category from now to the next `report_step`: productive, reduced or recovering."""
        active, desired = len(self.slice_set.active), self.slice_set.count
        if active:
            self.record.ledger.switch(self.record.category(active, desired), capacity=min(1.0, active / desired))

    def status(self):
        """The `ControllerStatus` served at `GET /v1/status`."""
        from elastic_jax.api.control import ControllerStatus

        active = sorted(self.slice_set.active)
        with self._lock:
            step, loss, initial_loss = self.step, self.loss, self.initial_loss
        phase = self._phase
        if phase == "Running" and self.manager.waiting:
            phase = "WaitingForSlices"
        elif phase == "Running" and self.record.recovering:
            phase = "Recovering"
        status = ControllerStatus(
            phase=phase, step=step, total_steps=self.job.spec.training.steps,
            desired_slices=self.slice_set.count, min_slices=self.job.spec.slices.minimum, active_slices=active,
            inactive_slices=[i for i in range(self.slice_set.total) if i not in active],
            slices=self.slice_set.statuses(), loss=loss, initial_loss=initial_loss, pid=os.getpid(),
            recoveries=self.record.counts(), recovery_history=self.record.history(),
            goodput=self.record.goodput(), goodput_seconds=self.record.ledger.seconds(),
            failure_reason=self._failure_reason,
        )
        self._handoff.served()
        return status


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

    Raises:
      RuntimeConfigError: a variable missing or bad, a manifest that does not
        validate or does not match its digest, or a port that cannot be bound;
        the message names which.
    """
    from elastic_jax.api.manifest import ManifestError, load_manifest
    from elastic_jax.api.manifest_digest import DIGEST_ENV, check_digest

    env = os.environ if environ is None else environ
    path = env.get(contract.ENV_MANIFEST)
    if not path:
        raise RuntimeConfigError(f"{contract.ENV_MANIFEST} is not set (the operator or elastic-jax run sets it)")
    try:
        job = load_manifest(path)
        check_digest(job, env.get(DIGEST_ENV), path)
    except (ManifestError, ValueError) as e:
        raise RuntimeConfigError(str(e)) from None
    token = _read_token(env.get(contract.ENV_TOKEN_FILE), env.get(contract.ENV_TOKEN))
    raw_port = env.get(contract.ENV_PORT, str(contract.CONTROLLER_PORT))
    if not raw_port.isdigit() or not 0 <= int(raw_port) <= 65535:
        raise RuntimeConfigError(f"{contract.ENV_PORT} {raw_port!r}: must be 0..65535")
    if job.spec.backend == "cpu":
        # As the built-in controller does: the exported per-slice program records the device count,
        # so this process must see as many devices as a worker host (effective only before jax loads).
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        if job.spec.slices.devices_per_host > 1:
            flag = f"--xla_force_host_platform_device_count={job.spec.slices.devices_per_host}"
            os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + flag).strip()
    return Runtime(job, token, host=env.get(contract.ENV_HOST, "0.0.0.0"), port=int(raw_port),
                   summary_file=env.get(contract.ENV_SUMMARY_FILE) or None).start()
