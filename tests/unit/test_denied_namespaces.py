"""Namespaces the operator never makes children in (issue 31, RISK 8; operator/k8s_operator/denied_namespaces.py):
the default list, the flag, and a job there failed by the operator's create handler with a condition and an Event
naming the setting. The same through a real API server and operator process: `e2e/test_tenancy.py`."""

from __future__ import annotations

import pytest

from elastic_jax.k8s_operator import denied_namespaces, job_pass
from elastic_jax.k8s_operator.admin_policies import AdminPolicies
from elastic_jax.k8s_operator.backends import UnsupportedBackend
from elastic_jax.k8s_operator.denied_namespaces import DEFAULT, DeniedNamespaces, NamespaceDenied
from tests.support.operator_refusal import refused_at_create
from tests.unit.test_pod_fields import _body


@pytest.mark.parametrize(("names", "namespace", "denied"), [
    (DEFAULT, "kube-system", True),
    (DEFAULT, "kube-public", True),
    (DEFAULT, "kube-node-lease", True),
    (DEFAULT, "ml", False),
    (DEFAULT, "kube-systems", False),  # exact names, not prefixes
    (DEFAULT, "default", False),
    (frozenset({"elastic-jax-system"}), "elastic-jax-system", True),
    (frozenset({"elastic-jax-system"}), "kube-system", False),  # the admin's list replaces the default
    (frozenset(), "kube-system", False),
])
def test_the_deny_list(names, namespace, denied):
    if denied:
        with pytest.raises(NamespaceDenied) as info:
            DeniedNamespaces(names).check(namespace)
        message = str(info.value)
        assert message.startswith(f"metadata.namespace {namespace!r} is denied") and "\n" not in message
        assert "deniedNamespaces" in message and "--denied-namespaces" in message
    else:
        DeniedNamespaces(names).check(namespace)


def test_the_flag_sets_the_list_and_none_keeps_the_default():
    assert denied_namespaces.from_flags(None).names == DEFAULT
    assert denied_namespaces.from_flags("kube-system, ops").names == {"kube-system", "ops"}
    assert denied_namespaces.from_flags("").names == frozenset()


def test_the_operator_denies_kube_system_by_default_through_parse_job():
    assert AdminPolicies().denied_namespaces == DeniedNamespaces() == denied_namespaces.from_flags(None)
    with pytest.raises(UnsupportedBackend, match="metadata.namespace 'kube-system' is denied"):
        job_pass.parse_job(_body("kube-system"), AdminPolicies())
    assert job_pass.parse_job(_body("ml"), AdminPolicies()).metadata.name == "pf-job"


def test_a_job_in_a_denied_namespace_fails_with_a_condition_and_an_event(monkeypatch):
    body = _body("kube-system")
    body["metadata"]["uid"] = "u-ks"
    status, cond, events = refused_at_create(monkeypatch, body, "deniedNamespaces")
    assert status["phase"] == "Failed"
    assert cond["reason"] == "InvalidSpec" and "metadata.namespace 'kube-system' is denied" in cond["message"]
    assert events == [("Warning", "InvalidSpec", cond["message"])]
