"""A job's NetworkPolicies (`network_policies`): rendered per job, selecting only that job's pods.

Objects only: no CNI here enforces NetworkPolicy, so these tests (and the e2e one,
e2e/test_network_policies.py) check what is asked of the cluster, not packet filtering.
The pathways backend's policies are in its golden files (tests/unit/test_operator_pathways.py).
"""

from __future__ import annotations

import json

import pytest

from elastic_jax.api import labels
from elastic_jax.api.manifest import parse_manifest
from elastic_jax.k8s_operator import children, names, network_policies
from elastic_jax.k8s_operator import main as operator_main
from tests.support.kube_models import validate
from tests.unit.test_operator_main import _usage_error
from tests.unit.test_operator_pathways import CONTROL_API_FROM, JOB_UID, pathways_job

PROMETHEUS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
              "podSelector": {"matchLabels": {"app": "prometheus"}}}


def _job(uid=JOB_UID):
    return parse_manifest({"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob",
                           "metadata": {"name": "demo", "namespace": "ns", "uid": uid},
                           "spec": {"slices": {"count": 2, "minSlices": 1},
                                    "training": {"steps": 10, "globalBatchSize": 4},
                                    "checkpoint": {"uri": "/tmp/ck"}}})


def _selects(policy: dict, pod_labels: dict) -> bool:
    return policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()


def _pod_labels(objs: list[dict]) -> tuple[dict, dict]:
    controller = next(o for o in objs if o["kind"] == "Pod")["metadata"]["labels"]
    jobset = next(o for o in objs if o["kind"] == "JobSet")
    worker = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["metadata"]["labels"]
    return controller, worker


def test_cpu_job_controller_takes_the_control_api_from_the_peers_and_workers_only_from_its_controller():
    objs = children.render_children(_job(), token="t", job_uid=JOB_UID, control_api_from=[*CONTROL_API_FROM, PROMETHEUS])
    policies = {o["metadata"]["name"]: o for o in objs if o["kind"] == "NetworkPolicy"}
    assert sorted(policies) == [names.controller_policy("demo"), names.worker_policy("demo")]
    for p in policies.values():
        assert validate(p) == []
        assert p["spec"]["policyTypes"] == ["Ingress"]
    controller_labels, worker_labels = _pod_labels(objs)
    controller, worker = policies["demo-controller-ingress"], policies["demo-worker-ingress"]
    assert _selects(controller, controller_labels) and not _selects(controller, worker_labels)
    assert _selects(worker, worker_labels) and not _selects(worker, controller_labels)
    assert controller["spec"]["ingress"] == [{"from": [*CONTROL_API_FROM, PROMETHEUS],
                                              "ports": [{"protocol": "TCP", "port": 8080}]}]
    (rule,) = worker["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8471}]
    # Only this job's controller: its name, UID and role (not any controller of the namespace).
    assert rule["from"] == [{"podSelector": {"matchLabels": {labels.JOB_NAME: "demo", labels.JOB_UID: JOB_UID,
                                                             labels.ROLE: labels.ROLE_CONTROLLER}}}]
    assert rule["from"][0]["podSelector"]["matchLabels"].items() <= controller_labels.items()


def test_an_earlier_job_of_the_same_name_is_not_selected():
    mine = network_policies.network_policies(_job("uid-new"), CONTROL_API_FROM)
    earlier_pods = _pod_labels(children.render_children(_job("uid-old"), token="t", job_uid="uid-old"))
    assert not any(_selects(p, pod) for p in mine for pod in earlier_pods)


def test_pathways_job_keeps_the_resource_manager_open_and_has_no_worker_policy():
    """Its TPU workers run on the host network: from node addresses, outside any NetworkPolicy."""
    objs = children.render_children(pathways_job(), token="t", job_uid=JOB_UID, control_api_from=CONTROL_API_FROM)
    (policy,) = [o for o in objs if o["kind"] == "NetworkPolicy"]
    assert _selects(policy, next(o for o in objs if o["kind"] == "Pod")["metadata"]["labels"])
    assert policy["spec"]["ingress"][1] == {"ports": [{"protocol": "TCP", "port": 29001},
                                                      {"protocol": "TCP", "port": 29002}]}


def test_no_peers_no_policies():
    assert [o for o in children.render_children(_job(), token="t") if o["kind"] == "NetworkPolicy"] == []
    assert network_policies.parse_peers("") is None


@pytest.mark.parametrize("text, says", [
    ("[", "not JSON"),
    ("[]", "non-empty"),
    ('{"podSelector": {}}', "non-empty JSON list"),
    ("[1]", "item 0: must be an object"),
    ('[{"podselector": {}}]', "unknown key 'podselector'"),
    ('[{"ipBlock": {"cidr": "10.0.0.0/8"}, "podSelector": {}}]', "ipBlock cannot be combined"),
    ('[{"podSelector": {"app": "x"}}]', "podSelector must be an object with matchLabels"),
    # A new-user trial: an ipBlock typo passed, so every job would have failed on the refused policy.
    ('[{"ipBlock": {"cidr": "not-a-cidr"}}]', "item 0: ipBlock.cidr: 'not-a-cidr' is not a CIDR"),
    ('[{"ipBlock": {"cidr": "10.0.0.1"}}]', "ipBlock.cidr: '10.0.0.1' is not a CIDR"),
    ('[{"ipBlock": {"cidr": "10.0.0.0/33"}}]', "is not a CIDR"),
    ('[{"ipBlock": {}}]', "ipBlock must be an object with a cidr string"),
    ('[{"ipBlock": {"cidr": "10.0.0.0/8", "exept": []}}]', "ipBlock must be an object with a cidr string"),
    ('[{"ipBlock": {"cidr": "10.0.0.0/8", "except": "10.1.0.0/16"}}]', "except must be a list"),
    ('[{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["192.168.0.0/16"]}}]', "192.168.0.0/16 must lie strictly inside 10.0.0.0/8"),
    ('[{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.0.0.0/8"]}}]', "must lie strictly inside"),
    ('[{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["fd00::/8"]}}]', "must lie strictly inside"),
])
def test_bad_peers_are_one_usage_error_naming_the_flag(text, says, monkeypatch, capsys):
    with pytest.raises(ValueError, match=says):
        network_policies.parse_peers(text)
    err = _usage_error(monkeypatch, capsys, operator_main.main, ["--metrics-port", "0", "--control-api-from", text])
    assert "--control-api-from:" in err and says in err and "Traceback" not in err, err


def test_good_peers_are_kept_as_given():
    text = json.dumps([*CONTROL_API_FROM, {"ipBlock": {"cidr": "10.0.0.0/8"}},
                       {"ipBlock": {"cidr": "10.1.2.3/16", "except": ["10.1.5.0/24"]}}, {"ipBlock": {"cidr": "fd00::/8"}}])
    assert network_policies.parse_peers(text) == json.loads(text)


def test_a_taken_policy_name_says_what_the_policy_would_do():
    """The ConfigMap/Service wording ("would choose the job's code") was said of a planted NetworkPolicy."""
    from elastic_jax.k8s_operator.status_builder import child_conflict

    _, message = child_conflict("NetworkPolicy", "demo-controller-ingress")
    assert "NetworkPolicy demo-controller-ingress exists and is not owned by this job" in message
    assert "who reaches the job's pods" in message and "code" not in message
