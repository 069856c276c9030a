"""One rule for bad input (issue 9): what the API server refuses in a pod is refused by `elastic-jax validate`
naming the field, by the CRD (CEL generated from the same constants; `e2e/test_bad_manifests.py` runs it
through a real API server), and, as a backstop, a child the API server finds invalid (422) fails the job
InvalidSpec and stops it instead of a CreateFailed retried forever."""

from __future__ import annotations

from fractions import Fraction

import kopf
import pytest
import yaml
from typer.testing import CliRunner

from elastic_jax import contract
from elastic_jax.api import crd, pod_rules, runtime_env
from elastic_jax.api.manifest import ManifestError, dump_yaml, go_yaml_scalar, parse_manifest, safe_load_bounded
from elastic_jax.cli import app
from elastic_jax.k8s_operator import handlers, incarnation, job_pass, operator_state
from elastic_jax.k8s_operator.admin_policies import AdminPolicies
from elastic_jax.api import tpu_shapes
from elastic_jax.k8s_operator.kube import ChildRefused
from elastic_jax.k8s_operator.slices import jobset_view, pod_view
from elastic_jax.api import labels as lbl
from tests.support.bad_manifests import ACCEPTED, BAD_NAMESPACE, CASES, YAML_TEXT, cpu_job, pathways_job
from tests.support.fake_kube import FakeKube as _Kube
from tests.unit.test_operator_handler_faults import _Patch


def _validate(tmp_path, manifest: dict) -> tuple[int, str]:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    result = CliRunner().invoke(app, ["validate", "--cluster", str(path)])
    return result.exit_code, result.output


@pytest.mark.parametrize("make", [cpu_job, pathways_job])
def test_the_base_manifests_pass(tmp_path, make):
    code, out = _validate(tmp_path, make())
    assert code == 0, out


@pytest.mark.parametrize("case_id,make,field", CASES, ids=[c[0] for c in CASES])
def test_validate_refuses_naming_the_field(tmp_path, case_id, make, field):
    code, out = _validate(tmp_path, make())
    assert code == 2, out
    assert field in out, out
    assert "Traceback" not in out


@pytest.mark.parametrize("case_id,make", ACCEPTED, ids=[c[0] for c in ACCEPTED])
def test_validate_accepts_what_the_api_server_accepts(tmp_path, case_id, make):
    code, out = _validate(tmp_path, make())
    assert code == 0, out


@pytest.mark.parametrize("case_id,text,field", YAML_TEXT, ids=[c[0] for c in YAML_TEXT])
def test_validate_reads_yaml_as_kubectl_does(tmp_path, case_id, text, field):
    """`steps: 1e3` is the number kubectl sends (PyYAML alone reads a string), `value: y` the boolean."""
    path = tmp_path / "job.yaml"
    path.write_text(text)
    result = CliRunner().invoke(app, ["validate", "--cluster", str(path)])
    if field is None:
        assert result.exit_code == 0, result.output
    else:
        assert result.exit_code == 2 and field in result.output, result.output


@pytest.mark.parametrize("text,value", [
    ("y", True), ("N", False), ("off", False), ("1e3", 1000.0), ("1.0e3", 1000.0), ("1E+3", 1000.0), (".5", 0.5),
    ("0o17", 15), ("017", 15), ("0x1F", 31), ("1_000", 1000), ("09", 9.0), ("1:30", "1:30"), ("=", "="),
    ("1e400", "1e400"), ("2001-12-14", "2001-12-14"), (str(2**64 - 1), 2**64 - 1), (str(2**64), float(2**64)),
    ("-" + str(2**63), -2**63), ("-" + str(2**63 + 1), -float(2**63 + 1)), ("~", None), ("yes", True), ("x", "x"),
])
def test_plain_scalars_resolve_as_go_yaml_v2_resolves_them(text, value):
    """The table of go.yaml.in/yaml/v2 resolve.go (kubectl's reader): bools, ints by strconv.ParseInt base 0,
    then ParseUint, then floats of `yamlStyleFloat` that do not overflow, else strings."""
    got = go_yaml_scalar(text)[1]
    assert got == value and type(got) is type(value)
    assert safe_load_bounded(f"v: {text}")["v"] == value


def test_the_manifest_yaml_written_back_reads_the_same_through_both_readers():
    """The operator's manifest ConfigMap and `validate`'s output quote a string kubectl (or PyYAML) would take
    for another type, so the controller reads the spec the operator digested."""
    data = {"env": [{"name": n, "value": v} for n, v in
                    (("A", "y"), ("B", "1e3"), ("C", "1:30"), ("D", "="), ("E", "017"), ("F", "yes"), ("G", "2.0"))],
            "n": 3, "x": 1.5, "t": True}
    text = dump_yaml(data)
    assert safe_load_bounded(text) == data == yaml.safe_load(text)


def test_a_whole_number_float_is_the_integer_but_trainer_config_is_kept_as_written():
    job = cpu_job()
    job["spec"]["training"]["steps"] = 10.0
    job["spec"]["controller"] = {"trainer": {"config": {"lr": 1.0}}}
    parsed = parse_manifest(job)
    assert parsed.spec.training.steps == 10 and isinstance(parsed.spec.training.steps, int)
    assert isinstance(parsed.spec.controller.trainer.config["lr"], float)


def test_the_crd_carries_the_toleration_and_progress_timeout_rules():
    schema = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    toleration_rules = schema["worker"]["properties"]["tolerations"]["items"]["x-kubernetes-validations"]
    assert [r["rule"] for r in pod_rules.TOLERATION_CEL_RULES] == [r["rule"] for r in toleration_rules]
    rules = schema["elasticity"]["x-kubernetes-validations"]
    assert any(r.get("fieldPath") == ".progressTimeoutSeconds" for r in rules), rules
    assert schema["training"]["properties"]["globalBatchSize"]["maximum"] == 2**20


def test_validate_refuses_a_namespace_the_api_server_refuses(tmp_path):
    job = cpu_job()
    job["metadata"]["namespace"] = BAD_NAMESPACE
    code, out = _validate(tmp_path, job)
    assert code == 2 and "metadata.namespace" in out, out


def test_quantities_compare_by_value():
    assert pod_rules.quantity_value("500m") == Fraction(1, 2)
    assert pod_rules.quantity_value("1Ki") == 1024
    assert pod_rules.quantity_value("1e3") == 1000
    assert pod_rules.quantity_value("1.5Gi") == 3 * 2**29
    # a request equal in value to its limit, written differently, is fine
    assert pod_rules.resources_problems({"cpu": "1000m", "memory": "1Gi"}, {"cpu": "1", "memory": "1073741824"},
                                        "spec.worker.resources") == []
    assert pod_rules.resources_problems({"example.com/gpu": "2"}, {"example.com/gpu": "2"}, "f") == []
    # hugepages with a size, kubernetes.io-prefixed names are native (no extended rules)
    assert pod_rules.resource_name_problem("hugepages-2Mi") is None
    assert pod_rules.resource_name_problem("hugepages-x") is not None


def test_every_reserved_env_name_is_in_the_crds_rule():
    rules = {r["fieldPath"]: r["rule"] for r in runtime_env.cel_rules()}
    for role in ("controller", "worker"):
        for backend in ("cpu", "pathways"):
            for name in runtime_env.operator_set(role, backend) - {n for n in runtime_env.operator_set(role, backend)
                                                                    if n.startswith(runtime_env.PREFIX)}:
                assert f"'{name}'" in rules[f".{role}.env"], (role, backend, name)
        for name in runtime_env.USER_SETTINGS:
            assert f"'{name}'" in rules[f".{role}.env"]


def test_the_crd_carries_the_tpu_table():
    spec = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    text = yaml.safe_dump(spec["x-kubernetes-validations"])
    for accelerator, gen in tpu_shapes.GENERATIONS.items():
        assert f"self.slices.accelerator != '{accelerator}'" in text
    # env lists are maps keyed by name: the API server refuses a name given twice
    env = spec["properties"]["worker"]["properties"]["env"]
    assert env["x-kubernetes-list-type"] == "map" and env["x-kubernetes-list-map-keys"] == ["name"]
    assert spec["properties"]["training"]["properties"]["steps"]["maximum"] == 2**63 - 1024


def test_the_operators_refusal_says_spec_once():
    body = cpu_job("j")
    body["metadata"].update(namespace="ns", uid="u1")
    body["spec"]["controller"] = {"env": [{"name": "POD_IP", "value": "x"}]}
    with pytest.raises(ManifestError) as e:
        job_pass.parse_job(body, AdminPolicies())
    assert str(e.value).startswith("spec.controller.env[0].name: POD_IP is set by the operator"), str(e.value)
    # the CLI keeps its file name as the first word
    with pytest.raises(ManifestError) as e:
        parse_manifest({**body, "metadata": {"name": "j"}}, "job.yaml")
    assert str(e.value).startswith("job.yaml: spec.controller.env[0].name:")


# -- the backstop: a child the API server finds invalid ---------------------------------------


INVALID = ('Pod "j-controller-0" is invalid: spec.containers[0].resources.requests: Invalid value: "2": '
           'must be less than or equal to cpu limit of 1')


class _RefusingKube(_Kube):
    """Refuses the controller pod as invalid (422), as the API server does for a spec it should not have taken."""

    def create(self, namespace, body):
        if body["kind"] == "Pod":
            raise ChildRefused("Pod", body["metadata"]["name"], 422, INVALID)
        return super().create(namespace, body)


def _body():
    spec = {"slices": {"count": 1}, "training": {"steps": 10, "globalBatchSize": 1}, "checkpoint": {"uri": "/data/ck"}}
    meta = {"name": "j", "namespace": "ns", "uid": "u1", "generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z"}
    return {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": meta, "spec": spec}


def test_a_child_refused_as_invalid_fails_the_job_and_stops_its_workers(monkeypatch):
    events = []
    monkeypatch.setattr(kopf, "event", lambda ref, type, reason, message: events.append((type, reason, message)))
    body = _body()
    kube = _RefusingKube()
    state = operator_state.OperatorState(kube=kube, key=b"k" * 32)
    labels = {lbl.JOB_NAME: "j", lbl.JOB_UID: "u1"}
    key = incarnation.index_key("ns", labels)
    jobsets = [jobset_view({"metadata": {"name": "j-slice-0", "labels": labels}}, 0)]
    status = {"phase": "Pending", "tokenSecret": "j-token"}
    for _ in range(3):
        patch = _Patch()
        job_pass.reconcile_pass(body=body, spec=body["spec"], status=status, meta=body["metadata"], namespace="ns",
                               name="j", patch=patch, memo={"elasticjax": state}, job_pods={},
                               job_jobsets={key: jobsets})
        status = {**status, **patch.status}
    assert status["phase"] == "Failed"
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["status"] == "True" and failed["reason"] == "InvalidSpec", failed
    assert "spec.containers[0].resources.requests" in failed["message"]
    assert "spec.containers[0].resources.requests" in status["failureReason"]
    assert "j-slice-0" in kube.deleted  # the workers are stopped
    invalid_events = [e for e in events if e[1] == "InvalidSpec"]
    assert len(invalid_events) == 1, events  # refused once, then the job is finished: no retry loop


def test_a_refusal_that_may_pass_later_is_not_terminal(monkeypatch):
    monkeypatch.setattr(kopf, "event", lambda *a, **k: None)

    class Forbidden(_Kube):
        def create(self, namespace, body):
            if body["kind"] == "Pod":
                raise ChildRefused("Pod", body["metadata"]["name"], 403, "exceeded quota")
            return super().create(namespace, body)

    body = _body()
    state = operator_state.OperatorState(kube=Forbidden(), key=b"k" * 32)
    patch = _Patch()
    job_pass.reconcile_pass(body=body, spec=body["spec"], status={"tokenSecret": "j-token"}, meta=body["metadata"],
                           namespace="ns", name="j", patch=patch, memo={"elasticjax": state}, job_pods={},
                           job_jobsets={})
    assert patch.status.get("phase") != "Failed"
    assert any(c["type"] == "CreateFailed" and c["status"] == "True" for c in patch.status["conditions"])


class _InvalidTemplateKube(_Kube):
    """The Job controller's FailedCreate Event for a pod template the API server finds invalid."""

    def job_uid_if_owned(self, namespace, name, jobset_uid):
        return "job-uid" if jobset_uid == "js-uid" else None  # the JobSet's own Job

    def warning_events(self, namespace, kind, name, uid=""):
        if kind == "Job" and uid == "job-uid":
            return [{"reason": "FailedCreate", "last": "2026-01-01T00:00:40Z",
                     "message": 'Error creating: Pod "j-slice-0-worker-0-0-x" is invalid: '
                                'spec.containers[0].resources.requests: Invalid value: "2": must be less than or '
                                'equal to cpu limit of 1'}]
        return []


def test_worker_pods_refused_as_invalid_fail_the_job(monkeypatch):
    events = []
    monkeypatch.setattr(kopf, "event", lambda ref, type, reason, message: events.append((type, reason, message)))
    body = _body()
    kube = _InvalidTemplateKube()
    state = operator_state.OperatorState(kube=kube, key=b"k" * 32)
    labels = {lbl.JOB_NAME: "j", lbl.JOB_UID: "u1"}
    key = incarnation.index_key("ns", labels)
    ctrl = pod_view({"metadata": {"name": "j-controller-0", "uid": "c0", "labels": {
        **labels, lbl.ROLE: lbl.ROLE_CONTROLLER, lbl.CONTROLLER_ATTEMPT: "0"}}, "status": {"phase": "Running"}})
    jobsets = [jobset_view({"metadata": {"name": "j-slice-0", "uid": "js-uid", "creationTimestamp": "2026-01-01T00:00:30Z",
                                         "labels": labels}}, 0)]
    status = {"phase": "Pending", "tokenSecret": "j-token", "controllerPod": "j-controller-0"}
    patch = _Patch()
    job_pass.reconcile_pass(body=body, spec=body["spec"], status=status, meta=body["metadata"], namespace="ns",
                           name="j", patch=patch, memo={"elasticjax": state}, job_pods={key: [ctrl]},
                           job_jobsets={key: jobsets})
    status = {**status, **patch.status}
    assert status["phase"] == "Failed"
    failed = next(c for c in status["conditions"] if c["type"] == "Failed")
    assert failed["reason"] == "InvalidSpec" and "is invalid" in failed["message"]
    assert {"j-slice-0", "j-controller-0"} <= set(kube.deleted)


def test_plain_validate_applies_the_tpu_table_as_the_crd_does(tmp_path):
    job = pathways_job()
    job["spec"]["slices"]["accelerator"] = "tpu-v9-slice"
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2 and "spec.slices.accelerator 'tpu-v9-slice'" in result.output, result.output


def test_validate_cluster_refuses_a_manifest_too_large_for_its_configmap(tmp_path):
    job = cpu_job()
    job["spec"]["controller"] = {"trainer": {"config": {"vocab": ["w" * 1000] * 1100}}}
    code, out = _validate(tmp_path, job)
    assert code == 2 and "spec.controller.trainer.config" in out and "1048576" in out, out
    job["spec"]["controller"]["trainer"]["config"]["vocab"] = ["w" * 1000] * 900
    assert _validate(tmp_path, job)[0] == 0


def test_the_configmap_size_limit_counts_the_configmap_the_operator_renders(monkeypatch):
    """`validate --cluster` (`api.size_limits`) measures the manifest the operator's ConfigMap holds
    (`children.manifest_configmap`): at exactly its bytes the limit holds, one byte less refuses it."""
    from elastic_jax.api import size_limits
    from elastic_jax.k8s_operator import children

    job = parse_manifest({**cpu_job(), "metadata": {"name": "j", "namespace": "ml"}})
    rendered = sum(len(v.encode()) for v in children.manifest_configmap(job)["data"].values())
    monkeypatch.setattr(size_limits, "CONFIGMAP_MAX_BYTES", rendered)
    assert size_limits.manifest_size_problem(job) is None
    monkeypatch.setattr(size_limits, "CONFIGMAP_MAX_BYTES", rendered - 1)
    assert f"the manifest is {rendered} bytes" in size_limits.manifest_size_problem(job)


def test_validate_cluster_warns_that_plain_kubectl_apply_cannot_copy_a_large_job(tmp_path):
    """Over ~252 KiB as JSON, kubectl's last-applied copy (all annotations: 262144 bytes) cannot be stored:
    a warning naming `--server-side`, not an error (that and `kubectl create` take it, up to 1 MiB)."""
    job = cpu_job()
    job["spec"]["controller"] = {"trainer": {"config": {"vocab": ["w" * 1000] * 300}}}
    code, out = _validate(tmp_path, job)
    assert code == 0 and "warning:" in out and "last-applied-configuration" in out and "--server-side" in out, out
    job["spec"]["controller"]["trainer"]["config"]["vocab"] = ["w" * 1000] * 200
    code, out = _validate(tmp_path, job)
    assert code == 0 and "warning:" not in out, out


def test_an_empty_trainer_config_with_a_command_passes_the_operators_read_back():
    """The CRD refuses `trainer: {config: {}}` with a command as written (so `validate` does), but the
    operator's manifest ConfigMap writes every default back, `config: {}` included, and must read again."""
    job = cpu_job()
    job["spec"]["controller"] = {"command": ["python"], "trainer": {"config": {}}}
    with pytest.raises(ManifestError, match="spec.controller.trainer"):
        parse_manifest(job, as_written=True)
    written_back = parse_manifest(job).to_manifest()
    assert written_back["spec"]["controller"]["trainer"]["config"] == {}
    assert parse_manifest(written_back).spec.controller.command == ["python"]


def test_a_null_is_an_absent_field_outside_the_trainer_config():
    job = cpu_job()
    job["spec"]["controller"] = {"image": None, "trainer": {"config": {"keep": None}}}
    parsed = parse_manifest(job, as_written=True)
    assert parsed.spec.controller.image == crd.job_api.DEFAULT_CONTROLLER_IMAGE
    assert parsed.spec.controller.trainer.config == {"keep": None}


def test_validate_warns_that_a_suspend_drops_local_checkpoints(tmp_path):
    job = cpu_job()
    job["spec"]["suspend"] = True
    code, out = _validate(tmp_path, job)
    assert code == 0, out
    assert "warning: spec.suspend: true" in out and "go with the pod" in out and "step 0" in out, out
    job["spec"]["checkpoint"]["uri"] = "gs://bucket/ck"
    code, out = _validate(tmp_path, job)
    assert code == 0 and "warning" not in out, out


def test_validate_names_the_refused_env_entry(tmp_path):
    """`validate` names the entry (`spec.<role>.env[i].name`) and why; the API server names the list
    (`spec.<role>.env`): a CEL messageExpression that finds the index is over the API server's cost budget
    (it refused the CRD), so e2e/test_bad_manifests.py checks the list's name on both sides."""
    for role, entries, expected in (
            ("controller", [{"name": "POD_IP", "value": "1"}],
             "spec.controller.env[0].name: POD_IP is set by the operator in the cpu controller container"),
            ("worker", [{"name": "A", "value": "1"}, {"name": contract.ENV_TOKEN_FILE, "value": "/x"}],
             f"spec.worker.env[1].name: {contract.ENV_TOKEN_FILE} is set by elastic-jax itself")):
        job = cpu_job()
        job["spec"][role] = {"env": entries}
        code, out = _validate(tmp_path, job)
        assert code == 2 and expected in out, out
    assert all("messageExpression" not in r for r in runtime_env.cel_rules())


def test_one_refusal_posts_one_invalid_spec_event_whichever_handler_sees_it_first(monkeypatch):
    """Session 10's trial: one refusal of `spec.compilationCache` posted two identical InvalidSpec Events (the
    create handler and the job's first reconcile pass run side by side, both before the Failed status is
    back). Each cause is posted once per job; another job, or another cause, gets its own."""
    events = []
    monkeypatch.setattr(kopf, "event", lambda ref, type, reason, message: events.append((ref["metadata"]["uid"],
                                                                                         reason, message)))
    state = operator_state.OperatorState(kube=_Kube(), key=b"k" * 32)

    def refused(uid):
        body = _body()
        body["metadata"]["uid"] = uid
        body["spec"]["compilationCache"] = {"persistentVolumeClaim": {"claimName": "xla"}}  # not on the admin's list
        return body

    def both_paths(body):
        with pytest.raises(kopf.PermanentError, match="spec.compilationCache"):
            handlers.job_created(body=body, spec=body["spec"], status={}, meta=body["metadata"], patch=_Patch(),
                                 memo={"elasticjax": state})
        for _ in range(2):  # the status the passes read is not Failed yet
            job_pass.reconcile_pass(body=body, spec=body["spec"], status={}, meta=body["metadata"], namespace="ns",
                                   name="j", patch=_Patch(), memo={"elasticjax": state}, job_pods={}, job_jobsets={})

    both_paths(refused("uid-once-a"))
    invalid = [e for e in events if e[1] == "InvalidSpec"]
    assert len(invalid) == 1 and "spec.compilationCache" in invalid[0][2], events
    both_paths(refused("uid-once-b"))  # a new job of the same name: its own Event
    assert [e[0] for e in events if e[1] == "InvalidSpec"] == ["uid-once-a", "uid-once-b"], events
