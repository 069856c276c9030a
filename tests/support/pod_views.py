"""`PodView`s for the operator's decision tests, by keyword: a worker or a controller, defaults for the rest.

Each test names only the fields its case is about (phase, readiness, exit code, node, deletion), instead of
the 10 positional fields `PodView` needs (the issue-30 review: "13-argument positional `PodView(...)`s").
"""

from __future__ import annotations

from typing import Any

from elastic_jax.k8s_operator.slices import PodView


def _reason(exit_code: int | None, reason: str | None) -> str:
    """The pod's short why: given, else `exit code N` as `pod_view` derives it from a terminated container."""
    if reason is not None:
        return reason
    return "" if exit_code is None else f"exit code {exit_code}"


def worker_view(name: str, slice_index: int = 0, *, uid: str | None = None, attempt: int = 0, host: int = 0,
                phase: str = "Running", ready: bool = True, ip: str = "127.0.10.3", deleting: bool = False,
                exit_code: int | None = None, reason: str | None = None, **fields: Any) -> PodView:
    """A worker pod of slice `slice_index` (uid: its name unless given); other `PodView` fields by keyword."""
    return PodView(name=name, uid=name if uid is None else uid, role="worker", slice_index=slice_index,
                   attempt=attempt, host_index=host, phase=phase, ready=ready, pod_ip=ip, deleting=deleting,
                   exit_code=exit_code, reason=_reason(exit_code, reason), **fields)


def controller_view(attempt: int = 0, *, name: str | None = None, uid: str | None = None, phase: str = "Running",
                    ready: bool | None = None, ip: str = "127.0.10.2", deleting: bool = False,
                    exit_code: int | None = None, reason: str | None = None, **fields: Any) -> PodView:
    """The controller pod of incarnation `attempt` (name `demo-controller-<attempt>`, uid `uid<attempt>` unless
    given; ready while Running unless given); other `PodView` fields by keyword."""
    return PodView(name=f"demo-controller-{attempt}" if name is None else name,
                   uid=f"uid{attempt}" if uid is None else uid, role="controller", slice_index=-1, attempt=attempt,
                   host_index=0, phase=phase, ready=phase == "Running" if ready is None else ready, pod_ip=ip,
                   deleting=deleting, exit_code=exit_code, reason=_reason(exit_code, reason), **fields)
