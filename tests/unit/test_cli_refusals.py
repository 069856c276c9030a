"""Bad input to `elastic-jax run` and `validate`, in-process: one clear line naming the field, exit 2, nothing
started, nothing deleted.

Each refusal here happens before `run` starts a process (the manifest, the flags, `--workdir`, the checkpoint
folder's preflight) or in `validate`, so the CLI's `main` (typer's `app`) is called in this process by
`CliRunner`. What needs a real `elastic-jax run` (a refusal by the controller process, the console script's
exit path, signals, training) stays in tests/integration/test_cli_bad_input.py.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from elastic_jax import contract
from elastic_jax.api import identity
from elastic_jax.cli import app
from tests.support.runs import fake_step, job_manifest, leftover_processes


@dataclass
class Cli:
    """One in-process command: its exit code and its two streams."""

    returncode: int
    stdout: str
    stderr: str


@pytest.fixture(autouse=True)
def _in_tmp_with_signals_kept(tmp_path, monkeypatch):
    """Each command runs from tmp_path; `run` installs SIGTERM/SIGINT handlers once past its preflight (the
    `--workdir` refusals): this process gets pytest's back."""
    monkeypatch.chdir(tmp_path)
    kept = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    yield
    for s, handler in kept.items():
        signal.signal(s, handler)


def _invoke(*argv: str) -> Cli:
    result = CliRunner().invoke(app, list(argv))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # (a traceback: the test fails showing it)
    return Cli(result.exit_code, result.stdout, result.stderr)


def _write(tmp_path: Path, manifest) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(manifest if isinstance(manifest, str) else yaml.safe_dump(manifest))
    return path


def run_bad(tmp_path: Path, manifest, *flags: str) -> Cli:
    """`elastic-jax run MANIFEST --workdir tmp_path/run FLAGS` in this process."""
    return _invoke("run", str(_write(tmp_path, manifest)), "--workdir", str(tmp_path / "run"), *flags)


def _validate(tmp_path: Path, manifest, *flags: str) -> Cli:
    return _invoke("validate", *flags, str(_write(tmp_path, manifest)))


def assert_one_line_error(proc: Cli, *fragments: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errors) == 1, proc.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    assert "Traceback" not in proc.stderr and "SUMMARY" not in proc.stdout


def nothing_started(tmp_path: Path) -> bool:
    """No run directory, and no process mentioning tmp_path."""
    return not (tmp_path / "run").exists() and not leftover_processes(str(tmp_path))


# -- the manifest ------------------------------------------------------------------------------------------

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
    assert_one_line_error(run_bad(tmp_path, m), *fragments)
    assert nothing_started(tmp_path)  # refused before anything started


@pytest.mark.parametrize("path, value, fragment", [
    (("training", "steps"), 1.5, "spec.training.steps: 1.5: must be an integer (a whole number, e.g. 10), not a fraction"),
    (("worker", "resources"), {"requests": {"cpu": 2.0}},
     "spec.worker.resources.requests.cpu: 2.0: must be an integer or a quoted string, e.g. 2 or '2', not a float"),
])
def test_a_json_float_is_refused_saying_what_the_field_needs(tmp_path, path, value, fragment):
    """Issue 11: `steps: 1.5` read "Input should be a valid integer"; `cpu: 2.0` as if kubectl refused it."""
    m = job_manifest("floaty", tmp_path)
    m["spec"].setdefault(path[0], {})[path[1]] = value
    assert_one_line_error(run_bad(tmp_path, m), fragment)


def test_malformed_manifest(tmp_path):
    assert_one_line_error(run_bad(tmp_path, "apiVersion: elasticjax.dev/v1alpha1\nspec: {slices: [\n"), "malformed YAML")


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
    for proc in (_validate(tmp_path, m), run_bad(tmp_path, m)):
        assert proc.returncode == 2 and "Traceback" not in proc.stderr and "SUMMARY" not in proc.stdout, proc.stderr
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
        assert len(errors) == len(fields), proc.stderr
        for line, fragment in zip(errors, fields):
            assert line.startswith(f"error: {tmp_path / 'job.yaml'}: ") and fragment in line, (line, fragment)
    assert nothing_started(tmp_path)  # refused before anything started


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
    fake_step(ckpt, 10, identity.local_identity("writer-a", str(ckpt)))
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
    then "must be an absolute folder"); an uppercase bucket name two lines. Several bad fields at once: one
    line a fault, no field's fault said twice (the CRD's CEL says the same lines)."""
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
    assert_one_line_error(_validate(tmp_path, m), "spec.controller.env[0].name",
                          "ELASTIC_JAX_TOKEN_FILE is set by elastic-jax itself")
    del m["spec"]["controller"]["env"]
    m["spec"]["worker"]["tolerations"] = [{"key": "spot", "operator": "Exists", "value": "x"}]
    assert_one_line_error(_validate(tmp_path, m), "spec.worker.tolerations[0]", "operator Exists must not have a value")


# -- the trainer: `validate --trainer` builds it as the controller would (`load_trainer`) ----------------------

def test_validate_trainer_checks_config_and_data(tmp_path):
    """`validate` checks the manifest alone; `validate --trainer` also catches what the controller would:
    a data glob that matches nothing (`run` stops at its controller with the same line: the integration
    test of a trainer the controller cannot build)."""
    m = job_manifest("valid", tmp_path)
    m["spec"]["controller"]["trainer"]["config"]["data"] = str(tmp_path / "nothing" / "*.txt")
    assert _validate(tmp_path, m).returncode == 0  # the manifest itself is fine
    assert_one_line_error(_validate(tmp_path, m, "--trainer"), "spec.controller.trainer.config.data", "no files match")
    m["spec"]["controller"]["trainer"]["config"]["data"] = "stdlib"
    m["spec"]["controller"]["trainer"]["config"]["seqLen"] = "32"  # strict: not coerced
    assert_one_line_error(_validate(tmp_path, m, "--trainer"), "spec.controller.trainer.config.seqLen",
                          "valid integer")
    m["spec"]["controller"]["trainer"]["config"]["seqLen"] = 32
    proc = _validate(tmp_path, m, "--trainer")
    assert proc.returncode == 0, proc.stderr
    assert "config ok" in proc.stderr and yaml.safe_load(proc.stdout)["kind"] == "ElasticTrainingJob"


def test_bad_trainer_config_key_and_entry_point(tmp_path):
    """An unknown trainer config key, an entry point whose module does not exist: one line naming the field
    and the file (as `run` prints the controller's refusal)."""
    m = job_manifest("badcfg", tmp_path)
    m["spec"]["controller"]["trainer"]["config"]["dModle"] = 64
    assert_one_line_error(_validate(tmp_path, m, "--trainer"), "spec.controller.trainer.config.dModle")
    m = job_manifest("badep", tmp_path)
    m["spec"]["controller"]["trainer"]["entryPoint"] = "no_such_module:make"
    proc = _validate(tmp_path, m, "--trainer")
    assert_one_line_error(proc, "spec.controller.trainer.entryPoint", "no_such_module")
    assert f"{tmp_path / 'job.yaml'}: spec.controller.trainer.entryPoint" in proc.stderr, proc.stderr


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


def test_one_mistake_is_one_error_line_not_two(tmp_path):
    """A new user's trial: a trainer beside a command printed the same line twice (the model's rule, then the
    CRD's on what was written), and an entry point without `:function` got its shape error and an import error."""
    m = job_manifest("both", tmp_path)
    m["spec"]["controller"]["command"] = ["python", "train.py"]  # (beside the trainer and its config)
    for flags in ((), ("--trainer",)):
        proc = _validate(tmp_path, m, *flags)
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
        assert proc.returncode == 2 and len(errors) == 1, proc.stderr
        assert "spec.controller.trainer: not used with spec.controller.command" in errors[0]
    m = job_manifest("shape", tmp_path)
    m["spec"]["controller"]["trainer"]["entryPoint"] = "mypkg.mod"
    proc = _validate(tmp_path, m, "--trainer")
    assert_one_line_error(proc, "spec.controller.trainer.entryPoint 'mypkg.mod' must look like 'package.module:function'")


def test_an_error_quoting_a_huge_value_is_one_bounded_line(tmp_path):
    """A new user's trial: a 5 MB `config.data` string came back as a 5,000,129-byte `error:` line."""
    from elastic_jax import error_lines

    m = job_manifest("huge", tmp_path)
    m["spec"]["controller"]["trainer"]["config"]["data"] = "x" * 2_500_000  # (under the 3 MiB a manifest may be)
    proc = _validate(tmp_path, m, "--trainer")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[:2000]
    [line] = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert "spec.controller.trainer.config.data: no files match" in line
    assert len(line) <= len("error: ") + error_lines.MAX_CHARS + 40 and line.endswith(" more characters>"), line[-80:]


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


def test_an_entry_point_that_raises_is_one_line_naming_the_field(tmp_path, monkeypatch):
    """`make_trainer` reading a missing config key, or a function that is no trainer (`os:system` gets a
    dict): `run` printed `error: KeyError: 'loss'` naming nothing, `validate --trainer` a traceback. The
    line names the field, the entry point, the exception and where it was raised."""
    (tmp_path / "raising_trainer.py").write_text("def make_trainer(config):\n    return config['loss']\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    m = job_manifest("raises", tmp_path)
    try:
        m["spec"]["controller"]["trainer"]["entryPoint"] = "raising_trainer:make_trainer"
        assert_one_line_error(_validate(tmp_path, m, "--trainer"), "spec.controller.trainer.entryPoint",
                              "raising_trainer:make_trainer", "KeyError: 'loss'", "raising_trainer.py:2",
                              "spec.controller.trainer.config")
        m["spec"]["controller"]["trainer"]["entryPoint"] = "os:system"
        assert_one_line_error(_validate(tmp_path, m, "--trainer"), "spec.controller.trainer.entryPoint", "os:system",
                              "TypeError")
    finally:
        sys.modules.pop("raising_trainer", None)


def test_a_trainer_module_beside_the_manifest_is_named_with_the_path_that_would_find_it(tmp_path):
    """A new-user trial: `trainer: mytrainer:make_trainer` with mytrainer.py next to the yaml failed with
    `cannot import module 'mytrainer' (No module named 'mytrainer')` and no hint. The manifest's folder is
    not searched (a cluster's controller has no such folder): the error names the field, says the module
    must be installed or on PYTHONPATH, and names the folder it is in (`run` says the same: the integration
    test of a trainer the controller cannot build)."""
    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "mytrainer.py").write_text("def make_trainer(config):\n    raise SystemExit('not reached')\n")
    m = job_manifest("beside", tmp_path)
    m["spec"]["controller"]["trainer"]["entryPoint"] = "mytrainer:make_trainer"
    path = folder / "job.yaml"
    path.write_text(yaml.safe_dump(m))
    assert_one_line_error(_invoke("validate", "--trainer", str(path)),
                          "spec.controller.trainer.entryPoint 'mytrainer:make_trainer'", "No module named 'mytrainer'",
                          "must be installed", "on PYTHONPATH", f"mytrainer.py is beside the manifest in {folder}",
                          f"PYTHONPATH={folder}")
    # Not beside the manifest either: the error says where it looked.
    (folder / "mytrainer.py").unlink()
    assert_one_line_error(_invoke("validate", "--trainer", str(path)), "must be installed",
                          f"not found beside the manifest either (looked in {folder})")


# -- the checkpoint folder: `checkpoints.preflight`, before any process starts --------------------------------

def test_unreachable_local_checkpoint_uri(tmp_path):
    m = job_manifest("badckpt", tmp_path, checkpoint={"uri": "/proc/no/such/dir"})
    assert_one_line_error(run_bad(tmp_path, m), "spec.checkpoint.uri", "/proc/no/such/dir")
    assert nothing_started(tmp_path)


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
        run = run_bad(tmp_path, m, "--no-failure")
        validate = _validate(tmp_path, m, "--trainer")
    finally:
        subprocess.run(["chattr", "-i", str(tmp_path / "frozen")], check=False)
    assert_one_line_error(run, "spec.checkpoint.uri", fragment)
    assert nothing_started(tmp_path)
    assert_one_line_error(validate)
    assert [ln for ln in validate.stderr.splitlines() if ln.startswith("error: ")][0] == run.stderr.strip()
    assert not (tmp_path / "frozen" / "sub").exists() and (tmp_path / "afile").read_text() == "x"


def test_another_jobs_checkpoints_are_refused_before_any_process_starts(tmp_path):
    """A new-user trial: a job pointed at a directory holding another job's checkpoints was refused only
    after the controller and workers had started (exit 1, ~14 s). `run` refuses it up front, exit 2, and
    `validate` (with or without --trainer) reports the same line; --fresh refuses to delete them up front."""
    ckpt = tmp_path / "shared"
    fake_step(ckpt, 10, identity.local_identity("writer-a", str(ckpt)))
    m = job_manifest("writer-b", tmp_path, training={"steps": 20, "globalBatchSize": 8},
                     checkpoint={"uri": str(ckpt), "intervalSteps": 5})
    run = run_bad(tmp_path, m, "--no-failure")
    assert_one_line_error(run, f"spec.checkpoint.uri {str(ckpt)!r}",
                          "checkpoint step 10 was written by another job, local/writer-a",
                          "set spec.checkpoint.resumeFrom: Any")
    assert nothing_started(tmp_path)  # nothing started: not even the run directory
    for flags in ((), ("--trainer",)):
        proc = _validate(tmp_path, m, *flags)
        assert_one_line_error(proc)
        assert [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")] == run.stderr.strip().splitlines()
    fresh = run_bad(tmp_path, m, "--fresh", "--no-failure")
    assert_one_line_error(fresh, "spec.checkpoint.uri", "--fresh deletes this job's checkpoints only", "local/writer-a")
    assert (ckpt / "10" / "_CHECKPOINT_METADATA").is_file() and nothing_started(tmp_path)
    # A step beyond spec.training.steps is refused up front too, also with resumeFrom: Any.
    m["spec"]["training"]["steps"] = 5
    m["spec"]["checkpoint"]["resumeFrom"] = "Any"
    for proc in (run_bad(tmp_path, m, "--no-failure"), _validate(tmp_path, m)):
        assert_one_line_error(proc, "spec.checkpoint.uri", "holds checkpoint step 10, beyond spec.training.steps (5)")
    assert nothing_started(tmp_path)


def test_fresh_never_deletes_a_user_folder_named_by_digits(tmp_path):
    """Issue 9 item 12: `2024/` under the checkpoint directory is a user's folder, not an Orbax
    step (no step metadata): --fresh refuses and deletes nothing, not even this job's steps."""
    ckpt = tmp_path / "ckpt"
    for step in (5, 10):
        fake_step(ckpt, step, identity.local_identity("digits", str(ckpt)))
    (ckpt / "2024").mkdir()
    (ckpt / "2024" / "report.csv").write_text("a,b\n")
    m = job_manifest("digits", tmp_path, training={"steps": 10, "globalBatchSize": 8},
                     checkpoint={"uri": str(ckpt), "intervalSteps": 5})
    assert_one_line_error(run_bad(tmp_path, m, "--fresh", "--no-failure"), "spec.checkpoint.uri",
                          "--fresh deletes checkpoints only", "2024")
    assert (ckpt / "2024" / "report.csv").read_text() == "a,b\n"
    assert (ckpt / "10" / "_CHECKPOINT_METADATA").is_file() and (ckpt / "5" / "_CHECKPOINT_METADATA").is_file()
    assert nothing_started(tmp_path)


def test_fresh_never_deletes_a_step_folder_holding_a_users_file(tmp_path):
    """New-user trial (issue 31 FAIL 2's kind): beside this job's steps, `5/` with a garbage
    `_CHECKPOINT_METADATA` and the user's `thesis.tex`. `validate --trainer` refused it (never committed), but
    `run --fresh` deleted `5/`, thesis and all. Now refused: one line naming `5` and `thesis.tex`, exit 2,
    nothing deleted, nothing started."""
    ckpt = tmp_path / "ckpt"
    for step in (10, 20):
        fake_step(ckpt, step, identity.local_identity("thesis", str(ckpt)))
    (ckpt / "5").mkdir()
    (ckpt / "5" / "_CHECKPOINT_METADATA").write_text("not json {")
    (ckpt / "5" / "thesis.tex").write_text("\\chapter{One}")
    m = job_manifest("thesis", tmp_path, training={"steps": 20, "globalBatchSize": 8},
                     checkpoint={"uri": str(ckpt), "intervalSteps": 10})
    assert_one_line_error(run_bad(tmp_path, m, "--fresh", "--no-failure"), "spec.checkpoint.uri",
                          "step folder 5 holds thesis.tex, which Orbax does not write in a step",
                          "nothing was deleted")
    assert (ckpt / "5" / "thesis.tex").read_text() == "\\chapter{One}"
    assert all((ckpt / str(s) / "_CHECKPOINT_METADATA").is_file() for s in (5, 10, 20))
    assert nothing_started(tmp_path)


def test_fresh_on_a_directory_it_cannot_empty_deletes_nothing(tmp_path):
    """--fresh on a step whose folder is immutable: it deleted the step's metadata, then died with a
    PermissionError traceback (half a step gone). Now refused up front, one line, nothing deleted."""
    ckpt = tmp_path / "ckpt"
    step = fake_step(ckpt, 10, identity.local_identity("frozenfresh", str(ckpt)))
    (step / "state").mkdir()
    (step / "state" / "_METADATA").write_text("data")
    m = job_manifest("frozenfresh", tmp_path, checkpoint={"uri": str(ckpt)})
    subprocess.run(["chattr", "+i", str(step / "state")], check=True)
    try:
        proc = run_bad(tmp_path, m, "--fresh", "--no-failure")
    finally:
        subprocess.run(["chattr", "-i", str(step / "state")], check=False)
    assert_one_line_error(proc, "spec.checkpoint.uri",
                          f"--fresh cannot delete the checkpoints: {str(step / 'state')!r} is not writable; "
                          "nothing was deleted")
    assert (step / "_CHECKPOINT_METADATA").is_file() and (step / "state" / "_METADATA").read_text() == "data"
    assert nothing_started(tmp_path)


@pytest.mark.parametrize("example", sorted(p.name for p in (Path(__file__).resolve().parents[2] / "examples")
                                            .glob("*pathways*.yaml")))
def test_run_of_a_pathways_example_names_the_file(tmp_path, example):
    """New-user trial: `elastic-jax run examples/02-tpu-v5e-pathways.yaml` said `error: spec.backend: ...` without
    the file, unlike every other line about a manifest. Now the file, the field and what to do instead."""
    path = Path(__file__).resolve().parents[2] / "examples" / example
    proc = _invoke("run", str(path), "--workdir", str(tmp_path / "run"))
    assert_one_line_error(proc, f"error: {path}: spec.backend: 'pathways' runs on GKE (kubectl apply -f {path}; "
                                f"`elastic-jax validate --cluster {path}` checks it first)")
    assert nothing_started(tmp_path)


def test_fresh_with_a_gcs_uri_names_the_file(tmp_path):
    m = job_manifest("freshgcs", tmp_path, checkpoint={"uri": "gs://bucket/prefix"})
    path = _write(tmp_path, m)
    proc = _invoke("run", str(path), "--workdir", str(tmp_path / "run"), "--fresh")
    assert_one_line_error(proc, f"error: {path}: spec.checkpoint.uri is gs://bucket/prefix: --fresh clears local "
                                "checkpoint directories only")
    assert nothing_started(tmp_path)


# -- flags ------------------------------------------------------------------------------------------------

def test_bad_workdir(tmp_path):
    m = job_manifest("badwd", tmp_path)
    path = _write(tmp_path, m)
    (tmp_path / "afile").write_text("x")
    for workdir, what in (("/proc/no/such", "cannot be created"), (str(tmp_path / "afile"), "is a file, not a directory"),
                          ("", "--workdir '': empty"), ("  ", "--workdir '': empty")):  # ('': was the current folder)
        assert_one_line_error(_invoke("run", str(path), "--workdir", workdir), "--workdir", what)
    assert not leftover_processes(str(tmp_path))


def test_a_path_too_long_for_the_file_system_is_one_line_not_a_traceback(tmp_path):
    """A new user's trial: `--workdir` with a 300-character name printed an `OSError: File name too long`
    traceback; so did such a `spec.checkpoint.uri` in `validate` and `run`."""
    long_name = "a" * 300  # (NAME_MAX is 255 bytes on Linux file systems)
    m = job_manifest("longwd", tmp_path)
    path = _write(tmp_path, m)
    assert_one_line_error(_invoke("run", str(path), "--no-failure", "--workdir", str(tmp_path / long_name)),
                          "--workdir", "File name too long")
    m = job_manifest("longckpt", tmp_path, checkpoint={"uri": str(tmp_path / long_name / "ckpt")})
    assert_one_line_error(_validate(tmp_path, m), "spec.checkpoint.uri", "File name too long")
    assert_one_line_error(_validate(tmp_path, m, "--trainer"), "spec.checkpoint.uri", "File name too long")
    assert_one_line_error(run_bad(tmp_path, m), "spec.checkpoint.uri", "File name too long")
    assert nothing_started(tmp_path)


def test_a_workdir_that_is_not_a_run_folder_is_refused_before_anything_is_written(tmp_path):
    """Issue 31 RISK 6's kind: `--workdir /etc` (or a folder holding a `token` and `summary.json`) was written
    into, those files overwritten. A folder that is not new, empty or an earlier run's is refused, untouched."""
    path = _write(tmp_path, job_manifest("notrun", tmp_path))
    planted = {"token": "my token\n", "summary.json": '{"mine": true}\n'}
    for name, files in (("planted", planted), ("etc", {"passwd": "root:x:0:0\n", "hosts": "127.0.0.1\n"})):
        folder = tmp_path / name
        folder.mkdir(mode=0o700)
        for file, text in files.items():
            (folder / file).write_text(text)
        assert_one_line_error(_invoke("run", str(path), "--workdir", str(folder)),
                              f"--workdir {folder}", "not an earlier elastic-jax run's folder")
        assert {p.name: p.read_text() for p in folder.iterdir()} == files  # nothing written, nothing replaced
    assert not leftover_processes(str(tmp_path))


def test_contradictory_failure_flags_are_refused(tmp_path):
    m = job_manifest("flags", tmp_path)
    for flags in (["--kill-at-step", "5", "--no-failure"], ["--kill-slice", "1", "--no-failure"]):
        assert_one_line_error(run_bad(tmp_path, m, *flags), flags[0], "--no-failure")
    assert nothing_started(tmp_path)


@pytest.mark.parametrize("args, fragment", [
    (["--kill-at-step", "abc"], "'--kill-at-step'"),
    (["--kill-at-step", "0"], "--kill-at-step 0: must be in 1..59"),
    (["--kill-at-step", "-5"], "--kill-at-step -5: must be in 1..59"),
    (["--kill-at-step", "60"], "--kill-at-step 60: must be in 1..59"),
    (["--kill-slice", "-1"], "--kill-slice -1: the job has slices 0..1"),
    (["--kill-slice", "2"], "--kill-slice 2: the job has slices 0..1"),
])
def test_numeric_options_of_run_out_of_range_name_the_option(tmp_path, args, fragment):
    """No numeric option lets a value through where it makes no sense (a slice index outside the job reached
    the slice list); each refusal names the option, exit 2, nothing started."""
    proc = run_bad(tmp_path, job_manifest("numeric", tmp_path), *args)
    assert proc.returncode == 2, proc.stderr
    assert fragment in proc.stderr and "Traceback" not in proc.stderr
    assert nothing_started(tmp_path)


@pytest.mark.parametrize("args, fragment", [
    (["--port", "-1"], "--port -1: must be 0..65535"),
    (["--port", "70000"], "--port 70000: must be 0..65535"),
    (["--slice-index", "-1"], "--slice-index -1: must be 0 or more"),
    (["--cache-bytes", "0"], "--cache-bytes 0: must be at least 1"),
    (["--host-devices", "0"], "--host-devices must be at least 1"),
])
def test_numeric_options_of_the_worker_out_of_range_name_the_option(tmp_path, capsys, args, fragment):
    """The worker's (`elastic-jax-worker`'s argument parser, the first thing its `main` does): a negative port
    or slice index reached bind() or the slice list. The controller's `--port` is checked by a real
    `elastic-jax-controller` (tests/integration/test_cli_bad_input.py)."""
    from elastic_jax.worker.main import parse_args

    (tmp_path / "token").write_text("t")
    with pytest.raises(SystemExit) as stopped:
        parse_args(["--token-file", str(tmp_path / "token"), *args])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and fragment in err, err


@pytest.mark.parametrize("path, value", [
    (("spec",), [1, 2]), (("spec",), "hello"), (("spec", "controller"), [1]),
], ids=["spec-list", "spec-string", "controller-list"])
def test_a_section_that_is_not_a_mapping_is_one_line_naming_it(tmp_path, path, value):
    """A new user's trial: `spec: [1,2]` or `spec.controller: [1]` printed an AttributeError traceback (exit 1)
    from the library-mode rule, which read the manifest before the model refused it."""
    m = job_manifest("shape", tmp_path)
    parent = m
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    field = ".".join(path)
    assert_one_line_error(_validate(tmp_path, m), f"{field}: Input should be an object")
    assert_one_line_error(run_bad(tmp_path, m), f"{field}: Input should be an object")


@pytest.mark.parametrize("config, words", [
    ({"numLayers": 1e9}, "spec.controller.trainer.config.numLayers: 1000000000.0: must be an integer"),
    ({"numLayers": 1_000_000_000}, "spec.controller.trainer.config.numLayers: Input should be less than or equal"),
    ({"dModel": 1_048_576}, "spec.controller.trainer.config: the model is too large for this host"),
])
def test_a_trainer_config_refused_leaves_the_run_and_checkpoint_folders_as_they_were(tmp_path, config, words):
    """A new user's `numLayers: 1e9` (issue of session 21): refused in one line before anything is written; before,
    the controller refused it after the launcher had created --workdir (marker, token, lock, controller.log)
    and the checkpoint folder, and an integer billion sat at step 0 with no word. (In-process since session 27:
    `run` builds the trainer before it writes or starts anything, so a real console script showed no more.)"""
    m = job_manifest("big", tmp_path)
    m["spec"]["controller"] = {"trainer": {"config": {**config, "maxBytes": 20000}}}
    (tmp_path / "ckpt-parent").mkdir()
    m["spec"]["checkpoint"]["uri"] = str(tmp_path / "ckpt-parent" / "ck")
    assert_one_line_error(run_bad(tmp_path, m), f"{tmp_path / 'job.yaml'}: {words}")
    assert nothing_started(tmp_path) and list((tmp_path / "ckpt-parent").iterdir()) == []


def test_a_trainer_config_number_read_as_a_float_is_shown_as_written_saying_why(tmp_path):
    """Trial finding: `seqLen: 1e30` read `Input should be a valid integer (got 1e+30)`, and an integer written
    out beyond 2**64 `(got 1e+23)`: neither as written, nor why a whole number is no integer. The trainer's
    config keeps each float's text; the line says what the key needs and that YAML read it as a float."""
    m = job_manifest("bigconfig", tmp_path)
    m["spec"]["controller"]["trainer"]["config"].update(seqLen="__SEQ__", maxBytes="__BYTES__")
    (tmp_path / "job.yaml").write_text(
        yaml.safe_dump(m).replace("__SEQ__", "1e30").replace("__BYTES__", "100000000000000000000000"))
    proc = _invoke("validate", "--trainer", str(tmp_path / "job.yaml"))
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    why = "must be an integer (a whole number, e.g. 10), not a float (YAML reads"
    assert sorted(errors) == [
        f"error: {tmp_path / 'job.yaml'}: spec.controller.trainer.config.maxBytes: 100000000000000000000000: {why} "
        "a number with a decimal point or an exponent, or an integer beyond 2**64, as one)",
        f"error: {tmp_path / 'job.yaml'}: spec.controller.trainer.config.seqLen: 1e30: {why} a number with a "
        "decimal point or an exponent, or an integer beyond 2**64, as one)"], errors


def test_both_commands_print_their_version_and_exit_0(capsys):
    """A new user's trial (session 26) asked for `elastic-jax --version`: the package's version, which is the
    images' tag (`elastic_jax.api.images`), so a bug report can name what ran."""
    from elastic_jax import __version__
    from elastic_jax.k8s_operator import main as operator_main

    cli = _invoke("--version")
    assert (cli.returncode, cli.stdout.strip()) == (0, f"elastic-jax {__version__}"), cli
    with pytest.raises(SystemExit) as done:
        operator_main.main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"elastic-jax-operator {__version__}"


def test_a_run_refused_for_checkpoints_in_use_leaves_no_new_workdir(tmp_path):
    """Another run holds the job's checkpoint folder (its `CheckpointLock`, taken here as that run's launcher
    takes it): `run` with a new --workdir is refused naming the field, and the folder it had created is gone."""
    from elastic_jax.local.launcher import CheckpointLock

    manifest = job_manifest("held", tmp_path, training={"steps": 20, "globalBatchSize": 8})
    uri = manifest["spec"]["checkpoint"]["uri"]
    with CheckpointLock(uri):
        # (the holder's work half-done, e.g. a step folder its --fresh is emptying: not this run's to judge)
        (Path(uri) / "10").mkdir()
        proc = run_bad(tmp_path, manifest, "--no-failure")
    assert_one_line_error(proc, "spec.checkpoint.uri", "in use by another elastic-jax run")
    assert nothing_started(tmp_path)


@pytest.mark.parametrize("flags", [(), ("--fresh",)])
def test_a_checkpoint_folder_every_user_may_write_in_is_refused_before_anything_starts(tmp_path, flags):
    """A new user's trial: `--workdir` refused a world-writable folder, the checkpoint folder (where another user
    could plant a step to resume from, or folders `--fresh` deletes) passed."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    ckpt.chmod(0o777)
    m = job_manifest("shared", tmp_path)
    m["spec"]["checkpoint"]["uri"] = str(ckpt)
    for proc in (run_bad(tmp_path, m, *flags), _validate(tmp_path, m, "--trainer")):
        assert_one_line_error(proc, "spec.checkpoint.uri", "writable by every user (mode 0777)", "chmod o-w")
    assert nothing_started(tmp_path)
    ckpt.chmod(0o1777)  # (the sticky bit does not help: others may still add a step folder)
    assert_one_line_error(run_bad(tmp_path, m, *flags), "writable by every user (mode 1777)")
    ckpt.chmod(0o755)
    assert _validate(tmp_path, m, "--trainer").returncode == 0
