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
  started again `operator_down_s` later (as a kubelet restarts its pod);
* with `whole_job`, each tick's failure (a worker or its node, as above) takes
  the whole job down, as it does a synchronous job: the controller's process
  is SIGKILLed first (a crash: no SIGTERM, so nothing is saved on the way
  out), then the drawn worker (or its node), then every other worker. The
  operator recreates the controller pod, which resumes from the latest
  committed checkpoint, and the JobSets replace the workers;
* with `after_commit` too, a whole-job tick also waits until the controller
  started since the last one (or the first controller) has logged a
  committed checkpoint (:func:`committed_steps`), so every recreated
  controller has a step in `gs://` to resume from, not step 0.

No tick comes once the job has logged its last step: a failure after
training measures nothing (and would cost a whole-job arm a restart that no
other arm pays).

Placement is made deterministic with a node pool of our own
(:data:`POOL`, added with `LocalCluster.add_node`): each node fits one worker
(400m CPU; a worker requests 250m), four nodes for at most three slices (two
training, one spare), so a node loss takes exactly one slice and its
replacement has a node to go to. The controller stays on `cpu-pool` (its
`nodeSelector`), which no failure touches.

Checkpoints: a local `spec.checkpoint.uri` is the controller pod's own
emptyDir (the operator mounts one over the folder; `backends/cpu.py`
`checkpoint_volume`), so it is gone with the pod and a recreated controller
starts again from step 0. A `whole_job` arm therefore needs :class:`GcsCheckpoints`:
a bucket of a fake-gcs-server on loopback (the node agent's pods share the
host's network), which the controller reaches through `spec.controller.env`,
as a GKE job keeps its checkpoints in `gs://`.

With `compilation_cache` (the default) the job's workers share a persistent
XLA compilation cache (`spec.compilationCache.persistentVolumeClaim`): the arm,
as a cluster admin would, makes a hostPath PersistentVolume on a folder of its
own, a claim bound to it in the job's namespace (:func:`cache_claim`), and
allows that claim to the operator (`--allowed-compilation-cache-claims`).
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from e2e.harness import layout
from e2e.harness.cluster import LocalCluster
from e2e.helpers import create_namespace, is_ready, pods, wait_for
from e2e.operator_fixtures import OperatorProcess, get_job, install_crd, job_events, write_operator_kubeconfig
from elastic_jax.api import labels
from elastic_jax.api.status import REASON_CONTROLLER_BACK_OFF
from elastic_jax.logs import read_events
from elastic_jax.local.processes import free_port
from tests.support.gcs_emulator import GcsEmulator, running_emulator

POOL = layout.PoolSpec("chaos-pool", 4, "e2-standard-2", cpu="400m", memory="8Gi")
CONTROLLER_POOL = "cpu-pool"
POLL_S = 0.1
CACHE_CLAIM = "xla-cache"
# The controller's line once a checkpoint step is in storage (`controller_image/controller/checkpointing.py`).
COMMITTED = re.compile(r"checkpoint step (\d+) committed")


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
      whole_job: each tick's failure takes the whole job down (a synchronous job): the controller and every
        worker SIGKILLed, the controller pod recreated by the operator from the latest checkpoint.
      after_commit: with `whole_job`, a tick also waits (however long: the arm's `timeout_s` bounds it) until
        the controller started since the previous tick has logged a committed checkpoint step; without it a
        tick can kill a controller before its first save commits (then the next one starts from step 0).
    """

    every: float = 0.0
    unit: str = "s"
    node_loss_tick: int | None = None
    operator_kill_tick: int | None = None
    max_ticks: int | None = None
    node_down_s: float = 20.0
    operator_down_s: float = 5.0
    whole_job: bool = False
    after_commit: bool = False

    def __post_init__(self) -> None:
        if self.unit not in ("s", "step"):
            raise ValueError(f"Plan.unit must be 's' or 'step', not {self.unit!r}")
        if self.every < 0:
            raise ValueError(f"Plan.every must be >= 0, not {self.every}")
        if self.after_commit and not self.whole_job:
            raise ValueError("Plan.after_commit needs Plan.whole_job (only a whole-job tick kills the controller)")


@dataclass
class ArmRun:
    """What one cluster arm saw.

    Attributes:
      wall_s: seconds from `kubectl apply` to the job's `Succeeded` (or `Failed`) phase in status, or to the
        arm's time limit (`timed_out`).
      phase: the job's last phase.
      status: the job's last status.
      finished: the last controller's `finished` log record (its run summary: `final_loss`, `steps_lost`, ...);
        {} when it wrote none.
      controller_logs: each controller pod's container log (JSON lines; the bench's log readers take them),
        copied into the arm's `workdir`, in the order the pods ran; more than one when the controller pod was
        recreated (a path without a file: that pod logged nothing).
      failures: (unix time, kind, what) per injected failure; kind "pod", "node" or "operator".
      timed_out: the job had not ended within the arm's time limit (it was deleted then).
      controller_backoffs: the operator's ControllerBackOff Events about the job (a recreated controller
        lost again before any controller trained a step waited: `supervision.backoff`).
      worker_logs: {pod UID: a copy of that worker pod's container log in the arm's `workdir`}, every worker
        pod the job had (the node agent keeps a pod's folder after the pod is gone).
      first_workers: the UIDs of the worker pods that existed when the first failure was injected (the first
        generation, which found the compilation cache as the arm made it: empty); empty when none was.
    """

    wall_s: float
    phase: str
    status: dict
    finished: dict
    controller_logs: list[Path] = field(default_factory=list)
    failures: list[tuple[float, str, str]] = field(default_factory=list)
    timed_out: bool = False
    controller_backoffs: int = 0
    worker_logs: dict[str, Path] = field(default_factory=dict)
    first_workers: frozenset[str] = frozenset()

    @property
    def controller_log(self) -> Path | None:
        """The last controller pod's log file (None: no controller pod ran)."""
        return self.controller_logs[-1] if self.controller_logs else None

    def kills(self, *kinds: str) -> list[float]:
        """Times of the injected failures of `kinds` (all kinds when none given), in order."""
        return [t for t, kind, _ in self.failures if not kinds or kind in kinds]


@dataclass(frozen=True)
class GcsCheckpoints:
    """Checkpoints that outlive the controller pod, as on GKE: a bucket per arm on one fake-gcs-server on
    loopback (:func:`gcs_checkpoints`), which the controller pod reaches through its `spec.controller.env`."""

    emulator: GcsEmulator

    def uri(self, namespace: str) -> str:
        """A fresh `spec.checkpoint.uri` for the job of `namespace` (its bucket is made, named after it)."""
        return f"{self.emulator.make_bucket(namespace)}/ckpt"

    def controller_env(self) -> list[dict[str, str]]:
        """`spec.controller.env` pointing every GCS client at the emulator (and any metadata lookup at its trap)."""
        return [{"name": k, "value": v} for k, v in sorted(self.emulator.env.items())]


@contextlib.contextmanager
def gcs_checkpoints(log_dir: Path) -> Iterator[GcsCheckpoints]:
    """A fake-gcs-server on 127.0.0.1 for as long as the context lasts (stopped by PID); its log under `log_dir`.

    Raises:
      RuntimeError: the emulator did not start.
    """
    log_dir.mkdir(parents=True, exist_ok=True)
    with running_emulator(log_dir) as emulator:
        yield GcsCheckpoints(emulator)


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


def job_manifest(name: str, steps: int, ckpt_uri: Path | str, ckpt_interval: int, cache_claim_name: str | None = None,
                 worker_env: list[dict] | None = None, spares: int = 0,
                 controller_env: list[dict] | None = None) -> dict:
    """The chaos job for the operator: the local arms' job (2 slices, minSlices 1, the built-in LM at its
    defaults, a log line per step), workers on :data:`POOL`, the controller on `cpu-pool`.

    Args:
      name: metadata.name.
      steps: N.
      ckpt_uri: an absolute folder (the controller pod's emptyDir: lost with the pod) or a `gs://` uri.
      ckpt_interval: steps between checkpoints.
      cache_claim_name: the claim of the workers' compilation cache; None: no cache.
      worker_env: spec.worker.env.
      spares: spec.slices.spares (hot spare slices).
      controller_env: spec.controller.env.
    """
    spec = {
        "backend": "cpu",
        "slices": {"count": 2, "minSlices": 1, "spares": spares},
        "controller": {"nodeSelector": {layout.NODEPOOL_LABEL: CONTROLLER_POOL}, "env": list(controller_env or [])},
        "worker": {"nodeSelector": {layout.NODEPOOL_LABEL: POOL.name}, "env": list(worker_env or [])},
        "training": {"steps": steps, "globalBatchSize": 24, "logEverySteps": 1},
        "checkpoint": {"uri": str(ckpt_uri), "intervalSteps": ckpt_interval, "maxToKeep": 2},
        "elasticity": {"stepDeadlineSeconds": 30, "maxRestarts": 1000, "maxRestartsPerSlice": 1000},
    }
    if cache_claim_name is not None:
        spec["compilationCache"] = {"persistentVolumeClaim": {"claimName": cache_claim_name}}
    return {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob",
            "metadata": {"name": name}, "spec": spec}


class _Job:
    """The arm's view of its job: pods, the controller's log, its processes."""

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

    def kill(self, pod: dict, container: str) -> bool:
        """SIGKILLs `container` of `pod` (`LocalCluster.kill_container`); False when it was not running."""
        return self.cluster.kill_container(self.namespace, pod["metadata"]["name"], container, pod["metadata"]["uid"])


def _steps(log: Path | None) -> list[dict]:
    return [e for e in read_events(log.read_text(errors="replace")) if e.get("event") == "step"] \
        if log is not None and log.exists() else []


def committed_steps(log: Path | None) -> list[int]:
    """The checkpoint steps a controller's log says were committed (in storage), in the order it logged them;
    [] for no log or a log not written yet."""
    if log is None or not log.exists():
        return []
    return [int(m.group(1)) for e in _json_lines(log) if (m := COMMITTED.match(str(e.get("msg", ""))))]


def tick_due(plan: Plan, tick: int, at: float | None, logs: list[Path], logs_at_kill: int) -> bool:
    """Whether tick `tick` (0-based) of `plan` fails something now.

    Args:
      plan: the failures.
      tick: the ticks done so far.
      at: seconds (or the job's step, `unit="step"`) since the first step; None: no step yet.
      logs: the controller logs seen so far, in the order the controllers ran (the last one: the current).
      logs_at_kill: `len(logs)` when the last tick failed something (0: none yet).

    With `plan.after_commit` the controller started since the last failure (a log past `logs_at_kill`) must also
    have logged a committed checkpoint (:func:`committed_steps`): the old controller's log, still the last one
    until its replacement runs, does not count.
    """
    if at is None or not plan.every or (plan.max_ticks is not None and tick >= plan.max_ticks) \
            or at < (tick + 1) * plan.every:
        return False
    return not plan.after_commit or (len(logs) > logs_at_kill and bool(committed_steps(logs[-1])))


def _json_lines(log: Path) -> list[dict]:
    """Every JSON object line of `log` (`JsonFormatter`'s lines, with or without an `event` field)."""
    out = []
    for line in log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict):
            out.append(entry)
    return out


def _fail(cluster: LocalCluster, job: _Job, plan: Plan, tick: int, rng: random.Random, training: set[int],
          node_lost: bool) -> tuple[tuple[float, str, str] | None, str | None]:
    """One tick's failure (the module docstring): a training slice's worker SIGKILLed, or its node lost at tick
    `plan.node_loss_tick` (unless `node_lost`: a node is down already); with `plan.whole_job` the controller is
    SIGKILLed before it and every other worker after it.

    Returns:
      ((unix time, "pod" or "node", what), the lost node's name or None) once something failed; (None, None)
      when no worker was Running and Ready (the tick passes with no failure, in every kind of arm).
    """
    victims = job.running_workers(training)
    if not victims:
        return None, None
    index = rng.choice(sorted(victims))
    p = victims[index]
    # First the controller: killed after a worker, it would carry on (or save) without it.
    controllers = sum(job.kill(c, "controller") for c in job.pods(labels.ROLE_CONTROLLER)) if plan.whole_job else 0
    node = p["spec"]["nodeName"] if tick == plan.node_loss_tick and not node_lost else None
    if node is not None:
        cluster.fail_node(node)
        kind, what = "node", node
    else:
        kind, what = ("pod", f"slice {index}") if job.kill(p, "worker") else ("", "")
    if plan.whole_job:
        others = sum(job.kill(w, "worker") for w in job.pods(labels.ROLE_WORKER))
        if kind or controllers or others:
            kind = kind or "pod"
            what = f"{what or f'slice {index} (already gone)'}, {controllers} controller, {others} more workers"
    return ((time.time(), kind, what) if kind else None), node


def _backoffs(cluster: LocalCluster, namespace: str, name: str) -> int:
    """How many times the operator said a lost controller's replacement waits (ControllerBackOff Events)."""
    return sum(int(e.get("count") or 1) for e in job_events(cluster, namespace, name)
               if e.get("reason") == REASON_CONTROLLER_BACK_OFF)


def _keep_logs(logs: list[Path], workdir: Path) -> list[Path]:
    """Copies of the controller logs as `workdir/controller-<k>.log` (k: the order they ran), which outlive the
    cluster's pod folders (a cluster started again deletes them); a log never written has no copy."""
    kept = []
    for k, log in enumerate(logs):
        copy = workdir / f"controller-{k}.log"
        if log.exists():
            shutil.copyfile(log, copy)
        kept.append(copy)
    return kept


def _keep_worker_logs(cluster: LocalCluster, namespace: str, workdir: Path) -> dict[str, Path]:
    """Copies of every worker container log the node agents wrote for `namespace` (pods gone or not) as
    `workdir/worker-<pod uid>.log`; {pod uid: copy}."""
    kept = {}
    for log in sorted((cluster.state / "nodes").glob(f"*/pods/{namespace}/*/*/logs/worker.log")):
        uid = log.parent.parent.name
        kept[uid] = workdir / f"worker-{uid}.log"
        shutil.copyfile(log, kept[uid])
    return kept


def run_arm(cluster: LocalCluster, kubeconfig: Path, workdir: Path, steps: int, plan: Plan, rng: random.Random,
            ckpt_interval: int = 50, timeout_s: float = 1800.0, compilation_cache: bool = True, spares: int = 0,
            checkpoints: GcsCheckpoints | None = None, worker_env: list[dict] | None = None) -> ArmRun:
    """One cluster arm: its own namespace and operator, the job applied and followed to the end, `plan` injected.

    The namespace is deleted (and waited for, so the next arm finds the pool empty) and the operator stopped by
    PID before returning; a lost node is restored. A job not ended within `timeout_s` is deleted the same way
    and returned with `timed_out` (a synchronous job whose restarts take longer than the failure period never
    gets there).

    Args:
      cluster: a running local cluster with the :data:`POOL` nodes (:func:`chaos_nodes`) and the CRD.
      kubeconfig: the operator's identity (`write_operator_kubeconfig`).
      workdir: the operator's log, copies of the controller logs and the job's checkpoints (unless
        `checkpoints`) go here.
      steps: N.
      plan: the failures.
      rng: draws the victims.
      ckpt_interval: steps between checkpoints.
      timeout_s: the job must end within this.
      compilation_cache: the workers share a compilation cache (`cache_claim`, under `workdir/xla-cache`).
      spares: hot spare slices (`spec.slices.spares`).
      checkpoints: a bucket of its own for the job's checkpoints (they outlive the controller pod); None: a
        local folder, the controller pod's emptyDir.
      worker_env: spec.worker.env (e.g. `JAX_LOG_COMPILES=1`, whose cache hits `ArmRun.worker_logs` then show).

    Raises:
      ValueError: `plan.whole_job` without `checkpoints` (every recreated controller would start from step 0).
    """
    if plan.whole_job and checkpoints is None:
        raise ValueError("a whole_job plan recreates the controller pod: its checkpoints must outlive the pod "
                         "(checkpoints=GcsCheckpoints)")
    ns = create_namespace(cluster, f"chaos-{uuid.uuid4().hex[:6]}")
    name = "bench-chaos"
    job = _Job(cluster, ns, name)
    op = OperatorProcess(kubeconfig, workdir / "operator.log", free_port())
    failures: list[tuple[float, str, str]] = []
    lost_node: tuple[str, float] | None = None
    operator_back_at: float | None = None
    logs: list[Path] = []
    first_workers: frozenset[str] = frozenset()
    try:
        if compilation_cache:  # the admin's part: the volume, the claim, the operator's allow list
            op.extra_args.append(f"--allowed-compilation-cache-claims={cache_claim(cluster, ns, workdir / 'xla-cache')}")
        op.start()
        op.wait_up()
        manifest = job_manifest(name, steps, checkpoints.uri(ns) if checkpoints else workdir / "ckpt", ckpt_interval,
                                CACHE_CLAIM if compilation_cache else None, spares=spares,
                                controller_env=checkpoints.controller_env() if checkpoints else None,
                                worker_env=worker_env)
        t0 = time.time()
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(manifest))
        tick, origin = 0, None  # origin: the first step's time (unit s) or 0 (unit step)
        logs_at_kill = 0  # controller logs seen when the last whole-job tick killed the controller
        operator_at = None
        status: dict = {}
        timed_out = False
        while True:
            now = time.time()
            if now - t0 > timeout_s:
                timed_out = True
                break
            status = get_job(cluster, ns, name).get("status") or {}
            if status.get("phase") in ("Succeeded", "Failed"):
                break
            current = job.controller_log()
            if current is not None and current not in logs:
                logs.append(current)
            events = _steps(logs[-1] if logs else None)
            if plan.every and origin is None and events:
                origin = float(events[0]["ts"]) if plan.unit == "s" else 0.0
            at = (now - origin if plan.unit == "s" else (events[-1]["step"] if events else 0)) \
                if origin is not None else None
            trained_all = bool(events) and events[-1]["step"] >= steps
            if not trained_all and tick_due(plan, tick, at, logs, logs_at_kill):
                training = set(events[-1].get("active_slices", [])) if events else set()
                if not failures:
                    first_workers = frozenset(p["metadata"]["uid"] for p in job.pods(labels.ROLE_WORKER))
                failure, node = _fail(cluster, job, plan, tick, rng, training, lost_node is not None)
                if failure is not None:
                    failures.append(failure)
                    logs_at_kill = len(logs)
                if node is not None:
                    lost_node = (node, time.time() + plan.node_down_s)
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
        logs = _keep_logs(logs, workdir)
        log = logs[-1] if logs else None
        finished = next((e for e in reversed(read_events(log.read_text(errors="replace")))
                         if e.get("event") == "finished"), {}) if log is not None and log.exists() else {}
        return ArmRun(wall_s=wall, phase=status.get("phase", ""), status=status, finished=finished,
                      controller_logs=logs, failures=failures, timed_out=timed_out,
                      controller_backoffs=_backoffs(cluster, ns, name),
                      worker_logs=_keep_worker_logs(cluster, ns, workdir), first_workers=first_workers)
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

