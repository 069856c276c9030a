"""Every job gets its own NetworkPolicies from the operator, owned by it, and they go with it (issue 31 RISK 8).

That a training job's policies are stored, owned by it, select its live pods by role (and nothing of another
job) and go with it is checked on e2e/test_status_truth.py's job (its steps 0 and 8; session 27: this file
started a job of its own for it). Here: a tenant's policy planted under the job's policy name.

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
    apply_job, ejob_crd, example_manifest, operator_kubeconfig, run_operator,
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
