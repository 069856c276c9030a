"""Every job gets its own NetworkPolicies from the operator, owned by it, and they go with it (issue 31 RISK 8).

On the local control plane, with the operator under the chart's RBAC rules and given the control API's
peers as the chart gives them (`--control-api-from`: the operator's pods, then the admin's). What is
checked is the objects the real API server stores (accepted, owner reference, selectors that select the
job's live pods and nothing of an earlier job) and the garbage collector deleting them with the job.
No CNI here enforces NetworkPolicy (pods share the host's network), so no packet is filtered: that part
is the cluster's CNI (docs/security.md).
"""

from __future__ import annotations

import json

from e2e.helpers import pods, wait_for
from e2e.operator_fixtures import (  # noqa: F401  (fixtures)
    apply_job, ejob_crd, example_manifest, get_job, operator_kubeconfig, run_operator,
)
from elastic_jax.api import labels
from elastic_jax.api import status as status_api

OPERATOR_PEER = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "elastic-jax"}},
                 "podSelector": {"matchLabels": {"app.kubernetes.io/name": "elastic-jax",
                                                 "app.kubernetes.io/instance": "ej",
                                                 "app.kubernetes.io/component": "operator"}}}
PROMETHEUS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}


def _policies(cluster, namespace: str) -> dict[str, dict]:
    items = cluster.api().get(f"/apis/networking.k8s.io/v1/namespaces/{namespace}/networkpolicies")["items"]
    return {p["metadata"]["name"]: p for p in items}


def _selects(policy: dict, pod: dict) -> bool:
    return policy["spec"]["podSelector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()


def test_each_job_gets_owned_network_policies_selecting_its_pods_and_they_go_with_it(
        cluster, namespace, operator_kubeconfig, tmp_path):
    runner = run_operator(operator_kubeconfig, tmp_path / "operator.log",
                          ("--control-api-from", json.dumps([OPERATOR_PEER, PROMETHEUS])))
    operator = next(runner)
    try:
        manifest = example_manifest()
        manifest["spec"]["training"]["steps"] = 200000  # never finishes during the test
        manifest["spec"]["checkpoint"]["uri"] = f"/tmp/elastic-jax/e2e-netpol/{namespace}/checkpoints"
        name = manifest["metadata"]["name"]
        status, explain = apply_job(cluster, namespace, manifest, operator)
        uid = get_job(cluster, namespace, name)["metadata"]["uid"]
        want = {f"{name}-controller-ingress", f"{name}-worker-ingress"}
        policies = wait_for(lambda: (p := _policies(cluster, namespace)) and want <= set(p) and p,
                            timeout_s=120, what="the job's NetworkPolicies", interval_s=0.5, explain=explain)
        for p in policies.values():
            (ref,) = p["metadata"]["ownerReferences"]
            assert (ref["kind"], ref["name"], ref["uid"], ref.get("controller")) == (
                "ElasticTrainingJob", name, uid, True), ref
        controller, worker = policies[f"{name}-controller-ingress"], policies[f"{name}-worker-ingress"]
        assert controller["spec"]["ingress"] == [{"from": [OPERATOR_PEER, PROMETHEUS],
                                                  "ports": [{"protocol": "TCP", "port": 8080}]}]
        assert worker["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": {
            labels.JOB_NAME: name, labels.JOB_UID: uid, labels.ROLE: labels.ROLE_CONTROLLER}}}],
            "ports": [{"protocol": "TCP", "port": 8471}]}]

        # The selectors select the job's live pods: the controller policy its controller pod only, the
        # worker policy its worker pods only.
        def live():
            found = pods(cluster, namespace, f"{labels.JOB_NAME}={name}")
            roles = {p["metadata"]["labels"].get(labels.ROLE) for p in found}
            return found if {labels.ROLE_CONTROLLER, labels.ROLE_WORKER} <= roles else None
        for pod in wait_for(live, timeout_s=300, what="controller and worker pods", interval_s=0.5, explain=explain):
            role = pod["metadata"]["labels"][labels.ROLE]
            assert _selects(controller, pod) == (role == labels.ROLE_CONTROLLER), pod["metadata"]["name"]
            assert _selects(worker, pod) == (role == labels.ROLE_WORKER), pod["metadata"]["name"]

        # Deleted with the job (its ownerReference, by the garbage collector; the operator cannot delete them).
        cluster.kubectl("delete", "elastictrainingjob", "-n", namespace, name, "--wait=false")
        wait_for(lambda: not (want & set(_policies(cluster, namespace))), timeout_s=120,
                 what="the NetworkPolicies deleted with the job", interval_s=0.5,
                 explain=lambda: json.dumps(sorted(_policies(cluster, namespace))))
    finally:
        runner.close()  # stops the operator by PID


def test_a_planted_policy_of_the_jobs_name_is_not_taken_for_the_jobs_own(cluster, namespace, operator_kubeconfig,
                                                                           tmp_path):
    """A tenant's NetworkPolicy named like the job's (say, admitting every pod) would decide who reaches it:
    the operator reads its owner (RBAC `get`), refuses it by name and starts nothing."""
    manifest = example_manifest()
    name = manifest["metadata"]["name"]
    planted = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
               "metadata": {"name": f"{name}-controller-ingress", "namespace": namespace},
               "spec": {"podSelector": {}, "policyTypes": ["Ingress"], "ingress": [{}]}}
    cluster.kubectl("apply", "-f", "-", input=json.dumps(planted))
    runner = run_operator(operator_kubeconfig, tmp_path / "operator.log",
                          ("--control-api-from", json.dumps([OPERATOR_PEER])))
    operator = next(runner)
    try:
        manifest["spec"]["checkpoint"]["uri"] = f"/tmp/elastic-jax/e2e-netpol/{namespace}/checkpoints"
        status, explain = apply_job(cluster, namespace, manifest, operator)
        failed = wait_for(lambda: next((c for c in status().get("conditions") or []
                                        if c["type"] == "CreateFailed" and c["status"] == "True"), None),
                          timeout_s=120, what="CreateFailed naming the planted NetworkPolicy", interval_s=0.5,
                          explain=explain)
        assert failed["reason"] == status_api.REASON_CHILD_CONFLICT, failed
        assert f"NetworkPolicy {name}-controller-ingress exists and is not owned by this job" in failed["message"]
        assert "who reaches the job's pods" in failed["message"], failed
        assert pods(cluster, namespace, f"{labels.JOB_NAME}={name}") == []
        assert "ownerReferences" not in _policies(cluster, namespace)[f"{name}-controller-ingress"]["metadata"]
    finally:
        cluster.kubectl("delete", "elastictrainingjob", "-n", namespace, name, "--wait=false", check=False)
        runner.close()  # stops the operator by PID
