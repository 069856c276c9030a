"""The Node object and its heartbeats: Ready condition and the node Lease.

As the kubelet does, the agent creates its Node (labels, taints, capacity),
reports status (conditions, addresses, capacity, allocatable), renews a Lease
in ``kube-node-lease`` every ``LEASE_RENEW_S`` and refreshes the Ready
condition every ``STATUS_EVERY_S``. The node-lifecycle controller marks the
node NotReady once both stop (see ``--node-monitor-grace-period``).
"""

from __future__ import annotations

from datetime import datetime, timezone

from e2e.nodeagent.kubeapi import ApiError, KubeApi

LEASE_DURATION_S = 40
LEASE_RENEW_S = 2.0
STATUS_EVERY_S = 10.0
KUBELET_VERSION = "v1.35.4"


def micro_now() -> str:
    """MicroTime, as Lease.spec.renewTime wants it."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


class NodeHeartbeat:
    """Registers one Node and keeps it alive.

    Args:
        api: API client.
        name: node name.
        labels: node labels (kubernetes.io/hostname etc. are added).
        taints: node taints.
        capacity: resource name -> quantity (allocatable is the same).
        host_ip: the node's InternalIP.
    """

    def __init__(self, api: KubeApi, name: str, labels: dict[str, str], taints: list[dict],
                 capacity: dict[str, str], host_ip: str):
        self.api, self.name, self.host_ip = api, name, host_ip
        self.labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                       "kubernetes.io/arch": "amd64", **labels}
        self.taints = taints
        self.capacity = capacity
        self.ready_since = _now()
        self.node_uid: str | None = None

    def register(self) -> None:
        """Create the Node (or adopt an existing one of that name) and report status.

        Raises:
            ApiError: the API server refused.
        """
        body = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": self.name, "labels": self.labels},
                "spec": {"taints": self.taints}}
        try:
            node = self.api.create("/api/v1/nodes", body)
        except ApiError as e:
            if e.status != 409:
                raise
            node = self.api.merge_patch(f"/api/v1/nodes/{self.name}",
                                        {"metadata": {"labels": self.labels}, "spec": {"taints": self.taints}})
        self.node_uid = node["metadata"]["uid"]
        self.report_status()
        self.renew_lease()

    def report_status(self) -> None:
        """PATCH the node status with fresh heartbeat times."""
        now = _now()

        def cond(ctype: str, status: str, reason: str, message: str) -> dict:
            return {"type": ctype, "status": status, "reason": reason, "message": message,
                    "lastHeartbeatTime": now, "lastTransitionTime": self.ready_since}

        status = {
            "capacity": self.capacity, "allocatable": self.capacity,
            "conditions": [
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "node agent has sufficient memory"),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "node agent has no disk pressure"),
                cond("PIDPressure", "False", "KubeletHasSufficientPID", "node agent has sufficient PID"),
                cond("Ready", "True", "KubeletReady", "e2e node agent is posting ready status"),
            ],
            "addresses": [{"type": "InternalIP", "address": self.host_ip},
                          {"type": "Hostname", "address": self.name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"kubeletVersion": KUBELET_VERSION, "kubeProxyVersion": "",
                         "operatingSystem": "linux", "architecture": "amd64",
                         "containerRuntimeVersion": "e2e-nodeagent://0.1", "osImage": "e2e node agent",
                         "kernelVersion": "", "machineID": self.name, "systemUUID": self.name,
                         "bootID": self.name},
        }
        self.api.strategic_patch(f"/api/v1/nodes/{self.name}/status", {"status": status})

    def renew_lease(self) -> None:
        """Create or renew ``kube-node-lease/<node>`` (owned by the Node, so GC removes it with it)."""
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.name}"
        spec = {"holderIdentity": self.name, "leaseDurationSeconds": LEASE_DURATION_S, "renewTime": micro_now()}
        try:
            self.api.merge_patch(path, {"spec": spec})
        except ApiError as e:
            if e.status != 404:
                raise
            owner = [{"apiVersion": "v1", "kind": "Node", "name": self.name, "uid": self.node_uid}]
            self.api.create("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
                            {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                             "metadata": {"name": self.name, "ownerReferences": owner}, "spec": spec})
