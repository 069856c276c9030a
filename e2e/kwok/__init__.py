"""kwok (sigs.k8s.io/kwok) on the local control plane: nodes and pods that only need to exist.

The node agent runs every pod as a process; 1600 worker pods would be 1600
JAX processes. For the operator at scale (benchmarks/bench_operator_scale.py,
e2e/test_kwok_scale.py) the worker pods only need to exist, be scheduled,
turn Running and Ready, fail, and be replaced by the real Job and JobSet
controllers: kwok does that for the nodes it manages (annotation
`kwok.x-k8s.io/node=fake`), with the stages in `stages.yaml` (kwok's own fast
stages without pod-complete). Everything else stays real: the API server,
scheduler, Job/JobSet controllers, the operator, and the controller pods,
which the node agent runs as `elastic-jax-controller --serve-only` processes.

Backend pathways (`tpu_node`): kwok's nodes are GKE TPU node pools, one pool
per slice, each host a node with GKE's labels (`cloud.google.com/gke-nodepool`,
`gke-tpu-accelerator`, `gke-tpu-topology`), `google.com/tpu` capacity and GKE's
`google.com/tpu=present:NoSchedule` taint, so the real scheduler places each
slice on a pool of its own (the JobSet webhook's exclusive placement) and one
worker per host; the Pathways head (controller pod with the resource manager
and proxy stand-ins) runs on a node agent's CPU node.

The binary is built by `e2e/build_kwok.sh` (pinned `KWOK_VERSION`) into
`e2e/.build/bin/kwok`.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from e2e.harness import processes
from e2e.harness.paths import bin_dir

KWOK_VERSION = "v0.8.0"
STAGES = Path(__file__).resolve().parent / "stages.yaml"
MANAGED_ANNOTATION = "kwok.x-k8s.io/node"
# The label a job's workers select (spec.worker.nodeSelector) to land on kwok's nodes only.
POOL_LABEL = "cloud.google.com/gke-nodepool"
POOL = "kwok-pool"


def binary() -> Path:
    """Path of the kwok binary `e2e/build_kwok.sh` builds."""
    return bin_dir() / "kwok"


# Labels and resource of GKE's TPU nodes (as e2e/harness/layout.py gives the node agent's TPU pools).
TPU_ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
TPU_TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
TPU_RESOURCE = "google.com/tpu"
# What every kwok node carries besides its pool, so one label selector finds them all.
KWOK_NODE_LABEL = "elasticjax.dev/kwok-node"


def tpu_node(name: str, pool: str, index: int, accelerator: str, topology: str, chips: int = 4,
             machine_type: str = "ct5lp-hightpu-4t") -> dict:
    """A Node kwok manages, shaped as one host of a GKE multi-host TPU slice node pool.

    GKE's node-pool, accelerator, topology and machine-type labels, `google.com/tpu` capacity of `chips`, and
    the `google.com/tpu=present:NoSchedule` taint GKE puts on TPU nodes (the API server's
    ExtendedResourceToleration admission gives pods that ask for `google.com/tpu` its toleration, as GKE's does).
    Its InternalIP (what a hostNetwork worker pod gets as its IP) and pod CIDR are its own, outside loopback and
    never dialled: nothing runs there.

    Args:
      name: node name.
      pool: the node pool (`cloud.google.com/gke-nodepool`), one per slice.
      index: 0..64515, picks the InternalIP 10.(200 + index // 254).(1 + index % 254).1.
      accelerator, topology: the slice shape the pool serves, e.g. tpu-v5-lite-podslice, 4x4.
      chips: TPU chips per host (`google.com/tpu` capacity).
      machine_type: `node.kubernetes.io/instance-type`.

    Raises:
      ValueError: `index` out of range.
    """
    if not 0 <= index < 254 * 54:
        raise ValueError(f"kwok TPU node index {index} is outside 0..{254 * 54 - 1}")
    a, b = 200 + index // 254, 1 + index % 254
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": {MANAGED_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
                     "labels": {POOL_LABEL: pool, "kubernetes.io/hostname": name, "type": "kwok", KWOK_NODE_LABEL: "tpu",
                                TPU_ACCELERATOR_LABEL: accelerator, TPU_TOPOLOGY_LABEL: topology,
                                "node.kubernetes.io/instance-type": machine_type}},
        "spec": {"podCIDR": f"10.{a}.{b}.0/24", "podCIDRs": [f"10.{a}.{b}.0/24"],
                 "taints": [{"key": TPU_RESOURCE, "value": "present", "effect": "NoSchedule"}]},
        "status": {"addresses": [{"type": "InternalIP", "address": f"10.{a}.{b}.1"}, {"type": "Hostname", "address": name}],
                   "allocatable": {"cpu": "223", "memory": "190Gi", "pods": "110", TPU_RESOURCE: str(chips)},
                   "capacity": {"cpu": "224", "memory": "192Gi", "pods": "110", TPU_RESOURCE: str(chips)}},
    }


def fake_node(name: str, index: int, pods: int = 1000) -> dict:
    """A Node kwok manages: pool label, its own /16 of pod IPs, room for `pods` pods.

    No taint: the jobs here put their controllers on the node agent's `cpu-pool` and their workers on
    this pool by nodeSelector (a taint would need the operator to allow its key in tolerations).

    Args:
      name: node name.
      index: 0..255, picks the pod CIDR 10.<index>.0.0/16 (kwok assigns pod IPs from it).
      pods: the node's pod capacity (kwok reports what the Node's status says; the node stage copies it).
    """
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "annotations": {MANAGED_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
                     "labels": {POOL_LABEL: POOL, "kubernetes.io/hostname": name, "type": "kwok", KWOK_NODE_LABEL: "cpu"}},
        "spec": {"podCIDR": f"10.{index}.0.0/16", "podCIDRs": [f"10.{index}.0.0/16"]},
        "status": {"allocatable": {"cpu": "1k", "memory": "1Ti", "pods": str(pods)},
                   "capacity": {"cpu": "1k", "memory": "1Ti", "pods": str(pods)}},
    }


class KwokProcess(processes.LoggedProcess):
    """`kwok` as a child process, managing the nodes annotated `kwok.x-k8s.io/node=fake`; `stop()` by PID.

    Args:
      kubeconfig: admin credentials (kwok writes node and pod status, node leases).
      log_path: its stdout and stderr.
      server_port: its own HTTP server (health, metrics) on 127.0.0.1.
      node_lease_s: the nodes' lease duration, renewed every quarter of it; at most the cluster's
        node-monitor grace (`controlplane.node_monitor_grace_s`, 8 s by default), or the controller manager
        calls the nodes NotReady between renewals and evicts their pods.

    Raises:
      FileNotFoundError (from `start`): the binary is not built (`e2e/build_kwok.sh`).
    """

    def __init__(self, kubeconfig: Path, log_path: Path, server_port: int, node_lease_s: int = 8):
        super().__init__(log_path)
        self.kubeconfig = kubeconfig
        self.server_port = server_port
        self.node_lease_s = node_lease_s

    def start(self) -> None:
        """Starts kwok; returns at once (nodes turn Ready within seconds)."""
        exe = binary()
        if not exe.exists():
            raise FileNotFoundError(f"{exe}: build it with e2e/build_kwok.sh")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = [str(exe), "--kubeconfig", str(self.kubeconfig), "--config", str(STAGES),
                "--manage-all-nodes=false", f"--manage-nodes-with-annotation-selector={MANAGED_ANNOTATION}=fake",
                "--server-address", f"127.0.0.1:{self.server_port}", "--cidr", "10.255.0.0/16",
                # Leases renewed every quarter of this (2 s by default): the local controller manager calls a
                # node NotReady after its grace (8 s by default, e2e/README.md) without one, and evicts its
                # pods 2 s later.
                "--node-lease-duration-seconds", str(self.node_lease_s)]
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
        env["HOME"] = str(self.log_path.parent)  # kwok reads ~/.kwok/kwok.yaml too: keep it ours
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, start_new_session=True)


def failed_status(pod: dict, exit_code: int = 137) -> dict:
    """The status a kubelet posts when a pod's containers end for good: phase Failed.

    restartPolicy Never (backend cpu): its only container was killed (137: SIGKILL). kwok's stages leave a
    Failed pod alone; the Job controller then fails the worker Job (backoffLimit 0) and the JobSet
    controller recreates the slice, as with a real kubelet.

    restartPolicy OnFailure (backend pathways): a kubelet restarts a killed container in place and keeps the
    pod Running, so the failure that ends such a pod is an eviction (the node short of memory): phase Failed,
    reason Evicted, its containers killed. The Job controller replaces the pod on its node pool (backoffLimit
    hosts x maxRestartsPerSlice); kwok makes the new one Ready.
    """
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    containers = pod["spec"]["containers"]
    evicted = {}
    if pod["spec"].get("restartPolicy") == "OnFailure":
        evicted = {"reason": "Evicted",
                   "message": "The node was low on resource: memory. Threshold quantity: 100Mi, available: 90Mi."}
    return {"status": {
        **evicted,
        "phase": "Failed",
        "conditions": [{"type": t, "status": "False", "lastTransitionTime": now, "reason": "PodFailed"}
                       for t in ("Ready", "ContainersReady")],
        "containerStatuses": [{
            "name": c["name"], "image": c["image"], "ready": False, "restartCount": 0, "started": False,
            "state": {"terminated": {"exitCode": exit_code, "reason": "Error", "startedAt": now, "finishedAt": now}},
        } for c in containers],
    }}
