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


def test_run_refuses_fresh_and_validate_refuses_trainer_in_library_mode(tmp_path):
    path = tmp_path / "job.yaml"
    manifest = _with_controller(cpu_job, command=["python", "x.py"])
    manifest["spec"]["checkpoint"] = {"uri": str(tmp_path / "ck")}
    path.write_text(yaml.safe_dump(manifest))
    result = CliRunner().invoke(app, ["run", str(path), "--fresh", "--workdir", str(tmp_path / "run")])
    assert result.exit_code == 2 and "--fresh" in result.output and "Traceback" not in result.output
    # It says where the checkpoints to delete are ("delete them yourself" named no place).
    assert f"spec.checkpoint.uri ({tmp_path / 'ck'}:" in result.output, result.output
    manifest["spec"]["checkpoint"] = {"uri": "ck"}  # relative: also the folder it is from here
    path.write_text(yaml.safe_dump(manifest))
    result = CliRunner().invoke(app, ["run", str(path), "--fresh", "--workdir", str(tmp_path / "run")])
    assert result.exit_code == 2 and f"(ck, i.e. {Path.cwd() / 'ck'}:" in result.output, result.output
    result = CliRunner().invoke(app, ["validate", "--trainer", str(path)])
    assert result.exit_code == 2 and "--trainer" in result.output and "Traceback" not in result.output
