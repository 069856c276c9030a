"""Pods → slice states: what the operator tells the controller about each slice.

Pure functions over `PodView`s (the few pod fields that matter, kept in the
operator's in-memory index). A slice goes Provisioning → Ready (every host
Running and Ready) → Down (a pod failed, vanished or is being replaced) →
Ready …; a Ready pod that gets a deletion timestamp *with a grace period*
(preemption, drain, `kubectl delete`) makes the slice Draining first, so the
controller can checkpoint before it goes. A force delete (grace 0) leaves no
time to act: it is a loss (Down), like a kill.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from elastic_jax.api import labels
from elastic_jax.api.status import SliceState
from elastic_jax.k8s_operator import names
from elastic_jax.supervision import slice_state
from elastic_jax.supervision.slice_state import Observation

# The pathways controller pod's resource-manager sidecar (backends.pathways.RM_CONTAINER;
# not imported: that module imports the renderers, this one stays a leaf).
RM_CONTAINER = "pathways-rm"


@dataclasses.dataclass(frozen=True)
class PodView:
    """The fields of a pod the operator needs.

    Attributes:
      name, uid: identity.
      role: "controller" or "worker".
      slice_index: the worker's slice (-1 for the controller).
      attempt: JobSet restart attempt (worker) or controller incarnation.
      host_index: the pod's host index within its slice.
      phase: Pending, Running, Succeeded, Failed (or "" when unknown).
      ready: the pod's Ready condition is True.
      pod_ip: status.podIP ("" until assigned).
      deleting: metadata.deletionTimestamp is set.
      deletion_grace_s: metadata.deletionGracePeriodSeconds (None when not deleting
        or not reported): 0 is a force delete, no time to act.
      deletion_deadline: metadata.deletionTimestamp (RFC 3339, "" when not deleting): the time the
        API server set for the kubelet to SIGKILL the pod (the delete's time plus its grace period).
      exit_code: the first terminated container's exit code, else None.
      reason: a short why (e.g. "exit code 137", "OOMKilled", "NodeLost").
      termination_message: the container's termination message, if any.
      finished_at: that terminated container's `finishedAt` (RFC 3339; "" when none): a controller's
        restart back-off counts from it (`supervision.backoff`).
      created: metadata.creationTimestamp (RFC 3339; sorts in time order).
      waiting_reason, waiting_message, waiting_image: the first container (or
        init/sidecar container) the kubelet holds in `waiting` with a reason other
        than ContainerCreating/PodInitializing (e.g. ImagePullBackOff), its
        message and image.
      unschedulable: the scheduler's message while PodScheduled is False ("" otherwise).
      node: spec.nodeName, the node the pod is bound to ("" until scheduled).
      rm_started: pathways controller pod: its resource-manager sidecar passed its
        startupProbe (listens on its port) and runs.
      rm_restarts: pathways controller pod: restarts of that sidecar in this pod.
      resource_version: metadata.resourceVersion of the object this view was read from
        ("" unknown): the tracker never applies an older view of a pod over a newer one.
    """

    name: str
    uid: str
    role: str
    slice_index: int
    attempt: int
    host_index: int
    phase: str
    ready: bool
    pod_ip: str
    deleting: bool
    exit_code: int | None = None
    reason: str = ""
    termination_message: str = ""
    created: str = ""
    deletion_grace_s: int | None = None
    deletion_deadline: str = ""
    waiting_reason: str = ""
    waiting_message: str = ""
    waiting_image: str = ""
    unschedulable: str = ""
    node: str = ""
    rm_started: bool = False
    rm_restarts: int = 0
    resource_version: str = ""
    finished_at: str = ""

    @property
    def terminal(self) -> bool:
        """The pod finished (Succeeded or Failed) and will not run again."""
        return self.phase in ("Succeeded", "Failed")


# Waiting reasons that are only a container starting, not a fault.
_STARTING = frozenset({"", "ContainerCreating", "PodInitializing"})


@dataclasses.dataclass(frozen=True)
class JobSetView:
    """The fields of a worker JobSet the operator needs."""

    name: str
    slice_index: int
    restarts: int = 0
    failed: bool = False
    message: str = ""
    deleting: bool = False
    head: str = ""
    created: str = ""  # metadata.creationTimestamp (RFC 3339)
    uid: str = ""  # metadata.uid: its Events are read by it, never by name alone; a JobSet created again under the same name restarts its count (`counters`)


def jobset_view(body: dict[str, Any], slice_index: int) -> JobSetView:
    """Extracts a `JobSetView` from a JobSet object."""
    status = body.get("status") or {}
    failed = next((c for c in status.get("conditions") or [] if c.get("type") == "Failed" and c.get("status") == "True"), None)
    return JobSetView(
        name=(body.get("metadata") or {}).get("name", ""),
        slice_index=slice_index,
        restarts=int(status.get("restarts") or 0),
        failed=failed is not None,
        message=(failed or {}).get("message", ""),
        deleting=bool((body.get("metadata") or {}).get("deletionTimestamp")),
        head=((body.get("metadata") or {}).get("annotations") or {}).get(labels.PATHWAYS_HEAD, ""),
        created=(body.get("metadata") or {}).get("creationTimestamp") or "",
        uid=(body.get("metadata") or {}).get("uid") or "",
    )


def _waiting(status: dict[str, Any]) -> tuple[str, str, str]:
    """(reason, message, image) of the first container held in a waiting state that is a fault."""
    for key in ("initContainerStatuses", "containerStatuses"):
        for cs in status.get(key) or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if waiting.get("reason", "") not in _STARTING:
                return waiting["reason"], (waiting.get("message") or "").strip()[:500], cs.get("image") or ""
    return "", "", ""


def _unschedulable(status: dict[str, Any]) -> str:
    for c in status.get("conditions") or []:
        if c.get("type") == "PodScheduled" and c.get("status") == "False":
            return f"{c.get('reason') or 'Unschedulable'}: {(c.get('message') or '').strip()[:500]}"
    return ""


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def pod_view(body: dict[str, Any]) -> PodView:
    """Extracts a `PodView` from a pod object (a dict as the API returns it)."""
    meta = body.get("metadata") or {}
    lab = meta.get("labels") or {}
    status = body.get("status") or {}
    role = lab.get(labels.ROLE, "")
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    exit_code, reason, message, finished_at = None, status.get("reason") or "", "", ""
    statuses = status.get("containerStatuses") or []
    # the controller pod's own container first (the pathways sidecars are init containers)
    statuses = sorted(statuses, key=lambda cs: cs.get("name") != labels.ROLE_CONTROLLER)
    for cs in statuses:
        term = (cs.get("state") or {}).get("terminated")
        if term:
            exit_code = term.get("exitCode")
            detail = term.get("reason") or ""
            reason = reason or (f"exit code {exit_code}" + (f" ({detail})" if detail and detail != "Error" else ""))
            message = (term.get("message") or "").strip()
            finished_at = term.get("finishedAt") or ""
            break
    waiting = _waiting(status)
    rm = next((cs for cs in status.get("initContainerStatuses") or [] if cs.get("name") == RM_CONTAINER), {})
    if role == labels.ROLE_CONTROLLER:
        attempt = _int(lab.get(labels.CONTROLLER_ATTEMPT), 0)
    else:
        attempt = _int(lab.get(labels.JOBSET_RESTART_ATTEMPT), 0)
    return PodView(
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        role=role,
        slice_index=_int(lab.get(labels.SLICE_INDEX), -1),
        attempt=attempt,
        host_index=_int(lab.get(labels.JOB_COMPLETION_INDEX), 0),
        phase=status.get("phase") or "",
        ready=ready,
        pod_ip=status.get("podIP") or "",
        deleting=bool(meta.get("deletionTimestamp")),
        deletion_grace_s=_int(meta["deletionGracePeriodSeconds"], 0) if meta.get("deletionGracePeriodSeconds") is not None else None,
        deletion_deadline=meta.get("deletionTimestamp") or "",
        exit_code=exit_code,
        reason=reason,
        termination_message=message[-4096:],  # the kubelet caps it at 4096 bytes (a log fallback: 2048)
        created=meta.get("creationTimestamp") or "",
        waiting_reason=waiting[0],
        waiting_message=waiting[1],
        waiting_image=waiting[2],
        unschedulable=_unschedulable(status) if (status.get("phase") or "Pending") == "Pending" else "",
        node=(body.get("spec") or {}).get("nodeName") or "",
        rm_started=bool(rm.get("started")) and "running" in (rm.get("state") or {}),
        rm_restarts=_int(rm.get("restartCount"), 0),
        resource_version=str(meta.get("resourceVersion") or ""),
        finished_at=finished_at,
    )


@dataclasses.dataclass(frozen=True)
class SliceObservation:
    """What one slice's pods show right now.

    Attributes:
      kind: Ready (all hosts Running+Ready), Draining (a live pod is being
        deleted with a grace period: time to act), Failed (a pod of the current
        attempt failed, was force-deleted, or vanished), NotReady.
      addresses: `podIP:port` per host, by host index (only for Ready).
      pods: names of the current attempt's pods.
      reason: why, for status and the controller.
      node: the lost node that failed the slice ("" otherwise).
    """

    kind: Observation
    addresses: tuple[str, ...] = ()
    pods: tuple[str, ...] = ()
    reason: str = ""
    node: str = ""


def drains(pod: PodView) -> bool:
    """The pod is being deleted with a grace period and still runs: a notice with time to act.

    A deletion timestamp alone is not enough: a force delete (grace 0) kills
    the pod at once, so it is a loss, not a drain.
    """
    return pod.deleting and not pod.terminal and pod.exit_code is None and (pod.deletion_grace_s or 0) > 0


def _superseded_dropped(current: list[PodView]) -> list[PodView]:
    """The attempt's pods without the finished ones whose host already has a Ready replacement.

    Backend pathways restarts a slice in place (`backends.pathways`: the Job's backoffLimit is hosts x
    maxRestartsPerSlice): an evicted or failed worker pod stays listed, phase Failed, while its Job runs a
    new pod of the same completion index in the same JobSet attempt. Until that replacement is Running and
    Ready the failed pod is the truth (the slice is down); once it is, the failed one is history, or the
    slice would read Failed for as long as the Job keeps its failed pods (found by e2e/test_kwok_pathways.py).
    """
    ready_hosts = {p.host_index for p in current if p.phase == "Running" and p.ready and not p.deleting}
    return [p for p in current if not (p.terminal and p.host_index in ready_hosts)]


def observe_slice(pods: list[PodView], hosts_per_slice: int, port: int = names.WORKER_PORT,
                  known: tuple[str, ...] = (), lost_nodes: Mapping[str, str] | None = None) -> SliceObservation:
    """Classifies one slice from its worker pods.

    Only the newest JobSet restart attempt counts: pods of older attempts are
    leftovers being cleaned up.

    Args:
      pods: the slice's worker pods (any attempts).
      hosts_per_slice: hosts a complete slice has.
      port: the workers' port, for the addresses.
      known: the pods of the slice's last observation; one of them missing now
        and no replacement Ready was deleted without a graceful period (or its
        grace passed unseen): a loss, reported as Failed "deleted".
      lost_nodes: node name -> why, for nodes not Ready longer than the operator's
        bound (`nodes.lost_nodes`): a current pod bound to one is lost whatever
        its phase says (a dead kubelet reports nothing), Failed naming the node.
    """
    if not pods:
        if known:
            return SliceObservation("Failed", reason=f"pod {known[0]} deleted (killed; no graceful notice seen)")
        return SliceObservation("NotReady", reason="no worker pod")
    newest = max(p.attempt for p in pods)
    current = sorted((p for p in pods if p.attempt == newest), key=lambda p: (p.host_index, p.created))
    current = _superseded_dropped(current)
    pod_names = tuple(p.name for p in current)
    # First: a pod on a lost node looks Running (or Terminating) for as long as the node is
    # dead; the node's loss is the truth, and it names what to look at.
    stranded = next((p for p in current if p.node and p.node in (lost_nodes or {}) and not p.terminal), None)
    if stranded is not None:
        return SliceObservation("Failed", pods=pod_names, node=stranded.node,
                                reason=f"pod {stranded.name}: node {stranded.node} lost: {lost_nodes[stranded.node]}")
    failed = [p for p in current if p.phase == "Failed" or (p.exit_code is not None and not p.deleting)]
    if failed:
        p = failed[0]
        return SliceObservation("Failed", pods=pod_names, reason=f"pod {p.name}: {p.reason or 'failed'}")
    forced = [p for p in current if p.deleting and not drains(p)]
    if forced:
        p = forced[0]
        how = "force-deleted (grace 0)" if p.deletion_grace_s == 0 else "deleted, no time left to act"
        return SliceObservation("Failed", pods=pod_names, reason=f"pod {p.name} {how}: killed")
    deleting = [p for p in current if drains(p)]
    if deleting:
        p = deleting[0]
        return SliceObservation("Draining", pods=pod_names,
                                reason=f"pod {p.name} is being deleted (grace {p.deletion_grace_s} s)")
    gone = [n for n in known if n not in {p.name for p in pods}]
    live = [p for p in current if p.phase == "Running" and p.ready and p.pod_ip]
    if gone and len(live) < hosts_per_slice:
        return SliceObservation("Failed", pods=pod_names, reason=f"pod {gone[0]} deleted (killed; no graceful notice seen)")
    if len(live) >= hosts_per_slice:
        addresses = tuple(f"{p.pod_ip}:{port}" for p in live[:hosts_per_slice])
        return SliceObservation("Ready", addresses=addresses, pods=pod_names)
    stuck = next((p for p in current if p.waiting_reason), None)
    why = f"; pod {stuck.name}: {stuck.waiting_reason} ({stuck.waiting_image})" if stuck else ""
    return SliceObservation("NotReady", pods=pod_names, reason=f"{len(live)}/{hosts_per_slice} hosts ready{why}")


def next_slice_state(previous: SliceState | None, observation: SliceObservation) -> SliceState:
    """The slice's new state given its previous state and what its pods show (the supervision core's
    `slice_state.next_slice_state`, which the local launcher drives too)."""
    return slice_state.next_slice_state(previous, observation.kind)


def group_by_slice(pods: list[PodView], count: int) -> dict[int, list[PodView]]:
    """Worker pods by slice index 0..count-1 (pods of other indices are ignored)."""
    out: dict[int, list[PodView]] = {i: [] for i in range(count)}
    for p in pods:
        if p.role == labels.ROLE_WORKER and p.slice_index in out:
            out[p.slice_index].append(p)
    return out
