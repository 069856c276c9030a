"""The kind cluster works on the real kubelet: nodes, pod network, Services, DNS, JobSet, admission.

Every pod runs the tools image the node image preloads (busybox, never
pulled). Traffic stays on the cluster's Docker network: pod to pod, pod to
Service, pod to CoreDNS (which has no upstream forwarder).
"""

from __future__ import annotations

import json
import time
import uuid

import pytest

from e2e.kind.cluster import WORKER_LABELS, KindCluster, corefile_without_forward
from e2e.kind.nodeimage.build import kubernetes_version
from elastic_jax import contract

# The first test of a session also pays for what its fixtures build (images, node
# image, cluster, chart: up to ~30 min on a fresh machine under load).
pytestmark = pytest.mark.timeout(3600)

POD_TIMEOUT_S = 180
WGET = ("timeout", "10", "busybox", "wget", "-qO-")
"""An HTTP GET from a pod (busybox 1.35's own ``wget -T`` crashes: coreutils' timeout instead)."""


@pytest.fixture
def kind_namespace(kind_cluster: KindCluster):
    """A fresh namespace in the kind cluster, deleted afterwards."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    kind_cluster.kubectl("create", "namespace", name)
    yield name
    kind_cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _pod(name: str, image: str, command: list[str], node: str | None = None, labels: dict | None = None) -> dict:
    spec = {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "main", "image": image, "imagePullPolicy": "Never", "command": command}]}
    if node:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}}, "spec": spec}


def _apply(cluster: KindCluster, ns: str, *objects: dict) -> None:
    cluster.kubectl("-n", ns, "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                     "items": list(objects)}))


def _wait_ready(cluster: KindCluster, ns: str, *pods: str) -> dict[str, dict]:
    cluster.kubectl("-n", ns, "wait", "--for=condition=Ready", *[f"pod/{p}" for p in pods],
                    f"--timeout={POD_TIMEOUT_S}s", timeout_s=POD_TIMEOUT_S + 30)
    out = json.loads(cluster.kubectl("-n", ns, "get", "pods", "-o", "json").stdout)
    return {p["metadata"]["name"]: p for p in out["items"]}


def _exec(cluster: KindCluster, ns: str, pod: str, *command: str, check: bool = True):
    return cluster.kubectl("-n", ns, "exec", pod, "--", *command, check=check, timeout_s=60)


def _web_and_client(cluster: KindCluster, ns: str) -> tuple[str, str, dict[str, dict]]:
    """An HTTP server pod on the first worker and a client pod on the second; both Ready."""
    first, second = cluster.workers()[:2]
    tools = cluster.image.tools_image
    serve = ["/bin/sh", "-c", "mkdir -p /tmp/www && hostname > /tmp/www/index.html && "
                              "exec busybox httpd -f -p 8080 -h /tmp/www"]
    _apply(cluster, ns,
           _pod("web", tools, serve, node=first, labels={"app": "web"}),
           _pod("client", tools, ["busybox", "sleep", "3600"], node=second))
    return first, second, _wait_ready(cluster, ns, "web", "client")


KUBEADM_COREFILE = """\
.:53 {
    errors
    health {
       lameduck 5s
    }
    ready
    kubernetes cluster.local in-addr.arpa ip6.arpa {
       pods insecure
       fallthrough in-addr.arpa ip6.arpa
       ttl 30
    }
    prometheus :9153
    forward . /etc/resolv.conf {
       max_concurrent 1000
    }
    cache 30 {
       disable success cluster.local
       disable denial cluster.local
    }
    loop
    reload
    loadbalance
}
"""


def test_corefile_without_forward_drops_only_the_upstream():
    out = corefile_without_forward(KUBEADM_COREFILE)
    assert "forward" not in out and "max_concurrent" not in out
    assert out == KUBEADM_COREFILE.replace("    forward . /etc/resolv.conf {\n       max_concurrent 1000\n    }\n", "")
    assert corefile_without_forward(".:53 {\n    forward . 10.0.0.1\n    cache 30\n}\n") == ".:53 {\n    cache 30\n}\n"


def test_nodes_are_ready_with_the_built_kubelet(kind_cluster):
    nodes = json.loads(kind_cluster.kubectl("get", "nodes", "-o", "json").stdout)["items"]
    assert len(nodes) == 3
    for node in nodes:
        conditions = {c["type"]: c["status"] for c in node["status"]["conditions"]}
        assert conditions["Ready"] == "True", node["metadata"]["name"]
        info = node["status"]["nodeInfo"]
        assert info["kubeletVersion"] == kubernetes_version()
        assert info["containerRuntimeVersion"].startswith("containerd://")
        assert node["spec"].get("podCIDR")
    workers = [n for n in nodes if "node-role.kubernetes.io/control-plane" not in n["metadata"]["labels"]]
    assert len(workers) == 2
    for node in workers:
        for key, value in WORKER_LABELS.items():
            assert node["metadata"]["labels"].get(key) == value


def test_pod_reaches_pod_on_another_node(kind_cluster, kind_namespace):
    first, second, pods = _web_and_client(kind_cluster, kind_namespace)
    assert pods["web"]["spec"]["nodeName"] == first and pods["client"]["spec"]["nodeName"] == second
    web_ip = pods["web"]["status"]["podIP"]
    out = _exec(kind_cluster, kind_namespace, "client", *WGET, f"http://{web_ip}:8080/")
    assert out.stdout.strip() == "web"


def test_service_name_resolves_and_cluster_ip_answers(kind_cluster, kind_namespace):
    _web_and_client(kind_cluster, kind_namespace)
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web"},
               "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]}}
    _apply(kind_cluster, kind_namespace, service)
    cluster_ip = kind_cluster.kubectl("-n", kind_namespace, "get", "service", "web",
                                      "-o", "jsonpath={.spec.clusterIP}").stdout
    fqdn = f"web.{kind_namespace}.svc.cluster.local"
    # CoreDNS: the full name and the short name (the pod's search path) give the ClusterIP.
    assert _exec(kind_cluster, kind_namespace, "client", "getent", "hosts", fqdn).stdout.split()[0] == cluster_ip
    assert _exec(kind_cluster, kind_namespace, "client", "getent", "hosts", "web").stdout.split()[0] == cluster_ip
    # kube-proxy: the ClusterIP reaches the pod behind it (endpoints may take a moment).
    deadline = time.monotonic() + 60
    while True:
        out = _exec(kind_cluster, kind_namespace, "client", *WGET, f"http://{fqdn}/",
                    check=False)
        if out.returncode == 0 or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "web"


def test_cluster_dns_has_no_upstream(kind_cluster, kind_namespace):
    corefile = kind_cluster.kubectl("-n", "kube-system", "get", "configmap", "coredns",
                                    "-o", "jsonpath={.data.Corefile}").stdout
    assert "forward" not in corefile
    _apply(kind_cluster, kind_namespace, _pod("client", kind_cluster.image.tools_image, ["busybox", "sleep", "3600"]))
    _wait_ready(kind_cluster, kind_namespace, "client")
    assert _exec(kind_cluster, kind_namespace, "client", "getent", "hosts", "kubernetes.default").returncode == 0
    assert _exec(kind_cluster, kind_namespace, "client", "getent", "hosts", "example.com.", check=False).returncode != 0


def test_jobset_runs_to_completion(kind_cluster, kind_namespace):
    jobset = {
        "apiVersion": contract.JOBSET_API_VERSION, "kind": contract.JOBSET_KIND, "metadata": {"name": "hello"},
        "spec": {"replicatedJobs": [{"name": "workers", "replicas": 2, "template": {"spec": {
            "parallelism": 1, "completions": 1, "backoffLimit": 0,
            "template": {"spec": {"restartPolicy": "Never", "nodeSelector": dict(WORKER_LABELS),
                                  "containers": [{"name": "main", "image": kind_cluster.image.tools_image,
                                                  "imagePullPolicy": "Never",
                                                  "command": ["/bin/sh", "-c", "echo hello from $(hostname)"]}]}}}}}]},
    }
    _apply(kind_cluster, kind_namespace, jobset)
    kind_cluster.kubectl("-n", kind_namespace, "wait", "--for=condition=Completed", "jobset/hello",
                         f"--timeout={POD_TIMEOUT_S}s", timeout_s=POD_TIMEOUT_S + 30)
    pods = json.loads(kind_cluster.kubectl("-n", kind_namespace, "get", "pods", "-o", "json").stdout)["items"]
    assert len(pods) == 2 and all(p["status"]["phase"] == "Succeeded" for p in pods)


def test_restricted_namespace_refuses_a_violating_pod(kind_cluster, kind_namespace):
    kind_cluster.kubectl("label", "namespace", kind_namespace, "pod-security.kubernetes.io/enforce=restricted")
    tools = kind_cluster.image.tools_image
    bad = _pod("root", tools, ["busybox", "sleep", "60"])
    bad["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    refused = kind_cluster.kubectl("-n", kind_namespace, "create", "-f", "-", input=json.dumps(bad), check=False)
    assert refused.returncode != 0
    assert "violates PodSecurity" in refused.stderr and "restricted" in refused.stderr
    # A pod that meets the profile is admitted and runs (uid 65532, no capabilities, RuntimeDefault seccomp).
    good = _pod("nonroot", tools, ["busybox", "id", "-u"])
    good["spec"]["securityContext"] = {"runAsNonRoot": True, "runAsUser": 65532,
                                       "seccompProfile": {"type": "RuntimeDefault"}}
    good["spec"]["containers"][0]["securityContext"] = {"allowPrivilegeEscalation": False,
                                                        "capabilities": {"drop": ["ALL"]}}
    kind_cluster.kubectl("-n", kind_namespace, "create", "-f", "-", input=json.dumps(good))
    kind_cluster.kubectl("-n", kind_namespace, "wait", "--for=jsonpath={.status.phase}=Succeeded", "pod/nonroot",
                         f"--timeout={POD_TIMEOUT_S}s", timeout_s=POD_TIMEOUT_S + 30)
    assert kind_cluster.kubectl("-n", kind_namespace, "logs", "nonroot").stdout.strip() == "65532"
