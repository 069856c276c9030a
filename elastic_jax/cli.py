"""`elastic-jax`: the command line.

    elastic-jax run MANIFEST      train locally: controller + one CPU worker process per slice
    elastic-jax validate MANIFEST check a manifest and print the normalized spec
                                  (--trainer: also build the trainer and open its data)
    elastic-jax report DIR        draw an earlier run's timeline.png again

A user mistake (bad manifest, bad trainer config, unusable checkpoint URI,
checkpoints another job wrote) prints `error: ...` lines (a manifest: one per
problem, each naming its field) and exits 2; no traceback. What can be checked without starting a process is checked before
one starts (`elastic_jax.api.checkpoints.preflight` for the checkpoint location).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import signal
import subprocess
import sys
from pathlib import Path
from typing import Optional

import typer

from elastic_jax import error_lines, timeline
from elastic_jax.api.job import entry_point_problems
from elastic_jax.api.manifest import ManifestError, dump_yaml, load_manifest

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False)


def _print_version(value: bool) -> None:
    """Eager `--version`: the package's version (the images' tag, `elastic_jax.api.images`), then exit 0."""
    if value:
        from elastic_jax import __version__
        typer.echo(f"elastic-jax {__version__}")
        raise typer.Exit()


@app.callback()
def _options(version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                           help="Print the version and exit.")) -> None:
    """Train an ElasticTrainingJob locally, check a manifest, or redraw a run's timeline."""


def _error(message: str, code: int = 2) -> typer.Exit:
    typer.echo(f"error: {error_lines.clip(message)}", err=True)
    return typer.Exit(code)


def _errors(messages: list[str], code: int = 2) -> typer.Exit:
    """Every problem on its own `error:` line (as the API server lists them all, not the first)."""
    for message in messages[:-1]:
        typer.echo(f"error: {error_lines.clip(message)}", err=True)
    return _error(messages[-1], code)


@app.command()
def run(
    manifest: Path = typer.Argument(..., metavar="MANIFEST", help="ElasticTrainingJob YAML (e.g. examples/local-cpu.yaml)."),
    workdir: Optional[str] = typer.Option(None, help="Logs, summary and metrics; default runs/<job name>."),
    fresh: bool = typer.Option(False, "--fresh", help="Start from step 0: delete the job's local checkpoints once the trainer checks out (library mode: before your program starts; else resume from them)."),
    kill_at_step: Optional[int] = typer.Option(
        None, help="Kill a worker when training passes this step (1..steps-1); default a third of the run. "
                   "A run that resumes from a checkpoint at or past it injects nothing."),
    no_failure: bool = typer.Option(False, "--no-failure", help="Do not inject the demo worker failure."),
    kill_slice: Optional[int] = typer.Option(None, help="Slice whose worker is killed; default the highest-indexed slice training at that step."),
    hang: bool = typer.Option(False, "--hang", help="SIGSTOP the worker instead of SIGKILL (the step deadline catches it)."),
) -> None:
    """Train locally through a worker failure and print a SUMMARY JSON line last."""
    from elastic_jax.local.launcher import CheckpointLock, LaunchError, LaunchOptions, LocalLauncher, RunLock
    from elastic_jax.local.progress import ProgressView

    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        job = load_manifest(manifest, as_written=True)
    except ManifestError as e:
        raise _errors(e.problems)
    if job.spec.backend != "cpu":
        # (every line about the manifest's content names the file, as `validate` and the manifest's own errors do)
        raise _error(f"{manifest}: spec.backend: {job.spec.backend!r} runs on GKE (kubectl apply -f {manifest}; "
                     f"`elastic-jax validate --cluster {manifest}` checks it first); `elastic-jax run` runs the cpu "
                     "backend only")
    steps = job.spec.training.steps
    total = job.spec.slices.total  # spares have indices count..total-1
    if kill_slice is not None and not 0 <= kill_slice < total:
        raise _error(f"--kill-slice {kill_slice}: the job has slices 0..{total - 1}")
    if kill_at_step is not None and steps == 1:
        raise _error(f"--kill-at-step {kill_at_step}: a 1-step job (spec.training.steps: 1) has no step to fail after")
    if kill_at_step is not None and not 1 <= kill_at_step < steps:
        raise _error(f"--kill-at-step {kill_at_step}: must be in 1..{steps - 1} (a failure after that many steps)")
    if workdir is not None and not workdir.strip():
        # (Path("") is ".": the current folder would have been taken quietly; a new user's trial)
        raise _error("--workdir '': empty; give a folder (default runs/<job name>)")
    if hang and no_failure:
        raise _error("--hang and --no-failure contradict each other")
    for flag, value in (("--kill-at-step", kill_at_step), ("--kill-slice", kill_slice)):
        if no_failure and value is not None:
            raise _error(f"{flag} and --no-failure contradict each other")
    if fresh and "://" in job.spec.checkpoint.uri:
        raise _error(f"{manifest}: spec.checkpoint.uri is {job.spec.checkpoint.uri}: --fresh clears local checkpoint "
                     "directories only")
    # Before any process starts: a checkpoint location that is a file or not writable, another
    # job's checkpoints, a step beyond spec.training.steps (gs:// is probed by the controller,
    # which refuses it before any worker starts).
    # Checkpoints another process holds (a run deleting them for --fresh, or saving; a SIGKILLed launcher's
    # controller on its way out) are checked once this run holds them: read now, that work half-done would be
    # blamed on the steps ("uncommitted steps"). The locks below then wait for a gone launcher's processes
    # (same --workdir) or refuse a live run.
    checkpoints_held = not CheckpointLock(job.spec.checkpoint.uri).is_free()
    if not checkpoints_held:
        _check_checkpoint(job, manifest, fresh=fresh, check_gcs=False)
    # The trainer too (its config, its size, its data), before the run folder or the checkpoint folder is
    # created or locked: a refusal leaves both as they were (the controller would refuse it the same way, but
    # only after the launcher had written its folder).
    _check_trainer(job, manifest)
    inject = not no_failure and steps > 1
    options = LaunchOptions(
        workdir=Path(workdir) if workdir is not None else Path("runs") / job.metadata.name,
        kill_at_step=None if not inject else (kill_at_step if kill_at_step is not None else max(1, steps // 3)),
        kill_slice=kill_slice,
        kill_signal=signal.SIGSTOP if hang else signal.SIGKILL,
        fresh=fresh,
    )
    # SIGTERM (kill, timeout, a CI cancel) stops the run like Ctrl-C: checkpoint, stop every child.
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    # Ctrl-C or `kill -INT`, set explicitly: a run started from a background shell inherits SIGINT ignored,
    # and Python keeps an inherited SIG_IGN (no KeyboardInterrupt), so `kill -INT` would do nothing.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    # (a step already there is an earlier run's: the report says so, even if maxToKeep deletes it during this run)
    earlier_steps = _saved_steps(job.spec.checkpoint.uri)
    try:
        with RunLock(options.workdir, on_wait=lambda m: typer.echo(m, err=True), job=job.metadata.name,
                     on_note=lambda m: typer.echo(f"note: {m}", err=True)) as run_lock, \
                CheckpointLock(job.spec.checkpoint.uri) as checkpoint_lock:
            # (the controller holds them too: a SIGKILLed launcher's controller still checkpointing keeps
            # the next run waiting instead of writing the same checkpoints beside it)
            options = dataclasses.replace(options, lock_fds=tuple(
                fd for fd in (run_lock.fd, checkpoint_lock.fd) if fd is not None))
            if checkpoints_held:  # (now ours: what it reads is what the holder left committed)
                _check_checkpoint(job, manifest, fresh=fresh, check_gcs=False)
                earlier_steps = _saved_steps(job.spec.checkpoint.uri)
            if fresh and job.spec.controller.library_mode:
                _clear_for_library_mode(job, manifest)
            elif fresh:
                _say_what_fresh_keeps(job)
            finished = _finished_at(job, fresh)
            if finished is not None:  # nothing to train: no process is started
                summary = LocalLauncher(job, manifest, options).finished_summary(*finished)
                summary["timeline"] = None  # (nothing trained: nothing to draw)
            else:
                with ProgressView(steps, resuming_from=None if fresh else max(earlier_steps, default=None)) as view:
                    launcher = LocalLauncher(job, manifest, options, on_status=view.update, on_message=view.message)
                    summary = launcher.run()
                    signal.signal(signal.SIGINT, signal.SIG_IGN)  # (the report below is printed whole)
                    signal.signal(signal.SIGTERM, signal.SIG_IGN)
                # (after the progress view, under the run lock: no other run of this folder rewrites its history)
                summary["timeline"] = _draw_timeline(options.workdir, job.metadata.name)
    except LaunchError as e:
        # The controller's refusal of a field (the trainer it cannot build) names the file as `validate` does.
        message = str(e)
        raise _error(f"{manifest}: {message}" if message.startswith("spec.") else message, e.exit_code)
    except KeyboardInterrupt:
        # before the launcher ran (it catches its own: a SUMMARY follows): waiting for a lock, checking
        # the checkpoints; no process of this run was started
        typer.echo("interrupted before the run started: no process was started", err=True)
        raise typer.Exit(130)
    _print_report(summary, earlier_steps)
    if summary.get("interrupted"):
        typer.echo("interrupted: every process stopped", err=True)
    typer.echo("SUMMARY " + json.dumps(summary, sort_keys=True))
    raise typer.Exit(130 if summary.get("interrupted") else 0 if summary["succeeded"] else 1)


def _check_trainer(job, manifest: Path) -> None:
    """`_trainer_problems` for `run`, before anything is written: its `error:` lines (exit 2) when the trainer
    cannot be built. Nothing in library mode (your program is the trainer), nor without the controller extra
    here (the controller then checks it, and says so the same way)."""
    if job.spec.controller.library_mode:
        return
    found = [p for p in _trainer_problems(job, manifest) if not p.startswith(_NEEDS_EXTRA)]
    if found:
        raise _errors(found)


def _clear_for_library_mode(job, manifest: Path) -> None:
    """`--fresh` in library mode: your program restores what `Runtime.save` wrote at spec.checkpoint.uri, so the
    steps are deleted here, before it starts (the built-in controller deletes them itself once its trainer
    checked out). The same rules as the built-in's (`checkpoints.fresh_plan`, already checked by the preflight:
    only Orbax entries, only this job's steps unless resumeFrom is Any); one line says what was deleted, or
    that there was nothing to delete.

    Raises:
      typer.Exit: the directory could not be emptied (one `error:` line, exit 2; nothing started).
    """
    from elastic_jax.api import checkpoints, identity

    ckpt = job.spec.checkpoint
    where = _where(ckpt.uri)
    try:
        plan = checkpoints.clear_local_checkpoints(ckpt.uri, identity.local_identity(job.metadata.name, ckpt.uri),
                                                   allow_foreign=ckpt.resume_from == "Any")
    except checkpoints.CheckpointUriError as e:
        raise _errors(_in_file(manifest, [str(e)]))
    deleted = plan.delete
    if plan.keep:
        typer.echo(f"--fresh: {plan.kept_line()} (in spec.checkpoint.uri {where})", err=True)
    if deleted:
        typer.echo(f"--fresh: deleted {len(deleted)} checkpoint entr{'y' if len(deleted) == 1 else 'ies'} "
                   f"({', '.join(deleted)}) from spec.checkpoint.uri {where}; your program starts from step 0",
                   err=True)
    else:
        typer.echo(f"--fresh: nothing to delete: spec.checkpoint.uri {where} holds no checkpoint; "
                   "your program starts from step 0", err=True)


def _where(uri: str) -> str:
    """`uri` as a user finds it: a relative local folder also as the absolute path it names from here."""
    if "://" in uri or Path(uri).is_absolute():
        return uri
    return f"{uri}, i.e. {Path(uri).resolve()}"


def _say_what_fresh_keeps(job) -> None:
    """`--fresh` with the built-in trainer (its controller deletes this job's steps once the trainer checks
    out): one line now naming what it will keep in spec.checkpoint.uri, if anything (already checked by the
    preflight)."""
    from elastic_jax.api import checkpoints, identity

    ckpt = job.spec.checkpoint
    try:
        plan = checkpoints.fresh_plan(ckpt.uri, identity.local_identity(job.metadata.name, ckpt.uri),
                                      allow_foreign=ckpt.resume_from == "Any")
    except checkpoints.CheckpointUriError:
        return  # (the controller refuses it with the same words)
    if plan.keep:
        typer.echo(f"--fresh: {plan.kept_line()} (in spec.checkpoint.uri {_where(ckpt.uri)})", err=True)


def _finished_at(job, fresh: bool):
    """`checkpoints.finished_at` for `run`: the job's local checkpoints already hold its last step, and it reads
    (so a run would start every process, restore, and train nothing); None with --fresh or in library mode
    (the user's program owns its checkpoints).

    The last step's data is read too (`checkpointing.step_read_problem`): one whose metadata is intact but
    whose arrays are truncated or missing is not a finished job. A warning line says so, and None is
    returned: the run starts, and its controller falls back to the newest step that restores, as for any
    corrupt newest step (the report says from which, and why).
    """
    if fresh or job.spec.controller.library_mode:
        return None
    from elastic_jax.api import checkpoints

    uri = job.spec.checkpoint.uri
    finished = checkpoints.finished_at(uri, job.spec.training.steps)
    if finished is None:
        return None
    problem = _last_step_read_problem(uri, finished[0])
    if problem is None:  # the check could not run (no controller extra here): the controller decides
        return None
    if problem:
        typer.echo(f"warning: spec.checkpoint.uri {uri}: the last checkpoint step {finished[0]} could not be read "
                   f"({problem}); the run resumes from the newest step that restores", err=True)
        return None
    return finished


def _last_step_read_problem(uri: str, step: int) -> str | None:
    """`checkpointing.step_read_problem` in a child process: "" when local step `step` reads, the short reason
    when it does not, None when the check itself could not run (no controller extra, a crash).

    A child, because a read that fails part-way leaves Orbax's and TensorStore's reads in flight, which print
    a traceback each ("Event loop is closed") and absl warnings on this process's console after the answer.
    """
    code = ("import sys\n"
            "from elastic_jax.controller.checkpointing import step_read_problem\n"
            "print('READ ' + (step_read_problem(sys.argv[1], int(sys.argv[2])) or ''))\n")
    try:
        proc = subprocess.run([sys.executable, "-c", code, uri, str(step)], capture_output=True, text=True,
                              timeout=600, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    answers = [ln for ln in proc.stdout.splitlines() if ln.startswith("READ ")]
    return answers[-1].removeprefix("READ ").strip() if answers else None


def _saved_steps(uri: str) -> dict[int, float]:
    """The steps in a local checkpoint folder before a run starts: {step: its folder's mtime (Unix seconds)};
    {} for gs:// or a folder that is missing or unreadable (the preflight has said what is wrong with it)."""
    from elastic_jax.api import checkpoints

    if not checkpoints.is_local(uri):
        return {}
    root, saved = checkpoints.local_path(uri), {}
    for step in checkpoints.committed_local_steps(root):  # (Orbax's listing, as the controller's)
        try:
            saved[step] = (root / str(step)).stat().st_mtime
        except OSError:  # (deleted since the listing)
            pass
    return saved


def _earlier_run(uri: str, step: int, earlier_steps: dict[int, float]) -> str | None:
    """For a run that resumed from a local checkpoint step that was there before it started (`earlier_steps`,
    from `_saved_steps`): where it was and when an earlier run saved it. The folder is the manifest's, so
    every run of that manifest on this machine shares it (another clone's run too, as
    `examples/04-own-loop.yaml`'s /tmp folder): the report says so, and how to start over. None for a step
    this run saved (a restarted controller resumed from it). Read before the run, so a step `maxToKeep`
    deleted during the run is still named (a new user's trial: the note was skipped then)."""
    from datetime import datetime, timezone

    if step not in earlier_steps:
        return None
    when = datetime.fromtimestamp(earlier_steps[step], timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    return (f"step {step} was saved at {when} by an earlier run into {uri}, a folder every run of this "
            "manifest on this machine shares (another clone's too); --fresh starts from step 0")


def _draw_timeline(workdir: Path, job_name: str) -> str | None:
    """`workdir`'s timeline.png (`elastic_jax.timeline`), its path; None (with a warning) when it cannot be drawn:
    the run's report must not fail for its picture."""
    try:
        return str(timeline.draw(workdir, title=job_name))
    except (timeline.TimelineError, ImportError) as e:
        typer.echo(f"warning: no timeline picture: {e}", err=True)
        return None


@app.command()
def report(
    run_dir: Path = typer.Argument(..., metavar="DIR", help="An earlier run's folder (its --workdir, e.g. runs/<job name>)."),
) -> None:
    """Draw DIR/timeline.png again from the run's history (loss, steps per second, active slices, recoveries)."""
    try:
        path = timeline.draw(run_dir)
    except timeline.TimelineError as e:
        raise _error(str(e))
    except ImportError as e:
        raise _error(f"the timeline needs matplotlib (pip install 'elastic-jax[plot]'): {e}")
    typer.echo(f"timeline {path}")


def _print_report(s: dict, earlier_steps: dict[int, float]) -> None:
    """The run's report on stderr, for a reader (the SUMMARY line on stdout is for programs); `earlier_steps`
    the local checkpoint steps there before the run started (`_saved_steps`)."""
    out = sys.stderr
    print("", file=out)
    if s.get("already_finished"):
        started = "nothing was started" if s.get("nothing_started") else "its processes started only to restore it"
        print(f"job {s['job']}: already finished at checkpoint step {s['steps']}/{s['total_steps']}; trained 0 "
              f"steps this run, {started} (--fresh starts over)", file=out)
    else:
        outcome = "interrupted" if s.get("interrupted") else "succeeded" if s["succeeded"] else "FAILED"
        this_run = s.get("steps_this_run")
        trained = "" if this_run is None or this_run == s["steps"] else f" ({this_run} this run)"
        if s["steps"] is None:  # (interrupted before any controller answered: nothing known of its progress)
            print(f"job {s['job']}: {outcome} before its controller answered, in {s['wall_seconds']:.0f} s",
                  file=out)
        else:
            print(f"job {s['job']}: {outcome} after {s['steps']}/{s['total_steps']} steps{trained} "
                  f"in {s['wall_seconds']:.0f} s", file=out)
    restored = s.get("restored_from_step")
    started = s.get("started_from_step")
    if started == 0 and restored:
        restored = None  # the run started at step 0; a successor's resume point is in its controller-loss line
    if restored is not None:
        done = " (already finished: nothing left to train; --fresh starts over)" if restored >= s["total_steps"] else ""
        resumed = s.get("resumed_from") or {}
        writer = resumed.get("writer")
        by = (f" written by {writer['namespace']}/{writer['name']} (uid {writer['uid']})" if writer
              else " written by an unknown job (no writer identity saved)" if resumed else "")
        step = resumed.get("step", restored)
        if started is not None and started != step:  # (as above: the run's own start, not a successor's)
            step, by = started, ""
        if s.get("already_finished"):
            print(f"  checkpoint step {restored}{by}", file=out)
        else:
            print(f"  resumed from checkpoint step {step}{by}{done}", file=out)
        if resumed.get("fallbackReason"):
            print(f"  warning: {resumed['fallbackReason']}; resumed from step {step}", file=out)
        earlier = _earlier_run(s["checkpoint_uri"], step, earlier_steps)
        if earlier:
            print(f"    {earlier}", file=out)
    if s.get("initial_loss") is not None and s.get("final_loss") is not None:
        # (a resumed run carries the job's first loss, saved with the checkpoint: said, so it is not read as this
        # run's first step; a trial did)
        first = " (the job's first step, saved with its checkpoints)" if restored else ""
        print(f"  loss {s['initial_loss']:.3f}{first} -> {s['final_loss']:.3f}", file=out)
    elif s.get("goodput") is None:  # (None exactly when no controller of the run completed a step)
        print("  loss n/a (no step made)", file=out)
    rec = ", ".join(f"{x:.2f} s" for x in s["recovery_seconds"])
    if s.get("unfinished_recoveries"):
        rec += ("; " if rec else "") + f"{s['unfinished_recoveries']} unfinished when the run ended"
    lost = "n/a (not measured: your program owns its loop)" if s["steps_lost"] is None else s["steps_lost"]
    if (s.get("slices_lost") or 0) > s["recoveries"]:  # (a slice lost while another's loss was recovered)
        rec += f"; {s['slices_lost']} slices lost"
    if s.get("paused_seconds"):
        rec += f"; paused {s['paused_seconds']:.1f} s waiting for slices below the minimum"
    print(f"  recoveries {s['recoveries']} ({rec or '-'}); steps lost {lost}; "
          f"worker restarts {s['worker_restarts']}; controller restarts {s['controller_restarts']}", file=out)
    for loss in s.get("controller_losses") or []:
        what = ("interrupted by a signal (it checkpointed the step it reached)" if loss["cause"] == "interrupted"
                else f"lost (exit {loss['exit_code']})")
        resumed = loss.get("resumed_from_step")
        print(f"    controller {what} at step {loss['at_step']}"
              + ("" if resumed is None else f"; its successor resumed from step {resumed}"), file=out)
    for spell in s.get("controller_unresponsive") or []:
        ended = {"answered": "then answered again", "exited": "then its process ended",
                 "run_ended": "until the run ended"}.get(spell["ended"], "")
        print(f"    controller (pid {spell['pid']}) unresponsive at step {spell['at_step']} for "
              f"{spell['seconds']:.0f} s, {ended} (booked recovering, not productive)", file=out)
    if s.get("injected_failure_skipped"):
        print(f"  injected failure: none ({s['injected_failure_skipped']})", file=out)
    unbooked = s.get("unbooked_seconds") or 0.0
    # (what the unbooked seconds were: a trial read "start-up, shutdown" over a long wait for a lost controller's
    # successor)
    what = "start-up, waits for a lost controller's successor, shutdown" if s.get("controller_restarts") \
        else "start-up, shutdown"
    over = (f" of {s['booked_seconds']:.1f} s booked by the controllers; the launcher's own {unbooked:.1f} s of the "
            f"{s['wall_seconds']:.1f} s wall ({what}) are not" if unbooked >= 0.05 else "")
    print(f"  goodput {'n/a (no steps run)' if s.get('goodput') is None else format(s['goodput'], '.1%') + over}",
          file=out)
    booked = {k: v for k, v in (s.get("goodput_seconds") or {}).items() if v >= 0.05}
    if booked:
        print("    seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in booked.items()), file=out)
    committed = s["last_committed_checkpoint_step"]
    print(f"  checkpoints {s['checkpoint_uri']} (last committed step {'none' if committed is None else committed})", file=out)
    print(f"  metrics {s['metrics_file']}; logs {s['logs_dir']}", file=out)
    if s.get("timeline"):
        print(f"  timeline {s['timeline']}", file=out)
    if s.get("failure_reason"):
        print(f"  failure: {s['failure_reason']}", file=out)


@app.command()
def validate(
    manifest: Path = typer.Argument(..., metavar="MANIFEST", help="ElasticTrainingJob YAML."),
    trainer: bool = typer.Option(
        False, "--trainer",
        help="Also build the trainer as the controller would: import spec.controller.trainer.entryPoint, "
             "check its config, open its data (needs the controller extra)."),
    cluster: bool = typer.Option(
        False, "--cluster",
        help="Also apply the rules of a job on a cluster, as `kubectl apply` (the CRD's CEL) and the operator do: "
             "an absolute checkpoint folder the controller pod can mount, gs:// for pathways, a known TPU "
             "accelerator/topology. Without it, the rules of `elastic-jax run` (a relative path is fine)."),
) -> None:
    """Validate a manifest; print it with defaults filled in.

    Also refuses a local checkpoint directory that exists here and holds checkpoints
    `elastic-jax run` would not resume from (another job's, or beyond spec.training.steps).
    With --trainer, everything `run` checks before starting: the trainer, and whether
    checkpoints can be written at spec.checkpoint.uri (a gs:// bucket is probed).

    Every stage runs whatever an earlier one found (the manifest, then the TPU table or the --cluster
    rules, then the trainer and the checkpoint folder), each over the fields that validated (a check
    reading a field that failed is skipped: that field's error says why), and every problem is one
    `error:` line (exit 2), as the API server lists every failed rule of an object at once.
    """
    problems: list[str] = []
    try:
        job = checked = load_manifest(manifest, as_written=True)
    except ManifestError as e:
        problems += e.problems
        job, checked = None, e.partial  # (None: unreadable, or no mapping: nothing to check further)
    if checked is not None:
        problems += _stage_problems(_cluster_problems if cluster else _tpu_problems, checked, job)
        if job is not None:
            _warn_suspend(job)
        library_mode = _attr(checked, "spec.controller.command") is not None
        if trainer and library_mode:
            # (a note, not an error: a valid library-mode manifest must pass `validate --trainer examples/*`)
            typer.echo(f"note: {manifest}: --trainer: spec.controller.command runs your own program: there is no "
                       "trainer to build; its checkpoint folder is checked", err=True)
            problems += _stage_problems(_checkpoint_problems, checked, False, True)
        elif trainer:
            problems += _stage_problems(_trainer_problems, checked, manifest)
            problems += _stage_problems(_checkpoint_problems, checked, False, True)
        elif not cluster:  # (on a cluster the folder is in the controller pod, not here)
            problems += _stage_problems(_resume_problems, checked)
    if problems:
        # Every line about the manifest's content names the file, whichever stage found it; a later stage may
        # refuse what the manifest's own rules refused (the `s3://` uri the checkpoint folder check refuses
        # too): one line for it.
        raise _errors(list(dict.fromkeys(_in_file(manifest, problems))))
    typer.echo(dump_yaml(as_applied(job)))


def _in_file(manifest: Path, problems: list[str]) -> list[str]:
    """`problems` each prefixed `MANIFEST: ` as the manifest's own errors are (`ManifestError`), unless it
    already is, or is about this machine rather than the file (`--trainer needs the controller extra`)."""
    prefix = f"{manifest}: "
    return [p if p.startswith(prefix) or p.startswith(_NEEDS_EXTRA) else prefix + p for p in problems]


def _attr(obj, dotted: str, default=None):
    """`obj.a.b.c` for `dotted` "a.b.c", or `default` where a part is missing (a field that failed validation)."""
    for name in dotted.split("."):
        obj = getattr(obj, name, default)
        if obj is default:
            return default
    return obj


def _stage_problems(check, job, *args) -> list[str]:
    """The problems `check(job, *args)` finds; [] when it reads a field the manifest did not validate
    (`job` is then `ManifestError.partial`, whose failed fields are absent: their own errors were printed)."""
    try:
        return check(job, *args)
    except AttributeError:
        return []


def as_applied(job) -> dict:
    """The normalized manifest (camelCase, defaults filled in) with the container resources the operator's
    renderer gives the pods (`Resources.effective`, its `DEFAULT_REQUESTS`): `requests: {}` in the spec is
    250m CPU / 512Mi memory on the cluster, so `validate` prints that. The controller pod is the cpu
    renderer's on both backends; a pathways worker gets no default request (its TPU limit is the operator's),
    the Pathways server image unless the spec names one, and the hosts and chips its topology has (when the
    operator's rules resolve it). A library-mode job (spec.controller.command) prints no default trainer:
    the printout validates again."""
    from elastic_jax.api.backend_rules import pathways_server_image, resolve_pathways
    from elastic_jax.api.cluster import UnsupportedBackend

    if job.spec.backend == "pathways":
        try:
            job = resolve_pathways(job)
        except UnsupportedBackend:
            pass  # (a rule of the cluster, checked with --cluster: the fields stay as written)
    out = job.model_dump(mode="json", by_alias=True, exclude_none=True)
    spec = out["spec"]
    spec["controller"]["resources"] = job.spec.controller.resources.effective("controller")
    if job.spec.controller.command is not None:
        spec["controller"].pop("trainer", None)
    if job.spec.backend == "cpu":
        spec["worker"]["resources"] = job.spec.worker.resources.effective("worker")
    else:
        spec["worker"]["image"] = pathways_server_image(job)
    return out


def _cluster_problems(checked, job) -> list[str]:
    """The rules `kubectl apply` (the CRD's CEL, `elastic_jax.api.cluster`) and then the operator apply to a job
    on a cluster, over `checked` (the job, or as far as it validated); `job` None when it did not (the
    manifest's size and the operator's rendering need the whole job, and are then not checked)."""
    from elastic_jax.api import cluster

    # (the cluster rules read only these two fields; a failed one is absent and skips them)
    found = cluster.problems({"backend": checked.spec.backend, "checkpoint": {"uri": checked.spec.checkpoint.uri}})
    if job is None:
        return found + _tpu_problems(checked, job)
    from elastic_jax.api.size_limits import client_apply_size_problem, manifest_size_problem

    too_large_for_client_apply = client_apply_size_problem(job)
    if too_large_for_client_apply:  # (a warning: `kubectl apply --server-side` takes it)
        typer.echo(f"warning: {too_large_for_client_apply}", err=True)
    too_large = manifest_size_problem(job)
    if too_large:  # (the API server refuses it only when the operator creates the ConfigMap)
        found.append(too_large)
    # What the operator checks when rendering (the TPU table of backend pathways), with its messages.
    from elastic_jax.api.backend_rules import resolve
    from elastic_jax.api.cluster import UnsupportedBackend

    try:
        resolve(job)
    except UnsupportedBackend as e:
        found.append(str(e))
    # (resolve stops at its first refusal; the TPU checks each alone, the duplicates dropped)
    return list(dict.fromkeys(found + _tpu_problems(job)))


def _warn_suspend(job) -> None:
    """`spec.suspend: true` with a local checkpoint folder: a warning line (not an error), in the words of the
    operator's SuspendDropsCheckpoints / ResumedFromStepZero Events (`cluster.local_checkpoint_loss`)."""
    if not job.spec.suspend:
        return
    from elastic_jax.api.cluster import local_checkpoint_loss

    why = local_checkpoint_loss(job)
    if why:
        typer.echo(f"warning: spec.suspend: true: on a cluster, {why}; the resume starts again from step 0", err=True)


def _tpu_problems(checked, job=None) -> list[str]:
    """The TPU accelerator/topology table, the TPU node selectors (backend pathways: the CRD's CEL applies
    them to every job, so `validate` does too, with or without --cluster) and the operator's split of the
    global batch over the slices' chips; each checked alone over `checked`
    (the job, or as far as it validated: a check reading a field that failed is skipped)."""
    if checked.spec.backend != "pathways":
        return []
    from elastic_jax.api.backend_rules import check_batch_shares, check_node_selectors
    from elastic_jax.api.cluster import UnsupportedBackend
    from elastic_jax.api.tpu_shapes import slice_shape

    found = []
    slices = checked.spec.slices
    for check in (lambda: slice_shape(slices.accelerator, slices.topology) if slices.accelerator and slices.topology
                  else None,  # (a missing one is the manifest's own error: "backend pathways needs ...")
                  lambda: check_node_selectors(checked),  # (also a CEL rule of the CRD)
                  # (the operator's: the chips come from the TPU table, which the CRD's CEL does not multiply)
                  lambda: check_batch_shares(checked, slice_shape(slices.accelerator, slices.topology))
                  if slices.accelerator and slices.topology else None):
        try:
            check()
        except UnsupportedBackend as e:
            found.append(str(e))
        except AttributeError:
            pass
    return found


def _check_checkpoint(job, manifest: Path, *, fresh: bool, check_gcs: bool) -> None:
    """`_checkpoint_problems` for `run`: one `error:` line naming the manifest (exit 2) when there is one, the
    line `validate` prints."""
    found = _checkpoint_problems(job, fresh, check_gcs)
    if found:
        raise _errors(_in_file(manifest, found))


def _checkpoint_problems(job, fresh: bool, check_gcs: bool) -> list[str]:
    """The checkpoint checks `run` makes before starting anything (`checkpoints.preflight`); [] or one problem.

    The identity is the one `elastic-jax run` gives the job (namespace `local`).
    """
    from elastic_jax.api import checkpoints, identity

    ckpt = job.spec.checkpoint
    me = identity.local_identity(job.metadata.name, ckpt.uri)
    try:
        checkpoints.preflight(ckpt.uri, job.spec.training.steps, me, ckpt.resume_from, fresh=fresh,
                              check_gcs=check_gcs, data=_run_data(job), allow_data_change=ckpt.allow_data_change)
    except (checkpoints.CheckpointUriError, checkpoints.CheckpointMismatchError) as e:
        return [str(e)]
    return []


def _run_data(job) -> dict | None:
    """What the built-in loop records with each step that a resume must match (`checkpoints.run_data`); None in
    library mode (the user's own loop records what it likes)."""
    from elastic_jax.api import checkpoints

    if job.spec.controller.command is not None:
        return None
    return checkpoints.run_data(job.spec.training.global_batch_size, job.spec.training.seed)


def _resume_problems(job) -> list[str]:
    """`validate` without `--trainer`: reads (never writes) a local checkpoint directory that exists here,
    and refuses checkpoints `elastic-jax run` would refuse to resume from; [] or one problem."""
    from elastic_jax.api import checkpoints, identity

    ckpt = job.spec.checkpoint
    try:
        checkpoints.check_resume(ckpt.uri, job.spec.training.steps,
                                 identity.local_identity(job.metadata.name, ckpt.uri), ckpt.resume_from,
                                 _run_data(job), ckpt.allow_data_change)
    except (checkpoints.CheckpointMismatchError, checkpoints.CheckpointUncommittedError) as e:
        return [str(e)]
    return []


# The one `validate --trainer` problem about this machine, not the manifest.
_NEEDS_EXTRA = "--trainer needs the controller extra"


def _trainer_problems(job, manifest: Path) -> list[str]:
    """Builds the job's trainer (config checked, data opened); [] or its problems (every one the trainer
    reports: `TrainerConfigError.problems`), each with the manifest's name.

    An entry point that raises (a missing config key, a function that is no trainer) is one problem
    too (`load_trainer` names the field, the exception and where it was raised), as the
    controller reports it under `elastic-jax run` and in a pod.
    """
    try:
        from elastic_jax.controller.trainer import TrainerConfigError, load_trainer
    except ImportError as e:
        return [f"{_NEEDS_EXTRA} (pip install 'elastic-jax[controller]'): {e}"]
    spec = job.spec.controller.trainer
    if entry_point_problems(spec.entry_point):
        return []  # (an entry point of the wrong shape: its own error says so; importing it would say it twice)
    try:
        built = load_trainer(spec.entry_point, spec.config, manifest.parent)
    except TrainerConfigError as e:
        return [f"{manifest}: {problem}" for problem in e.problems]
    try:
        examples = f"{len(built.dataset):,} examples"
    except TypeError:  # an iterable dataset has no length
        examples = "an unsized dataset"
    typer.echo(f"trainer {built.name!r} from {spec.entry_point}: config ok, {examples}", err=True)
    return []


def main() -> None:
    """Console-script entry point."""
    app()


if __name__ == "__main__":
    main()
