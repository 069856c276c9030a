"""Kubernetes-style conditions and the job's phase: pure functions over status dicts."""

from __future__ import annotations

import datetime as dt
from typing import Any

from elastic_jax.api.status import Phase


def now_rfc3339() -> str:
    """The current UTC time as Kubernetes writes it (second precision, Z suffix)."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: list[dict[str, Any]],
    type_: str,
    status: str,
    reason: str,
    message: str,
    generation: int,
    now: str,
) -> list[dict[str, Any]]:
    """Returns `conditions` with `type_` set; lastTransitionTime changes only when status does.

    Args:
      conditions: the current list (not modified).
      type_, status, reason, message: the condition.
      generation: metadata.generation it was computed for (observedGeneration).
      now: RFC 3339 time used if the status changes.
    """
    out = []
    found = False
    for c in conditions:
        if c.get("type") == type_:
            found = True
            since = c.get("lastTransitionTime") if c.get("status") == status else now
            out.append({"type": type_, "status": status, "reason": reason, "message": message,
                        "lastTransitionTime": since or now, "observedGeneration": generation})
        else:
            out.append(dict(c))
    if not found:
        out.append({"type": type_, "status": status, "reason": reason, "message": message,
                    "lastTransitionTime": now, "observedGeneration": generation})
    return out


def get_condition(conditions: list[dict[str, Any]], type_: str) -> dict[str, Any] | None:
    """The condition of `type_`, or None."""
    return next((c for c in conditions if c.get("type") == type_), None)


def derive_phase(
    *,
    finished: str | None,
    suspended: bool,
    controller_phase: str | None,
    slice_states: list[str],
    active_slices: int,
    desired_slices: int,
) -> Phase:
    """The job's phase from what the operator observed.

    Args:
      finished: "Succeeded" or "Failed" once the job ended, else None.
      suspended: spec.suspend is true and the job is torn down.
      controller_phase: the controller's own phase (`GET /v1/status`), None when unreachable.
      slice_states: the operator's per-slice states.
      active_slices: slices in the controller's training mesh.
      desired_slices: spec.slices.count.

    Returns:
      Succeeded/Failed when finished; Suspended; Pending until the controller
      trains; Recovering while a lost slice is being handled; Degraded while
      training on fewer slices than desired; Running otherwise.
    """
    if finished:
        return finished  # type: ignore[return-value]
    if suspended:
        return "Suspended"
    if controller_phase in (None, "Starting") or (controller_phase == "WaitingForSlices" and
                                                 all(s == "Provisioning" for s in slice_states)):
        return "Pending"
    lost = any(s in ("Down", "Draining") for s in slice_states)
    if controller_phase == "Recovering" or (controller_phase == "WaitingForSlices" and lost):
        return "Recovering"
    if active_slices < desired_slices:
        return "Degraded"
    return "Running"
