"""Bad input: the API server refuses what the schema can say; the chart's operator fails the rest clearly.

On the kind cluster, in namespaces enforcing PodSecurity ``restricted``.
"""

from __future__ import annotations

import subprocess

import pytest
import yaml

from e2e.operator_fixtures import example_manifest, get_job, wait_phase

# The first test of a session also pays for what its fixtures build (images, node
# image, cluster, chart: up to ~30 min on a fresh machine under load).
pytestmark = pytest.mark.timeout(3600)


def _apply(cluster, namespace, manifest) -> subprocess.CompletedProcess:
    return cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest), check=False)


@pytest.mark.parametrize("edit, message", [
    (lambda s: s["slices"].update(minSlices=3), "spec.slices.minSlices must not exceed spec.slices.count"),
    (lambda s: s["slices"].update(count=0), "spec.slices.count: Invalid value: 0"),
    (lambda s: s.update(backend="gpu"), 'spec.backend: Unsupported value: "gpu"'),
    (lambda s: s["slices"].update(cuont=2), 'unknown field "spec.slices.cuont"'),
    (lambda s: s["controller"]["trainer"].update(entryPoint="nocolon"), "spec.controller.trainer.entryPoint"),
    (lambda s: s.update(backend="pathways"), "backend pathways needs spec.slices.accelerator and spec.slices.topology"),
    # The same type rules `elastic-jax validate` applies (tests/unit/test_manifest.py).
    (lambda s: s["training"].update(steps="10"), "spec.training.steps: Invalid value"),
    (lambda s: s.setdefault("worker", {}).update(resources={"limits": {"memory": "4GB"}}), "spec.worker.resources.limits.memory"),
])
def test_invalid_manifest_is_rejected_by_the_api_server(cluster, namespace, ejob_crd, edit, message):
    manifest = example_manifest()
    edit(manifest["spec"])
    result = _apply(cluster, namespace, manifest)
    assert result.returncode != 0
    assert message in result.stderr, result.stderr
    assert cluster.kubectl("get", "ejob", "-n", namespace, "-o", "name").stdout.strip() == ""


def test_int_quantities_are_accepted_as_in_a_pod(cluster, namespace, ejob_crd):
    """`cpu: 1` (an int), as users write it in Pod specs, passes the API server as it passes the local check."""
    manifest = example_manifest()
    manifest["spec"]["suspend"] = True  # nothing needs to run for this
    manifest["spec"]["worker"] = {"resources": {"requests": {"cpu": 1, "memory": "256Mi"}}}
    result = _apply(cluster, namespace, manifest)
    assert result.returncode == 0, result.stderr
    stored = get_job(cluster, namespace, manifest["metadata"]["name"])
    assert stored["spec"]["worker"]["resources"]["requests"] == {"cpu": 1, "memory": "256Mi"}


def test_backend_is_immutable(cluster, namespace, ejob_crd):
    manifest = example_manifest()
    manifest["spec"]["suspend"] = True  # nothing needs to run for this
    assert _apply(cluster, namespace, manifest).returncode == 0
    manifest["spec"].update(backend="pathways")
    manifest["spec"]["slices"].update(accelerator="tpu-v5-lite-podslice", topology="2x2")
    result = _apply(cluster, namespace, manifest)
    assert result.returncode != 0 and "spec.backend is immutable" in result.stderr, result.stderr


def test_an_unknown_tpu_is_refused_at_apply_naming_the_field(cluster, namespace, ejob_crd):
    # The CRD carries the operator's TPU table as CEL (issue 9: validate, the CRD and the operator agree),
    # so an accelerator it has no row for never reaches the operator.
    manifest = example_manifest()
    manifest["spec"].update(backend="pathways")
    manifest["spec"]["slices"].update(accelerator="tpu-v9-imaginary", topology="2x2")
    manifest["spec"]["checkpoint"]["uri"] = "gs://elastic-jax-e2e/never-written"
    proc = _apply(cluster, namespace, manifest)
    assert proc.returncode != 0 and "spec.slices.accelerator" in proc.stderr, proc.stderr
    assert cluster.api().get(f"/api/v1/namespaces/{namespace}/pods")["items"] == []


def test_bad_trainer_config_reaches_the_job_status(cluster, namespace, operator):
    """What only the controller can check (the trainer config) is in the job's Failed condition, not
    just in the controller's log: the pod's FallbackToLogsOnError termination message carries it."""
    manifest = example_manifest()
    manifest["spec"]["controller"]["trainer"]["config"]["dModle"] = 64
    assert _apply(cluster, namespace, manifest).returncode == 0
    job = wait_phase(cluster, namespace, "cpu-job", ("Failed",), timeout_s=180)
    failed = next(c for c in job["status"]["conditions"] if c["type"] == "Failed")
    assert "spec.controller.trainer.config.dModle" in failed["message"], failed


def test_edit_of_an_immutable_field_is_refused_at_apply_naming_it_and_suspend_stays_editable(cluster, namespace,
                                                                                                 ejob_crd):
    """The API server refuses what the operator cannot apply to an existing job (CEL transition rules), so the
    printer column never shows a slice count the job does not have; suspend is still an edit it takes."""
    manifest = example_manifest()
    manifest["spec"]["suspend"] = True  # nothing needs to run for this
    assert _apply(cluster, namespace, manifest).returncode == 0
    for path, edit in (("spec.slices.count", lambda s: s["slices"].update(count=3)),
                       ("spec.training.steps", lambda s: s["training"].update(steps=7)),
                       ("spec.checkpoint.uri", lambda s: s["checkpoint"].update(uri="/data/other")),
                       ("spec.controller.trainer.config", lambda s: s["controller"]["trainer"]["config"].update(x=1)),
                       ("spec.elasticity", lambda s: s.update(elasticity={"maxRestarts": 3}))):
        changed = yaml.safe_load(yaml.safe_dump(manifest))
        edit(changed["spec"])
        result = _apply(cluster, namespace, changed)
        assert result.returncode != 0 and f"{path}" in result.stderr and "is immutable" in result.stderr, \
            (path, result.stderr)
    stored = get_job(cluster, namespace, "cpu-job")
    assert stored["spec"]["slices"]["count"] == 2 and stored["metadata"]["generation"] == 1
    manifest["spec"]["suspend"] = False
    manifest["spec"]["ttlSecondsAfterFinished"] = 600
    result = _apply(cluster, namespace, manifest)
    assert result.returncode == 0, result.stderr
    stored = get_job(cluster, namespace, "cpu-job")
    assert stored["spec"]["suspend"] is False and stored["spec"]["ttlSecondsAfterFinished"] == 600


@pytest.mark.parametrize("uri, message", [
    ("runs/ck", "must be an absolute folder"),
    ("/etc/elastic-jax/token", "must not overlap /etc/elastic-jax/token"),
    ("/tmp/elastic-jax-scratch", "must not overlap /tmp/elastic-jax-scratch"),
    ("/usr/ck", "must not be inside"),
])
def test_cluster_rules_refused_at_apply_as_validate_cluster_refuses_them(cluster, namespace, ejob_crd, tmp_path,
                                                                        uri, message):
    """What the operator used to refuse seconds after apply is the API server's refusal now, with the message
    `elastic-jax validate --cluster` prints for the same manifest (one definition: elastic_jax.api.cluster)."""
    import shutil
    import sys
    from pathlib import Path

    manifest = example_manifest()
    manifest["spec"]["checkpoint"]["uri"] = uri
    result = _apply(cluster, namespace, manifest)
    assert result.returncode != 0, result.stdout
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    cli = shutil.which("elastic-jax", path=str(Path(sys.executable).parent))
    validate = subprocess.run([cli, "validate", "--cluster", str(path)], capture_output=True, text=True, timeout=120)
    assert validate.returncode == 2, validate.stdout
    # (every line of validate names the file first; the API server's lines do not)
    lines = [ln.removeprefix("error: ").removeprefix(f"{path}: ") for ln in validate.stderr.splitlines()]
    assert any(message in ln for ln in lines), lines
    for line in lines:  # each of validate's errors is one of the API server's
        assert line in result.stderr, (line, result.stderr)
    assert cluster.kubectl("get", "ejob", "-n", namespace, "-o", "name").stdout.strip() == ""
