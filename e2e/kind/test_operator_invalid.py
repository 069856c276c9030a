"""Bad input: the API server refuses what the schema can say; the chart's operator fails the rest clearly.

On the kind cluster, in namespaces enforcing PodSecurity ``restricted``.
"""

from __future__ import annotations

import subprocess

import pytest
import yaml

from e2e.helpers import wait_for
from e2e.operator_fixtures import example_manifest, get_job, job_events, wait_phase

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


def test_unsupported_backend_fails_the_job_naming_the_field(cluster, namespace, operator):
    # pathways is supported now; an accelerator it has no table row for takes the same path.
    manifest = example_manifest()
    manifest["spec"].update(backend="pathways")
    manifest["spec"]["slices"].update(accelerator="tpu-v9-imaginary", topology="2x2")
    assert _apply(cluster, namespace, manifest).returncode == 0
    job = wait_phase(cluster, namespace, "cpu-job", ("Failed",), timeout_s=60)
    failed = next(c for c in job["status"]["conditions"] if c["type"] == "Failed")
    assert failed["status"] == "True" and "spec.slices.accelerator 'tpu-v9-imaginary'" in failed["message"]
    # A permanent error: no retry loop, no children, the operator still alive.
    assert operator.alive()
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


def test_unappliable_spec_change_is_rejected_with_a_condition(cluster, namespace, operator):
    manifest = example_manifest()
    manifest["spec"]["suspend"] = True
    assert _apply(cluster, namespace, manifest).returncode == 0
    wait_phase(cluster, namespace, "cpu-job", ("Suspended",), timeout_s=60)
    manifest["spec"]["slices"]["count"] = 3
    assert _apply(cluster, namespace, manifest).returncode == 0

    def rejected():
        job = get_job(cluster, namespace, "cpu-job")
        return next((c for c in (job.get("status") or {}).get("conditions", [])
                     if c["type"] == "SpecChangeRejected" and c["status"] == "True"), None)
    cond = wait_for(rejected, timeout_s=60, what="SpecChangeRejected condition")
    assert cond["message"].startswith("spec.slices.count cannot change on an existing job")
    assert cond["observedGeneration"] == 2
    job = get_job(cluster, namespace, "cpu-job")
    assert job["status"]["desiredSlices"] == 2 and len(job["status"]["slices"]) == 2  # the applied spec stays
    assert any(e["reason"] == "SpecChangeRejected" for e in job_events(cluster, namespace, "cpu-job"))
