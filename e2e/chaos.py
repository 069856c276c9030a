"""The chaos benchmark's cluster arms (`benchmarks/bench_chaos.py`, issue 12 item 1): one job through the operator.

On the local control plane (`e2e.harness`), the operator a least-privilege
process (`e2e.operator_fixtures.OperatorProcess`), the job's controller and
workers pods the node agent runs. One arm is one ElasticTrainingJob applied
in a fresh namespace and followed to `Succeeded`; a :class:`Plan` says what
goes wrong meanwhile:

* every `every` seconds (or steps, `unit="step"`) from the job's first
  completed step, the worker process of a slice that is training (drawn with
  the caller's `random.Random`) is SIGKILLed, as a hardware loss would;
* at tick `node_loss_tick` the node of such a worker is lost instead
  (`LocalCluster.fail_node`: its agent and every container on it SIGKILLed,
  then the out-of-service taint), and restored `node_down_s` later;
* half a tick after tick `operator_kill_tick` the operator is SIGKILLed and
  started again `operator_down_s` later (as a kubelet restarts its pod).

Placement is made deterministic with a node pool of our own
(:data:`POOL`, added with `LocalCluster.add_node`): each node fits one worker
(400m CPU; a worker requests 250m), three nodes for two slices, so a node loss
takes exactly one slice and its replacement has a node to go to. The
controller stays on `cpu-pool` (its `nodeSelector`), which no failure touches.

With `compilation_cache` (the default) the job's workers share a persistent
XLA compilation cache (`spec.compilationCache.persistentVolumeClaim`): the arm,
as a cluster admin would, makes a hostPath PersistentVolume on a folder of its
own, a claim bound to it in the job's namespace (:func:`cache_claim`), and
allows that claim to the operator (`--allowed-compilation-cache-claims`).
"""

from __future__ import annotations

import contextlib
import random
import os
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from e2e.harness import layout
from e2e.harness.cluster import LocalCluster
from e2e.helpers import create_namespace, is_ready, pods, wait_for
from e2e.operator_fixtures import OperatorProcess, get_job, install_crd, write_operator_kubeconfig
from elastic_jax.api import labels
from elastic_jax.logs import read_events
from elastic_jax.local.processes import free_port

POOL = layout.PoolSpec("chaos-pool", 3, "e2-standard-2", cpu="400m", memory="8Gi")
CONTROLLER_POOL = "cpu-pool"
POLL_S = 0.1
CACHE_CLAIM = "xla-cache"


@dataclass(frozen=True)
class Plan:
    """What goes wrong during one cluster arm (see the module docstring); the default: nothing.

    Attributes:
      every: ticks apart, in seconds (`unit="s"`) or completed steps (`unit="step"`), from the first step;
        0: no failures.
      unit: "s" or "step".
      node_loss_tick: the tick (0-based) that loses a worker's node instead of killing a worker; None: none.
      operator_kill_tick: the operator is SIGKILLed half a tick after this tick; None: never.
      max_ticks: stop injecting after this many ticks; None: until the job ends.
      node_down_s: seconds from the node loss to `restore_node`.
      operator_down_s: seconds from the operator's SIGKILL to its restart.
    """

    every: float = 0.0
    unit: str = "s"
    node_loss_tick: int | None = None
    operator_kill_tick: int | None = None
    max_ticks: int | None = None
    node_down_s: float = 20.0
    operator_down_s: float = 5.0

    def __post_init__(self) -> None:
        if self.unit not in ("s", "step"):
            raise ValueError(f"Plan.unit must be 's' or 'step', not {self.unit!r}")
        if self.every < 0:
            raise ValueError(f"Plan.every must be >= 0, not {self.every}")


@dataclass
class ArmRun:
    """What one cluster arm saw.

    Attributes:
      wall_s: seconds from `kubectl apply` to the job's `Succeeded` (or `Failed`) phase in status.
      phase: the job's last phase.
      status: the job's last status.
      finished: the controller's `finished` log record (its run summary: `final_loss`, `steps_lost`, ...);
        {} when it wrote none.
      controller_log: the controller container's log file (JSON lines; the bench's log readers take it).
      failures: (unix time, kind, what) per injected failure; kind "pod", "node" or "operator".
    """

    wall_s: float
    phase: str
    status: dict
    finished: dict
    controller_log: Path | None
    failures: list[tuple[float, str, str]] = field(default_factory=list)

    def kills(self, *kinds: str) -> list[float]:
        """Times of the injected failures of `kinds` (all kinds when none given), in order."""
        return [t for t, kind, _ in self.failures if not kinds or kind in kinds]


@contextlib.contextmanager
def chaos_nodes(cluster: LocalCluster) -> Iterator[list[str]]:
    """Adds the :data:`POOL` nodes to the running cluster; removes them (by PID) afterwards. Yields their names.

    Raises:
      ClusterError: a node did not become Ready.
    """
    specs = layout.nodes((POOL,), address_octet=cluster.ports.address_octet, first_index=layout.EXTRA_NODE_INDEX)
    added: list[str] = []
    try:
        for spec in specs:
            cluster.add_node(spec)
            added.append(spec.name)
        yield added
    finally:
        for name in added:
            cluster.remove_node(name)


def cache_claim(cluster: LocalCluster, namespace: str, host_dir: Path, name: str = CACHE_CLAIM,
                timeout_s: float = 60) -> str:
    """An admin's compilation cache for `namespace`: a hostPath PersistentVolume on `host_dir` (created) and the
    claim `name` bound to it (ReadWriteMany, no storage class: kube-controller-manager binds it). The volume is
    named after the namespace, so deleting the namespace releases it; `delete_cache_volume` deletes it.

    Returns:
      `namespace/name`, the operator's `--allowed-compilation-cache-claims` entry.

    Raises:
      TimeoutError: the claim was not Bound within `timeout_s`.
    """
    host_dir.mkdir(parents=True, exist_ok=True)
    spec = {"accessModes": ["ReadWriteMany"], "storageClassName": ""}
    pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": f"{namespace}-{name}"},
          "spec": {**spec, "capacity": {"storage": "1Gi"}, "persistentVolumeReclaimPolicy": "Retain",
                   "hostPath": {"path": str(host_dir), "type": "Directory"},
                   "claimRef": {"namespace": namespace, "name": name}}}
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
           "spec": {**spec, "volumeName": pv["metadata"]["name"], "resources": {"requests": {"storage": "1Gi"}}}}
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(pv))
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(pvc))
    wait_for(lambda: (cluster.api().get(f"/api/v1/namespaces/{namespace}/persistentvolumeclaims/{name}")
                      .get("status") or {}).get("phase") == "Bound",
             timeout_s=timeout_s, what=f"claim {namespace}/{name} Bound")
    return f"{namespace}/{name}"


def delete_cache_volume(cluster: LocalCluster, namespace: str, name: str = CACHE_CLAIM) -> None:
    """Deletes the PersistentVolume `cache_claim` made for `namespace` (the host folder stays: the caller's)."""
    cluster.kubectl("delete", "persistentvolume", f"{namespace}-{name}", "--ignore-not-found", "--wait=false",
                    check=False)


def job_manifest(name: str, steps: int, ckpt_dir: Path, ckpt_interval: int, cache_claim_name: str | None = None,
                 worker_env: list[dict] | None = None) -> dict:
    """The chaos job for the operator: the local arms' job (2 slices, minSlices 1, the built-in LM at its
    defaults, a log line per step), workers on :data:`POOL`, the controller on `cpu-pool`.

    Args:
      name: metadata.name.
      steps: N.
      ckpt_dir: an absolute host folder (pods are host processes here).
      ckpt_interval: steps between checkpoints.
      cache_claim_name: the claim of the workers' compilation cache; None: no cache.
      worker_env: spec.worker.env.
    """
    spec = {
        "backend": "cpu",
        "slices": {"count": 2, "minSlices": 1},
        "controller": {"nodeSelector": {layout.NODEPOOL_LABEL: CONTROLLER_POOL}},
        "worker": {"nodeSelector": {layout.NODEPOOL_LABEL: POOL.name}, "env": list(worker_env or [])},
        "training": {"steps": steps, "globalBatchSize": 24, "logEverySteps": 1},
        "checkpoint": {"uri": str(ckpt_dir), "intervalSteps": ckpt_interval, "maxToKeep": 2},
        "elasticity": {"stepDeadlineSeconds": 30, "maxRestarts": 1000, "maxRestartsPerSlice": 1000},
    }
    if cache_claim_name is not None:
        spec["compilationCache"] = {"persistentVolumeClaim": {"claimName": cache_claim_name}}
    return {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob",
            "metadata": {"name": name}, "spec": spec}


class _Job:
    """The arm's view of its job: pods, the controller's log."""

    def __init__(self, cluster: LocalCluster, namespace: str, name: str):
        self.cluster, self.namespace, self.name = cluster, namespace, name

    def pods(self, role: str) -> list[dict]:
        return pods(self.cluster, self.namespace, f"{labels.JOB_NAME}={self.name},{labels.ROLE}={role}")

    def controller_log(self) -> Path | None:
        found = [p for p in self.pods(labels.ROLE_CONTROLLER) if (p.get("status") or {}).get("phase") == "Running"]
        if not found:
            return None
        p = found[-1]
        try:
            return self.cluster.pod_dir(self.namespace, p["metadata"]["name"], p["metadata"]["uid"]) / "logs" / \
                "controller.log"
        except FileNotFoundError:
            return None

    def running_workers(self, training: set[int]) -> dict[int, dict]:
        """{slice index: pod} of Running, Ready worker pods not being deleted; of slices in `training` if any is."""
        found = {}
        for p in self.pods(labels.ROLE_WORKER):
            if (p.get("status") or {}).get("phase") == "Running" and is_ready(p) \
                    and not p["metadata"].get("deletionTimestamp"):
                found[int(p["metadata"]["labels"][labels.SLICE_INDEX])] = p
        return {i: p for i, p in found.items() if i in training} or found


def _steps(log: Path | None) -> list[dict]:
    return [e for e in read_events(log.read_text(errors="replace")) if e.get("event") == "step"] \
        if log is not None and log.exists() else []


def run_arm(cluster: LocalCluster, kubeconfig: Path, workdir: Path, steps: int, plan: Plan, rng: random.Random,
            ckpt_interval: int = 50, timeout_s: float = 1800.0, compilation_cache: bool = True) -> ArmRun:
    """One cluster arm: its own namespace and operator, the job applied and followed to the end, `plan` injected.

    The namespace is deleted (and waited for, so the next arm finds the pool empty) and the operator stopped by
    PID before returning; a lost node is restored.

    Args:
      cluster: a running local cluster with the :data:`POOL` nodes (:func:`chaos_nodes`) and the CRD.
      kubeconfig: the operator's identity (`write_operator_kubeconfig`).
      workdir: the operator's log and the job's checkpoints go here.
      steps: N.
      plan: the failures.
      rng: draws the victims.
      ckpt_interval: steps between checkpoints.
      timeout_s: the job must end within this.
      compilation_cache: the workers share a compilation cache (`cache_claim`, under `workdir/xla-cache`).

    Raises:
      TimeoutError: the job did not end within `timeout_s`.
    """
    ns = create_namespace(cluster, f"chaos-{uuid.uuid4().hex[:6]}")
    name = "bench-chaos"
    job = _Job(cluster, ns, name)
    op = OperatorProcess(kubeconfig, workdir / "operator.log", free_port())
    failures: list[tuple[float, str, str]] = []
    lost_node: tuple[str, float] | None = None
    operator_back_at: float | None = None
    log: Path | None = None
    try:
        if compilation_cache:  # the admin's part: the volume, the claim, the operator's allow list
            op.extra_args.append(f"--allowed-compilation-cache-claims={cache_claim(cluster, ns, workdir / 'xla-cache')}")
        op.start()
        op.wait_up()
        manifest = job_manifest(name, steps, workdir / "ckpt", ckpt_interval, CACHE_CLAIM if compilation_cache else None)
        t0 = time.time()
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(manifest))
        tick, origin = 0, None  # origin: the first step's time (unit s) or 0 (unit step)
        operator_at = None
        status: dict = {}
        while True:
            now = time.time()
            if now - t0 > timeout_s:
                raise TimeoutError(f"chaos arm: job {ns}/{name} not finished within {timeout_s:.0f} s: {status}")
            status = get_job(cluster, ns, name).get("status") or {}
            if status.get("phase") in ("Succeeded", "Failed"):
                break
            log = job.controller_log() or log
            events = _steps(log)
            if plan.every and origin is None and events:
                origin = float(events[0]["ts"]) if plan.unit == "s" else 0.0
            at = (now - origin if plan.unit == "s" else (events[-1]["step"] if events else 0)) \
                if origin is not None else None
            if at is not None and (plan.max_ticks is None or tick < plan.max_ticks) and at >= (tick + 1) * plan.every:
                training = set(events[-1].get("active_slices", [])) if events else set()
                victims = job.running_workers(training)
                if victims:
                    index = rng.choice(sorted(victims))
                    p = victims[index]
                    if tick == plan.node_loss_tick and lost_node is None:
                        node = p["spec"]["nodeName"]
                        cluster.fail_node(node)
                        failures.append((time.time(), "node", node))
                        lost_node = (node, time.time() + plan.node_down_s)
                    else:
                        with contextlib.suppress(ProcessLookupError, FileNotFoundError):
                            os.kill(cluster.container_pid(ns, p["metadata"]["name"], "worker", p["metadata"]["uid"]),
                                    signal.SIGKILL)
                            failures.append((time.time(), "pod", f"slice {index}"))
                if tick == plan.operator_kill_tick:
                    operator_at = (tick + 1.5) * plan.every
                tick += 1
            if operator_at is not None and at is not None and at >= operator_at:
                op.kill()
                failures.append((time.time(), "operator", str(op.procs[-1].pid)))
                operator_at, operator_back_at = None, time.time() + plan.operator_down_s
            if operator_back_at is not None and time.time() >= operator_back_at:
                op.start()
                operator_back_at = None
            if lost_node is not None and lost_node[1] and time.time() >= lost_node[1]:
                cluster.restore_node(lost_node[0])
                lost_node = (lost_node[0], 0.0)
            time.sleep(POLL_S)
        wall = time.time() - t0
        finished = next((e for e in reversed(read_events(log.read_text(errors="replace")))
                         if e.get("event") == "finished"), {}) if log is not None else {}
        return ArmRun(wall_s=wall, phase=status.get("phase", ""), status=status, finished=finished,
                      controller_log=log, failures=failures)
    finally:
        if operator_back_at is not None:
            op.start()
        if lost_node is not None and lost_node[1]:
            cluster.restore_node(lost_node[0])
        # Before the operator stops: the job's finalizer is the operator's to remove.
        cluster.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=180s", check=False, timeout_s=200)
        op.stop()
        delete_cache_volume(cluster, ns)


def setup(cluster: LocalCluster, workdir: Path) -> Path:
    """The CRD installed and the operator's kubeconfig written under `workdir`; returns the kubeconfig."""
    install_crd(cluster)
    return write_operator_kubeconfig(cluster, workdir)

