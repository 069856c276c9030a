"""Bad input to `elastic-jax run`: one clear line, a non-zero exit, nothing half-started."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from elastic_jax import contract
from elastic_jax.api import identity
from elastic_jax.api.identity import local_uid
from tests.support.runs import ROOT, job_manifest, leftover_processes, run_cli

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


@pytest.mark.parametrize(
    "spec_change, fragments",
    [
        ({"slices": {"count": 0}}, ["spec.slices.count", "greater than or equal to 1"]),
        ({"slices": {"count": 2, "minSlices": 3}}, ["spec.slices.minSlices (3) must not exceed spec.slices.count (2)"]),
        ({"sliecs": {"count": 2}}, ["spec.sliecs: unknown field"]),
    ],
)
def test_invalid_manifest(tmp_path, spec_change, fragments):
    m = job_manifest("bad", tmp_path)
    m["spec"].update(spec_change)
    code, out, err = run_bad(tmp_path, m)
    assert_one_line_error(code, out, err, *fragments)
    assert not (tmp_path / "run").exists()  # refused before anything started


@pytest.mark.parametrize("path, value, fragment", [
    (("training", "steps"), 1.5, "spec.training.steps: 1.5: must be an integer (a whole number, e.g. 10), not a fraction"),
    (("worker", "resources"), {"requests": {"cpu": 2.0}},
     "spec.worker.resources.requests.cpu: 2.0: must be an integer or a quoted string, e.g. 2 or '2', not a float"),
])
def test_a_json_float_is_refused_saying_what_the_field_needs(tmp_path, path, value, fragment):
    """Issue 11: `steps: 1.5` read "Input should be a valid integer"; `cpu: 2.0` as if kubectl refused it."""
    m = job_manifest("floaty", tmp_path)
    m["spec"].setdefault(path[0], {})[path[1]] = value
    code, out, err = run_bad(tmp_path, m)
    assert_one_line_error(code, out, err, fragment)


def test_malformed_manifest(tmp_path):
    code, out, err = run_bad(tmp_path, "apiVersion: elasticjax.dev/v1alpha1\nspec: {slices: [\n")
    assert_one_line_error(code, out, err, "malformed YAML")


def test_unreachable_local_checkpoint_uri(tmp_path):
    m = job_manifest("badckpt", tmp_path, checkpoint={"uri": "/proc/no/such/dir"})
    code, out, err = run_bad(tmp_path, m)
    assert_one_line_error(code, out, err, "spec.checkpoint.uri", "/proc/no/such/dir")
    assert no_workers_started(tmp_path)


def test_unreachable_gcs_checkpoint_uri(tmp_path, gcs_emulator):
    m = job_manifest("badgcs", tmp_path, checkpoint={"uri": "gs://no-such-bucket-ej/ckpt"})
    code, out, err = run_bad(tmp_path, m, env=gcs_emulator.env)
    assert_one_line_error(code, out, err, "spec.checkpoint.uri", "gs://no-such-bucket-ej/ckpt")
    assert no_workers_started(tmp_path)


def test_empty_data_glob(tmp_path):
    m = job_manifest("nodata", tmp_path)
    m["spec"]["controller"]["trainer"]["config"]["data"] = str(tmp_path / "nothing" / "*.txt")
    code, out, err = run_bad(tmp_path, m)
    assert_one_line_error(code, out, err, "spec.controller.trainer.config.data", "no files match")
    assert no_workers_started(tmp_path)


def test_bad_trainer_config_key_and_entry_point(tmp_path):
    m = job_manifest("badcfg", tmp_path)
    m["spec"]["controller"]["trainer"]["config"]["dModle"] = 64
    code, out, err = run_bad(tmp_path, m)
    assert_one_line_error(code, out, err, "spec.controller.trainer.config.dModle")
    m = job_manifest("badep", tmp_path)
    m["spec"]["controller"]["trainer"]["entryPoint"] = "no_such_module:make"
    code, out, err = run_bad(tmp_path, m)
    assert_one_line_error(code, out, err, "spec.controller.trainer.entryPoint", "no_such_module")
    assert "job.yaml: spec.controller.trainer.entryPoint" in err, err  # the file, as `validate` names it


def test_an_entry_point_that_raises_is_one_line_naming_the_field_for_run_and_validate(tmp_path):
    """`make_trainer` reading a missing config key, or a function that is no trainer (`os:system` gets a
    dict): `run` printed `error: KeyError: 'loss'` naming nothing, `validate --trainer` a traceback."""
    (tmp_path / "raising_trainer.py").write_text("def make_trainer(config):\n    return config['loss']\n")
    env = {"PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}"}
    m = job_manifest("raises", tmp_path)
    m["spec"]["controller"]["trainer"]["entryPoint"] = "raising_trainer:make_trainer"
    code, out, err = run_bad(tmp_path, m, env=env)
    assert_one_line_error(code, out, err, "spec.controller.trainer.entryPoint", "raising_trainer:make_trainer",
                          "KeyError: 'loss'", "raising_trainer.py:2", "spec.controller.trainer.config")
    path = tmp_path / "job.yaml"
    for entry, fragment in (("raising_trainer:make_trainer", "KeyError: 'loss'"), ("os:system", "TypeError")):
        m["spec"]["controller"]["trainer"]["entryPoint"] = entry
        path.write_text(yaml.safe_dump(m))
        proc = subprocess.run([CLI, "validate", "--trainer", str(path)], capture_output=True, text=True, timeout=180,
                              cwd=tmp_path, env={**os.environ, **env})
        assert_one_line_error(proc.returncode, proc.stdout, proc.stderr, "spec.controller.trainer.entryPoint",
                              entry, fragment)


def _validate(tmp_path: Path, manifest: dict, *flags: str) -> subprocess.CompletedProcess:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return subprocess.run([CLI, "validate", *flags, str(path)], capture_output=True, text=True, timeout=180,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_validate_trainer_checks_config_and_data(tmp_path):
    """`validate` checks the manifest alone; `validate --trainer` also catches what the controller would."""
    m = job_manifest("valid", tmp_path)
    m["spec"]["controller"]["trainer"]["config"]["data"] = str(tmp_path / "nothing" / "*.txt")
    assert _validate(tmp_path, m).returncode == 0  # the manifest itself is fine
    proc = _validate(tmp_path, m, "--trainer")
    assert_one_line_error(proc.returncode, proc.stdout, proc.stderr, "spec.controller.trainer.config.data",
                          "no files match")
    m["spec"]["controller"]["trainer"]["config"]["data"] = "stdlib"
    m["spec"]["controller"]["trainer"]["config"]["seqLen"] = "32"  # strict: not coerced
    proc = _validate(tmp_path, m, "--trainer")
    assert_one_line_error(proc.returncode, proc.stdout, proc.stderr, "spec.controller.trainer.config.seqLen",
                          "valid integer")
    m["spec"]["controller"]["trainer"]["config"]["seqLen"] = 32
    proc = _validate(tmp_path, m, "--trainer")
    assert proc.returncode == 0, proc.stderr
    assert "config ok" in proc.stderr and yaml.safe_load(proc.stdout)["kind"] == "ElasticTrainingJob"


def test_validate_trainer_reports_every_config_problem_in_one_run(tmp_path):
    """A new-user trial: `validate --trainer` named one trainer config mistake per run (fix, rerun, the next).
    Now one `error:` line each, naming the file and its key, as the manifest's own errors are; the data source
    is opened too when its own keys are fine."""
    m = job_manifest("many-config", tmp_path)
    m["spec"]["controller"]["trainer"]["config"].update(dModle=64, numLayers=0, data=str(tmp_path / "none" / "*.txt"))
    proc = _validate(tmp_path, m, "--trainer")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    prefix = f"error: {tmp_path / 'job.yaml'}: spec.controller.trainer.config."
    assert [ln.removeprefix(prefix).split(":")[0] for ln in errors] == ["numLayers", "dModle", "data"], errors
    assert all(ln.startswith(prefix) for ln in errors) and "no files match" in errors[-1], errors


def test_validate_trainer_passes_a_valid_library_mode_manifest_with_a_note(tmp_path):
    """A new-user trial: `validate --trainer examples/04-own-loop.yaml` exited 2 ("there is no trainer to
    build") for a valid manifest, so a CI loop over the examples failed. A note; its checkpoint folder is
    still checked, and a real problem there is still an error."""
    m = job_manifest("own", tmp_path, controller={"command": ["python", "train.py"]})
    m["spec"]["controller"].pop("trainer", None)
    proc = _validate(tmp_path, m, "--trainer")
    assert proc.returncode == 0, proc.stderr
    assert "note: " in proc.stderr and "there is no trainer to build" in proc.stderr, proc.stderr
    (tmp_path / "a-file").write_text("x")
    m["spec"]["checkpoint"]["uri"] = str(tmp_path / "a-file")
    proc = _validate(tmp_path, m, "--trainer")
    assert proc.returncode == 2 and "error: " in proc.stderr and "spec.checkpoint.uri" in proc.stderr, proc.stderr


def test_every_validate_line_names_the_file_with_cluster_too(tmp_path):
    """`validate --cluster` printed its cluster-rule and TPU lines without the `FILE: ` every other line has;
    the checkpoint folder's lines too (of `run` as well, which prints the same line)."""
    m = job_manifest("prefix", tmp_path, checkpoint={"uri": "relative/ckpt", "intervalSteps": 0})
    m["spec"]["backend"] = "pathways"
    m["spec"]["slices"] = {"count": 2, "accelerator": "tpu-v9", "topology": "2x2"}
    proc = _validate(tmp_path, m, "--cluster")
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert proc.returncode == 2 and len(errors) == 4, proc.stderr
    assert all(ln.startswith(f"error: {tmp_path / 'job.yaml'}: spec.") for ln in errors), errors


def test_validate_cluster_says_each_field_error_once(tmp_path):
    """Issue 11: a bad uri got its specific line and then a generic one for the same field (`/`: the root,
    then "must be an absolute folder"); an uppercase bucket name two lines. Several bad fields at once, the
    real CLI: one line a fault, no field's fault said twice (the CRD's CEL says the same lines)."""
    m = job_manifest("once", tmp_path, checkpoint={"uri": "/", "intervalSteps": 0})
    m["spec"]["compilationCache"] = {"uri": "gs://UPPER//xla"}
    m["spec"]["training"]["steps"] = 1.5
    proc = _validate(tmp_path, m, "--cluster")
    errors = [ln.removeprefix(f"error: {tmp_path / 'job.yaml'}: ") for ln in proc.stderr.splitlines()
              if ln.startswith("error: ")]
    assert proc.returncode == 2, proc.stderr
    assert [e for e in errors if e.startswith("spec.checkpoint.uri")] == [
        "spec.checkpoint.uri: '/': the file system's root: name a folder of the job's own, e.g. /checkpoints/JOB"]
    assert [e.split(": ", 2)[2] for e in errors if e.startswith("spec.compilationCache.uri: 'gs:")] == [
        "a GCS bucket name holds only lowercase letters, digits, '-', '_' and '.'",
        "an empty path segment ('//' after the bucket name): write one '/' between folders"], errors
    assert len(errors) == len(set(errors)) and sum(e.startswith("spec.training.steps") for e in errors) == 1


def test_checkpoints_on_gcs_emulator_and_resume(tmp_path, gcs_emulator):
    """A run that loses a worker checkpoints to gs://; a second run of the same job resumes from gs://."""
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


def test_bad_workdir(tmp_path):
    m = job_manifest("badwd", tmp_path)
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(m))
    (tmp_path / "afile").write_text("x")
    for workdir, what in (("/proc/no/such", "cannot be created"), (str(tmp_path / "afile"), "is a file, not a directory")):
        proc = subprocess.run([CLI, "run", str(path), "--workdir", workdir], capture_output=True, text=True, timeout=120,
                              cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})
        assert_one_line_error(proc.returncode, proc.stdout, proc.stderr, "--workdir", what)


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
    m = job_manifest("danger", tmp_path, checkpoint={"uri": str(project), "intervalSteps": 10})
    proc = _run_args(tmp_path, m, "--fresh", "--no-failure")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("kept 4 entries that are not this job's checkpoints: metadata, notes.txt, old.orbax-checkpoint-tmp, "
            "src") in proc.stdout + proc.stderr, proc.stderr[-3000:]
    for folder in ("src", "metadata", "old.orbax-checkpoint-tmp"):
        assert (project / folder / "important.py").read_text() == "x = 1\n"
    assert (project / "notes.txt").exists()


def test_fresh_with_a_manifest_mistake_keeps_the_checkpoints(tmp_path):
    """The old checkpoints go only once the trainer checks out; a typo costs nothing."""
    ckpt = tmp_path / "ckpt"
    _fake_step(ckpt, 100, identity.identity_from_env({}, "typo", str(ckpt)))
    m = job_manifest("typo", tmp_path, checkpoint={"uri": str(ckpt), "intervalSteps": 10})
    m["spec"]["controller"]["trainer"]["config"]["seqlen"] = 32
    proc = _run_args(tmp_path, m, "--fresh", "--no-failure")
    assert_one_line_error(proc.returncode, proc.stdout, proc.stderr, "spec.controller.trainer.config.seqlen")
    assert (ckpt / "100" / "_CHECKPOINT_METADATA").is_file()


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


def test_contradictory_failure_flags_are_refused(tmp_path):
    m = job_manifest("flags", tmp_path)
    for flags in (["--kill-at-step", "5", "--no-failure"], ["--kill-slice", "1", "--no-failure"]):
        proc = _run_args(tmp_path, m, *flags)
        assert_one_line_error(proc.returncode, proc.stdout, proc.stderr, flags[0], "--no-failure")


def test_another_jobs_checkpoints_fail_the_run_clearly(tmp_path):
    """A job pointed at checkpoints it did not write must not 'succeed' without training."""
    ckpt = {"uri": str(tmp_path / "shared"), "intervalSteps": 10}
    first = run_cli(job_manifest("owner", tmp_path, training={"steps": 20, "globalBatchSize": 8}, checkpoint=ckpt),
                    tmp_path, "--no-failure")
    assert first.returncode == 0, first.stderr[-3000:]
    # resumeFrom Any: past the writer check, the state itself must still fit this job.
    ckpt = {**ckpt, "resumeFrom": "Any"}
    shorter = _run_args(tmp_path, job_manifest("shorter", tmp_path, training={"steps": 10, "globalBatchSize": 8},
                                               checkpoint=ckpt), "--no-failure")
    # Refused before any process starts (it was refused by the controller, exit 1, after ~14 s).
    assert_one_line_error(shorter.returncode, shorter.stdout, shorter.stderr, "spec.checkpoint.uri",
                          "holds checkpoint step 20, beyond spec.training.steps (10)")
    other = job_manifest("othermodel", tmp_path, training={"steps": 40, "globalBatchSize": 8}, checkpoint=ckpt)
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


def test_resume_is_refused_from_another_jobs_checkpoint_unless_the_spec_allows_it(tmp_path):
    """Issue 9 item 13: a run resumes only from steps its own job wrote, and says which job that was.
    Another job pointed at the same directory is refused with one line naming spec.checkpoint.uri, the step
    and the writer; `spec.checkpoint.resumeFrom: Any` takes it, and the summary names the writer."""
    uri = str(tmp_path / "shared")
    ckpt = {"uri": uri, "intervalSteps": 5}
    training = {"steps": 10, "globalBatchSize": 8}
    first = run_cli(job_manifest("writer-a", tmp_path, training=training, checkpoint=ckpt), tmp_path, "--no-failure")
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.summary["resumed_from"] is None
    uid_a = local_uid("writer-a", uri)

    log_before = first.controller_log()
    other = _run_args(tmp_path, job_manifest("writer-b", tmp_path, training={**training, "steps": 20}, checkpoint=ckpt),
                      "--no-failure")
    message = (f"spec.checkpoint.uri {uri!r}: checkpoint step 10 was written by another job, "
               f"local/writer-a (uid {uid_a}), not this job local/writer-b (uid {local_uid('writer-b', uri)}); "
               "set spec.checkpoint.resumeFrom: Any to resume from it, or give this job its own directory")
    # Refused by `elastic-jax run` itself, before any process starts.
    assert_one_line_error(other.returncode, other.stdout, other.stderr)
    assert other.stderr.strip() == f"error: {tmp_path / 'job.yaml'}: {message}"
    assert first.controller_log() == log_before  # no controller ran (the launcher would have replaced its log)

    again = run_cli(job_manifest("writer-a", tmp_path, training={**training, "steps": 20}, checkpoint=ckpt),
                    tmp_path, "--no-failure")
    assert again.returncode == 0, again.stderr[-3000:]
    writer_a = {"namespace": "local", "name": "writer-a", "uid": uid_a}
    assert again.summary["resumed_from"] == {"step": 10, "fallbackReason": None, "writer": writer_a}
    assert f"resumed from checkpoint step 10 written by local/writer-a (uid {uid_a})" in again.stderr
    assert '"event": "resumed"' in again.controller_log()

    taken = run_cli(job_manifest("writer-b", tmp_path, training={**training, "steps": 30},
                                 checkpoint={**ckpt, "resumeFrom": "Any"}), tmp_path, "--no-failure")
    assert taken.returncode == 0, taken.stderr[-3000:]
    assert taken.summary["resumed_from"] == {"step": 20, "fallbackReason": None, "writer": writer_a}
    # Steps it saved carry its own identity: writer-b's rerun resumes without resumeFrom Any.
    mine = run_cli(job_manifest("writer-b", tmp_path, training={**training, "steps": 35}, checkpoint=ckpt),
                   tmp_path, "--no-failure")
    assert mine.returncode == 0, mine.stderr[-3000:]
    assert mine.summary["resumed_from"]["writer"] == {"namespace": "local", "name": "writer-b",
                                                      "uid": local_uid("writer-b", uri)}


def test_a_checkpoint_without_writer_identity_needs_resume_from_any(tmp_path):
    """Steps saved before the writer was recorded (Orbax step metadata with empty custom metadata, as older
    elastic-jax wrote it) cannot be shown to be this job's: refused unless resumeFrom is Any."""
    ckpt_dir = tmp_path / "ckpt"
    ckpt = {"uri": str(ckpt_dir), "intervalSteps": 5}
    training = {"steps": 10, "globalBatchSize": 8}
    first = run_cli(job_manifest("legacy", tmp_path, training=training, checkpoint=ckpt), tmp_path, "--no-failure")
    assert first.returncode == 0, first.stderr[-3000:]
    for meta in ckpt_dir.glob("*/_CHECKPOINT_METADATA"):
        data = json.loads(meta.read_text())
        assert data["custom_metadata"]["elasticJaxWriter"]["name"] == "legacy"
        data["custom_metadata"] = {}
        meta.write_text(json.dumps(data))
    refused = _run_args(tmp_path, job_manifest("legacy", tmp_path, training={**training, "steps": 15}, checkpoint=ckpt),
                        "--no-failure")
    assert_one_line_error(refused.returncode, refused.stdout, refused.stderr, "spec.checkpoint.uri",
                          "checkpoint step 10 has no writer identity (saved by an older elastic-jax)",
                          "spec.checkpoint.resumeFrom: Any")
    taken = run_cli(job_manifest("legacy", tmp_path, training={**training, "steps": 15},
                                 checkpoint={**ckpt, "resumeFrom": "Any"}), tmp_path, "--no-failure")
    assert taken.returncode == 0, taken.stderr[-3000:]
    assert taken.summary["resumed_from"] == {"step": 10, "fallbackReason": None, "writer": None}
    assert "resumed from checkpoint step 10 written by an unknown job (no writer identity saved)" in taken.stderr


def test_fresh_never_deletes_a_user_folder_named_by_digits(tmp_path):
    """Issue 9 item 12: `2024/` under the checkpoint directory is a user's folder, not an Orbax
    step (no step metadata): --fresh refuses and deletes nothing, not even the real steps."""
    ckpt = tmp_path / "ckpt"
    first = run_cli(job_manifest("digits", tmp_path, training={"steps": 10, "globalBatchSize": 8},
                                 checkpoint={"uri": str(ckpt), "intervalSteps": 5}), tmp_path, "--no-failure")
    assert first.returncode == 0, first.stderr[-3000:]
    (ckpt / "2024").mkdir()
    (ckpt / "2024" / "report.csv").write_text("a,b\n")
    m = job_manifest("digits", tmp_path, training={"steps": 10, "globalBatchSize": 8},
                     checkpoint={"uri": str(ckpt), "intervalSteps": 5})
    proc = _run_args(tmp_path, m, "--fresh", "--no-failure")
    assert_one_line_error(proc.returncode, proc.stdout, proc.stderr, "spec.checkpoint.uri",
                          "--fresh deletes checkpoints only", "2024")
    assert (ckpt / "2024" / "report.csv").read_text() == "a,b\n"
    assert (ckpt / "10").is_dir() and (ckpt / "5").is_dir()


def _fake_step(ckpt: Path, step: int, writer) -> Path:
    """A committed Orbax step directory as Orbax lays it out on disk: `<step>/_CHECKPOINT_METADATA`
    naming its writer in `custom_metadata` (the state itself is not needed to decide ownership)."""
    step_dir = ckpt / str(step)
    step_dir.mkdir(parents=True)
    (step_dir / "_CHECKPOINT_METADATA").write_text(json.dumps({"custom_metadata": identity.to_metadata(writer)}))
    return step_dir


def _cli(tmp_path: Path, manifest: dict, *args: str) -> subprocess.CompletedProcess:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return subprocess.run([CLI, *args, str(path)] if args[0] == "validate" else
                          [CLI, *args[:1], str(path), "--workdir", str(tmp_path / "run"), *args[1:]],
                          capture_output=True, text=True, timeout=180, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


def test_another_jobs_checkpoints_are_refused_before_any_process_starts(tmp_path):
    """A new-user trial: a job pointed at a directory holding another job's checkpoints was refused only
    after the controller and workers had started (exit 1, ~14 s). `run` refuses it up front, exit 2, and
    `validate` (with or without --trainer) reports the same line; --fresh refuses to delete them up front."""
    import time

    ckpt = tmp_path / "shared"
    _fake_step(ckpt, 10, identity.local_identity("writer-a", str(ckpt)))
    m = job_manifest("writer-b", tmp_path, training={"steps": 20, "globalBatchSize": 8},
                     checkpoint={"uri": str(ckpt), "intervalSteps": 5})
    started = time.monotonic()
    run = _cli(tmp_path, m, "run", "--no-failure")
    assert_one_line_error(run.returncode, run.stdout, run.stderr, f"spec.checkpoint.uri {str(ckpt)!r}",
                          "checkpoint step 10 was written by another job, local/writer-a",
                          "set spec.checkpoint.resumeFrom: Any")
    assert time.monotonic() - started < 10
    assert not (tmp_path / "run").exists()  # nothing started: not even the run directory
    for flags in (("validate",), ("validate", "--trainer")):
        proc = _cli(tmp_path, m, *flags)
        assert_one_line_error(proc.returncode, proc.stdout, proc.stderr)
        assert [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")] == run.stderr.strip().splitlines()
    fresh = _cli(tmp_path, m, "run", "--fresh", "--no-failure")
    assert_one_line_error(fresh.returncode, fresh.stdout, fresh.stderr, "spec.checkpoint.uri",
                          "--fresh deletes this job's checkpoints only", "local/writer-a")
    assert (ckpt / "10" / "_CHECKPOINT_METADATA").is_file() and not (tmp_path / "run").exists()
    # A step beyond spec.training.steps is refused up front too, also with resumeFrom: Any.
    m["spec"]["training"]["steps"] = 5
    m["spec"]["checkpoint"]["resumeFrom"] = "Any"
    for flags in (("run", "--no-failure"), ("validate",)):
        proc = _cli(tmp_path, m, *flags)
        assert_one_line_error(proc.returncode, proc.stdout, proc.stderr, "spec.checkpoint.uri",
                              "holds checkpoint step 10, beyond spec.training.steps (5)")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("uri, fragment", [
    ("s3://bucket/ckpt", "unsupported scheme"),
    ("file:///tmp/elastic-jax-ckpt", "file:// is not supported; write the local path itself ('/tmp/elastic-jax-ckpt')"),
    ("http://example.invalid/ckpt", "unsupported scheme"),
    ("gs://", "no bucket name"),
    ("{tmp}/afile", "is a file, not a directory"),
    ("{tmp}/afile/sub", "cannot be created: '{tmp}/afile' is a file, not a directory"),
    ("{tmp}/frozen", "directory is not writable (Operation not permitted)"),
    ("{tmp}/frozen/sub", "cannot be created: directory '{tmp}/frozen' is not writable (Operation not permitted)"),
])
def test_run_and_validate_trainer_refuse_the_same_checkpoint_uris(tmp_path, uri, fragment):
    """`validate --trainer` accepted checkpoint URIs `run` refused (s3://, file://), and a checkpoint path that
    is a file or an unwritable directory gave a raw OS message ("File exists"): both now make the same check
    (`checkpoints.preflight`), one line naming spec.checkpoint.uri and what is wrong, before anything starts."""
    (tmp_path / "afile").write_text("x")
    (tmp_path / "frozen").mkdir()
    uri, fragment = uri.format(tmp=tmp_path), fragment.format(tmp=tmp_path)
    m = job_manifest("uris", tmp_path, checkpoint={"uri": uri})
    subprocess.run(["chattr", "+i", str(tmp_path / "frozen")], check=True)  # EPERM even for root
    try:
        run = _cli(tmp_path, m, "run", "--no-failure")
        validate = _cli(tmp_path, m, "validate", "--trainer")
    finally:
        subprocess.run(["chattr", "-i", str(tmp_path / "frozen")], check=False)
    assert_one_line_error(run.returncode, run.stdout, run.stderr, "spec.checkpoint.uri", fragment)
    assert not (tmp_path / "run").exists()
    assert_one_line_error(validate.returncode, validate.stdout, validate.stderr)
    assert [ln for ln in validate.stderr.splitlines() if ln.startswith("error: ")][0] == run.stderr.strip()
    assert not (tmp_path / "frozen" / "sub").exists() and (tmp_path / "afile").read_text() == "x"


def test_fresh_on_a_directory_it_cannot_empty_deletes_nothing(tmp_path):
    """--fresh on a step whose folder is immutable: it deleted the step's metadata, then died with a
    PermissionError traceback (half a step gone). Now refused up front, one line, nothing deleted."""
    ckpt = tmp_path / "ckpt"
    step = _fake_step(ckpt, 10, identity.local_identity("frozenfresh", str(ckpt)))
    (step / "state").mkdir()
    (step / "state" / "array").write_text("data")
    m = job_manifest("frozenfresh", tmp_path, checkpoint={"uri": str(ckpt)})
    subprocess.run(["chattr", "+i", str(step / "state")], check=True)
    try:
        proc = _cli(tmp_path, m, "run", "--fresh", "--no-failure")
    finally:
        subprocess.run(["chattr", "-i", str(step / "state")], check=False)
    assert_one_line_error(proc.returncode, proc.stdout, proc.stderr, "spec.checkpoint.uri",
                          f"--fresh cannot delete the checkpoints: {str(step / 'state')!r} is not writable; "
                          "nothing was deleted")
    assert (step / "_CHECKPOINT_METADATA").is_file() and (step / "state" / "array").read_text() == "data"


@pytest.mark.parametrize("command, args, fragment", [
    ("elastic-jax", ["run", "{manifest}", "--kill-at-step", "abc"], "'--kill-at-step'"),
    ("elastic-jax", ["run", "{manifest}", "--kill-at-step", "0"], "--kill-at-step 0: must be in 1..59"),
    ("elastic-jax", ["run", "{manifest}", "--kill-at-step", "-5"], "--kill-at-step -5: must be in 1..59"),
    ("elastic-jax", ["run", "{manifest}", "--kill-at-step", "60"], "--kill-at-step 60: must be in 1..59"),
    ("elastic-jax", ["run", "{manifest}", "--kill-slice", "-1"], "--kill-slice -1: the job has slices 0..1"),
    ("elastic-jax", ["run", "{manifest}", "--kill-slice", "2"], "--kill-slice 2: the job has slices 0..1"),
    ("elastic-jax-worker", ["--token-file", "{manifest}", "--port", "-1"], "--port -1: must be 0..65535"),
    ("elastic-jax-worker", ["--token-file", "{manifest}", "--port", "70000"], "--port 70000: must be 0..65535"),
    ("elastic-jax-worker", ["--token-file", "{manifest}", "--slice-index", "-1"], "--slice-index -1: must be 0 or more"),
    ("elastic-jax-worker", ["--token-file", "{manifest}", "--cache-bytes", "0"], "--cache-bytes 0: must be at least 1"),
    ("elastic-jax-worker", ["--token-file", "{manifest}", "--host-devices", "0"], "--host-devices must be at least 1"),
    ("elastic-jax-controller", ["--manifest", "{manifest}", "--port", "-3"], "--port -3: must be 0..65535"),
])
def test_numeric_options_out_of_range_name_the_option(tmp_path, command, args, fragment):
    """No numeric option lets a value through where it makes no sense (a negative port or slice index
    reached bind() or the slice list); each refusal names the option, exit 2, nothing started."""
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job_manifest("numeric", tmp_path)))
    argv = [str(Path(sys.executable).parent / command), *(a.format(manifest=path) for a in args)]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2, proc.stderr
    assert fragment in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists() and not leftover_processes(str(tmp_path))


def test_validate_refuses_operator_env_and_bad_pod_fields_naming_them(tmp_path):
    """`elastic-jax validate` makes the model's checks of the new pod fields: one line naming the field."""
    m = job_manifest("podfields", tmp_path)
    m["spec"].update({"imagePullSecrets": [{"name": "regcred"}], "priorityClassName": "training",
                      "worker": {"nodeSelector": {"cloud.google.com/gke-nodepool": "cpu-pool"},
                                 "tolerations": [{"key": "spot", "operator": "Exists"}]}})
    m["spec"]["controller"]["serviceAccountName"] = "trainer"  # its allow list is the operator's, not validate's
    proc = _validate(tmp_path, m)
    assert proc.returncode == 0, proc.stderr
    m["spec"]["controller"]["env"] = [{"name": contract.ENV_TOKEN_FILE, "value": "/tmp/mine"}]
    proc = _validate(tmp_path, m)
    assert_one_line_error(proc.returncode, proc.stdout, proc.stderr, "spec.controller.env[0].name",
                          "ELASTIC_JAX_TOKEN_FILE is set by elastic-jax itself")
    del m["spec"]["controller"]["env"]
    m["spec"]["worker"]["tolerations"] = [{"key": "spot", "operator": "Exists", "value": "x"}]
    proc = _validate(tmp_path, m)
    assert_one_line_error(proc.returncode, proc.stdout, proc.stderr, "spec.worker.tolerations[0]",
                          "operator Exists must not have a value")


def test_a_finished_job_run_again_says_so_and_starts_nothing(tmp_path):
    """A new-user trial: a job whose checkpoints already hold its last step, run again, started the controller
    and every worker (~30 s) to restore and train nothing, and its summary's first loss was the first run's.
    `run` now says at once that the job is finished, starts no process, and exits 0 (the job is done) with a
    SUMMARY that trained nothing and measured no loss; --fresh still starts over."""
    ckpt = tmp_path / "ckpt"
    m = job_manifest("done", tmp_path, training={"steps": 20, "globalBatchSize": 8},
                     checkpoint={"uri": str(ckpt), "intervalSteps": 10})
    # Real steps: "finished" now also reads the last step's data (a step of metadata alone is not finished).
    first = run_cli(m, tmp_path, "--no-failure")
    assert first.returncode == 0, first.stderr[-3000:]
    shutil.rmtree(tmp_path / "run")
    proc = _cli(tmp_path, m, "run", "--no-failure")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert ("job done: already finished at checkpoint step 20/20; trained 0 steps this run, nothing was started "
            "(--fresh starts over)") \
        in proc.stderr, proc.stderr
    assert "checkpoint step 20 written by local/done (uid " in proc.stderr and "Traceback" not in proc.stderr
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


def test_a_corrupt_final_step_is_not_a_finished_job_and_all_corrupt_steps_say_so(tmp_path):
    """A new-user trial, on real Orbax steps: (1) the last step's largest data file truncated, and `run` said
    "already finished" (exit 0) from the step's metadata alone, though the final model could not be read. Now
    it warns, starts, falls back to the newest step that restores and trains the rest, like the controller with
    any corrupt newest step; (2) the report says it fell back, and why, in one short line (the warning was only
    in controller.log); (3) every step truncated: the run failed as "does not fit this trainer's state (a
    changed model?)"; now it says no step could be restored, each step tried and why."""
    ckpt = tmp_path / "ckpt"
    m = job_manifest("fin", tmp_path, training={"steps": 20, "globalBatchSize": 8},
                     checkpoint={"uri": str(ckpt), "intervalSteps": 10, "maxToKeep": 5})
    first = run_cli(m, tmp_path, "--no-failure")
    assert first.returncode == 0, first.stderr[-3000:]
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


@pytest.mark.parametrize("damage", ["empty", "truncated"])
def test_a_newest_step_with_unreadable_step_metadata_falls_back_and_fresh_clears_it(tmp_path, damage):
    """A new-user trial: the newest step's `_CHECKPOINT_METADATA` emptied or cut short, and the job was refused
    (exit 2) as "no writer identity (saved by an older elastic-jax)" (Orbax reads a broken file as empty
    metadata), with no fallback, and --fresh refused to delete it too. It is a corrupt step: the run falls back
    to the newest one that reads, and --fresh deletes it with this job's own steps."""
    ckpt = tmp_path / "ckpt"
    m = job_manifest("meta", tmp_path, training={"steps": 20, "globalBatchSize": 8},
                     checkpoint={"uri": str(ckpt), "intervalSteps": 10, "maxToKeep": 5})
    assert run_cli(m, tmp_path, "--no-failure").returncode == 0
    meta = ckpt / "20" / "_CHECKPOINT_METADATA"
    meta.write_text("" if damage == "empty" else meta.read_text()[: len(meta.read_text()) // 2])
    shutil.rmtree(tmp_path / "run")
    again = run_cli(m, tmp_path, "--no-failure")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "writer identity" not in again.stderr and "already finished" not in again.stderr, again.stderr[-3000:]
    s = again.summary
    assert s["succeeded"] and s["steps"] == 20 and s["restored_from_step"] == 10, s
    assert s["resumed_from"]["fallbackReason"].startswith("newer committed steps could not be restored: step 20"), s

    meta = ckpt / "20" / "_CHECKPOINT_METADATA"  # (saved again whole: damage it once more for --fresh)
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


def test_validate_and_run_report_every_field_error_not_the_first(tmp_path):
    """A manifest with five mistakes in three sections: both commands list all five, one `error:` line each
    naming its field, as the API server lists every failed rule. Before, a rule of one section
    (minSlices > count) hid the others' and every rule across sections (globalBatchSize, hostsPerSlice, a
    repeated env name)."""
    m = job_manifest("many", tmp_path)
    m["spec"]["slices"].update(count=4, minSlices=5, hostsPerSlice=2)
    m["spec"]["training"]["globalBatchSize"] = 2
    m["spec"]["controller"].update(args=["x"], env=[{"name": "A", "value": "1"}, {"name": "A", "value": "2"}])
    fields = ["spec.slices.minSlices (5) must not exceed spec.slices.count (4)", "spec.controller.args:",
              "spec.controller.env[1].name: A is set twice", "spec.training.globalBatchSize (2) must be at least",
              "spec.slices.hostsPerSlice must be 1"]
    proc = _validate(tmp_path, m)
    run_code, run_out, run_err = run_bad(tmp_path, m)
    for code, out, err in ((proc.returncode, proc.stdout, proc.stderr), (run_code, run_out, run_err)):
        assert code == 2 and "Traceback" not in err and "SUMMARY" not in out, err
        errors = [ln for ln in err.splitlines() if ln.startswith("error: ")]
        assert len(errors) == len(fields), err
        for line, fragment in zip(errors, fields):
            assert line.startswith(f"error: {tmp_path / 'job.yaml'}: ") and fragment in line, (line, fragment)
    assert not (tmp_path / "run").exists()  # refused before anything started


def test_validate_reports_every_problem_of_every_stage_in_one_run(tmp_path):
    """A new-user trial: one field error in a section hid the section's other rules (`intervalSteps: 0` hid
    a `file://` uri; `hostsPerSlice: 0` a `minSlices` above `count`), and `validate` stopped between its
    stages (the manifest, then the TPU table / --cluster rules, then the checkpoint folder). Now every
    problem of every stage is one `error:` line naming its field, as the API server lists every CEL rule
    beside the field errors; a rule over a field that itself failed is skipped (no line about it)."""
    def errors(proc):
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
        return [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]

    m = job_manifest("every-stage", tmp_path)
    m["spec"]["slices"] = {"count": 2, "minSlices": 3, "hostsPerSlice": 0}
    m["spec"]["checkpoint"] = {"uri": "file:///tmp/x", "intervalSteps": 0}
    found = errors(_validate(tmp_path, m))
    assert len(found) == 4, found
    for fragment in ("spec.slices.hostsPerSlice: Input should be greater than or equal to 1",
                     "spec.slices.minSlices (3) must not exceed spec.slices.count (2)",
                     "spec.checkpoint.intervalSteps: Input should be greater than or equal to 1",
                     "spec.checkpoint.uri: 'file:///tmp/x': file:// is not supported"):
        assert sum(fragment in ln for ln in found) == 1, (fragment, found)
    # A rule over an invalid field is skipped: `count: 0` says so once, `minSlices` beside it stays quiet.
    m["spec"]["slices"] = {"count": 0, "minSlices": 1}
    found = errors(_validate(tmp_path, m))
    assert [ln for ln in found if "spec.slices" in ln] == [
        f"error: {tmp_path / 'job.yaml'}: spec.slices.count: Input should be greater than or equal to 1 (got 0)"], found

    # The stages after the manifest: the TPU table and node selectors, the cluster rules, the checkpoint folder.
    ckpt = tmp_path / "shared"
    _fake_step(ckpt, 10, identity.local_identity("writer-a", str(ckpt)))
    m = job_manifest("every-stage", tmp_path, checkpoint={"uri": str(ckpt), "intervalSteps": 0})
    m["spec"]["backend"] = "pathways"
    m["spec"]["slices"] = {"count": 2, "accelerator": "tpu-v9", "topology": "2x2"}
    m["spec"]["worker"] = {"nodeSelector": {"cloud.google.com/gke-tpu-topology": "2x2"}}
    found = errors(_validate(tmp_path, m))
    for fragment in ("spec.checkpoint.intervalSteps: Input should be greater than or equal to 1",
                     "spec.slices.accelerator 'tpu-v9' is not a TPU accelerator",
                     "spec.worker.nodeSelector['cloud.google.com/gke-tpu-topology']",
                     "checkpoint step 10 was written by another job, local/writer-a"):
        assert sum(fragment in ln for ln in found) == 1, (fragment, found)
    assert len(found) == 4, found
    m["spec"]["checkpoint"]["uri"] = "relative/ckpt"
    found = errors(_validate(tmp_path, m, "--cluster"))
    for fragment in ("spec.checkpoint.intervalSteps", "spec.checkpoint.uri: a local path must be an absolute folder",
                     "spec.checkpoint.uri must be gs://bucket/prefix for backend pathways",
                     "'tpu-v9' is not a TPU accelerator", "spec.worker.nodeSelector["):
        assert sum(fragment in ln for ln in found) == 1, (fragment, found)
    assert len(found) == 5, found


def test_a_trainer_module_beside_the_manifest_is_named_with_the_path_that_would_find_it(tmp_path):
    """A new-user trial: `trainer: mytrainer:make_trainer` with mytrainer.py next to the yaml failed with
    `cannot import module 'mytrainer' (No module named 'mytrainer')` and no hint. The manifest's folder is
    not searched (a cluster's controller has no such folder): the error names the field, says the module
    must be installed or on PYTHONPATH, and names the folder it is in; `run` and `validate --trainer` alike."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "mytrainer.py").write_text("def make_trainer(config):\n    raise SystemExit('not reached')\n")
    m = job_manifest("beside", tmp_path)
    m["spec"]["controller"]["trainer"]["entryPoint"] = "mytrainer:make_trainer"
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(m))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    fragments = ("spec.controller.trainer.entryPoint 'mytrainer:make_trainer'", "No module named 'mytrainer'",
                 "must be installed", "on PYTHONPATH", f"mytrainer.py is beside the manifest in {folder}",
                 f"PYTHONPATH={folder}")
    for args in (["run", str(path), "--workdir", str(tmp_path / "run"), "--no-failure"],
                 ["validate", "--trainer", str(path)]):
        proc = subprocess.run([CLI, *args], capture_output=True, text=True, timeout=180, cwd=tmp_path, env=env)
        assert_one_line_error(proc.returncode, proc.stdout, proc.stderr, *fragments)
    assert not leftover_processes(str(tmp_path))
    # Not beside the manifest either: the error says where it looked.
    (folder / "mytrainer.py").unlink()
    proc = subprocess.run([CLI, "validate", "--trainer", str(path)], capture_output=True, text=True, timeout=180,
                          cwd=tmp_path, env=env)
    assert_one_line_error(proc.returncode, proc.stdout, proc.stderr, "must be installed",
                          f"not found beside the manifest either (looked in {folder})")
