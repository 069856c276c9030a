"""spec.priorityClassName, tolerations, imagePullSecrets: only what the cluster admin allowed (operator/k8s_operator/pod_fields.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from elastic_jax.api import labels as lbl
from elastic_jax.api.manifest import parse_manifest
from elastic_jax.k8s_operator import children, job_pass, operator_state, pod_fields
from elastic_jax.k8s_operator.admin_policies import AdminPolicies
from elastic_jax.k8s_operator.backends import UnsupportedBackend
from elastic_jax.k8s_operator.pod_fields import PodFieldRefused, PodFieldsPolicy, parse_names
from elastic_jax.k8s_operator.allow_lists import parse_namespaced
from tests.support.operator_refusal import refused_at_create


def _body(namespace="ml", **spec):
    base = {"slices": {"count": 1}, "training": {"steps": 2, "globalBatchSize": 1},
            "checkpoint": {"uri": "gs://test-bucket/p"}}
    return {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob",
            "metadata": {"name": "pf-job", "namespace": namespace}, "spec": {**base, **spec}}


def _job(namespace="ml", **spec):
    return parse_manifest(_body(namespace, **spec))


POLICY = PodFieldsPolicy(priority_classes=parse_names("training-low"), toleration_keys=parse_names("ml-pool"),
                         pull_secrets=parse_namespaced("ml/registry", any_name=True))

CP_TOLERATION = {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}


def test_a_job_without_these_fields_passes_the_default_policy():
    PodFieldsPolicy().check(_job(), "ml")


def test_the_tpu_toleration_is_always_fine():
    # (backend pathways: a cpu job may not tolerate it at all, `elastic_jax.api.tpu_placement`)
    tpu = {"key": "google.com/tpu", "operator": "Exists", "effect": "NoSchedule"}
    PodFieldsPolicy().check(_job(backend="pathways", slices={"count": 1, "accelerator": "tpu-v5-lite-podslice",
                                                             "topology": "2x2"},
                                 worker={"tolerations": [tpu]}, controller={"tolerations": [tpu]}), "ml")


def test_listed_values_are_accepted():
    POLICY.check(_job(priorityClassName="training-low",
                      worker={"tolerations": [{"key": "ml-pool", "operator": "Equal", "value": "a"}]},
                      imagePullSecrets=[{"name": "registry"}]), "ml")


@pytest.mark.parametrize(("namespace", "spec", "message"), [
    # What a new-user trial on kind could do before: preempt anything, run on the control-plane node.
    ("ml", {"priorityClassName": "system-node-critical"},
     "spec.priorityClassName 'system-node-critical' is not allowed: a cluster admin must list it in the "
     "operator's podFields.priorityClassNames"),
    ("ml", {"controller": {"tolerations": [CP_TOLERATION]}},
     "spec.controller.tolerations[0].key 'node-role.kubernetes.io/control-plane' is not allowed"),
    ("ml", {"worker": {"tolerations": [{"key": "ml-pool", "operator": "Exists"}, CP_TOLERATION]}},
     "spec.worker.tolerations[1].key 'node-role.kubernetes.io/control-plane' is not allowed"),
    # A toleration without a key tolerates every taint (of its effect).
    ("ml", {"worker": {"tolerations": [{"operator": "Exists", "effect": "NoExecute"}]}},
     "spec.worker.tolerations[0]: a toleration without a key tolerates every taint"),
    ("ml", {"imagePullSecrets": [{"name": "registry"}, {"name": "prod-registry"}]},
     "spec.imagePullSecrets[1].name 'prod-registry' is not allowed in namespace ml: a cluster admin must list "
     "ml/prod-registry"),
    # A pull Secret entry is per namespace.
    ("other", {"imagePullSecrets": [{"name": "registry"}]},
     "spec.imagePullSecrets[0].name 'registry' is not allowed in namespace other"),
])
def test_anything_the_admin_did_not_allow_is_refused_naming_the_field(namespace, spec, message):
    with pytest.raises(PodFieldRefused) as info:
        POLICY.check(_job(namespace, **spec), namespace)
    assert message in str(info.value) and "\n" not in str(info.value)
    assert_names_the_operator_flag(str(info.value))


MAIN_SOURCE = (Path(__file__).resolve().parents[2] / "operator" / "k8s_operator" / "main.py").read_text()


def assert_names_the_operator_flag(message: str) -> None:
    """A refusal that names the Helm value also names the flag of an operator run without Helm (a trial's
    operator from the CLI was told only of Helm), and that flag exists."""
    if "Helm value" not in message:
        return
    flags = re.findall(r"--allowed-[a-z-]+", message)
    assert flags, message
    for flag in flags:
        assert f'"{flag}"' in MAIN_SOURCE, flag


def test_a_star_allows_any_value():
    anything = PodFieldsPolicy(parse_names("*"), parse_names("*"), parse_namespaced("ml/*", any_name=True))
    anything.check(_job(priorityClassName="system-node-critical",
                        controller={"tolerations": [CP_TOLERATION, {"operator": "Exists", "effect": "NoExecute"}]},
                        imagePullSecrets=[{"name": "any"}]), "ml")
    with pytest.raises(PodFieldRefused, match="not allowed in namespace other"):
        anything.check(_job("other", imagePullSecrets=[{"name": "any"}]), "other")


def test_the_operator_fails_the_job_through_parse_job():
    assert job_pass.parse_job(_body(priorityClassName="training-low"),
                              AdminPolicies(pod_fields=POLICY)).spec.priority_class_name == "training-low"
    # The operator's default allows none of them.
    for spec in ({"priorityClassName": "training-low"}, {"imagePullSecrets": [{"name": "registry"}]},
                 {"worker": {"tolerations": [{"key": "ml-pool", "operator": "Exists"}]}}):
        with pytest.raises(UnsupportedBackend, match="is not allowed"):
            job_pass.parse_job(_body(**spec), AdminPolicies())


def test_a_refused_job_is_failed_with_a_condition_and_an_event_and_nothing_is_created(monkeypatch):
    body = _body(priorityClassName="system-node-critical")
    body["metadata"]["uid"] = "u1"
    status, cond, events = refused_at_create(monkeypatch, body, "spec.priorityClassName")
    assert status["phase"] == "Failed"
    assert cond["reason"] == "InvalidSpec" and "spec.priorityClassName 'system-node-critical'" in cond["message"]
    assert events == [("Warning", "InvalidSpec", cond["message"])]


def test_a_tampered_manifest_configmap_cannot_bring_in_a_priority_class():
    live = _job()
    tampered = _job(priorityClassName="system-node-critical")

    class Kube:  # the ConfigMap as someone who may edit ConfigMaps of the namespace left it
        def read_manifest(self, ns, name, uid):
            return children.manifest_configmap(tampered)["data"][lbl.MANIFEST_KEY]
    state = operator_state.OperatorState(kube=Kube(), key=b"k" * 32)
    applied = job_pass._applied_job(state, ("ml", "pf-job"), live, "u1")
    assert applied.spec.priority_class_name is None


@pytest.mark.parametrize("text", ["registry", "ml/", "/registry", "a/b/c", "*/registry"])
def test_a_bad_pull_secret_entry_is_an_error_naming_it(text):
    with pytest.raises(ValueError, match="is not namespace/name"):
        parse_namespaced(text, any_name=True)


def test_the_operator_flags_reach_the_policy_and_a_bad_entry_stops_it(monkeypatch, capsys):
    from elastic_jax.k8s_operator import main
    with pytest.raises(SystemExit) as info:
        main.main(["--allowed-image-pull-secrets", "registry", "--metrics-port", "0"])
    assert info.value.code == 2 and "--allowed-image-pull-secrets" in capsys.readouterr().err
    policy = pod_fields.from_flags("a,b", "ml-pool", "ml/registry")
    assert policy == PodFieldsPolicy(frozenset({"a", "b"}), frozenset({"ml-pool"}), frozenset({("ml", "registry")}))
    assert pod_fields.from_flags("", "", "") == PodFieldsPolicy()  # (no flag: the defaults)


CACHE = {"persistentVolumeClaim": {"claimName": "xla-cache"}}


def test_a_cache_claim_is_mounted_only_when_the_admin_listed_it_for_the_namespace():
    job = _job(backend="cpu", checkpoint={"uri": "/ck"}, compilationCache=CACHE)
    with pytest.raises(PodFieldRefused, match=r"spec\.compilationCache\.persistentVolumeClaim\.claimName 'xla-cache' "
                                              r"is not allowed in namespace ml: .* list ml/xla-cache in the operator's "
                                              r"podFields\.compilationCacheClaims"):
        PodFieldsPolicy().check(job, "ml")
    PodFieldsPolicy(cache_claims=parse_namespaced("ml/xla-cache", any_name=True)).check(job, "ml")
    PodFieldsPolicy(cache_claims=parse_namespaced("ml/*", any_name=True)).check(job, "ml")
    # Listed for another namespace: a tenant of `ml` cannot reach it by name.
    with pytest.raises(PodFieldRefused, match="not allowed in namespace ml"):
        PodFieldsPolicy(cache_claims=parse_namespaced("other/xla-cache", any_name=True)).check(job, "ml")
    # A gs:// cache mounts nothing: nothing to allow.
    PodFieldsPolicy().check(_job(backend="pathways", slices={"count": 1, "accelerator": "tpu-v5-lite-podslice",
                                                             "topology": "2x2"},
                                 compilationCache={"uri": "gs://test-bucket/xla"}), "ml")


def test_the_cache_claims_flag_reaches_the_policy_and_a_bad_entry_stops_the_operator(monkeypatch, capsys):
    from elastic_jax.k8s_operator import main
    with pytest.raises(SystemExit) as info:
        main.main(["--allowed-compilation-cache-claims", "xla-cache", "--metrics-port", "0"])
    assert info.value.code == 2 and "--allowed-compilation-cache-claims" in capsys.readouterr().err
    policy = pod_fields.from_flags("", "", "", "ml/xla-cache, ml2/*")
    assert policy.cache_claims == {("ml", "xla-cache"), ("ml2", "*")}
    with pytest.raises(ValueError, match="'xla-cache' is not namespace/name"):
        pod_fields.from_flags("", "", "", "xla-cache")
