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
                     "labels": {POOL_LABEL: POOL, "kubernetes.io/hostname": name, "type": "kwok"}},
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

    Raises:
      FileNotFoundError (from `start`): the binary is not built (`e2e/build_kwok.sh`).
    """

    def __init__(self, kubeconfig: Path, log_path: Path, server_port: int):
        super().__init__(log_path)
        self.kubeconfig = kubeconfig
        self.server_port = server_port

    def start(self) -> None:
        """Starts kwok; returns at once (nodes turn Ready within seconds)."""
        exe = binary()
        if not exe.exists():
            raise FileNotFoundError(f"{exe}: build it with e2e/build_kwok.sh")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        argv = [str(exe), "--kubeconfig", str(self.kubeconfig), "--config", str(STAGES),
                "--manage-all-nodes=false", f"--manage-nodes-with-annotation-selector={MANAGED_ANNOTATION}=fake",
                "--server-address", f"127.0.0.1:{self.server_port}", "--cidr", "10.255.0.0/16",
                # Leases renewed every 2 s (a quarter of this): the local controller manager calls a node
                # NotReady after 8 s without one (e2e/README.md), and evicts its pods 2 s later.
                "--node-lease-duration-seconds", "8"]
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
        env["HOME"] = str(self.log_path.parent)  # kwok reads ~/.kwok/kwok.yaml too: keep it ours
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=env, start_new_session=True)


def failed_status(pod: dict, exit_code: int = 137) -> dict:
    """The status a kubelet posts when a pod's only container was killed (137: SIGKILL): phase Failed.

    kwok's stages leave a Failed pod alone; the Job controller then fails the worker Job (backoffLimit 0)
    and the JobSet controller recreates the slice, as with a real kubelet.
    """
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    containers = pod["spec"]["containers"]
    return {"status": {
        "phase": "Failed",
        "conditions": [{"type": t, "status": "False", "lastTransitionTime": now, "reason": "PodFailed"}
                       for t in ("Ready", "ContainersReady")],
        "containerStatuses": [{
            "name": c["name"], "image": c["image"], "ready": False, "restartCount": 0, "started": False,
            "state": {"terminated": {"exitCode": exit_code, "reason": "Error", "startedAt": now, "finishedAt": now}},
        } for c in containers],
    }}
