"""`elastic-jax-controller`: the controller process's entry point.

Reads the job's manifest, builds the trainer and the checkpointer, serves the
control API, and runs the elastic training loop until it succeeds or fails.

Exit codes: `elastic_jax.exit_codes.ControllerExit`: 0 succeeded; 1 training
failed (reason in the summary and the log); 2 bad input (manifest, trainer
config, checkpoint URI, checkpoints of another job or beyond spec.training.steps), reported as one line on stderr starting with `error:`
before anything trains; 4 stopped on request (`POST /v1/stop`); 75 interrupted
by a signal that was not a stop request (SIGTERM, SIGINT, SIGHUP: a node
shutdown, a preemption), after checkpointing the last completed step, or the
Pathways proxy did not answer at start (`pathways_connect.ProxyUnavailableError`):
a controller loss, restart it and it resumes.

Configuration, flags first, then environment (as the operator sets it in a pod), read once into a
`settings.ControllerSettings` (the reader `elastic_jax.connect` uses too):
  --manifest / ELASTIC_JAX_MANIFEST      path of the ElasticTrainingJob YAML
  --token-file / ELASTIC_JAX_TOKEN_FILE  file holding the control-API bearer token
                 ELASTIC_JAX_TOKEN       the token itself (when no file)
  --host, --port / ELASTIC_JAX_HOST, ELASTIC_JAX_PORT
                                         control API bind address (default 0.0.0.0:8080)
  --summary-file / ELASTIC_JAX_SUMMARY_FILE
                                         where to write the run summary JSON
  --serve-only                           serve the control API and slice set without training (no
                                         trainer, checkpoint or JAX; `serve_only.py`): for operator
                                         benchmarks and tests of many jobs; exits 4 on `POST /v1/stop`,
                                         75 on a signal
  ELASTIC_JAX_TERMINATION_MESSAGE_PATH   where to write the one-line reason of a non-zero exit
                                         (default /dev/termination-log; only if it exists)
  ELASTIC_JAX_MANIFEST_SHA256            the digest the manifest must have (the operator sets it; a
                                         manifest ConfigMap edited after the job was created is refused
                                         with exit 2; `elastic_jax.api.manifest_digest`)
  ELASTIC_JAX_JOB_NAMESPACE, ELASTIC_JAX_JOB_NAME, ELASTIC_JAX_JOB_UID
                                         the job's identity, stored with each checkpoint step
                                         (without a UID: namespace `local` and a UID derived from
                                         the job name and checkpoint URI; `elastic_jax.api.identity`)
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
from pathlib import Path

# Before JAX and the trainer are imported: the goodput ledger's "starting" begins here.
_STARTED_AT = time.monotonic()

from elastic_jax import contract, error_lines
from elastic_jax.exit_codes import ControllerExit
from elastic_jax.controller.final_status import FinalStatusHandoff
from elastic_jax.controller.settings import ControllerSettings, pin_host_devices
from elastic_jax.controller.signals import forward_signals_to
from elastic_jax.logs import FORMATS, JsonFormatter, TextFormatter, bind, log_format



def _setup_logging(fmt: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
    for noisy in ("absl", "jax._src", "orbax", "grain", "httpx", "uvicorn"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


# Where the kubelet reads the container's termination message (the pod's terminationMessagePath).
TERMINATION_MESSAGE_ENV = contract.ENV_TERMINATION_MESSAGE_PATH
DEFAULT_TERMINATION_MESSAGE_PATH = contract.TERMINATION_MESSAGE_PATH


def write_termination_message(line: str) -> None:
    """Writes the one-line reason the process ends with to the container's termination message file.

    The operator reads it as the pod's termination message (status.failureReason,
    the JobFailed Event). Without it, FallbackToLogsOnError gives the last 2048
    bytes of the log, which end in the long JSON summary line, cut. Only an
    existing file is written (the kubelet creates it, writable even on a
    read-only root); elsewhere (`elastic-jax run`) nothing happens, and an
    error writing it never changes the outcome.
    """
    path = os.environ.get(TERMINATION_MESSAGE_ENV) or DEFAULT_TERMINATION_MESSAGE_PATH
    data = " ".join(line.split()).encode()[:4000]  # one line; the kubelet keeps at most 4096 bytes
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC)  # no O_CREAT: never create it
    except OSError:
        return
    try:
        os.write(fd, data + b"\n")
    except OSError:
        pass
    finally:
        os.close(fd)


def _fail(message: str) -> int:
    message = error_lines.clip(message)
    print(f"error: {message}", file=sys.stderr, flush=True)
    write_termination_message(f"error: {message}")
    return ControllerExit.BAD_INPUT


def _lost(message: str) -> int:
    """A controller loss before training (e.g. the Pathways proxy did not answer): the reason on stderr and in
    the termination message; `ControllerExit.RESTART`, so the operator or launcher starts a new controller."""
    logging.getLogger("elastic_jax.controller").error("controller lost: %s", message,
                                                      extra={"event": "controller_lost", "reason": message})
    write_termination_message(f"restart: {message}")
    return ControllerExit.RESTART


def _close_quietly(what: str, close) -> str | None:
    """Calls `close()`; returns its error as one line instead of raising, so the summary is always written."""
    try:
        close()
    except Exception as e:  # noqa: BLE001 - any failure while closing is reported, never lost
        from elastic_jax.controller.elastic.errors import one_line_reason

        reason = one_line_reason(e)
        logging.getLogger("elastic_jax.controller").error("closing the %s failed: %s", what, reason)
        return reason
    return None


def main(argv: list[str] | None = None) -> int:
    """Runs the controller; returns the process exit code."""
    parser = argparse.ArgumentParser(prog="elastic-jax-controller", description=__doc__.splitlines()[0])
    # (their environment variables are read by `ControllerSettings.build`, the one reader of them)
    parser.add_argument("--manifest", default=None)
    parser.add_argument("--token-file", default=None)
    parser.add_argument("--host", default=None)
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--summary-file", default=None)
    parser.add_argument("--fresh", action="store_true",
                        help="delete the local checkpoints once the trainer and the checkpoint location check out, "
                             "then start from step 0 (elastic-jax run --fresh)")
    parser.add_argument("--serve-only", action="store_true",
                        help="serve the control API and slice set without a training loop (no trainer, "
                             "checkpoint or JAX): for operator benchmarks and tests of many jobs")
    parser.add_argument("--log-format", type=log_format, default=os.environ.get(contract.ENV_LOG_FORMAT, "json"),
                        help=f"{' or '.join(FORMATS)} (env ELASTIC_JAX_LOG_FORMAT)")
    args = parser.parse_args(argv)
    _setup_logging(args.log_format)

    from elastic_jax.api.manifest import ManifestError, load_manifest
    from elastic_jax.api.manifest_digest import check_digest

    try:
        settings = ControllerSettings.build(os.environ, flags=True, manifest=args.manifest, token_file=args.token_file,
                                            host=args.host, port=args.port, summary_file=args.summary_file)
        job = load_manifest(settings.manifest)
        check_digest(job, settings.manifest_sha256, settings.manifest)
        # every later line names its job as the operator's lines do (elastic_jax.logs schema)
        bind(namespace=job.metadata.namespace, job=job.metadata.name)
        token = settings.token()
    except (ManifestError, ValueError) as e:  # (SettingsError is a ValueError)
        return _fail(str(e))

    if args.serve_only:
        return _serve_only(job, token, settings.host, settings.port)

    pin_host_devices(job.spec.backend, job.spec.slices.devices_per_host)  # (before jax loads)

    from elastic_jax.controller.backend import BackendContext, build
    from elastic_jax.controller.checkpointing import (CheckpointMismatchError, CheckpointUriError,
                                                      clear_local_checkpoints)
    from elastic_jax.controller.run_checkpoints import job_checkpointer
    from elastic_jax.controller.control_api import ControlApiServer, create_app
    from elastic_jax.controller.elastic.slice_set import SliceSet
    from elastic_jax.controller.loop import TrainingRun
    from elastic_jax.controller.metrics import ControllerMetrics
    from elastic_jax.controller.run_record import write_summary
    from elastic_jax.controller.trainer import TrainerConfigError, load_trainer
    from elastic_jax.api.identity import identity_from_env
    from elastic_jax.api.checkpoints import run_data

    log = logging.getLogger("elastic_jax.controller")
    slice_set = SliceSet(job.spec.slices.count, job.spec.slices.spares)
    metrics = ControllerMetrics()
    holder: dict = {}
    handoff = FinalStatusHandoff()

    def status():
        run = holder.get("run")
        if run is not None:
            snapshot = run.status()
            handoff.served()
            return snapshot
        from elastic_jax.api.control import ControllerStatus

        return ControllerStatus(
            phase="Starting", step=0, total_steps=job.spec.training.steps, desired_slices=slice_set.count,
            min_slices=job.spec.slices.minimum, active_slices=[], inactive_slices=list(range(slice_set.total)),
            slices=slice_set.statuses(), pid=os.getpid(),
        )

    def stop(reason: str) -> bool:
        run = holder.get("run")
        if run is None:
            return False
        run.request_stop(reason, requested=True)
        return True

    server = ControlApiServer(
        create_app(slice_set, status, metrics, token, ready=lambda: "run" in holder, stop=stop,
                   stalled=lambda: holder["run"].stall_reason() if "run" in holder else None),
        host=settings.host, port=settings.port,
    )
    try:
        server.start()
    except RuntimeError as e:
        return _fail(str(e))
    try:
        if job.spec.backend == "pathways":
            # First, before the trainer's module or Orbax touch a JAX backend: under JAX_PLATFORMS=proxy
            # only pathwaysutils.initialize() makes the proxy backend known (issue 29 fault 1).
            from elastic_jax.controller import pathways_connect

            try:
                pathways_connect.initialize()
            except ImportError as e:
                return _fail(f"spec.backend pathways: {e}")
            except pathways_connect.ProxyUnavailableError as e:
                return _lost(str(e))
        try:
            # The manifest's folder names a trainer module left beside it, except the operator's mount of
            # the manifest ConfigMap (a cluster: the user's folder is not there).
            manifest_dir = Path(settings.manifest).resolve().parent
            local_dir = None if manifest_dir.is_relative_to(Path(contract.MANIFEST_DIR).resolve()) else manifest_dir
            trainer = load_trainer(job.spec.controller.trainer.entry_point, job.spec.controller.trainer.config,
                                   local_dir)
            ckpt = job.spec.checkpoint
            writer = identity_from_env(os.environ, job.metadata.name, ckpt.uri)
            if args.fresh:  # only now: a manifest mistake must not cost the old checkpoints
                plan = clear_local_checkpoints(ckpt.uri, writer, allow_foreign=ckpt.resume_from == "Any")
                log.info("--fresh: deleted %d checkpoint entr%s of this job from %s%s", len(plan.delete),
                         "y" if len(plan.delete) == 1 else "ies", ckpt.uri,
                         f"; {plan.kept_line()}" if plan.keep else "",
                         extra={"event": "checkpoints_cleared", "deleted": plan.delete, "kept": plan.keep})
            checkpointer = job_checkpointer(job, metrics, writer)
        except (TrainerConfigError, CheckpointUriError) as e:
            return _fail(str(e))
        try:
            # Bad input, refused before ready (so before any worker starts): another job's
            # checkpoints, a step beyond spec.training.steps, or one trained with another batch size or seed. `elastic-jax run` refuses a
            # local directory like this before starting this process; this covers gs:// and pods.
            checkpointer.check_resume(job.spec.training.steps, ckpt.resume_from,
                                      run_data(job.spec.training.global_batch_size, job.spec.training.seed),
                                      ckpt.allow_data_change)
        except CheckpointMismatchError as e:
            _close_quietly("checkpointer", checkpointer.close)
            return _fail(str(e))
        try:
            backend = build(BackendContext(job, slice_set, token))
        except (ImportError, ValueError) as e:
            return _fail(f"spec.backend {job.spec.backend}: {e}")
        run = TrainingRun(job, trainer, backend, slice_set, checkpointer, metrics, started_at=_STARTED_AT)
        holder["run"] = run
        forward_signals_to(lambda signum: run.request_stop(signal.Signals(signum).name, requested=False))
        log.info("ready: job %s, control API on port %d", job.metadata.name, server.port,
                 extra={"event": "ready", "port": server.port, "pid": os.getpid(), "job": job.metadata.name})
        summary = run.run()
        handoff.ended()
        _close_quietly("backend", backend.close)
        close_error = _close_quietly("checkpointer", checkpointer.close)
        if close_error and summary.succeeded:
            # The final save did not commit: the job is not done (the summary says why).
            summary.succeeded, summary.exit_code = False, int(ControllerExit.FAILED)
            summary.failure_reason = f"final checkpoint failed: {close_error}"
        try:
            summary.last_committed_checkpoint_step = checkpointer.latest_committed_step()
        except Exception:  # noqa: BLE001 - storage unusable: keep what the run saw committed
            pass
        if settings.summary_file:
            write_summary(settings.summary_file, summary)
        outcome = {ControllerExit.SUCCEEDED: "succeeded", ControllerExit.STOPPED: "stopped",
                   ControllerExit.RESTART: "interrupted"}.get(summary.exit_code, "failed")
        log.info("finished: %s after %d/%d steps", outcome, summary.steps,
                 summary.total_steps, extra={"event": "finished", **summary.__dict__})
        if summary.exit_code == ControllerExit.FAILED:
            # last, so the kubelet reports this line rather than the tail of the JSON summary above
            write_termination_message(f"error: {summary.failure_reason or outcome}")
        # Stopped by a signal (the operator's suspend deletes the pod; a node shutdown): whoever polls
        # (the operator reads the stopping pod) gets the step and checkpoint the stop saved. Not after
        # `POST /v1/stop`: the launcher that sends it waits for the exit without reading again.
        if summary.exit_code == ControllerExit.RESTART and not handoff.wait():
            log.warning("the final status (step %d) was not read before exit", summary.steps,
                        extra={"event": "final_status_unread", "step": summary.steps})
        return summary.exit_code
    finally:
        server.stop()


def _serve_only(job, token: str, host: str, port: int) -> int:
    """The control API over the job's slice set, no training loop (`serve_only.py`); returns the exit code."""
    from elastic_jax.controller.control_api import ControlApiServer, create_app
    from elastic_jax.controller.elastic.slice_set import SliceSet
    from elastic_jax.controller.metrics import ControllerMetrics
    from elastic_jax.controller.serve_only import ServeOnly

    log = logging.getLogger("elastic_jax.controller")
    serve = ServeOnly(SliceSet(job.spec.slices.count, job.spec.slices.spares), job.spec.slices.minimum,
                      job.spec.training.steps)
    signalled: list[int] = []

    def on_signal(signum: int) -> None:
        signalled.append(signum)
        serve.stop(signal.Signals(signum).name)

    server = ControlApiServer(create_app(serve.slice_set, serve.status, ControllerMetrics(), token,
                                         ready=lambda: True, stop=serve.stop), host=host, port=port)
    try:
        server.start()
    except RuntimeError as e:
        return _fail(str(e))
    forward_signals_to(on_signal)
    log.info("ready (serve-only): job %s, control API on port %d", job.metadata.name, server.port,
             extra={"event": "ready", "port": server.port, "pid": os.getpid(), "job": job.metadata.name,
                    "serve_only": True})
    try:
        serve.wait()
    finally:
        server.stop()
    log.info("finished (serve-only): %s", serve.stop_reason, extra={"event": "finished", "serve_only": True})
    return int(ControllerExit.RESTART if signalled else ControllerExit.STOPPED)


if __name__ == "__main__":
    sys.exit(main())
