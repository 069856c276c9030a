"""A backend cpu job stays off TPU nodes (issue 31, RISK 8; `elastic_jax/api/tpu_placement.py`): the rule alone,
table-driven, then through `elastic-jax validate` and the operator's job handler (condition + Event, nothing
created). The same cases go through a real API server with the generated CRD in `e2e/test_bad_manifests.py`
(`tests/support/bad_manifests.py`)."""

from __future__ import annotations

import pytest
import yaml
from typer.testing import CliRunner

from elastic_jax.api import crd, tpu_placement
from elastic_jax.api.manifest import ManifestError, parse_manifest
from elastic_jax.cli import app
from tests.support.bad_manifests import cpu_job, pathways_job
from tests.support.operator_refusal import refused_at_create

TPU_TOLERATION = {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}


def _with(make, role: str, **fields):
    job = make()
    job["spec"].setdefault(role, {}).update(fields)
    return job


# (role, the role's fields, the start of the one line naming the field)
REFUSED = [
    ("worker", {"tolerations": [TPU_TOLERATION]}, "spec.worker.tolerations[0]: tolerates the TPU taint"),
    ("controller", {"tolerations": [{"key": "spot", "operator": "Exists"}, {"key": "google.com/tpu", "value": "present"}]},
     "spec.controller.tolerations[1]: tolerates the TPU taint"),
    ("worker", {"tolerations": [{"key": "google.com/tpu", "operator": "Exists", "effect": "NoExecute"}]},
     "spec.worker.tolerations[0]: tolerates the TPU taint"),
    ("worker", {"tolerations": [{"operator": "Exists"}]}, "spec.worker.tolerations[0]: a key-less Exists toleration"),
    ("controller", {"tolerations": [{"operator": "Exists", "effect": "NoSchedule"}]},
     "spec.controller.tolerations[0]: a key-less Exists toleration of effect NoSchedule"),
    ("worker", {"nodeSelector": {"cloud.google.com/gke-tpu-accelerator": "tpu-v5-lite-podslice"}},
     "spec.worker.nodeSelector['cloud.google.com/gke-tpu-accelerator']: selects TPU nodes"),
    ("controller", {"nodeSelector": {"pool": "a", "cloud.google.com/gke-tpu-topology": "2x2"}},
     "spec.controller.nodeSelector['cloud.google.com/gke-tpu-topology']: selects TPU nodes"),
    ("worker", {"resources": {"requests": {"google.com/tpu": 4}, "limits": {"google.com/tpu": 4}}},
     "spec.worker.resources.requests['google.com/tpu']: asks for TPU chips"),
    ("controller", {"resources": {"limits": {"google.com/tpu": "1"}}},
     "spec.controller.resources.limits['google.com/tpu']: asks for TPU chips"),
    ("worker", {"resources": {"limits": {"cloud-tpus.google.com/v3": 8}}},
     "spec.worker.resources.limits['cloud-tpus.google.com/v3']: asks for TPU chips"),
]

ACCEPTED = [
    ("worker", {"tolerations": [{"operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}]}),
    ("worker", {"tolerations": [{"operator": "Exists", "effect": "PreferNoSchedule"}]}),
    ("controller", {"tolerations": [{"key": "spot", "operator": "Exists"}]}),
    ("worker", {"nodeSelector": {"cloud.google.com/gke-nodepool": "cpu-pool", "cloud.google.com/machine-family": "c3"}}),
    ("worker", {"resources": {"limits": {"cpu": 2, "example.com/gpu": 1}, "requests": {"example.com/gpu": 1}}}),
]


@pytest.mark.parametrize("role, fields, line", REFUSED, ids=[r[2][:60] for r in REFUSED])
def test_a_cpu_job_is_refused_each_tpu_field_by_name(role, fields, line):
    with pytest.raises(ManifestError) as info:
        parse_manifest(_with(cpu_job, role, **fields), "")
    assert any(p.startswith(line) for p in info.value.problems), info.value.problems
    assert all("backend cpu runs on CPU nodes" in p for p in info.value.problems if "TPU" in p)


@pytest.mark.parametrize("role, fields", ACCEPTED, ids=[str(a[1])[:60] for a in ACCEPTED])
def test_what_cannot_reach_a_tpu_node_is_accepted(role, fields):
    parse_manifest(_with(cpu_job, role, **fields), "")


def test_every_problem_is_listed_at_once_and_pathways_keeps_its_tpu_fields():
    cpu = _with(cpu_job, "worker", tolerations=[TPU_TOLERATION],
                nodeSelector={"cloud.google.com/gke-tpu-accelerator": "x"}, resources={"limits": {"google.com/tpu": 4}})
    with pytest.raises(ManifestError) as info:
        parse_manifest(cpu, "")
    assert [p.split(":")[0] for p in info.value.problems] == [
        "spec.worker.tolerations[0]", "spec.worker.nodeSelector['cloud.google.com/gke-tpu-accelerator']",
        "spec.worker.resources.limits['google.com/tpu']"]
    parse_manifest(_with(pathways_job, "worker", tolerations=[TPU_TOLERATION]))
    assert tpu_placement.problems(parse_manifest(pathways_job()).spec) == []


def test_the_crd_carries_each_rule_for_each_role():
    rules = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "x-kubernetes-validations"]
    paths = {r["fieldPath"] for r in rules if "backend cpu job" in r["message"]}
    assert paths == {f".{role}.{f}" for role in ("controller", "worker")
                     for f in ("tolerations", "nodeSelector", "resources.requests", "resources.limits")}


def test_validate_refuses_it_in_one_line_naming_the_field(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(_with(cpu_job, "worker", tolerations=[TPU_TOLERATION])))
    result = CliRunner().invoke(app, ["validate", "--cluster", str(path)])
    assert result.exit_code == 2, result.output
    assert "spec.worker.tolerations[0]: tolerates the TPU taint google.com/tpu" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("command", ["validate", "run"])
def test_a_tpu_slice_shape_on_a_cpu_job_is_refused_by_validate_and_run(tmp_path, command):
    job = cpu_job()
    job["spec"]["slices"].update(accelerator="tpu-v5-lite-podslice", topology="2x4")
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    result = CliRunner().invoke(app, [command, str(path), *(["--workdir", str(tmp_path / "w")] if command == "run" else [])])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.output.splitlines() if ln.startswith("error:")]
    assert [ln.split(": ")[2] for ln in lines] == ["spec.slices.accelerator", "spec.slices.topology"], result.output
    assert all("backend cpu runs CPU worker processes" in ln for ln in lines)
    assert "Traceback" not in result.output and not (tmp_path / "w").exists()


def test_the_crd_refuses_a_tpu_slice_shape_on_a_cpu_job():
    rules = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "x-kubernetes-validations"]
    for name in ("accelerator", "topology"):
        [rule] = [r for r in rules if r["rule"] == f"self.backend != 'cpu' || !has(self.slices.{name})"]
        assert rule["fieldPath"] == f".slices.{name}" and rule["message"].startswith(f"spec.slices.{name}: ")


def test_the_operator_fails_the_job_with_a_condition_and_an_event(monkeypatch):
    body = _with(cpu_job, "controller", resources={"limits": {"google.com/tpu": "4"}, "requests": {"google.com/tpu": "4"}})
    body["metadata"].update(namespace="ml", uid="u-tpu")
    status, cond, events = refused_at_create(monkeypatch, body, r"spec\.controller\.resources\.requests")
    assert status["phase"] == "Failed" and cond["reason"] == "InvalidSpec"
    assert "spec.controller.resources.limits['google.com/tpu']: asks for TPU chips" in cond["message"]
    assert events == [("Warning", "InvalidSpec", cond["message"])]
