"""The local launcher: plays the operator's part on one machine.

It starts the controller, waits until it is ready (so a bad trainer config or
checkpoint URI stops everything before any worker starts), starts one CPU
slice worker per slice, and then supervises: a worker that dies is reported
`Down` to the controller at once and restarted (after 1 s; with exponential
backoff only while it keeps dying before it is Ready: a crash loop, not a
lost worker, which under a failure every few seconds must not wait 30 s); when
its port accepts connections it is reported `Ready` with its new address —
the same `PUT /v1/slices/{i}` calls, with increasing generations, that the
operator makes in a cluster. A controller that exits without ending the job
(`elastic_jax.exit_codes.ends_job` is false: killed by a signal, or exit
`RESTART` after a SIGTERM that was not the launcher's) is restarted (it
resumes from its last committed checkpoint) and told about the live workers
again. Only the launcher's own stop (Ctrl-C or SIGTERM to `elastic-jax run`)
ends a running job early: it sends `POST /v1/stop` first, so the controller
abandons its step, checkpoints and exits `STOPPED`, then stops every process. Optionally it injects a failure: SIGKILL (or SIGSTOP) of one
worker once training passes a given step.

What it decides is the supervision core's (`elastic_jax.supervision`), which
the operator drives too: a slice's state from what its worker process shows,
the generations, the replace rule, the restart delay, and the budgets (worker
deaths against `spec.elasticity.maxRestartsPerSlice`/`maxRestarts`, which
stop the job `Failed` naming the budget; controller restarts within
`maxRestarts`). This module only turns processes into observations and
carries out the result.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import logging
import os
import secrets
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

from elastic_jax import contract, timeline
from elastic_jax.api import checkpoints, identity
from elastic_jax.api.client import ControlApiError, ControlClient
from elastic_jax.api.control import ENDED_PHASES, ControllerStatus
from elastic_jax.api.job import ElasticTrainingJob
from elastic_jax.exit_codes import ControllerExit, ends_job
from elastic_jax.logs import read_events
from elastic_jax.local import run_folder
from elastic_jax.local.processes import (Child, UnsafeDirectoryError, describe_exit, free_port, open_private, port_open,
                                         private_dir, venv_script, wait_until, write_private_file)
from elastic_jax.supervision import backoff, budgets, controller_watch
from elastic_jax.supervision import steps_lost as steps_lost_rule
from elastic_jax.supervision.slice_state import Observation, SliceState, controller_saw_down, down_cause, \
    next_generation, next_slice_state, reported

_logger = logging.getLogger(__name__)

# Set in the environment of every process the launcher starts (see `_child_env`).
RUN_DIR_ENV = contract.ENV_RUN_DIR
# Seconds a worker the controller reports down may take to end by itself before the launcher SIGKILLs it: a
# worker stopped by SIGTERM closes its server first (the controller's RPCs fail at once), then exits 143.
EXIT_GRACE_S = 3.0


class LaunchError(RuntimeError):
    """The job could not be started (bad input found by the controller, or a port/process problem).

    `str()` is the one-line message for the user; `exit_code` is 2 for bad input.
    """

    def __init__(self, message: str, exit_code: int = 2):
        super().__init__(message)
        self.exit_code = exit_code


@dataclasses.dataclass
class LaunchOptions:
    """How to run a job locally.

    Attributes:
      workdir: logs, token, summary and the final metrics scrape go here.
      kill_at_step: inject a worker failure once this many steps are done (None: no failure).
      kill_slice: which slice's worker to kill; None: the highest-indexed active slice at the kill step
        (with hot spares, never a spare).
      kill_signal: SIGKILL (process death) or SIGSTOP (hang, caught by the step deadline).
      restart_backoff_s: the delay before a crash-looping worker's second start (seconds); doubles per further
        death before Ready (cap 30 s). A worker that was Ready when it died is restarted at once, every time
        (`supervision.budgets.restart_delay_s`, the kubelet's rule).
      ready_timeout_s: seconds to wait for the controller's /readyz.
      max_controller_restarts: controller restarts allowed (flow 3) before giving up; None: the job's
        `spec.elasticity.maxRestarts`, as the operator allows (`supervision.budgets`).
      fresh: the first controller deletes the local checkpoints once its trainer and
        checkpoint location check out (a restarted controller never does: it resumes).
      lock_fds: the run's lock file descriptors (`RunLock.fd`, `CheckpointLock.fd`), inherited by every
        controller process: a controller outlives a SIGKILLed launcher while it checkpoints on the SIGTERM
        its parent's death sends it, and the next run must not start a second writer of the same
        checkpoints meanwhile (`RunLock` waits for it).
    """

    workdir: Path
    kill_at_step: int | None = None
    kill_slice: int | None = None
    kill_signal: int = signal.SIGKILL
    restart_backoff_s: float = 1.0
    ready_timeout_s: float = 300.0
    max_controller_restarts: int | None = None
    fresh: bool = False
    lock_fds: tuple[int, ...] = ()


@dataclasses.dataclass
class _Slice:
    """One slice: its worker process and its state in the supervision core's terms."""

    index: int
    child: Child
    port: int = 0
    generation: int = 0  # the last generation sent (`next_generation` stays above it)
    ready_generation: int | None = None  # generation of the Ready the current controller accepted
    state: SliceState = "Provisioning"
    listening: bool = False  # this worker process accepted a connection (it was Ready)
    consecutive_failures: int = 0  # deaths since it was last Ready (the crash-loop backoff)
    deaths: int = 0  # worker deaths the launcher did not cause: the slice's replacements, against the budgets
    restart_at: float | None = None
    # The reported state the controller has not taken yet (its answer failed: unreachable, or slower than
    # the client's deadline, when uvicorn drops the request of a client that gave up), and when it is
    # sent again (monotonic seconds). Without this a lost `Ready` was never sent again: the slice's state
    # did not change, so no report followed, and the restarted worker never rejoined (`scale_ups: 0`).
    unsent: tuple[str, str | None] | None = None
    resend_at: float = 0.0
    # Why the launcher itself SIGKILLed the current worker (its report names that, not only the signal).
    killed_because: str | None = None




def control_api_line(port: int, token_file: Path) -> str:
    """The line `elastic-jax run` prints when a controller is ready: its control API's URL on loopback (`port`)
    and the file holding the bearer token (`token_file`); the token itself is never printed."""
    return f"control API: http://127.0.0.1:{port} (token: {token_file})"


@contextlib.contextmanager
def stopping_signals():
    """While the launcher stops everything, a second Ctrl-C or SIGTERM only says the stop is under way.

    Without this, a second Ctrl-C raised KeyboardInterrupt inside `stop_all`: the
    controller's checkpoint and the SUMMARY were cut short and the CLI said no
    process had started. The stop is bounded anyway (the controller's stop and
    grace, then SIGKILL). Only the main thread can set signal handlers; elsewhere
    this does nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def say(signum, _frame):
        print(f"{signal.Signals(signum).name}: already stopping (the controller checkpoints its last step, then "
              "every process is stopped; at most about a minute)", file=sys.stderr, flush=True)

    previous = {sig: signal.signal(sig, say) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


class LocalLauncher:
    """Runs one `ElasticTrainingJob` with local processes.

    Args:
      job: the validated manifest.
      manifest_path: passed to the controller process.
      options: see `LaunchOptions`.
      on_status: called with each polled `ControllerStatus` (progress display).
      on_message: called with a line for the progress output (a controller that stopped answering, and
        when it answers again); default: logged as a warning.
    """

    def __init__(
        self,
        job: ElasticTrainingJob,
        manifest_path: Path,
        options: LaunchOptions,
        on_status: Callable[[ControllerStatus], None] | None = None,
        on_message: Callable[[str], None] | None = None,
    ):
        self.job = job
        self.manifest_path = manifest_path
        self.options = options
        self.on_status = on_status or (lambda status: None)
        self.on_message = on_message or (lambda line: _logger.warning("%s", line))
        self.workdir = options.workdir
        self.token = secrets.token_urlsafe(24)
        self.controller_port = 0
        self.controller: Child | None = None
        self._last_status: ControllerStatus | None = None  # the newest status polled (library mode's summary)
        self.controller_pids: list[int] = []
        self.slices: list[_Slice] = []
        self.client: ControlClient | None = None
        self.killed: dict[str, Any] | None = None
        self.last_status: ControllerStatus | None = None
        self._controller_log_offset = 0  # where the current controller's lines begin in its (appended) log
        self._last_metrics_scrape = 0.0
        self._cleared = False
        self._previous_recoveries: list[dict[str, Any]] = []
        # The dead controllers' goodput ledgers summed, with the steps their successors redid re-booked
        # `recovering` (`supervision.steps_lost`, as the operator re-books them), and their reduced seconds'
        # equivalent; `_earlier_stepped`: one of them completed a step (else goodput is n/a).
        self._earlier_seconds: dict[str, float] = {}
        self._earlier_equivalent = 0.0
        self._earlier_stepped = False
        # The step the run's first controller resumed from (what the earlier ledgers trained from), once known.
        self._trained_from: int | None = None
        # The same, kept as it was (`_trained_from` moves down when a successor resumed from an older step).
        self._started_from: int | None = None
        # A live controller that stopped answering (`supervision.controller_watch`): when the current one last
        # answered (None: not yet, or it is new), the spell in progress once past the grace, every spell of
        # the run (the summary's `controller_unresponsive`), and the seconds of the spells the live
        # controller's ledger booked as training (it answered again after them), re-booked at the summary.
        self._answered_at: float | None = None
        self._unresponsive: dict[str, Any] | None = None
        self.controller_unresponsive: list[dict[str, Any]] = []
        self._frozen_training_s = 0.0
        self._frozen_reduced_s = 0.0  # (of those, the seconds frozen while training on fewer slices than desired)
        # One entry per controller that ended without ending the job (see `_carry_over_from_dead_controller`).
        self.controller_losses: list[dict[str, Any]] = []
        self.kill_skipped: str | None = None
        # Why the launcher ended the job: its slices' replacements exceeded a budget (`supervision.budgets`).
        self.budget_failure: str | None = None

    # -- setup ----------------------------------------------------------------

    def _child_env(self) -> dict[str, str]:
        """Marks every child with its run directory, so a leftover process can always be traced to its run."""
        return {RUN_DIR_ENV: str(self.workdir.resolve())}

    def _worker_env(self) -> dict[str, str]:
        """`_child_env` plus a persistent XLA compilation cache shared by the run's workers, private to this
        user: a worker restarted after a failure loads its step program's executable from there instead of
        compiling it again on cores the training needs.

        The cache is `JAX_COMPILATION_CACHE_DIR` when it is set in the launcher's environment (one cache kept
        across runs, as JAX itself reads that variable; the controller inherits it), else `xla-cache` in the
        run folder. A URL (`gs://...`) is passed on as given; a local folder is created 0700 or must be this
        user's alone.

        Raises:
          LaunchError: the folder is a symbolic link, not a directory, another user's, or writable by others
            (the message names `JAX_COMPILATION_CACHE_DIR` or the `--workdir`'s `xla-cache`).
        """
        given = os.environ.get(contract.JAX_ENV_COMPILATION_CACHE_DIR, "")
        if "://" in given:
            location = given
        else:
            cache = Path(given) if given else self.workdir / "xla-cache"
            what = (f"{contract.JAX_ENV_COMPILATION_CACHE_DIR}={given}" if given
                    else f"--workdir {self.workdir}: xla-cache")
            try:
                private_dir(cache, what)
            except UnsafeDirectoryError as e:
                raise LaunchError(str(e)) from None
            except OSError as e:  # (a parent that is a file or cannot be made: the trial's tracebacks)
                raise LaunchError(f"{what}: cannot be created ({e.strerror})") from None
            location = str(cache.resolve())
        return {**self._child_env(), contract.JAX_ENV_COMPILATION_CACHE_DIR: location,
                contract.JAX_ENV_CACHE_MIN_COMPILE_TIME_SECS: "0"}

    def _controller_env(self) -> dict[str, str]:
        """`_child_env` plus the job's identity: namespace `local`, a UID stable for this job name and
        checkpoint location (`identity.local_uid`), so a rerun of this job resumes and another job sharing
        the directory is refused (unless `spec.checkpoint.resumeFrom: Any`)."""
        writer = identity.local_identity(self.job.metadata.name, self.job.spec.checkpoint.uri)
        return {**self._child_env(), **identity.identity_env(writer)}

    def _start_controller(self) -> None:
        self.controller_port = free_port()
        token_file = self.workdir / "token"
        write_private_file(token_file, self.token)
        c = self.job.spec.controller
        env = self._controller_env()
        if c.library_mode:
            # The user's own program (spec.controller.command) imports elastic_jax and reads what the
            # built-in controller takes as flags from the environment, as in the controller pod.
            argv = [*c.command, *c.args]
            env.update({contract.ENV_MANIFEST: str(self.manifest_path), contract.ENV_TOKEN_FILE: str(token_file),
                        contract.ENV_HOST: "127.0.0.1", contract.ENV_PORT: str(self.controller_port),
                        # the runtime's close() writes the built-in controller's summary there
                        contract.ENV_SUMMARY_FILE: str(self.workdir / "summary.json")})
            # As in an activated venv: `python` in the command is the launcher's own environment
            # (the one with JAX and elastic_jax), as it is the image's /opt/venv in the pod.
            env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
        else:
            argv = [
                venv_script("elastic-jax-controller"), "--manifest", str(self.manifest_path), "--token-file",
                str(token_file), "--host", "127.0.0.1", "--port", str(self.controller_port),
                "--summary-file", str(self.workdir / "summary.json"),
            ]
            if self.options.fresh and not self._cleared:
                argv.append("--fresh")
        if self.controller is None:
            self.controller = Child("controller", argv, self.workdir / "controller.log", env=env,
                                    pass_fds=self.options.lock_fds)
        else:
            self.controller.argv = argv
            self.controller.env = {**os.environ, **env}
        (self.workdir / "summary.json").unlink(missing_ok=True)
        log = self.controller.log_path
        self._controller_log_offset = log.stat().st_size if log.exists() else 0  # (appended across restarts)
        self.controller.start()
        self.controller_pids.append(self.controller.pid)
        if self.client is not None:
            self.client.close()
        self.client = ControlClient(f"http://127.0.0.1:{self.controller_port}", self.token)
        ok = wait_until(lambda: self.client.ready() or not self.controller.alive(), self.options.ready_timeout_s, 0.1)
        if not self.controller.alive():
            code = self.controller.exit_code()
            line = self.controller.last_error_line()
            message = (line.removeprefix("error: ") if line.startswith("error: ")
                       else f"controller exited with {code} before it was ready: {self._log_tail()}")
            raise LaunchError(message, exit_code=2 if code == ControllerExit.BAD_INPUT else 1)
        if not ok or not self.client.ready():
            raise LaunchError(f"controller not ready after {self.options.ready_timeout_s:.0f} s; see {self.controller.log_path}", 1)
        self._cleared = True  # ready means --fresh is done; a restart must resume, not wipe again
        # The user's way in (curl, `elastic-jax` tools, a Prometheus scrape): said on the run's own output, at
        # every start (a restarted controller listens on a new port). The token's file, never the token.
        self.on_message(control_api_line(self.controller_port, token_file.resolve()))

    def _start_worker(self, s: _Slice) -> None:
        s.port = free_port()
        s.child.argv = [
            venv_script("elastic-jax-worker"), "--host", "127.0.0.1", "--port", str(s.port),
            "--slice-index", str(s.index), "--host-devices", str(self.job.spec.slices.devices_per_host),
            "--token-file", str(self.workdir / "token"),
        ]
        s.child.start()
        s.listening = False
        s.restart_at = None

    def _report(self, s: _Slice, state: str, reason: str | None = None) -> None:
        s.generation = next_generation(s.generation)
        addresses = [f"127.0.0.1:{s.port}"] if state == "Ready" else []
        s.ready_generation = None
        try:
            self.client.report_slice(s.index, state, s.generation, addresses, reason, retries=3)
        except ControlApiError as e:
            # A loaded or frozen controller, or one restarting: `_resend_unsent` sends the slice's state
            # again (with a new generation) until the controller takes it.
            _logger.warning("could not report slice %d %s: %s; sending it again", s.index, state, e)
            s.unsent, s.resend_at = (state, reason), time.monotonic() + self.RESEND_S
            return
        s.unsent = None
        s.ready_generation = s.generation if state == "Ready" else None

    RESEND_S = 1.0
    """Seconds after a failed slice report before it may be sent again (each try itself retries connection
    errors 3 times and waits up to the client's 2 s deadline)."""

    def _resend_unsent(self, status: ControllerStatus) -> None:
        """Sends again each slice's last state that did not reach the controller, if it is still the state.

        `status` is an answer read after the failure: a report that was applied though its answer came too
        late shows there with the generation sent, and is not sent again (a new generation of an active
        slice's Ready would make the controller reconnect to it, ending the step in flight).
        """
        now = time.monotonic()
        views = {v.index: v for v in status.slices}
        for s in self.slices:
            if s.unsent is None or now < s.resend_at:
                continue
            state, reason = s.unsent
            if state != s.state:  # a newer state was reported since (and is unsent itself if it failed)
                s.unsent = None
                continue
            view = views.get(s.index)
            if view is not None and view.generation == s.generation:
                s.unsent = None  # it was applied; only its answer was lost
                s.ready_generation = s.generation if state == "Ready" else None
                continue
            _logger.warning("slice %d: sending %s again (the controller has generation %s, not %d)", s.index,
                            state, None if view is None else view.generation, s.generation)
            self._report(s, state, reason)

    # -- supervision ------------------------------------------------------------

    def _observe(self, s: _Slice, observation: Observation, reason: str | None = None) -> None:
        """Moves the slice through the supervision core's state machine; a changed state is reported."""
        new = next_slice_state(s.state, observation)
        if new == s.state:
            return
        s.state = new
        if reported(new):
            self._report(s, new, reason)

    def _supervise_workers(self, now: float) -> None:
        for s in self.slices:
            if s.restart_at is not None:  # dead, waiting for its restart delay
                if now >= s.restart_at:
                    self._start_worker(s)
                continue
            if not s.child.alive():
                code = s.child.exit_code()
                how = describe_exit(code)
                if s.killed_because and code == -signal.SIGKILL:
                    how += f" (by the launcher: {s.killed_because})"
                s.killed_because = None
                s.deaths += 1
                # Lost after it was up (killed, OOM, a hung step replaced): a fresh failure. Only deaths
                # before Ready (it cannot start) back off further.
                s.consecutive_failures = budgets.failures_after_loss(s.listening, s.consecutive_failures)
                delay = budgets.restart_delay_s(s.consecutive_failures, self.options.restart_backoff_s)
                s.restart_at = now + delay
                self._observe(s, "Failed", f"worker process ended: {how}")
                _logger.warning("slice %d worker ended (%s); restarting in %.1f s", s.index, how, delay)
            elif s.listening or port_open("127.0.0.1", s.port):
                s.listening = True
                self._observe(s, "Ready")
            else:
                self._observe(s, "NotReady")

    def _replace_slices_seen_down(self, status: ControllerStatus) -> None:
        """Kills a worker the controller saw fail (e.g. hung past the step deadline) while its process lives on.

        The controller's view of a slice is a liveness signal, and a replaced
        worker is better than a stuck one; the operator applies the same rule
        (`supervision.slice_state.controller_saw_down`).
        """
        for view in status.slices:
            s = self.slices[view.index]
            if controller_saw_down(view.state, view.generation, s.state, s.ready_generation) and s.child.alive():
                cause = down_cause(status, s.index)
                s.ready_generation = None  # one kill per accepted Ready
                # A worker that stopped serving because it was told to stop (SIGTERM: it exits 143 once its
                # server has stopped) is on its way out: a SIGKILL now replaced its real end with "-9". Give it
                # a moment to end by itself; a hung one (a stuck step) is killed after it, a stopped one at once.
                if not s.child.stopped() and s.child.wait(EXIT_GRACE_S) is not None:
                    continue  # (the next supervise pass reports how it ended and restarts it)
                _logger.warning("controller reports slice %d down%s while its worker runs; replacing it", s.index,
                                f" ({cause})" if cause else "", extra={"slice": s.index, "cause": cause})
                s.killed_because = f"the controller reported slice {s.index} down{f' ({cause})' if cause else ''}"
                s.child.signal(signal.SIGKILL)  # the next supervise pass sees the exit and restarts it

    def _inject_failure(self, status: ControllerStatus) -> None:
        """Injects the demo failure once this run's training passes `kill_at_step`.

        Only a step this controller trains counts: a run that resumed from a
        checkpoint at or past `kill_at_step` never reaches it, so nothing is
        injected (and `kill_skipped` says why), instead of killing a worker in
        the first step after the resume.
        """
        opts = self.options
        if opts.kill_at_step is None or self.killed is not None or self.kill_skipped is not None:
            return
        if status.phase not in ("Running", "Recovering"):
            return  # not training yet (Starting: the restore may still move the step), or finished
        start = status.resumed_from.step if status.resumed_from is not None else 0
        if start >= opts.kill_at_step:
            self.kill_skipped = (f"the run resumed at step {start}, already past --kill-at-step {opts.kill_at_step}; "
                                 "no failure injected")
            _logger.warning("%s", self.kill_skipped)
            return
        if status.step < opts.kill_at_step or status.step >= status.total_steps:
            return
        index = opts.kill_slice if opts.kill_slice is not None else max(status.active_slices, default=None)
        if index is None:
            return
        s = self.slices[index]
        if not s.child.alive():
            return
        pid = s.child.pid
        s.child.signal(opts.kill_signal)
        self.killed = {"slice": s.index, "pid": pid, "signal": signal.Signals(opts.kill_signal).name,
                       "at_step": status.step, "time": time.time()}
        _logger.warning("injected failure: %s to slice %d worker (pid %d) at step %d",
                        self.killed["signal"], s.index, pid, status.step)

    def _poll_status(self) -> ControllerStatus | None:
        try:
            status = self.client.status()
        except ControlApiError:
            return None
        self.last_status = status
        now = time.monotonic()
        if now - self._last_metrics_scrape > 2.0:
            self._last_metrics_scrape = now
            try:
                write_private_file(self.workdir / "metrics.prom", self.client.metrics_text())  # (replaces a link)
            except ControlApiError:
                pass
        return status

    def run(self) -> dict[str, Any]:
        """Runs the job to the end.

        Returns:
          The summary dict (see `summary()`).

        Raises:
          LaunchError: the controller refused the job before training (exit code 2),
            or could not be started.
          KeyboardInterrupt: propagated after every child was stopped.
        """
        # Everything the run and its processes create (logs, summary, metrics, checkpoints, the compilation
        # cache) is this user's alone: 0600 files, 0700 folders.
        os.umask(0o077)
        try:
            private_dir(self.workdir, f"--workdir {self.workdir}")
        except UnsafeDirectoryError as e:
            raise LaunchError(str(e)) from None
        # The compilation cache before an earlier run's records go (a trial: a refused cache folder had already
        # deleted the earlier run's logs and picture); the controller inherits JAX_COMPILATION_CACHE_DIR.
        worker_env = self._worker_env()
        for old_log in [*self.workdir.glob("worker-*.log"), self.workdir / "controller.log"]:
            old_log.unlink(missing_ok=True)  # logs of this run only; restarts within it append
        (self.workdir / timeline.HISTORY_FILE).unlink(missing_ok=True)  # (as the logs: this run's steps only)
        (self.workdir / timeline.TIMELINE_FILE).unlink(missing_ok=True)  # (an earlier run's picture is not this one's)
        started = time.monotonic()
        controller_restarts = 0
        max_controller_restarts = self._max_controller_restarts()
        interrupted = False
        # The operator's crash-loop rule (`supervision.backoff`): losses since a controller last trained a step,
        # and when (monotonic) the lost one's successor may start.
        losses_in_a_row, restart_at = 0, None
        try:
            self._start_controller()
            controller_started = time.monotonic()
            self.slices = [_Slice(i, Child(f"worker-{i}", [], self.workdir / f"worker-{i}.log", env=worker_env))
                           for i in range(self.job.spec.slices.total)]
            for s in self.slices:
                self._start_worker(s)
            while True:
                now = time.monotonic()
                code = self.controller.exit_code()
                if code is not None:
                    if ends_job(code) or not budgets.controller_restart_allowed(controller_restarts,
                                                                                max_controller_restarts):
                        break
                    if restart_at is None:
                        losses_in_a_row = backoff.losses_after(losses_in_a_row, now - controller_started)
                        delay = backoff.restart_delay_s(losses_in_a_row)
                        restart_at = now + delay
                        if delay > 0:
                            _logger.warning("controller exited with %s, %d losses in a row with no step trained "
                                            "between them: restarting it in %.0f s (back-off %.0f s doubling to "
                                            "%.0f s, as the kubelet's CrashLoopBackOff)", code, losses_in_a_row,
                                            delay, backoff.INITIAL_DELAY_S, backoff.MAX_DELAY_S)
                    if now < restart_at:
                        # (the workers are still supervised while it waits; no controller to poll)
                        self._supervise_workers(now)
                        self.budget_failure = self._slice_budget_failure()
                        if self.budget_failure is not None:
                            _logger.error("%s; stopping the job", self.budget_failure)
                            break
                        time.sleep(0.1)
                        continue
                    restart_at = None
                    # Flow 3: the controller itself was lost (killed, or signalled by someone other than
                    # this launcher: exit RESTART); start a new one, it resumes from the checkpoint.
                    controller_restarts += 1
                    self._carry_over_from_dead_controller(code)
                    _logger.warning("controller exited with %s; restarting (%d)", code, controller_restarts)
                    self._start_controller()
                    controller_started = time.monotonic()
                    for s in self.slices:  # a new controller knows nothing: every slice it may have is re-sent
                        s.ready_generation = None
                        if reported(s.state):
                            self._report(s, s.state)
                    continue
                self._supervise_workers(now)
                self.budget_failure = self._slice_budget_failure()
                if self.budget_failure is not None:
                    _logger.error("%s; stopping the job", self.budget_failure)
                    break
                status = self._poll_status()
                self._watch_controller(status)
                if status is not None:
                    if status.step > (status.resumed_from.step if status.resumed_from is not None else 0):
                        losses_in_a_row = 0  # a controller trained a step: a crash loop, if any, is over
                    self._last_status = status
                    self._note_resume(status)
                    self.on_status(self._with_earlier_recoveries(status))
                    self._resend_unsent(status)
                    self._replace_slices_seen_down(status)
                    self._inject_failure(status)
                time.sleep(0.1)
        except KeyboardInterrupt:
            interrupted = True
        finally:
            with stopping_signals():
                if interrupted:  # (said at once: the stop takes seconds; a trial's user, seeing nothing, pressed again)
                    self.on_message("interrupted: stopping (the controller checkpoints its last step, then every "
                                    "process is stopped; at most about a minute)")
                self.stop_all()
        code = self.controller.exit_code()
        if not interrupted and self.budget_failure is None \
                and code not in (ControllerExit.SUCCEEDED, ControllerExit.FAILED):
            raise LaunchError(f"controller lost {controller_restarts + 1} times (last exit {code}; "
                              f"{max_controller_restarts} restarts allowed): {self._log_tail()}", exit_code=1)
        summary = self.summary(time.monotonic() - started, controller_restarts)
        if interrupted:
            summary["succeeded"] = False
            summary["failure_reason"] = (f"interrupted at step {summary['steps']}" if summary["steps"] is not None
                                         else "interrupted before any controller answered")
        elif self.budget_failure is not None:
            summary["succeeded"] = False
            summary["failure_reason"] = self.budget_failure
        summary["interrupted"] = interrupted
        return summary

    def _slice_budget_failure(self) -> str | None:
        """Why the slices' worker deaths exceed `spec.elasticity`'s budgets, as the operator counts its
        JobSets' restarts (`supervision.budgets`); None while within them."""
        elasticity = self.job.spec.elasticity
        return budgets.slice_budget_failure([s.deaths for s in self.slices], elasticity.max_restarts,
                                            elasticity.max_restarts_per_slice)

    def _max_controller_restarts(self) -> int:
        """Controller restarts allowed: the option if set, else the job's `spec.elasticity.maxRestarts`."""
        if self.options.max_controller_restarts is not None:
            return self.options.max_controller_restarts
        return self.job.spec.elasticity.max_restarts

    def _carry_over_from_dead_controller(self, exit_code: int) -> None:
        """Remembers what a dead controller had done, which its successor cannot know.

        The last polled status gives its slice recoveries and a lower bound on
        the step it reached (polls are 0.1 s apart); the successor's restored
        step then gives the steps lost to the restart. The controller's end is
        recorded in `controller_losses`, not as a slice recovery: `interrupted`
        (exit `RESTART`: signalled, it checkpointed the step it reached) or
        `lost` (killed, crashed: it resumes from the last committed step).
        """
        status = self.last_status
        self._previous_recoveries += [r.model_dump(mode="json") for r in (status.recovery_history if status else [])]
        self._end_unresponsive("exited")
        if status is not None:  # its goodput ledger as last polled (up to 0.1 s short)
            seconds = dict(status.goodput_seconds)
            # (a freeze it answered again after is in that ledger as training: re-booked first)
            seconds, equivalent = _rebook_frozen(seconds, self._frozen_training_s, self._frozen_reduced_s,
                                                 _equivalent(seconds, status.goodput))
            self._earlier_seconds = _sum_seconds([self._earlier_seconds, seconds])
            self._earlier_equivalent += equivalent
            self._earlier_stepped |= status.goodput is not None
        self._frozen_training_s = self._frozen_reduced_s = 0.0
        self._answered_at = None
        # The poll is a lower bound; a loaded machine can starve it for seconds (CI saw 0 for a controller
        # that had logged step 60), so the steps this controller logged count too.
        reached = max(status.step if status else 0, self._logged_step())
        self.controller_losses.append({
            "cause": "interrupted" if exit_code == ControllerExit.RESTART else "lost",
            "exit_code": exit_code, "at_step": reached, "resumed_from_step": None, "steps_lost": None})
        self.last_status = None

    def _logged_step(self) -> int:
        """The last step the current controller wrote in its log (its `step` events, every
        `spec.training.logEverySteps`); 0 when it logged none (library mode logs its own way) or the log is
        unreadable."""
        try:
            with open(self.controller.log_path, "rb") as f:
                f.seek(self._controller_log_offset)
                text = f.read().decode(errors="replace")
        except OSError:
            return 0
        return max((e["step"] for e in read_events(text)
                    if e["event"] == "step" and isinstance(e.get("step"), int)), default=0)

    def _watch_controller(self, status: ControllerStatus | None) -> None:
        """Tracks whether the live controller answers (`status`: this poll's answer, None: no answer).

        Once it answered and then went `LOCAL_UNRESPONSIVE_GRACE_S` without an answer while its process
        lives (frozen: SIGSTOP, a VM pause, a native call holding the GIL), says so on the progress output
        and opens a spell in `controller_unresponsive`; when it answers again the spell ends, and if it was
        training its ledger booked the frozen seconds as training: they are re-booked `recovering`.
        """
        now = time.monotonic()
        if status is not None:
            if self._unresponsive is not None:
                spell = self._unresponsive
                spell["seconds"] = round(now - spell["_since"], 1)
                if spell["_training"]:
                    frozen = controller_watch.freeze_training_s(spell["_ledger"], status.goodput_seconds,
                                                                now - spell["_since"])
                    self._frozen_training_s += frozen
                    if spell["_reduced"]:
                        self._frozen_reduced_s += frozen
                self.on_message(f"controller (pid {spell['pid']}) answers again after {spell['seconds']:.0f} s "
                                f"without an answer; that time is booked recovering, not productive")
                self._end_unresponsive("answered")
            self._answered_at = now
            return
        if self._unresponsive is not None or self.controller.exit_code() is not None:
            return  # (a spell already open; or the process ended: its exit code tells, next loop)
        seconds = controller_watch.unresponsive_seconds(self._answered_at, now,
                                                        controller_watch.LOCAL_UNRESPONSIVE_GRACE_S)
        last = self._last_status
        # (a controller that said it ended stops its API, then exits: no freeze)
        if seconds is None or (last is not None and last.phase in ENDED_PHASES):
            return
        booked = None if last is None else controller_watch.freeze_booked_as(
            last.phase, last.goodput is not None, len(last.active_slices), last.desired_slices)
        self._unresponsive = spell = {
            "pid": self.controller.pid, "at_step": last.step if last is not None else 0, "seconds": None,
            "ended": None, "_since": self._answered_at,
            # (a controller that was training books the freeze as training, `reduced` on fewer slices than
            # desired; paused, it books it waiting: the rule the operator applies too)
            "_training": booked is not None, "_reduced": booked == "reduced",
            "_ledger": dict(last.goodput_seconds) if last is not None else {}}
        self.controller_unresponsive.append(spell)
        self.on_message(f"controller (pid {spell['pid']}) is alive but its control API has not answered for "
                        f"{seconds:.0f} s, at step {spell['at_step']}: frozen (SIGSTOP? a paused machine?) or "
                        f"wedged; no step is made meanwhile")

    def _end_unresponsive(self, how: str) -> None:
        """Closes the open unresponsive spell, if any: `how` it ended (answered, exited, run_ended)."""
        spell, self._unresponsive = self._unresponsive, None
        if spell is None:
            return
        spell["ended"] = how
        if spell["seconds"] is None:
            spell["seconds"] = round(time.monotonic() - spell["_since"], 1)

    def _note_resume(self, status: ControllerStatus) -> None:
        """Notes the step a controller resumed from, once it has restored (it has left `Starting`)."""
        if status.phase == "Starting":
            return
        self._resumed_at(status.resumed_from.step if status.resumed_from else 0)

    def _resumed_at(self, resumed: int) -> None:
        """A controller resumed from step `resumed`: the run's first sets where the ledgers trained from; a
        restarted one's predecessors lost the steps from there to the step they had reached, whose seconds
        are re-booked `recovering` in the earlier ledgers (the operator's rule, `supervision.steps_lost`)."""
        if self._trained_from is None:
            self._trained_from = resumed
        if self._started_from is None:
            self._started_from = resumed
        loss = self.controller_losses[-1] if self.controller_losses else None
        if loss is None or loss["resumed_from_step"] is not None:
            return
        loss["resumed_from_step"] = resumed
        loss["steps_lost"] = lost = steps_lost_rule.lost_at_resume(loss["at_step"], resumed)
        share = steps_lost_rule.lost_share(lost, loss["at_step"], self._trained_from)
        self._earlier_seconds, self._earlier_equivalent = steps_lost_rule.rebook_lost(
            self._earlier_seconds, self._earlier_seconds, share, self._earlier_equivalent, self._earlier_equivalent)
        self._trained_from = min(self._trained_from, resumed)

    def _with_earlier_recoveries(self, status: ControllerStatus) -> ControllerStatus:
        """`status` with the slice recoveries of controllers before this one added to its counts (progress display)."""
        if not self._previous_recoveries:
            return status
        counts = dict(status.recoveries)
        for r in self._previous_recoveries:
            counts[r["cause"]] = counts.get(r["cause"], 0) + 1
        return status.model_copy(update={"recoveries": counts})

    def stop_all(self) -> None:
        """Stops the controller and every worker; nothing is left running.

        A live controller is first asked to stop (`POST /v1/stop`): it abandons
        the in-flight step, checkpoints the last completed one and exits
        `STOPPED`. SIGTERM follows (the same checkpoint, for a controller that
        could not be asked), then SIGKILL after the grace period.
        """
        if self.controller is not None:
            if self.controller.alive() and self.client is not None:
                try:
                    self.client.stop("elastic-jax run was stopped (Ctrl-C or SIGTERM)")
                    self.controller.wait(timeout_s=30.0)
                except ControlApiError as e:
                    _logger.info("stop request not delivered (%s); sending SIGTERM", e)
            self.controller.stop(grace_s=30.0)
        for s in self.slices:
            s.child.stop(grace_s=5.0)
        if self.client is not None:
            self.client.close()

    def summary(self, wall_seconds: float, controller_restarts: int) -> dict[str, Any]:
        """The run's summary: the controller's own plus what only the launcher saw.

        Keys: job, succeeded, steps (the step reached), steps_this_run (the steps this run advanced: `steps` less
        the step its first controller restored; 0 for a job whose checkpoints already held its last step),
        already_finished (that case: it trained nothing, the job was complete), nothing_started (True only
        from `finished_summary`: no process was started), total_steps, initial_loss, final_loss,
        recoveries (count of slice losses and drains, over every controller of the run),
        recovery_seconds (the measured ones, seconds each), slices_lost (count: the slices of the slice_down
        recoveries), paused_seconds (seconds the recoveries waited for slices, below the minimum), unfinished_recoveries (count:
        the run ended before the next step completed, so there is no duration), steps_lost (None: not
        measured, library mode),
        controller_pid_changed, controller_restarts, controller_losses (list of
        {cause: interrupted|lost, exit_code, at_step, resumed_from_step, steps_lost: what its successor
        redid}; a controller restart is not a slice recovery), controller_unresponsive (list of {pid, at_step,
        seconds, ended: answered|exited|run_ended}: a live controller that went
        `controller_watch.LOCAL_UNRESPONSIVE_GRACE_S` without answering; seconds from its last answer),
        worker_restarts, injected_failure,
        injected_failure_skipped (why none was injected), goodput (None: not applicable,
        no step run; (productive + reduced equivalent) / wall over every controller of the run),
        goodput_seconds (seconds per goodput category summed over the controllers, the seconds of the steps a
        restarted controller redid re-booked from productive/reduced to recovering, as the operator does:
        `supervision.steps_lost`), checkpoint_uri, last_committed_checkpoint_step,
        restored_from_step, resumed_from ({step, fallbackReason, writer: {namespace, name, uid} or None}) (both
        the last controller's: after a controller loss, its successor's), started_from_step (the step the run's
        first controller resumed from: where this run started),
        metrics_file, logs_dir, failure_reason; wall_seconds (the launcher's wall clock, from its start to
        every process stopped), booked_seconds (the seconds the controllers' ledgers booked, the sum of
        goodput_seconds: what goodput divides by, as on a cluster), unbooked_seconds (wall_seconds less
        booked_seconds: the launcher's own, before a controller's ledger starts (spawning the process, its
        imports), between a lost controller and its successor, and stopping every process at the end).
        """
        path = self.workdir / "summary.json"
        run = json.loads(path.read_text()) if path.exists() else {}
        return self._summary(run, wall_seconds, controller_restarts)

    def _log_tail(self) -> str:
        """The controller log's last line (a traceback's last line, a user program's own words) and where the
        log is: that line alone rarely says enough, and "see the log" must say which."""
        line = self.controller.last_error_line()
        return f"{line + '; ' if line else ''}see {self.controller.log_path}"

    def finished_summary(self, step: int, writer: identity.JobIdentity | None) -> dict[str, Any]:
        """The summary of a run that started nothing: the job's checkpoint directory already holds its last
        `step` (`checkpoints.finished_at`), written by `writer`. `already_finished` is true, `succeeded` too
        (the job is done), no step was trained (goodput None) and no loss was measured (None, not the first
        run's)."""
        run = {"succeeded": True, "steps": step, "restored_from_step": step, "last_committed_checkpoint_step": step,
               "resumed_from": {"step": step, "fallbackReason": None,
                                "writer": None if writer is None else writer.model_dump(by_alias=True)}}
        return {**self._summary(run, 0.0, 0), "nothing_started": True}

    def _summary(self, run: dict[str, Any], wall_seconds: float, controller_restarts: int) -> dict[str, Any]:
        """`summary` from the controller's own summary `run` (the dict of its `summary.json`)."""
        if self.job.spec.controller.library_mode and self.controller is not None:
            # The user's program owns its exit code: the job succeeded only if it says so too.
            exited_ok = self.controller.exit_code() == ControllerExit.SUCCEEDED
            if not run:
                # No summary (the program never closed its runtime): the last status it served says how it went.
                last = self._last_status
                stepped = last is not None and last.goodput is not None  # (None: it completed no step)
                run = {"steps": last.step, "final_loss": last.loss if stepped else None,
                       "initial_loss": last.initial_loss if stepped else None,
                       "recoveries": [r.model_dump(mode="json") for r in last.recovery_history],
                       "goodput": last.goodput, "goodput_seconds": dict(last.goodput_seconds)} if last else {}
            run["succeeded"] = exited_ok and run.get("succeeded", True)
        history = self._previous_recoveries + run.get("recoveries", [])
        recoveries = [r for r in history if r.get("cause") != "scale_up"]
        # Library mode: what the library measured (the steps its `recover` rewound), None when the user's
        # loop never called it (it owns its state; what it redoes is not measured).
        steps_lost = run.get("steps_lost") if self.job.spec.controller.library_mode else run.get("steps_lost") or 0
        if self.controller_losses and self.controller_losses[-1]["resumed_from_step"] is None \
                and run.get("restored_from_step") is not None:
            self._resumed_at(run["restored_from_step"])  # (the last one ended before a poll saw it resume)
        if steps_lost is not None:
            # At least these steps were redone after the controller restarts.
            steps_lost += sum(loss["steps_lost"] or 0 for loss in self.controller_losses)
        self._end_unresponsive("run_ended")
        live = run.get("goodput_seconds") or {}
        # (the live controller's ledger booked a freeze it answered again after as training)
        live, live_equivalent = _rebook_frozen(live, self._frozen_training_s, self._frozen_reduced_s,
                                               _equivalent(live, run.get("goodput")))
        seconds = _sum_seconds([self._earlier_seconds, live])
        stepped = self._earlier_stepped or run.get("goodput") is not None
        goodput = steps_lost_rule.goodput_fraction(
            seconds, self._earlier_equivalent + live_equivalent) if stepped else None
        # The step this run started from: the first controller's restore (a later one's resume is the run's
        # own progress, redone or not), else the controller's summary's.
        start = self._trained_from if self._trained_from is not None else run.get("restored_from_step")
        reached = run.get("steps")
        committed = run.get("last_committed_checkpoint_step")
        if not run and self._last_status is not None:
            # No summary from the last controller (stopped or lost before it wrote one): the run's progress is what
            # the controllers last answered, not "None" (a Ctrl-C while a successor was starting said so).
            reached = self._last_status.step
            committed = self._last_status.last_committed_checkpoint_step
        if committed is None and not run and checkpoints.is_local(self.job.spec.checkpoint.uri):
            # (no controller answered at all: a Ctrl-C within a second of the start; the folder says)
            steps_on_disk = checkpoints.committed_local_steps(checkpoints.local_path(self.job.spec.checkpoint.uri))
            committed = steps_on_disk[-1] if steps_on_disk else None
        start = 0 if start is None and reached is not None else start
        steps_this_run = None if reached is None or start is None else max(0, reached - start)
        booked = round(sum(seconds.values()), 2)
        return {
            "job": self.job.metadata.name,
            "succeeded": bool(run.get("succeeded")),
            "steps": reached,
            "steps_this_run": steps_this_run,
            # (the checkpoints already held the last step: this run trained nothing)
            "already_finished": start is not None and start >= self.job.spec.training.steps and steps_this_run == 0,
            "nothing_started": False,
            "total_steps": self.job.spec.training.steps,
            "initial_loss": run.get("initial_loss"),
            "final_loss": run.get("final_loss"),
            "recoveries": len(recoveries),
            "recovery_seconds": [r["seconds"] for r in recoveries if r.get("seconds") is not None],
            "unfinished_recoveries": sum(1 for r in recoveries if r.get("seconds") is None),
            "scale_ups": len(history) - len(recoveries),
            # (a recovery may handle several slices: one lost while another's loss waited for slices)
            "slices_lost": sum(len(r.get("slices") or []) for r in recoveries if r.get("cause") == "slice_down"),
            "paused_seconds": round(sum(r.get("paused_seconds") or 0.0 for r in history), 2),
            "steps_lost": steps_lost,
            "controller_pid_changed": len(set(self.controller_pids)) > 1,
            "controller_restarts": controller_restarts,
            "controller_losses": self.controller_losses,
            "controller_unresponsive": [{k: v for k, v in spell.items() if not k.startswith("_")}
                                        for spell in self.controller_unresponsive],
            "worker_restarts": sum(max(0, s.child.starts - 1) for s in self.slices),
            "injected_failure": self.killed,
            "injected_failure_skipped": self.kill_skipped,
            "goodput": None if goodput is None else round(goodput, 4),
            "goodput_seconds": seconds,
            "checkpoint_uri": self.job.spec.checkpoint.uri,
            "last_committed_checkpoint_step": committed,
            "restored_from_step": run.get("restored_from_step"),
            "resumed_from": run.get("resumed_from"),
            "started_from_step": self._started_from if self._started_from is not None
            else run.get("restored_from_step"),
            "metrics_file": str(self.workdir / "metrics.prom"),
            "logs_dir": str(self.workdir),
            "wall_seconds": round(wall_seconds, 2),
            "booked_seconds": booked,
            # (the launcher's own, booked by no controller: see `summary`)
            "unbooked_seconds": round(max(0.0, wall_seconds - booked), 2),
            "failure_reason": run.get("failure_reason"),
        }


def _sum_seconds(ledgers: list[dict[str, float]]) -> dict[str, float]:
    """Seconds per goodput category, summed over controllers (rounded to ms)."""
    total: dict[str, float] = {}
    for ledger in ledgers:
        for category, seconds in ledger.items():
            total[category] = total.get(category, 0.0) + seconds
    return {k: round(v, 3) for k, v in total.items()}


def _equivalent(seconds: dict[str, float], goodput: float | None) -> float:
    """A controller's reduced seconds x active/desired slices, from its ledger and goodput ratio
    (goodput x wall - productive, which the controller's ledger defines it by); 0 before its first step."""
    if goodput is None:
        return 0.0
    derived = goodput * sum(seconds.values()) - seconds.get("productive", 0.0)
    return min(max(0.0, derived), seconds.get("reduced", 0.0))


class _HeldFlock:
    """An exclusive `flock` on an open file descriptor, held from `acquire` until `release` (or the exit of
    every process holding the descriptor: the launcher passes it to its controllers). A context manager."""

    _fd: int | None = None

    @property
    def fd(self) -> int | None:
        """The lock's file descriptor while held (to pass to the controller), else None."""
        return self._fd

    def acquire(self) -> "_HeldFlock":
        raise NotImplementedError

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


class RunLock(_HeldFlock):
    """An exclusive lock on a run directory, so two launchers never run the same job at once.

    The launcher's controller processes hold it too (`LaunchOptions.lock_fds`): a launcher killed by
    SIGKILL leaves its controller checkpointing on the SIGTERM its parent's death sends it. A lock
    whose launcher is gone is waited for, up to `wait_s` seconds, with one line on stderr saying so.

    Args:
      workdir: the run directory (created if missing); an existing one must be empty or an earlier run's
        (`run_folder.check`; marked by `run_folder.mark` once the lock is held).
      wait_s: seconds to wait for the processes of a run whose launcher is gone.
      on_wait: called once with a message when it waits.
      job: the job's name, recorded in the folder's marker (`run_folder.mark`).
      on_note: called with one line when the folder held another job's run, whose files this run replaces.

    Raises (from `acquire`):
      LaunchError: another live launcher holds it, or a gone launcher's processes still did after
        `wait_s` (exit code 2); the directory cannot be created; it holds files and is not an earlier
        run's folder (exit code 2, before anything is written in it).
    """

    def __init__(self, workdir: Path, wait_s: float = 120.0, on_wait: Callable[[str], None] | None = None,
                 job: str = "", on_note: Callable[[str], None] | None = None):
        self.path = workdir / "launcher.lock"
        self.wait_s = wait_s
        self.on_wait = on_wait
        self.job, self.on_note = job, on_note
        self._made: list[Path] = []  # (the folders `acquire` created: removed again if the run never wrote)

    def acquire(self) -> "RunLock":
        workdir = self.path.parent
        try:
            is_file = workdir.exists() and not workdir.is_symlink() and not workdir.is_dir()
        except OSError as e:  # (a name too long for the file system, a component that denies search)
            raise LaunchError(f"--workdir {workdir}: cannot be used ({e.strerror})") from None
        if is_file:
            raise LaunchError(f"--workdir {workdir}: is a file, not a directory")
        self._made = _missing_folders(workdir)
        try:
            private_dir(workdir, f"--workdir {workdir}")
        except UnsafeDirectoryError as e:
            raise LaunchError(str(e)) from None
        except OSError as e:
            raise LaunchError(f"--workdir {workdir}: cannot be created ({e.strerror})") from None
        # Before the first file of the run is written: a folder that is not new, empty or an earlier run's
        # (`/etc`, a home folder) would have its `token`, `summary.json`, ... overwritten.
        try:
            marked = run_folder.check(workdir, f"--workdir {workdir}")
        except run_folder.NotARunFolderError as e:
            raise LaunchError(str(e)) from None
        except OSError as e:
            raise LaunchError(f"--workdir {workdir}: cannot be listed ({e.strerror})") from None
        try:
            fd = open_private(self.path, os.O_RDWR)
        except OSError as e:
            if e.errno == errno.ELOOP:
                raise LaunchError(f"--workdir {workdir}: launcher.lock is a symbolic link; refusing to follow it "
                                  "(remove it)") from None
            raise LaunchError(f"--workdir {workdir}: directory is not writable ({e.strerror})") from None
        if not _try_flock(fd):
            holder = os.read(fd, 32).decode(errors="replace").strip() or "?"
            if _pid_alive(holder):
                os.close(fd)
                running = ("this job" if not marked or not self.job or marked == self.job
                           else f"job {marked!r}")
                raise LaunchError(f"{running} is already running from {self.path.parent} (launcher pid {holder})")
            if self.on_wait is not None:
                self.on_wait(f"the previous run of this job (launcher pid {holder}) is gone, but a process it "
                             f"started still holds {self.path} (its controller checkpointing on the way out): "
                             f"waiting up to {self.wait_s:.0f} s for it to stop")
            if not wait_until(lambda: _try_flock(fd), self.wait_s, 0.2):
                os.close(fd)
                raise LaunchError(f"the previous run of this job (launcher pid {holder}, gone) still has a process "
                                  f"holding {self.path} after {self.wait_s:.0f} s; find it with `fuser -v "
                                  f"{self.path}` and stop it")
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)  # (at 0: a wait above read the holder's pid)
        self._fd = fd
        # Marked only now the folder is this run's: a refused run leaves the running job's marker as it is.
        try:
            earlier = run_folder.mark(workdir, self.job)
        except OSError as e:
            self.release()
            raise LaunchError(f"--workdir {workdir}: directory is not writable ({e.strerror})") from None
        if earlier and self.on_note is not None:
            self.on_note(f"--workdir {workdir} held a run of job {earlier!r}; this run of job {self.job!r} replaces "
                         "its logs, summary, metrics and timeline")
        return self

    def __exit__(self, exc_type, *exc) -> None:
        """Releases the lock; on an exception, first removes the folders `acquire` created if the run wrote
        nothing in them (a run refused once it held the folder, e.g. its checkpoint folder in use by another
        run, or interrupted before its first process: a new user's trial found the new `--workdir` left behind
        holding only the marker and lock file). A folder that existed before, or holds anything more, stays."""
        if exc_type is not None and self._fd is not None:
            _remove_if_untouched(self._made, {self.path.name, run_folder.MARKER})
        self.release()


def _missing_folders(folder: Path) -> list[Path]:
    """The folders `mkdir(parents=True)` would create for `folder`, deepest first (none if it exists)."""
    missing = []
    while not os.path.lexists(folder) and folder != folder.parent:
        missing.append(folder)
        folder = folder.parent
    return missing


def _remove_if_untouched(made: list[Path], own_files: set[str]) -> None:
    """Removes `made` (deepest first, as `_missing_folders` lists them) while the first holds only `own_files`
    and each parent is then empty; stops at the first folder that holds anything else or cannot be removed."""
    try:
        if made and {p.name for p in made[0].iterdir()} <= own_files:
            for name in own_files:
                (made[0] / name).unlink(missing_ok=True)
        for folder in made:
            folder.rmdir()  # (OSError when not empty: something else was written there; it stays)
    except OSError:
        pass


def _try_flock(fd: int) -> bool:
    """Takes the exclusive flock on `fd` if free; False if another open file holds it."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _pid_alive(pid: str) -> bool:
    """Whether the process `pid` (as written in a lock file; "?" unknown: taken as alive) exists."""
    try:
        os.kill(int(pid), 0)
    except ValueError:
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # (another user's process)
    return True


class CheckpointLock(_HeldFlock):
    """An exclusive lock on a local checkpoint directory, so two runs never write the same checkpoints
    (the same job started with another `--workdir`, or two jobs sharing `spec.checkpoint.uri`).

    The lock is a `flock` on the directory itself (created if missing): no file is
    added beside the checkpoints, and it is released when the launcher exits,
    however it exits. A `gs://` location is not locked.

    Raises (from `acquire`):
      LaunchError: another live launcher holds it (exit code 2); the directory cannot be created.
    """

    def __init__(self, uri: str):
        self.uri = uri  # (gs://: nothing to lock, `fd` stays None)

    def is_free(self) -> bool:
        """Whether no other open file holds the lock of these local checkpoints now (gs:// and a missing or
        unusable folder: True). Creates nothing and keeps nothing: a run checks its checkpoints before taking
        the lock only while nobody holds them (another run may be deleting them for `--fresh`)."""
        if "://" in self.uri:
            return True
        try:
            fd = os.open(self.uri, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            return True  # (missing or unusable: the preflight says what is wrong with it)
        try:
            return _try_flock(fd)
        finally:
            os.close(fd)  # (closing drops a flock taken here)

    def _in_use(self) -> str:
        return (f"spec.checkpoint.uri {self.uri!r} is in use by another elastic-jax run "
                "(two runs must not write the same checkpoints)")

    def acquire(self) -> "CheckpointLock":
        if "://" in self.uri:
            return self
        try:
            Path(self.uri).mkdir(parents=True, exist_ok=True)
            fd = os.open(self.uri, os.O_RDONLY | os.O_DIRECTORY)
        except OSError as e:  # `checkpoints.preflight` ran first: this is a race (changed since), said plainly
            raise LaunchError(f"spec.checkpoint.uri {self.uri!r}: cannot be created or opened as a directory "
                              f"({e.strerror})") from None
        if not _try_flock(fd):
            os.close(fd)
            raise LaunchError(self._in_use())
        self._fd = fd
        return self


def _rebook_frozen(seconds: dict, frozen_s: float, frozen_reduced_s: float, equivalent: float) -> tuple[dict, float]:
    """`controller_watch.rebook_freezes` (the operator's rule too)."""
    return controller_watch.rebook_freezes(seconds, frozen_s, frozen_reduced_s, equivalent)
