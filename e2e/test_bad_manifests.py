"""One rule for bad input (issue 9): every manifest of `tests/support/bad_manifests.py` is refused both by
`elastic-jax validate --cluster` and by a real API server with the generated CRD (server-side dry run, so
nothing is created), each refusal naming the same field; the base manifests pass both.

A manifest the API server refused only when the operator created a pod from it used to leave the job
`CreateFailed` forever while its workers ran.
"""

from __future__ import annotations

import json
import uuid

import pytest
import yaml
from typer.testing import CliRunner

from e2e.helpers import create_namespace
from e2e.nodeagent.kubeapi import ApiError
from e2e.operator_fixtures import ejob_crd  # noqa: F401  (fixture)
from elastic_jax.cli import app
from tests.support.bad_manifests import ACCEPTED, BAD_NAMESPACE, CASES, YAML_TEXT, cpu_job, pathways_job


@pytest.fixture(scope="module")
def dry_ns(cluster):
    """One namespace for every dry run of the module: a dry run creates nothing, so items cannot meet in it
    (a namespace per item cost ~0.4 s each to create and delete, 127 times). A test that creates for real
    takes the per-test `namespace`."""
    name = create_namespace(cluster, f"e2e-dry-{uuid.uuid4().hex[:8]}")
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _validate(tmp_path, manifest: dict):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return CliRunner().invoke(app, ["validate", "--cluster", str(path)])


def _dry_run_create(cluster, namespace: str, manifest: dict) -> dict:
    """POSTs the manifest as JSON (exact integers, as kubectl sends it) with dryRun=All.

    Raises:
      ApiError: the API server refused it.
    """
    path = f"/apis/elasticjax.dev/v1alpha1/namespaces/{namespace}/elastictrainingjobs"
    return cluster.api().request("POST", path, manifest, query={"dryRun": "All"})


@pytest.mark.parametrize("make", [cpu_job, pathways_job], ids=["cpu", "pathways"])
def test_the_base_manifests_pass_both(cluster, dry_ns, ejob_crd, tmp_path, make):  # noqa: F811
    assert _validate(tmp_path, make()).exit_code == 0
    created = _dry_run_create(cluster, dry_ns, make())
    assert created["metadata"]["name"] == "bad"


@pytest.mark.parametrize("case_id,make", ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_validate_and_the_api_server_accept_the_same_edge_cases(cluster, dry_ns, ejob_crd, tmp_path,  # noqa: F811
                                                                 case_id, make):
    """Through kubectl, as a user applies them (its YAML-to-JSON writes a whole-number float as an integer),
    and as JSON a client sends itself (`10.0` stays a float there): accepted however they are sent."""
    result = _validate(tmp_path, make())
    assert result.exit_code == 0, result.output
    proc = cluster.kubectl("apply", "--dry-run=server", "-o", "json", "-n", dry_ns, "-f", "-",
                           input=yaml.safe_dump(make()), check=False)
    assert proc.returncode == 0, proc.stderr
    _dry_run_create(cluster, dry_ns, make())


@pytest.mark.parametrize("case_id,text,field", YAML_TEXT, ids=[c[0] for c in YAML_TEXT])
def test_validate_and_kubectl_read_the_same_yaml(cluster, dry_ns, ejob_crd, tmp_path,  # noqa: F811
                                                 case_id, text, field):
    """YAML text as written: `steps: 1e3` is a number for both, `value: y` a boolean refused by both."""
    path = tmp_path / "job.yaml"
    path.write_text(text)
    result = CliRunner().invoke(app, ["validate", "--cluster", str(path)])
    proc = cluster.kubectl("apply", "--dry-run=server", "-n", dry_ns, "-f", "-", input=text, check=False)
    if field is None:
        assert result.exit_code == 0, result.output
        assert proc.returncode == 0, proc.stderr
    else:
        assert result.exit_code == 2 and field in result.output, result.output
        assert proc.returncode != 0 and field in proc.stderr, proc.stderr


def test_kubectl_apply_takes_steps_10_0_as_10(cluster, dry_ns, ejob_crd):  # noqa: F811
    """YAML's `10.0`, through kubectl: stored as the integer, as `validate` reads it."""
    text = yaml.safe_dump(cpu_job("whole")).replace("steps: 10", "steps: 10.0")
    assert "steps: 10.0" in text
    proc = cluster.kubectl("apply", "--dry-run=server", "-o", "json", "-n", dry_ns, "-f", "-", input=text)
    steps = json.loads(proc.stdout)["spec"]["training"]["steps"]
    assert steps == 10 and isinstance(steps, int), proc.stdout


@pytest.mark.parametrize("case_id,make,field", CASES, ids=[c[0] for c in CASES])
def test_validate_and_the_api_server_refuse_naming_the_same_field(cluster, dry_ns, ejob_crd, tmp_path,  # noqa: F811
                                                                   case_id, make, field):
    result = _validate(tmp_path, make())
    assert result.exit_code == 2 and field in result.output, result.output
    with pytest.raises(ApiError) as refused:
        _dry_run_create(cluster, dry_ns, make())
    assert refused.value.status == 422, refused.value.body
    assert field in refused.value.body["message"], refused.value.body["message"]
    # Where the API server puts it (kubectl prints it first: "spec.checkpoint.uri: Invalid value"): at the field
    # or inside it, never at an object above it (`spec`, or `<nil>` for a rule on the root: the CEL `fieldPath`).
    at = [c.get("field", "") for c in refused.value.body.get("details", {}).get("causes", [])]
    assert any(f.startswith(field) or (field.startswith(f) and f not in ("spec", "metadata")) for f in at if f), \
        (at, refused.value.body["message"])


def test_kubectl_apply_refuses_a_request_above_its_limit(cluster, dry_ns, ejob_crd):  # noqa: F811
    """What a user sees: `kubectl apply` of a worker request above its limit fails, naming the field."""
    manifest = cpu_job("over")
    manifest["spec"]["worker"] = {"resources": {"requests": {"cpu": 2}, "limits": {"cpu": "1"}}}
    proc = cluster.kubectl("apply", "--dry-run=server", "-n", dry_ns, "-f", "-", input=yaml.safe_dump(manifest),
                           check=False)
    assert proc.returncode != 0
    assert "spec.worker.resources.requests" in proc.stderr, proc.stderr


def test_an_edit_the_operator_cannot_apply_is_refused_at_apply_naming_the_field(cluster, namespace,  # noqa: F811
                                                                               ejob_crd):
    """Issue 11 (status truth): edits of `slices.count`, `training.steps` and `checkpoint.uri` were accepted and
    only flagged afterwards; the CRD's transition rules refuse them at apply (shown on kind too, with the
    operator: `e2e/kind/test_operator_invalid.py`). A suspend stays an edit the API server takes."""
    manifest = cpu_job("immutable")
    manifest["spec"]["suspend"] = True
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest))
    for field, edit in (("spec.slices.count", lambda s: s["slices"].update(count=s["slices"]["count"] + 1)),
                        ("spec.training.steps", lambda s: s["training"].update(steps=s["training"]["steps"] + 1)),
                        ("spec.checkpoint.uri", lambda s: s["checkpoint"].update(uri="/data/other"))):
        changed = yaml.safe_load(yaml.safe_dump(manifest))
        edit(changed["spec"])
        proc = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-",
                               input=yaml.safe_dump(changed), check=False)
        assert proc.returncode != 0 and field in proc.stderr and "is immutable" in proc.stderr, (field, proc.stderr)
    manifest["spec"]["suspend"] = False
    proc = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest),
                           check=False)
    assert proc.returncode == 0, proc.stderr


def test_a_bad_namespace_is_refused_by_both(cluster, ejob_crd, tmp_path):  # noqa: F811
    manifest = cpu_job()
    manifest["metadata"]["namespace"] = BAD_NAMESPACE
    result = _validate(tmp_path, manifest)
    assert result.exit_code == 2 and "metadata.namespace" in result.output, result.output
    with pytest.raises(ApiError) as refused:
        _dry_run_create(cluster, BAD_NAMESPACE.replace(" ", "%20"), manifest)
    assert refused.value.status >= 400, refused.value.body


@pytest.mark.parametrize("make,uri,faults", [
    (cpu_job, "/", 1), (cpu_job, "~", 1), (cpu_job, "/data/../ck", 1), (cpu_job, " /data/ck", 1),
    (pathways_job, "gs://UPPER_bad/ck", 1), (pathways_job, "gs://b//ck", 2), (pathways_job, "gs://ab.", 1),
], ids=["root", "home", "dot-dot", "white-space", "uppercase", "short-and-empty-segment", "trailing-dot"])
def test_validate_and_the_api_server_say_each_uri_fault_once(cluster, dry_ns, ejob_crd, tmp_path,  # noqa: F811
                                                              make, uri, faults):
    """Issue 11: `validate --cluster` said the fault of `/` twice (the uri table's line, then the cluster's
    generic local-path line), and so did the CRD's CEL; now both say the same lines, one a fault."""
    manifest = make()
    manifest["spec"]["checkpoint"]["uri"] = uri
    result = _validate(tmp_path, manifest)
    ours = [ln.split(": ", 2)[-1] for ln in result.output.splitlines()
            if ln.startswith("error: ") and ": spec.checkpoint.uri" in ln]
    with pytest.raises(ApiError) as refused:
        _dry_run_create(cluster, dry_ns, manifest)
    causes = [c for c in refused.value.body.get("details", {}).get("causes", [])
              if c.get("field") == "spec.checkpoint.uri"]
    assert len(ours) == len(causes) == faults, (ours, causes)
    assert len({c["message"] for c in causes}) == len(causes), causes
