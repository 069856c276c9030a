"""Pods that cannot start → one condition each, with the kubelet's or scheduler's own words (pure).

A pod whose image cannot be pulled, or that the scheduler cannot place, is
not a failure the operator repairs by deleting and recreating it: the
kubelet retries the pull with its own back-off, and the scheduler retries
placement (a cluster autoscaler may add a node). The operator says so, once,
in a condition naming the pod, the image and the message, and counts nothing
(no slice replacement, no controller restart, no `elasticity.maxRestarts`).
"""

from __future__ import annotations

import dataclasses

from elastic_jax.api import status as st
from elastic_jax.k8s_operator.slices import PodView

# Container waiting reasons meaning "the image cannot be pulled" (kubelet's images.Err* names).
IMAGE_PULL_REASONS = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
                                "RegistryUnavailable", "ErrImageInspect"})


@dataclasses.dataclass(frozen=True)
class PodFault:
    """One condition's worth of a pod that cannot start.

    Attributes:
      condition: `COND_IMAGE_PULL_FAILED` or `COND_PODS_NOT_STARTING`.
      reason: the kubelet's or scheduler's reason (ImagePullBackOff, Unschedulable, ...).
      message: names the pod, its role, the image and the kubelet's/scheduler's message.
    """

    condition: str
    reason: str
    message: str


def image_pull_failed(pod: PodView) -> bool:
    """The kubelet cannot pull one of the pod's images."""
    return pod.waiting_reason in IMAGE_PULL_REASONS


def pod_fault(pod: PodView) -> PodFault | None:
    """Why `pod` cannot start, or None (running, starting normally, finished or being deleted)."""
    if pod.deleting or pod.terminal:
        return None
    role = "controller" if pod.slice_index < 0 else f"slice {pod.slice_index} worker"
    if image_pull_failed(pod):
        return PodFault(st.COND_IMAGE_PULL_FAILED, pod.waiting_reason,
                        f"{role} pod {pod.name}: image {pod.waiting_image or '(unknown)'} cannot be pulled "
                        f"({pod.waiting_reason}): {pod.waiting_message or 'no message from the kubelet'}; "
                        "the kubelet retries with back-off")
    if pod.unschedulable:
        reason, _, message = pod.unschedulable.partition(": ")
        # Workers are not held back or torn down for this (docs/failure-handling.md): say what they cost.
        held = (" (the slices' workers keep their nodes meanwhile; spec.suspend: true releases them)"
                if pod.slice_index < 0 else "")
        return PodFault(st.COND_PODS_NOT_STARTING, reason,
                        f"{role} pod {pod.name} cannot be scheduled: {message or reason}{held}")
    if pod.waiting_reason:  # CreateContainerConfigError, RunContainerError, ...
        return PodFault(st.COND_PODS_NOT_STARTING, pod.waiting_reason,
                        f"{role} pod {pod.name}: container cannot start ({pod.waiting_reason}): "
                        f"{pod.waiting_message or 'no message from the kubelet'}")
    return None


# At most this many pods are quoted in one condition message (the rest are counted).
_MAX_QUOTED = 4


def pod_faults(pods: list[PodView]) -> dict[str, PodFault]:
    """One fault per condition type over the job's live pods, controller first.

    ImagePullFailed names the first pod (one image is the usual cause). PodsNotStarting names
    every slice that waits (a TPU node pool still provisioning holds back its slice only), each
    with the first waiting pod's scheduler/kubelet message, and ends with `[slices waiting: ...]`;
    its reason is the first pod's.
    """
    out: dict[str, PodFault] = {}
    waiting: dict[int, PodFault] = {}  # slice index (-1: the controller) -> its first PodsNotStarting fault
    for pod in sorted(pods, key=lambda p: (p.slice_index >= 0, p.slice_index, p.host_index, p.name)):
        fault = pod_fault(pod)
        if fault is None:
            continue
        if fault.condition == st.COND_PODS_NOT_STARTING:
            waiting.setdefault(pod.slice_index, fault)
        elif fault.condition not in out:
            out[fault.condition] = fault
    if waiting:
        first = next(iter(waiting.values()))
        quoted = [f.message for f in list(waiting.values())[:_MAX_QUOTED]]
        if len(waiting) > _MAX_QUOTED:
            quoted.append(f"and {len(waiting) - _MAX_QUOTED} more")
        slices = [i for i in waiting if i >= 0]
        suffix = f" [slices waiting: {', '.join(map(str, slices))}]" if slices else ""
        out[st.COND_PODS_NOT_STARTING] = PodFault(st.COND_PODS_NOT_STARTING, first.reason,
                                                  "; ".join(quoted) + suffix)
    return out


@dataclasses.dataclass(frozen=True)
class RefusalEvent:
    """A Warning Event another controller posted on one of the job's JobSets or Jobs (the fields that matter).

    Attributes:
      kind, name: the involved object (JobSet, Job).
      reason: the controller's reason (FailedCreate: the Job controller could not create a pod).
      message: the controller's message: the API server's refusal (quota, LimitRange, PodSecurity, webhook).
      last: RFC 3339 time of its last occurrence ("" when unknown).
    """

    kind: str
    name: str
    reason: str
    message: str
    last: str = ""


def slices_missing_pods(pods: list[PodView], jobset_created: dict[int, str], hosts_per_slice: int) -> list[int]:
    """Slices whose JobSet exists (index -> its creation time) but which have fewer live pods than hosts."""
    live: dict[int, int] = {}
    for p in pods:
        if p.slice_index >= 0 and not p.terminal and not p.deleting:
            live[p.slice_index] = live.get(p.slice_index, 0) + 1
    return sorted(i for i in jobset_created if live.get(i, 0) < hosts_per_slice)


def creation_fault(slice_index: int, events: list[RefusalEvent], since: str) -> PodFault | None:
    """The PodsNotStarting fault of a slice whose pods another controller could not create, or None.

    Args:
      slice_index: the slice (its pods are missing).
      events: Warning Events on the slice's JobSet and Job.
      since: the JobSet's creation time: older Events are an earlier incarnation's.

    Returns:
      A fault naming the object, the controller's reason and the API server's message (newest Event).
    """
    fresh = [e for e in events if e.reason.startswith("Failed") or e.reason.endswith("Failed")]
    fresh = [e for e in fresh if not since or not e.last or e.last >= since]
    if not fresh:
        return None
    event = max(fresh, key=lambda e: e.last)
    return PodFault(st.COND_PODS_NOT_STARTING, event.reason,
                    f"slice {slice_index} worker pods cannot be created: {event.kind} {event.name}: "
                    f"{event.reason}: {event.message}")


# How the API server words a 422 (apimachinery `errors.NewInvalid`: `<Kind> "<name>" is invalid: <field>: ...`),
# as the Job controller passes it on in its FailedCreate Event.
INVALID_MARK = " is invalid: "


def invalid_refusal(fault: PodFault | None) -> bool:
    """Whether a PodsNotStarting fault is the API server finding the pod template invalid (a 422): the spec
    copied into it is wrong, so no retry can create the pods (unlike a quota or an admission webhook)."""
    return fault is not None and fault.condition == st.COND_PODS_NOT_STARTING and INVALID_MARK in fault.message
