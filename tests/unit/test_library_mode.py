"""Library mode (spec.controller.command/args): the spec model, the controller pod, the launcher's argv, the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from elastic_jax import contract
from elastic_jax.api.manifest import ManifestError, parse_manifest
from elastic_jax.cli import app
from elastic_jax.k8s_operator.backends import renderer_for
from tests.support.bad_manifests import cpu_job, pathways_job


def _with_controller(make, **controller):
    manifest = make()
    manifest["spec"]["controller"] = {k: v for k, v in manifest["spec"].get("controller", {}).items()
                                      if k != "trainer"}
    manifest["spec"]["controller"].update(controller)
    return manifest


@pytest.mark.parametrize("make,backend", [(cpu_job, "cpu"), (pathways_job, "pathways")])
def test_command_and_args_replace_the_trainer_host_in_the_controller_pod(make, backend):
    job = parse_manifest(_with_controller(make, command=["python", "/app/train.py"], args=["--lr", "0.1"]))
    assert job.spec.controller.library_mode
    pod = renderer_for(backend).controller_pod(job, attempt=0)
    c = pod["spec"]["containers"][0]
    assert c["command"] == ["python", "/app/train.py"] and c["args"] == ["--lr", "0.1"]
    env = {e["name"] for e in c["env"]}
    # the library reads the same settings as the built-in controller, and is probed the same way
    assert {contract.ENV_MANIFEST, contract.ENV_TOKEN_FILE, contract.ENV_PORT, contract.ENV_HOST} <= env
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"


def test_the_manifest_configmap_round_trips_in_library_mode():
    """The operator writes the spec back with every default (trainer included): the program must read it."""
    from elastic_jax.k8s_operator import children

    job = parse_manifest(_with_controller(cpu_job, command=["python", "/app/train.py"]))
    written = yaml.safe_load(children.manifest_configmap(job)["data"]["job.yaml"])
    assert parse_manifest(written).spec == job.spec


def test_without_command_the_image_entry_point_runs():
    job = parse_manifest(cpu_job())
    assert not job.spec.controller.library_mode
    c = renderer_for("cpu").controller_pod(job, attempt=0)["spec"]["containers"][0]
    assert "command" not in c and "args" not in c


@pytest.mark.parametrize("controller,field", [
    ({"command": ["python", "x.py"], "trainer": {"entryPoint": "a.b:c"}}, "spec.controller.trainer"),
    ({"args": ["--x"]}, "spec.controller.args"),
    ({"command": []}, "command"),
    ({"command": [""]}, "command"),
    ({"command": "python x.py"}, "command"),
])
def test_bad_command_is_refused_naming_the_field(controller, field):
    manifest = cpu_job()
    manifest["spec"]["controller"] = dict(controller)
    with pytest.raises(ManifestError) as e:
        parse_manifest(manifest)
    assert field in str(e.value)


def _step(ckpt: Path, step: int, writer) -> None:
    """A committed Orbax step as it lies on disk (`<step>/_CHECKPOINT_METADATA` naming its writer)."""
    import json

    from elastic_jax.api import identity

    (ckpt / str(step)).mkdir(parents=True)
    (ckpt / str(step) / "_CHECKPOINT_METADATA").write_text(
        json.dumps({"custom_metadata": identity.to_metadata(writer)}))
    (ckpt / str(step) / "commit_success.txt").write_text("committed")  # (Orbax's commit marker, written last)


def test_run_fresh_in_library_mode_deletes_this_jobs_steps_or_says_there_is_nothing_to_delete(tmp_path):
    """A new-user trial: `run --fresh` was refused in library mode even with nothing to delete, so a clone
    whose first run restored another clone's step 200 (examples/04-own-loop.yaml's /tmp folder) could not
    start over. Now it deletes this job's steps (the built-in's rules: nothing else, no other job's) before
    the program starts, or says there was nothing to delete; either way the program is started."""
    from elastic_jax.api import identity

    path = tmp_path / "job.yaml"
    manifest = _with_controller(cpu_job, command=["python", str(tmp_path / "no-such-program.py")])
    ckpt = tmp_path / "ck"
    manifest["spec"]["checkpoint"] = {"uri": str(ckpt)}
    path.write_text(yaml.safe_dump(manifest))

    def run():
        result = CliRunner().invoke(app, ["run", str(path), "--fresh", "--no-failure", "--workdir", str(tmp_path / "run")])
        assert "Traceback" not in result.output
        return result

    result = run()  # (the program does not exist: the run starts it, and it exits before ready)
    assert f"--fresh: nothing to delete: spec.checkpoint.uri {ckpt} holds no checkpoint" in result.output, result.output
    assert "no-such-program.py" in result.output and (tmp_path / "run" / "controller.log").exists()
    _step(ckpt, 10, identity.local_identity("bad", str(ckpt)))
    result = run()
    assert f"--fresh: deleted 1 checkpoint entry (10) from spec.checkpoint.uri {ckpt}" in result.output, result.output
    assert ckpt.is_dir() and not list(ckpt.iterdir())
    # Another job's step: refused, as the built-in refuses it, before anything starts; nothing deleted.
    _step(ckpt, 20, identity.local_identity("writer-a", str(ckpt)))
    (tmp_path / "run" / "controller.log").unlink()
    result = run()
    assert result.exit_code == 2 and "--fresh deletes this job's checkpoints only" in result.output, result.output
    assert (ckpt / "20").is_dir() and not (tmp_path / "run" / "controller.log").exists()


def test_validate_trainer_notes_library_mode_and_passes(tmp_path):
    """No trainer to build: a note, not a refusal (a valid library-mode manifest passes `validate --trainer`)."""
    path = tmp_path / "job.yaml"
    manifest = _with_controller(cpu_job, command=["python", "x.py"])
    manifest["spec"]["checkpoint"] = {"uri": str(tmp_path / "ck")}
    path.write_text(yaml.safe_dump(manifest))
    result = CliRunner().invoke(app, ["validate", "--trainer", str(path)])
    assert result.exit_code == 0 and "note: " in result.output and "no trainer to build" in result.output
    assert "Traceback" not in result.output


def test_the_report_says_a_resumed_local_step_was_an_earlier_runs_in_a_shared_folder(tmp_path, capsys):
    """A new-user trial: a second clone's first `run examples/04-own-loop.yaml` resumed the other clone's step
    200 from the example's /tmp folder and its report said only "resumed from checkpoint step 200". It says
    now when an earlier run saved that step there, that the folder is shared, and that --fresh starts over;
    nothing of the kind for a step this run saved itself (a restarted controller resumed from it)."""
    import os
    import time

    from elastic_jax.api import identity
    import shutil

    from elastic_jax.cli import _print_report, _saved_steps

    ckpt = tmp_path / "ck"
    _step(ckpt, 200, identity.local_identity("own-loop", str(ckpt)))
    os.utime(ckpt / "200", (time.time() - 3600, time.time() - 3600))
    summary = {"job": "own-loop", "succeeded": True, "steps": 200, "total_steps": 200, "wall_seconds": 3.0,
               "restored_from_step": 200, "resumed_from": {"step": 200, "writer": None}, "recovery_seconds": [],
               "recoveries": 0, "steps_lost": None, "worker_restarts": 0, "controller_restarts": 0,
               "goodput": None, "checkpoint_uri": str(ckpt), "last_committed_checkpoint_step": 200,
               "metrics_file": "m", "logs_dir": "l", "initial_loss": 6.0, "final_loss": 1.5}
    earlier_steps = _saved_steps(str(ckpt))  # (read as `run` reads them, before its run starts)
    # the run then saved past it and maxToKeep deleted step 200 (a trial found the note skipped then)
    shutil.rmtree(ckpt / "200")
    _print_report(summary, earlier_steps)
    err = capsys.readouterr().err
    assert "resumed from checkpoint step 200" in err
    # (the first loss is the job's, saved with the checkpoints: a trial read it as this run's first step's)
    assert "loss 6.000 (the job's first step, saved with its checkpoints) -> 1.500" in err, err
    assert (f"step 200 was saved at {time.strftime('%Y-%m-%d', time.gmtime(time.time() - 3600))}" in err
            and f"by an earlier run into {ckpt}, a folder every run of this manifest on this machine shares "
                "(another clone's too); --fresh starts from step 0" in err), err
    _print_report(summary, {})  # saved during this run: not there before it started
    assert "earlier run" not in capsys.readouterr().err


def test_validate_prints_what_a_pathways_job_runs_and_a_printout_that_validates_again(tmp_path):
    """A new user's trial: `validate` printed the cpu worker image and devicesPerHost 1 for examples/02 (the
    operator renders the Pathways server image and 4 chips per host of a 2x2 v5e slice), and a library-mode
    job's printout carried a default trainer, which `validate` then refused beside spec.controller.command."""
    import yaml

    from elastic_jax.api.backend_rules import PATHWAYS_SERVER_IMAGE

    examples = Path(__file__).resolve().parents[2] / "examples"
    printed = CliRunner().invoke(app, ["validate", str(examples / "02-tpu-v5e-pathways.yaml")])
    assert printed.exit_code == 0, printed.output
    spec = yaml.safe_load(printed.stdout)["spec"]
    assert spec["worker"]["image"] == PATHWAYS_SERVER_IMAGE
    assert (spec["slices"]["hostsPerSlice"], spec["slices"]["devicesPerHost"]) == (1, 4)
    printed = CliRunner().invoke(app, ["validate", str(examples / "03-maxtext-pathways.yaml")])
    assert printed.exit_code == 0, printed.output
    assert "trainer" not in yaml.safe_load(printed.stdout)["spec"]["controller"]
    (tmp_path / "again.yaml").write_text(printed.stdout)
    again = CliRunner().invoke(app, ["validate", str(tmp_path / "again.yaml")])
    assert again.exit_code == 0, again.output
