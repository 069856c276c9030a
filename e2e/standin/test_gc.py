"""Deleting an owner garbage-collects its children (the real garbage collector)."""

from __future__ import annotations

from e2e.helpers import apply, pods, sleeper_deployment, summary, wait_for
from e2e.nodeagent.kubeapi import ApiError

DEPLOYMENT = sleeper_deployment("owner", pool="cpu-pool", replicas=2, grace_s=2) + """
---
apiVersion: v1
kind: ConfigMap
metadata: {name: owned-config}
"""


def test_deleting_a_deployment_collects_replicaset_and_pods(cluster, namespace):
    apply(cluster, DEPLOYMENT, namespace)
    wait_for(lambda: len([p for p in pods(cluster, namespace, "app=owner") if p["status"].get("phase") == "Running"]) == 2,
             timeout_s=60, what="2 pods running", explain=lambda: summary(pods(cluster, namespace)))
    api = cluster.api()
    rs = api.get(f"/apis/apps/v1/namespaces/{namespace}/replicasets", labelSelector="app=owner")["items"]
    assert len(rs) == 1 and rs[0]["metadata"]["ownerReferences"][0]["kind"] == "Deployment"

    # A second child of the Deployment, owned by hand: GC must follow any ownerReference.
    dep = api.get(f"/apis/apps/v1/namespaces/{namespace}/deployments/owner")
    api.merge_patch(f"/api/v1/namespaces/{namespace}/configmaps/owned-config", {"metadata": {"ownerReferences": [
        {"apiVersion": "apps/v1", "kind": "Deployment", "name": "owner", "uid": dep["metadata"]["uid"]}]}})

    cluster.kubectl("delete", "deployment", "owner", "-n", namespace, "--wait=false")  # background cascade
    wait_for(lambda: not pods(cluster, namespace, "app=owner"), timeout_s=60, what="pods collected",
             explain=lambda: summary(pods(cluster, namespace)))
    assert not api.get(f"/apis/apps/v1/namespaces/{namespace}/replicasets", labelSelector="app=owner")["items"]

    def configmap_gone():
        try:
            api.get(f"/api/v1/namespaces/{namespace}/configmaps/owned-config")
            return False
        except ApiError as e:
            return e.status == 404
    wait_for(configmap_gone, timeout_s=30, what="owned ConfigMap collected")
