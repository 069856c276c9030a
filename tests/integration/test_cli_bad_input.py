"""Bad input to a real `elastic-jax run`: one clear line, a non-zero exit, nothing half-started.

One test per way a run ends on bad input: a refusal before any process starts (the wording of every such
refusal, and of `validate`, and that nothing was written, is checked in-process by
tests/unit/test_cli_refusals.py), a refusal by the
controller process (the trainer, a gs:// bucket), a controller that exits before it is ready, checkpoints
that are another job's, corrupt, or already finished, a second launcher, signals to the launcher.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from elastic_jax.api import identity
from elastic_jax.api.identity import local_uid
from tests.support.runs import ROOT, fake_step, job_manifest, leftover_processes, run_cli

CLI = str(Path(sys.executable).parent / "elastic-jax")


def run_bad(tmp_path: Path, manifest, env: dict | None = None) -> tuple[int, str, str]:
    path = tmp_path / "job.yaml"
    path.write_text(manifest if isinstance(manifest, str) else yaml.safe_dump(manifest))
    proc = subprocess.run([CLI, "run", str(path), "--workdir", str(tmp_path / "run")], capture_output=True, text=True,
                          timeout=180, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})
    assert not leftover_processes(str(tmp_path))
    return proc.returncode, proc.stdout, proc.stderr


def assert_one_line_error(code, stdout, stderr, *fragments):
    assert code == 2, (code, stderr)
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errors) == 1, stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    assert "Traceback" not in stderr and "SUMMARY" not in stdout


def no_workers_started(tmp_path: Path) -> bool:
    return not list((tmp_path / "run").glob("worker-*.log"))


TRAINED = "trained"  # the name of the job whose real checkpoints the tests below start from


@dataclass
class TrainedJob:
    """Real Orbax steps 10 and 20 of job `trained` (20 steps, one save every 10), written once per module.

    `restore()` puts them back at `ckpt`, always the same path: a local job's writer UID is of its name and
    its checkpoint path (`identity.local_uid`), so a copy elsewhere would be another job's steps."""

    ckpt: Path
    pristine: Path

    def restore(self) -> Path:
        """The checkpoint folder as the training run left it (whatever an earlier test did to it)."""
        shutil.rmtree(self.ckpt, ignore_errors=True)
        shutil.copytree(self.pristine, self.ckpt, symlinks=True)
        return self.ckpt

    def manifest(self, tmp_path: Path, name: str = TRAINED, steps: int = 20, **checkpoint) -> dict:
        """A manifest of job `name` training `steps` steps on these checkpoints (`checkpoint` adds fields)."""
        return job_manifest(name, tmp_path, training={"steps": steps, "globalBatchSize": 8},
                            checkpoint={"uri": str(self.ckpt), "intervalSteps": 10, "maxToKeep": 5, **checkpoint})


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> TrainedJob:
    """One real training run shared by every test that needs a job's committed steps: each of them used to
    train its own (a full `elastic-jax run` each, 8 in this file) before what it tests."""
    base = tmp_path_factory.mktemp("trained")
    job = TrainedJob(ckpt=base / "ckpt", pristine=base / "pristine")
    first = run_cli(job.manifest(base), base, "--no-failure")
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.summary["resumed_from"] is None and first.summary["steps"] == 20, first.summary
    steps = sorted(int(p.name) for p in job.ckpt.iterdir() if p.name.isdigit())
    assert steps == [10, 20], steps
    for step in steps:  # each committed step names its writer (Orbax custom metadata)
        data = json.loads((job.ckpt / str(step) / "_CHECKPOINT_METADATA").read_text())
        assert data["custom_metadata"]["elasticJaxWriter"] == {
            "namespace": "local", "name": TRAINED, "uid": local_uid(TRAINED, str(job.ckpt))}, data
    shutil.copytree(job.ckpt, job.pristine, symlinks=True)
    return job


def test_a_refusal_before_anything_starts_is_exit_2_and_one_line_from_the_installed_command(tmp_path):
    """The console script's refusal path, once for every refusal `run` makes before starting a process (the
    manifest, its flags, `--workdir`, the checkpoint folder's preflight: each checked in-process by
    tests/unit/test_cli_refusals.py): exit 2, one `error:` line, no traceback, nothing created."""
    m = job_manifest("bad", tmp_path)
    m["spec"]["sliecs"] = {"count": 2}
    code, out, err = run_bad(tmp_path, m)
    assert_one_line_error(code, out, err, f"{tmp_path / 'job.yaml'}: spec.sliecs: unknown field")
    assert not (tmp_path / "run").exists()  # refused before anything started


def test_unreachable_gcs_checkpoint_uri(tmp_path, gcs_emulator):
    m = job_manifest("badgcs", tmp_path, checkpoint={"uri": "gs://no-such-bucket-ej/ckpt"})
    code, out, err = run_bad(tmp_path, m, env=gcs_emulator.env)
    assert_one_line_error(code, out, err, "spec.checkpoint.uri", "gs://no-such-bucket-ej/ckpt")
    assert no_workers_started(tmp_path)


def test_checkpoints_on_gcs_emulator_and_resume(tmp_path, gcs_emulator):
    """A run that loses a worker checkpoints to gs://; a second run of the same job resumes from gs://; a third
    with another seed is refused by the controller, the one process that reads gs:// steps (issue 31 item 11)."""
    bucket = gcs_emulator.make_bucket("ej-runtime")
    m = job_manifest("gcsjob", tmp_path, checkpoint={"uri": f"{bucket}/jobs/gcsjob", "intervalSteps": 20})
    first = run_cli(m, tmp_path, "--kill-at-step", "10", env=gcs_emulator.env)
    assert first.returncode == 0, first.stderr[-3000:]
    s = first.summary
    assert s["succeeded"] and s["recoveries"] == 1 and s["last_committed_checkpoint_step"] == 60

    from google.cloud import storage

    client = storage.Client(project="test", client_options={"api_endpoint": gcs_emulator.url})
    names = {b.name for b in client.list_blobs("ej-runtime", prefix="jobs/gcsjob/")}
    assert any(n.startswith("jobs/gcsjob/60/") for n in names)
    assert any(n.endswith("commit_success.txt") for n in names)

    second = run_cli(m, tmp_path, "--no-failure", env=gcs_emulator.env)
    assert second.returncode == 0, second.stderr[-3000:]
    assert second.summary["restored_from_step"] == 60 and second.summary["steps"] == 60
    # Issue 11: `steps` 60 read as if this run had trained them; it trained none, the job was complete.
    assert second.summary["steps_this_run"] == 0 and second.summary["already_finished"], second.summary
    # The report says so, not only the JSON: a finished job run again trains nothing.
    assert ("job gcsjob: already finished at checkpoint step 60/60; trained 0 steps this run, its processes "
            "started only to restore it") in second.stderr, second.stderr
    assert "checkpoint step 60 written by local/gcsjob (uid " in second.stderr

    # Issue 31 item 11 on gs://: the steps are read by the controller only, so its refusal (exit 2, before any
    # worker starts) is the run's: the changed seed named, the unchanged batch size not.
    changed = copy.deepcopy(m)
    changed["spec"]["training"].update({"steps": 80, "seed": 1})
    refused = run_cli(changed, tmp_path, "--no-failure", env=gcs_emulator.env)
    _refused_data_change(refused.returncode, refused.stderr, "spec.training.seed 1 (checkpoint step 60 was trained "
                         "with 0)")
    assert "globalBatchSize" not in [ln for ln in refused.stderr.splitlines() if ln.startswith("error: ")][-1]


def test_second_run_of_the_same_job_is_refused(tmp_path):
    """Two launchers on one run directory would share checkpoints, token and logs: the second is refused."""
    import time

    m = job_manifest("twice", tmp_path, training={"steps": 3000, "globalBatchSize": 8})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(m))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen([CLI, "run", str(path), "--workdir", str(tmp_path / "run"), "--no-failure"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "run" / "launcher.lock").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        second = subprocess.run([CLI, "run", str(path), "--workdir", str(tmp_path / "run"), "--fresh"],
                                capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
        assert_one_line_error(second.returncode, second.stdout, second.stderr, "already running", str(first.pid))
        # Another workdir, same checkpoints: refused too (two runs would interleave their saves).
        third = subprocess.run([CLI, "run", str(path), "--workdir", str(tmp_path / "run2"), "--no-failure"],
                               capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
        assert_one_line_error(third.returncode, third.stdout, third.stderr, "spec.checkpoint.uri",
                              "in use by another elastic-jax run")
        assert not (tmp_path / "run2").exists(), "the refused run left the --workdir it created"
        # SIGTERM (what kill, timeout and CI cancellation send) stops the first like Ctrl-C, with a SUMMARY.
        first.terminate()
        out, err = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 130, err[-2000:]
    assert out.strip().splitlines()[-1].startswith("SUMMARY ")
    assert "Traceback" not in err
    assert not leftover_processes(str(tmp_path))


def test_sigkill_of_the_launcher_takes_its_children_down(tmp_path):
    """Even a SIGKILLed launcher leaves nothing running: its children get SIGTERM when it dies."""
    import signal
    import time

    m = job_manifest("orphans", tmp_path, training={"steps": 3000, "globalBatchSize": 8})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(m))
    proc = subprocess.Popen([CLI, "run", str(path), "--workdir", str(tmp_path / "run"), "--no-failure"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        deadline = time.monotonic() + 120
        while len(leftover_processes(str(tmp_path))) < 3 and time.monotonic() < deadline:  # controller + 2 workers
            time.sleep(0.2)
        assert len(leftover_processes(str(tmp_path))) >= 3
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 60
        while leftover_processes(str(tmp_path)) and time.monotonic() < deadline:
            time.sleep(0.2)
        survivors = leftover_processes(str(tmp_path))
    finally:
        for p in leftover_processes(str(tmp_path)):
            p.kill()
    assert not survivors, f"still running after the launcher died: {[p.pid for p in survivors]}"


def _run_args(tmp_path: Path, manifest: dict, *flags: str) -> subprocess.CompletedProcess:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    proc = subprocess.run([CLI, "run", str(path), "--workdir", str(tmp_path / "run"), *flags], capture_output=True,
                          text=True, timeout=600, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert not leftover_processes(str(tmp_path))
    return proc


def test_fresh_never_deletes_what_is_not_a_checkpoint(tmp_path):
    """--fresh on a checkpoint uri that is someone's project folder: every file kept, and said so in one line
    (issue 31: a folder named `metadata/` or `*.orbax-checkpoint-tmp` was deleted as a checkpoint)."""
    project = tmp_path / "project"
    for folder in ("src", "metadata", "old.orbax-checkpoint-tmp"):
        (project / folder).mkdir(parents=True)
        (project / folder / "important.py").write_text("x = 1\n")
    (project / "notes.txt").write_text("keep me")
    m = job_manifest("danger", tmp_path, training={"steps": 10, "globalBatchSize": 8},
                     checkpoint={"uri": str(project), "intervalSteps": 10})
    proc = _run_args(tmp_path, m, "--fresh", "--no-failure")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("kept 4 entries that are not this job's checkpoints: metadata, notes.txt, old.orbax-checkpoint-tmp, "
            "src") in proc.stdout + proc.stderr, proc.stderr[-3000:]
    for folder in ("src", "metadata", "old.orbax-checkpoint-tmp"):
        assert (project / folder / "important.py").read_text() == "x = 1\n"
    assert (project / "notes.txt").exists()


def test_fresh_deletes_steps_and_interrupted_saves_then_trains_from_zero(tmp_path):
    ckpt = tmp_path / "ckpt"
    # What makes it an Orbax step of this job: Orbax's step metadata naming this job as its writer.
    this_job = identity.identity_from_env({}, "fresh", str(ckpt))
    (ckpt / "100").mkdir(parents=True)
    (ckpt / "100" / "_CHECKPOINT_METADATA").write_text(
        json.dumps({"custom_metadata": identity.to_metadata(this_job)}))
    (ckpt / "110.orbax-checkpoint-tmp-1234").mkdir()
    m = job_manifest("fresh", tmp_path, training={"steps": 20, "globalBatchSize": 8},
                     checkpoint={"uri": str(ckpt), "intervalSteps": 10})
    proc = _run_args(tmp_path, m, "--fresh", "--no-failure")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1].removeprefix("SUMMARY "))
    assert summary["restored_from_step"] is None and summary["steps"] == 20
    assert sorted(p.name for p in ckpt.iterdir() if not p.name.startswith(".")) == ["10", "20"]


def test_another_jobs_checkpoints_fail_the_run_clearly(tmp_path, trained):
    """A job pointed at checkpoints it did not write must not 'succeed' without training."""
    trained.restore()
    # resumeFrom Any: past the writer check, the state itself must still fit this job.
    shorter = _run_args(tmp_path, trained.manifest(tmp_path, "shorter", steps=10, resumeFrom="Any"), "--no-failure")
    # Refused before any process starts (it was refused by the controller, exit 1, after ~14 s).
    assert_one_line_error(shorter.returncode, shorter.stdout, shorter.stderr, "spec.checkpoint.uri",
                          "holds checkpoint step 20, beyond spec.training.steps (10)")
    other = trained.manifest(tmp_path, "othermodel", steps=40, resumeFrom="Any")
    other["spec"]["controller"]["trainer"]["config"]["dModel"] *= 2
    changed = run_cli(other, tmp_path, "--no-failure")
    assert changed.returncode == 1 and not changed.summary["succeeded"]
    assert "checkpoint step 20 does not fit this trainer's state" in changed.summary["failure_reason"]
    # The reason is one log line, and nothing else: the state that does not fit is refused from the step's
    # metadata before Orbax starts reading, whose reads in flight printed an "Event loop is closed" traceback
    # each (173 for this model) after its own refusal.
    log = changed.controller_log()
    assert "training failed: spec.checkpoint.uri" in log
    assert "Event loop is closed" not in log and "Traceback" not in log, log[-3000:]
    assert "is not compatible with the stored shape" in changed.summary["failure_reason"]


def test_resume_is_refused_from_another_jobs_checkpoint_unless_the_spec_allows_it(tmp_path, trained):
    """Issue 9 item 13: a run resumes only from steps its own job wrote, and says which job that was.
    Another job pointed at the same directory is refused with one line naming spec.checkpoint.uri, the step
    and the writer; `spec.checkpoint.resumeFrom: Any` takes it, and the summary names the writer. (Job
    `trained` wrote steps 10 and 20 in the fixture, a run of its own: `resumed_from` None, each step its writer.)"""
    uri = str(trained.restore())
    uid_a = local_uid(TRAINED, uri)

    other = _run_args(tmp_path, trained.manifest(tmp_path, "writer-b", steps=30), "--no-failure")
    message = (f"spec.checkpoint.uri {uri!r}: checkpoint step 20 was written by another job, "
               f"local/{TRAINED} (uid {uid_a}), not this job local/writer-b (uid {local_uid('writer-b', uri)}); "
               "set spec.checkpoint.resumeFrom: Any to resume from it, or give this job its own directory")
    # Refused by `elastic-jax run` itself, before any process starts.
    assert_one_line_error(other.returncode, other.stdout, other.stderr)
    assert other.stderr.strip() == f"error: {tmp_path / 'job.yaml'}: {message}"
    assert not (tmp_path / "run" / "controller.log").exists()  # no controller ran

    again = run_cli(trained.manifest(tmp_path, steps=30), tmp_path, "--no-failure")
    assert again.returncode == 0, again.stderr[-3000:]
    writer_a = {"namespace": "local", "name": TRAINED, "uid": uid_a}
    assert again.summary["resumed_from"] == {"step": 20, "fallbackReason": None, "writer": writer_a}
    assert f"resumed from checkpoint step 20 written by local/{TRAINED} (uid {uid_a})" in again.stderr
    assert '"event": "resumed"' in again.controller_log()

    taken = run_cli(trained.manifest(tmp_path, "writer-b", steps=40, resumeFrom="Any"), tmp_path, "--no-failure")
    assert taken.returncode == 0, taken.stderr[-3000:]
    assert taken.summary["resumed_from"] == {"step": 30, "fallbackReason": None, "writer": writer_a}
    # Steps it saved carry its own identity: writer-b's rerun resumes without resumeFrom Any.
    mine = run_cli(trained.manifest(tmp_path, "writer-b", steps=50), tmp_path, "--no-failure")
    assert mine.returncode == 0, mine.stderr[-3000:]
    assert mine.summary["resumed_from"]["writer"] == {"namespace": "local", "name": "writer-b",
                                                      "uid": local_uid("writer-b", uri)}


BATCH = "spec.training.globalBatchSize 16 (checkpoint step 20 was trained with 8)"
SEED = "spec.training.seed 1 (checkpoint step 20 was trained with 0)"


def _validate(tmp_path: Path, manifest: dict, *flags: str) -> subprocess.CompletedProcess:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return subprocess.run([CLI, "validate", *flags, str(path)], capture_output=True, text=True, timeout=180,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})


def _refused_data_change(code: int, stderr: str, *fragments: str) -> None:
    """Exit 2 and an `error:` line naming every fragment and `spec.checkpoint.allowDataChange`; no traceback."""
    errors = [ln for ln in stderr.splitlines() if ln.startswith("error: ")]
    assert code == 2 and errors, (code, stderr[-3000:])
    assert "Traceback" not in stderr
    line = next((e for e in errors if all(f in e for f in fragments)), None)
    assert line is not None, (fragments, errors)
    assert "spec.checkpoint.allowDataChange" in line


def test_a_changed_batch_size_and_seed_are_refused_naming_both_unless_allowed(tmp_path, trained):
    """Issue 31 item 11 (accelerate#2016): `validate`, `validate --trainer` and `run` exited 0 and "resumed from
    checkpoint step 20" with another global batch size or seed never named: the data order and what a step
    means to the optimizer changed silently. The built-in loop records both with each step (`trained`'s steps:
    batch 8, seed 0); a resume must match them unless `spec.checkpoint.allowDataChange` says the change is
    intended. (It trained a job of its own first, in a file of its own.)"""
    trained.restore()
    changed = trained.manifest(tmp_path, steps=40)
    changed["spec"]["training"].update({"globalBatchSize": 16, "seed": 1})
    for flags in ((), ("--trainer",)):
        proc = _validate(tmp_path, changed, *flags)
        _refused_data_change(proc.returncode, proc.stderr, BATCH, SEED)
    refused = run_cli(changed, tmp_path, "--no-failure")
    _refused_data_change(refused.returncode, refused.stderr, BATCH, SEED)
    assert "resumed from checkpoint" not in refused.stderr

    changed["spec"]["checkpoint"]["allowDataChange"] = True
    assert _validate(tmp_path, changed).returncode == 0
    allowed = run_cli(changed, tmp_path, "--no-failure")
    assert allowed.returncode == 0, allowed.stderr[-3000:]
    assert allowed.summary["restored_from_step"] == 20 and allowed.summary["steps"] == 40
    log = allowed.controller_log()
    assert "spec.checkpoint.allowDataChange" in log and BATCH in log and SEED in log, log[-3000:]
    # Trial finding C5: the run's own output says so too (it was in controller.log only), once, naming both.
    said = [ln for ln in allowed.stderr.splitlines() if ln.startswith("warning: spec.checkpoint.allowDataChange")]
    assert said == ["warning: spec.checkpoint.allowDataChange: true: resumed from checkpoint step 20 with a changed "
                    f"data order: {BATCH}, {SEED}"], allowed.stderr[-3000:]


def test_a_checkpoint_without_writer_identity_needs_resume_from_any(tmp_path, trained):
    """Steps saved before the writer was recorded (Orbax step metadata with empty custom metadata, as older
    elastic-jax wrote it) cannot be shown to be this job's: refused unless resumeFrom is Any."""
    ckpt_dir = trained.restore()
    for meta in ckpt_dir.glob("*/_CHECKPOINT_METADATA"):
        data = json.loads(meta.read_text())
        assert data["custom_metadata"]["elasticJaxWriter"]["name"] == TRAINED
        data["custom_metadata"] = {}
        meta.write_text(json.dumps(data))
    refused = _run_args(tmp_path, trained.manifest(tmp_path, steps=30), "--no-failure")
    assert_one_line_error(refused.returncode, refused.stdout, refused.stderr, "spec.checkpoint.uri",
                          "checkpoint step 20 has no writer identity (saved by an older elastic-jax)",
                          "spec.checkpoint.resumeFrom: Any")
    taken = run_cli(trained.manifest(tmp_path, steps=30, resumeFrom="Any"), tmp_path, "--no-failure")
    assert taken.returncode == 0, taken.stderr[-3000:]
    assert taken.summary["resumed_from"] == {"step": 20, "fallbackReason": None, "writer": None}
    assert "resumed from checkpoint step 20 written by an unknown job (no writer identity saved)" in taken.stderr


def _cli(tmp_path: Path, manifest: dict, *args: str) -> subprocess.CompletedProcess:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return subprocess.run([CLI, *args, str(path)] if args[0] == "validate" else
                          [CLI, *args[:1], str(path), "--workdir", str(tmp_path / "run"), *args[1:]],
                          capture_output=True, text=True, timeout=180, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_the_controllers_port_out_of_range_names_the_option(tmp_path):
    """A negative port reached bind(): `elastic-jax-controller --port -3` is refused naming the option, exit 2,
    nothing started (the same checks of `run` and the worker: tests/unit/test_cli_refusals.py)."""
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job_manifest("numeric", tmp_path)))
    argv = [str(Path(sys.executable).parent / "elastic-jax-controller"), "--manifest", str(path), "--port", "-3"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2, proc.stderr
    assert "--port -3: must be 0..65535" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists() and not leftover_processes(str(tmp_path))


def test_a_trainer_the_controller_cannot_build_is_one_line_of_run_and_keeps_the_checkpoints(tmp_path):
    """A trainer that cannot be built (here a module beside the manifest, which a controller does not search):
    `run` builds it before writing anything, as the controller would, and prints the refusal as one line
    naming the file, the field and the folder that would find it (exit 2); no process started, no run
    folder created. With --fresh the old checkpoints stay: they go only once the trainer checks out, so a typo costs
    nothing. The wording of each such refusal (a config key, the data, an entry point that is missing or
    raises) is `load_trainer`'s, checked in-process by `validate --trainer` in tests/unit/test_cli_refusals.py."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "mytrainer.py").write_text("def make_trainer(config):\n    raise SystemExit('not reached')\n")
    ckpt = tmp_path / "ckpt"
    fake_step(ckpt, 100, identity.identity_from_env({}, "beside", str(ckpt)))
    m = job_manifest("beside", tmp_path, checkpoint={"uri": str(ckpt), "intervalSteps": 10})
    m["spec"]["controller"]["trainer"]["entryPoint"] = "mytrainer:make_trainer"
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(m))
    proc = subprocess.run([CLI, "run", str(path), "--workdir", str(tmp_path / "run"), "--fresh", "--no-failure"],
                          capture_output=True, text=True, timeout=180, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert_one_line_error(proc.returncode, proc.stdout, proc.stderr,
                          f"{path}: spec.controller.trainer.entryPoint 'mytrainer:make_trainer'",
                          "No module named 'mytrainer'", "must be installed", "on PYTHONPATH",
                          f"mytrainer.py is beside the manifest in {folder}", f"PYTHONPATH={folder}")
    assert not (tmp_path / "run").exists()  # refused before the run folder was written
    assert (ckpt / "100" / "_CHECKPOINT_METADATA").is_file()
    assert not leftover_processes(str(tmp_path))


def test_a_finished_job_run_again_says_so_and_starts_nothing(tmp_path, trained):
    """A new-user trial: a job whose checkpoints already hold its last step, run again, started the controller
    and every worker (~30 s) to restore and train nothing, and its summary's first loss was the first run's.
    `run` now says at once that the job is finished, starts no process, and exits 0 (the job is done) with a
    SUMMARY that trained nothing and measured no loss; --fresh still starts over."""
    # Real steps (the fixture's run): "finished" also reads the last step's data (metadata alone is not finished).
    trained.restore()
    m = trained.manifest(tmp_path)
    proc = _cli(tmp_path, m, "run", "--no-failure")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (f"job {TRAINED}: already finished at checkpoint step 20/20; trained 0 steps this run, nothing was "
            "started (--fresh starts over)") in proc.stderr, proc.stderr
    assert f"checkpoint step 20 written by local/{TRAINED} (uid " in proc.stderr and "Traceback" not in proc.stderr
    s = json.loads(proc.stdout.strip().splitlines()[-1].removeprefix("SUMMARY "))
    assert s["already_finished"] and s["succeeded"] and s["steps"] == s["restored_from_step"] == 20, s
    assert s["steps_this_run"] == 0 and s["nothing_started"], s
    assert s["initial_loss"] is None and s["final_loss"] is None and s["goodput"] is None, s
    assert s["last_committed_checkpoint_step"] == 20 and s["recoveries"] == 0, s
    assert not (tmp_path / "run" / "controller.log").exists()  # no process was started
    # A job that stopped before its last step still resumes (the controller starts).
    m["spec"]["training"]["steps"] = 30
    m["spec"]["controller"]["trainer"]["config"]["seqlen"] = 32  # (a config mistake: stops at the controller)
    resumed = _cli(tmp_path, m, "run", "--no-failure")
    assert resumed.returncode == 2 and "seqlen" in resumed.stderr and "already finished" not in resumed.stderr


def _truncate_largest_data_file(step_dir: Path) -> None:
    files = sorted((p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"),
                   key=lambda p: p.stat().st_size)
    files[-1].write_bytes(files[-1].read_bytes()[: files[-1].stat().st_size // 2])


def test_a_corrupt_final_step_is_not_a_finished_job_and_all_corrupt_steps_say_so(tmp_path, trained):
    """A new-user trial, on real Orbax steps: (1) the last step's largest data file truncated, and `run` said
    "already finished" (exit 0) from the step's metadata alone, though the final model could not be read. Now
    it warns, starts, falls back to the newest step that restores and trains the rest, like the controller with
    any corrupt newest step; (2) the report says it fell back, and why, in one short line (the warning was only
    in controller.log); (3) every step truncated: the run failed as "does not fit this trainer's state (a
    changed model?)"; now it says no step could be restored, each step tried and why."""
    ckpt = trained.restore()
    m = trained.manifest(tmp_path)
    _truncate_largest_data_file(ckpt / "20")

    again = run_cli(m, tmp_path, "--no-failure")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "already finished" not in again.stderr, again.stderr[-3000:]
    assert (f"warning: spec.checkpoint.uri {ckpt}: the last checkpoint step 20 could not be read ("
            in again.stderr), again.stderr[-3000:]
    s = again.summary
    assert s["succeeded"] and s["steps"] == 20 and s["restored_from_step"] == 10 and s["steps_this_run"] == 10, s
    reason = s["resumed_from"]["fallbackReason"]
    assert reason.startswith("newer committed steps could not be restored: step 20: "), reason
    assert "<" not in reason and "bound method" not in reason and len(reason) <= 300, reason
    warnings = [ln.strip() for ln in again.stderr.splitlines() if ln.strip().startswith("warning: newer")]
    assert warnings == [f"warning: {reason}; resumed from step 10"], again.stderr[-3000:]

    shutil.rmtree(tmp_path / "run")
    done = run_cli(m, tmp_path, "--no-failure")  # step 20 saved again, whole: now the job is finished
    assert done.returncode == 0 and "already finished at checkpoint step 20/20" in done.stderr, done.stderr[-3000:]

    for step in (10, 20):
        _truncate_largest_data_file(ckpt / str(step))
    shutil.rmtree(tmp_path / "run")
    broken = run_cli(m, tmp_path, "--no-failure")
    assert broken.returncode == 1 and not broken.summary["succeeded"], broken.stderr[-3000:]
    failure = broken.summary["failure_reason"]
    assert (f"spec.checkpoint.uri {str(ckpt)!r}: no committed checkpoint step could be restored "
            "(20: ") in failure and "; 10: " in failure and "<" not in failure, failure
    assert failure.endswith("delete them or use --fresh") and "does not fit" not in failure, failure
    assert "failure: " in broken.stderr and failure in broken.stderr, broken.stderr[-3000:]
    assert "Traceback" not in broken.stderr and "Event loop is closed" not in broken.stderr, broken.stderr[-3000:]


def test_a_newest_step_with_unreadable_step_metadata_falls_back_and_fresh_clears_it(tmp_path, trained):
    """A new-user trial: the newest step's `_CHECKPOINT_METADATA` emptied or cut short, and the job was refused
    (exit 2) as "no writer identity (saved by an older elastic-jax)" (Orbax reads a broken file as empty
    metadata), with no fallback, and --fresh refused to delete it too. It is a corrupt step: the run falls back
    to the newest one that reads (each damage in turn: each run saves step 20 again, whole), and --fresh deletes
    it with this job's own steps."""
    ckpt = trained.restore()
    m = trained.manifest(tmp_path)
    meta = ckpt / "20" / "_CHECKPOINT_METADATA"
    for damage in ("empty", "truncated"):
        meta.write_text("" if damage == "empty" else meta.read_text()[: len(meta.read_text()) // 2])
        shutil.rmtree(tmp_path / "run", ignore_errors=True)
        again = run_cli(m, tmp_path, "--no-failure")
        assert again.returncode == 0, (damage, again.stderr[-3000:])
        assert "writer identity" not in again.stderr and "already finished" not in again.stderr, \
            (damage, again.stderr[-3000:])
        s = again.summary
        assert s["succeeded"] and s["steps"] == 20 and s["restored_from_step"] == 10, (damage, s)
        assert s["resumed_from"]["fallbackReason"].startswith(
            "newer committed steps could not be restored: step 20"), (damage, s)
        assert json.loads(meta.read_text())["custom_metadata"], damage  # step 20 saved again, whole

    meta.write_text("")
    shutil.rmtree(tmp_path / "run")
    fresh = run_cli(m, tmp_path, "--no-failure", "--fresh")
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    assert fresh.summary["steps_this_run"] == 20, fresh.summary


def test_a_program_that_exits_before_ready_names_its_log(tmp_path):
    """Library mode: the user's program dies before serving (its own words, not an `error:` line). The
    message gave that last line alone; it now says which log holds the rest."""
    m = job_manifest("early", tmp_path, controller={"command": [sys.executable, "-c", "raise SystemExit('no data here')"]})
    code, out, err = run_bad(tmp_path, m)
    assert code == 1, err
    errors = [ln for ln in err.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in err, err
    assert "controller exited with 1 before it was ready: no data here; see " in errors[0], errors[0]
    log = Path(errors[0].rsplit("see ", 1)[1])
    assert log == tmp_path / "run" / "controller.log" and "no data here" in log.read_text(), errors[0]


