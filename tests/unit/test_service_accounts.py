"""spec.controller.serviceAccountName: only accounts the cluster admin allowed (operator/k8s_operator/service_accounts.py)."""

from __future__ import annotations

import pytest

from elastic_jax.api.manifest import parse_manifest
from elastic_jax.k8s_operator import handlers, job_pass, operator_state
from elastic_jax.k8s_operator.admin_policies import AdminPolicies
from elastic_jax.k8s_operator.backends import UnsupportedBackend, renderer_for
from elastic_jax.k8s_operator.service_accounts import ServiceAccountPolicy, ServiceAccountRefused
from elastic_jax.k8s_operator.allow_lists import parse_namespaced
from tests.unit.test_pod_fields import assert_names_the_operator_flag


def _body(namespace="ml", **controller):
    return {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob",
            "metadata": {"name": "sa-job", "namespace": namespace},
            "spec": {"slices": {"count": 1}, "training": {"steps": 2, "globalBatchSize": 1},
                     "checkpoint": {"uri": "gs://test-bucket/p"}, "controller": controller}}


def _job(namespace="ml", **controller):
    return parse_manifest(_body(namespace, **controller))


POLICY = ServiceAccountPolicy(allowed=parse_namespaced("ml/trainer", any_name=False),
                              token_allowed=parse_namespaced("ml/api-user", any_name=False))
POLICIES = AdminPolicies(service_accounts=POLICY)


def test_no_service_account_is_always_fine_and_gets_no_token():
    ServiceAccountPolicy().check(_job(), "ml")
    pod = renderer_for("cpu").controller_pod(_job(), 0)
    assert pod["spec"]["automountServiceAccountToken"] is False and "serviceAccountName" not in pod["spec"]


def test_an_allowed_account_is_rendered_without_a_token():
    job = _job(serviceAccountName="trainer")
    POLICY.check(job, "ml")
    spec = renderer_for("cpu").controller_pod(job, 0)["spec"]
    assert spec["serviceAccountName"] == "trainer" and spec["automountServiceAccountToken"] is False


def test_a_token_only_when_asked_and_allowed():
    job = _job(serviceAccountName="api-user", automountServiceAccountToken=True)
    POLICY.check(job, "ml")
    assert renderer_for("cpu").controller_pod(job, 0)["spec"]["automountServiceAccountToken"] is True


@pytest.mark.parametrize(("namespace", "controller", "message"), [
    # Not listed at all.
    ("ml", {"serviceAccountName": "default"}, "spec.controller.serviceAccountName 'default' is not allowed in namespace ml"),
    # Listed, but for another namespace: an allow entry is per namespace.
    ("other", {"serviceAccountName": "trainer"}, "spec.controller.serviceAccountName 'trainer' is not allowed in namespace other"),
    # Allowed to run as, not to mount the token of.
    ("ml", {"serviceAccountName": "trainer", "automountServiceAccountToken": True},
     "spec.controller.automountServiceAccountToken: the token of ServiceAccount ml/trainer may not be mounted"),
])
def test_anything_the_admin_did_not_allow_is_refused_naming_the_field(namespace, controller, message):
    with pytest.raises(ServiceAccountRefused) as info:
        POLICY.check(_job(namespace, **controller), namespace)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert_names_the_operator_flag(str(info.value))


def test_the_operator_fails_the_job_through_parse_job():
    assert job_pass.parse_job(_body(serviceAccountName="trainer"),
                              POLICIES).spec.controller.service_account_name == "trainer"
    with pytest.raises(UnsupportedBackend, match="spec.controller.serviceAccountName 'admin' is not allowed"):
        job_pass.parse_job(_body(serviceAccountName="admin"), POLICIES)
    # The operator's default policy allows nothing.
    with pytest.raises(UnsupportedBackend, match="not allowed in namespace ml"):
        job_pass.parse_job(_body(serviceAccountName="trainer"), AdminPolicies())


@pytest.mark.parametrize("text", ["trainer", "ml/", "/trainer", "a/b/c", "*/trainer", "ml/*"])
def test_a_bad_allow_entry_is_an_error_naming_it(text):
    with pytest.raises(ValueError, match="is not namespace/name"):
        parse_namespaced(text, any_name=False)


def test_the_operator_flag_refuses_a_bad_entry_before_starting(capsys):
    from elastic_jax.k8s_operator import main
    with pytest.raises(SystemExit) as info:
        main.main(["--allowed-service-accounts", "trainer", "--metrics-port", "0"])
    assert info.value.code == 2
    assert "--allowed-service-accounts" in capsys.readouterr().err


def test_the_namespace_is_the_objects_not_the_manifests():
    # A manifest's text (e.g. the ConfigMap copy of a spec) naming another namespace gains nothing.
    job = _job("ml", serviceAccountName="trainer")
    with pytest.raises(ServiceAccountRefused, match="not allowed in namespace tenant"):
        POLICY.check(job, "tenant")


def test_a_tampered_manifest_configmap_cannot_bring_in_an_account():
    """The operator renders from the ConfigMap copy of the spec after a restart; a tenant who may edit
    ConfigMaps must not slip a ServiceAccount past the admin's rule that way."""
    import yaml

    live = job_pass.parse_job(_body(), POLICIES)
    tampered = _body("ml", serviceAccountName="admin")

    class Kube:
        def read_manifest(self, namespace, configmap, owner_uid):
            return yaml.safe_dump(tampered)
    state = operator_state.OperatorState(kube=Kube(), key=b"k" * 32, policies=POLICIES)
    applied = job_pass._applied_job(state, ("ml", "sa-job"), live, "uid-1")
    assert applied.spec.controller.service_account_name is None  # the live spec, which passed the check


def test_a_refused_account_is_a_failed_condition_and_one_warning_event(monkeypatch):
    import kopf

    events = []
    monkeypatch.setattr(kopf, "event", lambda ref, type, reason, message: events.append((type, reason, message)))
    body = _body(serviceAccountName="admin")
    body["metadata"].update({"uid": "u1", "generation": 1})

    class Patch:
        status: dict = {}
    patch = Patch()
    patch.status = {}
    with pytest.raises(kopf.PermanentError):
        handlers.job_created(body=body, spec=body["spec"], status={}, meta=body["metadata"], patch=patch,
                             memo={"elasticjax": operator_state.OperatorState(key=b"k" * 32, policies=POLICIES)})
    assert patch.status["phase"] == "Failed"
    (cond,) = patch.status["conditions"]
    assert cond["reason"] == "InvalidSpec" and "spec.controller.serviceAccountName 'admin'" in cond["message"]
    assert [(t, r) for t, r, _ in events] == [("Warning", "InvalidSpec")]
    assert "spec.controller.serviceAccountName 'admin' is not allowed in namespace ml" in events[0][2]
