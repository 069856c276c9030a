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


def pod_faults(pods: list[PodView]) -> dict[str, PodFault]:
    """The first fault of each condition type over the job's live pods, controller first."""
    out: dict[str, PodFault] = {}
    for pod in sorted(pods, key=lambda p: (p.slice_index >= 0, p.slice_index, p.host_index, p.name)):
        fault = pod_fault(pod)
        if fault is not None and fault.condition not in out:
            out[fault.condition] = fault
    return out
