"""The cluster itself: every part is up, nodes carry the GKE layout, it idles lean."""

from __future__ import annotations

import json

from e2e.harness import layout, processes

IDLE_RSS_LIMIT_BYTES = 2 * 1024**3


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def test_control_plane_is_healthy(cluster):
    out = cluster.kubectl("get", "--raw", "/readyz?verbose").stdout
    assert "readyz check passed" in out
    version = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert version["serverVersion"]["gitVersion"] == "v1.35.4"
    crds = cluster.kubectl("get", "crd", "-o", "name").stdout
    assert "jobsets.jobset.x-k8s.io" in crds


def test_nodes_follow_the_gke_layout(cluster, kube):
    from kubernetes import client
    typed = client.CoreV1Api(kube).list_node().items
    assert sorted(n.metadata.name for n in typed) == sorted(n.name for n in cluster.nodes)
    nodes = {n["metadata"]["name"]: n for n in cluster.api().get("/api/v1/nodes")["items"]}
    for spec in cluster.nodes:
        node = nodes[spec.name]
        labels = node["metadata"]["labels"]
        assert labels[layout.NODEPOOL_LABEL] == spec.pool
        if spec.pool.startswith("tpu"):
            assert labels[layout.TPU_ACCELERATOR_LABEL] == "tpu-v5-lite-podslice"
            assert labels[layout.TPU_TOPOLOGY_LABEL] == "2x2"
            assert node["status"]["allocatable"][layout.TPU_RESOURCE] == "4"
            assert {"key": "google.com/tpu", "value": "present", "effect": "NoSchedule"} in node["spec"]["taints"]
        else:
            assert layout.TPU_RESOURCE not in node["status"]["capacity"]
        assert [a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"] == [spec.host_ip]


def test_idle_control_plane_fits_in_two_gib(cluster):
    total = 0
    for pid, _ in processes.leftovers(cluster.state):
        total += rss_bytes(pid)
    print(f"resident memory of all cluster processes: {total / 1024**2:.0f} MiB")
    assert 0 < total < IDLE_RSS_LIMIT_BYTES
