"""Kubernetes-style conditions and the job's phase: pure functions over the typed status."""

from __future__ import annotations

import datetime as dt

from elastic_jax.api.status import REASON_CONTROLLER_ANSWERING, REASON_CONTROLLER_GONE, Condition, ConditionStatus, Phase


def now_rfc3339() -> str:
    """The current UTC time as Kubernetes writes it (second precision, Z suffix)."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: list[Condition],
    type_: str,
    status: ConditionStatus,
    reason: str,
    message: str,
    generation: int,
    now: str,
) -> list[Condition]:
    """Returns `conditions` with `type_` set; lastTransitionTime changes only when status does.

    Args:
      conditions: the current list (not modified).
      type_, status, reason, message: the condition (reason: an `elastic_jax.api.status.REASON_*`).
      generation: metadata.generation it was computed for (observedGeneration).
      now: RFC 3339 time used if the status changes.
    """
    out = []
    found = False
    for c in conditions:
        if c.type == type_:
            found = True
            since = c.last_transition_time if c.status == status else now
            out.append(Condition(type=type_, status=status, reason=reason, message=message,
                                 last_transition_time=since or now, observed_generation=generation))
        else:
            out.append(c.model_copy())
    if not found:
        out.append(Condition(type=type_, status=status, reason=reason, message=message,
                             last_transition_time=now, observed_generation=generation))
    return out


def get_condition(conditions: list[Condition], type_: str) -> Condition | None:
    """The condition of `type_`, or None."""
    return next((c for c in conditions if c.type == type_), None)


def derive_phase(
    *,
    finished: str | None,
    suspended: bool,
    controller_phase: str | None,
    slice_states: list[str],
    active_slices: int,
    desired_slices: int,
    trained: bool = True,
    stopping: bool = False,
    started: bool = True,
) -> Phase:
    """The job's phase from what the operator observed.

    Args:
      finished: "Succeeded" or "Failed" once the job ended, else None.
      suspended: spec.suspend is true and the job is torn down.
      controller_phase: the controller's own phase (`GET /v1/status`), None when unreachable.
      slice_states: the operator's per-slice states.
      active_slices: slices in the controller's training mesh.
      desired_slices: spec.slices.count.
      trained: this controller has completed a step (beyond the one it resumed from).
      stopping: with `suspended`, a controller container still runs (`reconcile.Plan.suspend_waits_for`): it may
        still make a step before it checkpoints and exits.
      started: the job left Pending before (its previous phase was not Pending). While it has not, and
        `trained` is False, it stays Pending whatever the controller says: a first step that fails while
        it compiles is no recovery of a job that never trained (it flapped Pending/Recovering).

    Returns:
      Succeeded/Failed when finished; Suspending while a suspended job's controller still runs, then
      Suspended; Pending until the controller
      trains (also while it waits at start for slices still coming up, some
      Ready and some not: a pool added late); Recovering while a lost slice is
      being handled, or the controller waits for slices after it trained;
      Degraded while training on fewer slices than desired; Running otherwise.
    """
    if finished:
        return finished  # type: ignore[return-value]
    if suspended:
        return "Suspending" if stopping else "Suspended"
    if not started and not trained:
        return "Pending"
    lost = any(s in ("Down", "Draining") for s in slice_states)
    waiting = controller_phase == "WaitingForSlices"
    if controller_phase in (None, "Starting") or (waiting and not lost and
                                                 (not trained or all(s == "Provisioning" for s in slice_states))):
        # Waiting at start is not training on fewer slices: "Degraded" would say it trains.
        return "Pending"
    if controller_phase == "Recovering" or waiting:
        return "Recovering"
    if active_slices < desired_slices:
        return "Degraded"
    return "Running"


# (reason, Event message) of a controller-answer condition that turns False because a good answer came.
ANSWERED_AGAIN = (REASON_CONTROLLER_ANSWERING, "the controller answers again")
# ... because the job was suspended or finished: its controller is stopped, nothing is asked of it any more.
JOB_STOPPED = (REASON_CONTROLLER_GONE, "the job is suspended or finished: its controller is no longer asked")
