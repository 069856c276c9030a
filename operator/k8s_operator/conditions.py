"""Kubernetes-style conditions: pure functions over the typed status (the phase: `phases`)."""

from __future__ import annotations

from elastic_jax.api.status import REASON_CONTROLLER_ANSWERING, REASON_CONTROLLER_GONE, Condition, ConditionStatus
from elastic_jax.k8s_operator.clock import Clock, rfc3339


def now_rfc3339(clock: Clock) -> str:
    """`clock`'s current UTC time as Kubernetes writes it (second precision, Z suffix)."""
    return rfc3339(clock.now())


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


# (reason, Event message) of a controller-answer condition that turns False because a good answer came.
ANSWERED_AGAIN = (REASON_CONTROLLER_ANSWERING, "the controller answers again")
# ... because the job was suspended or finished: its controller is stopped, nothing is asked of it any more.
JOB_STOPPED = (REASON_CONTROLLER_GONE, "the job is suspended or finished: its controller is no longer asked")
