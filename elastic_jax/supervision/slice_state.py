"""One slice's state as its supervisor sees it, and the reports it sends the controller (pure).

A slice goes Provisioning (never Ready yet: the controller is not told) →
Ready (every host up) → Down (a host failed, vanished or is being replaced) →
Ready …; a Ready slice whose host is being deleted with a grace period is
Draining first, so the controller can checkpoint before it goes. Each report
(`PUT /v1/slices/{i}`) carries a generation; the controller applies only a
generation above the last one it applied for that slice.
"""

from __future__ import annotations

import time
from typing import Literal

from elastic_jax.api.status import SliceState  # the supervisor's state of a slice, as status shows it

Observation = Literal["Ready", "Draining", "Failed", "NotReady"]
"""What a slice's hosts show right now: Ready (all hosts up and reachable), Draining (a live host is
being deleted with time to act), Failed (a host died, was force-deleted or vanished), NotReady
(starting, or some hosts not up yet)."""


def next_slice_state(previous: SliceState | None, observation: Observation) -> SliceState:
    """The slice's new state given its previous state and what its hosts show.

    A slice that was never Ready and has no failed host is Provisioning (the
    controller is not told); a failed host makes it Down, Ready before or not
    (the controller learns that the slice it waits for is failing, and the
    reason); once it has been Ready, anything short of Ready is Down (or
    Draining while a live host is being deleted).

    Args:
      previous: the state before this observation (None: first observation).
      observation: see `Observation`.
    """
    seen_ready = previous in ("Ready", "Draining", "Down")
    if observation == "Ready":
        return "Ready"
    if observation == "Draining":
        return "Draining" if previous in ("Ready", "Draining") else (previous or "Provisioning")
    if observation == "Failed":
        return "Down"
    return "Down" if seen_ready else "Provisioning"


def reported(state: SliceState) -> bool:
    """Whether the controller is told this state (a Provisioning slice is one it does not have yet)."""
    return state != "Provisioning"


def is_loss(previous: SliceState, new: SliceState, teardown: bool) -> bool:
    """Whether this transition is a slice lost in service: Ready (or Draining) → Down, outside a teardown.

    A teardown (the job finished, suspended or deleted; the slice's JobSet
    removed on purpose) takes slices Down with no loss.
    """
    return new == "Down" and previous in ("Ready", "Draining") and not teardown


def next_generation(last: int, now_ns: int | None = None) -> int:
    """The generation of a slice's next report: above `last`, and nanoseconds since the epoch.

    The epoch time keeps generations increasing across supervisor restarts
    (no stored counter) and above any report an earlier supervisor made; the
    `last + 1` floor keeps them strictly increasing when two reports fall in
    the same nanosecond or the clock steps back, since the controller drops a
    generation that is not above the last one it applied.

    Args:
      last: the generation this supervisor last sent for the slice (0: none).
      now_ns: `time.time_ns()` (tests pass their own).
    """
    return max(last + 1, time.time_ns() if now_ns is None else now_ns)


def down_cause(status, index: int) -> str:
    """Why the controller lost slice `index`, as it said: the cause of the newest record of its
    `recovery_history` (a `ControllerStatus`'s) naming the slice (`slice_down`, `step_deadline` for a
    hung step, `draining`), "" when none does. A supervisor replacing the slice's worker names it."""
    return next((r.cause for r in reversed(status.recovery_history) if index in r.slices and r.cause != "scale_up"),
                "")


def controller_saw_down(controller_state: str, controller_generation: int, state: SliceState,
                        ready_generation: int | None) -> bool:
    """The replace rule: the controller holds a slice Down that its supervisor sees Ready.

    The controller marks a slice Down itself (a hung step past its deadline, a
    Ready address that does not answer) keeping the generation of the Ready it
    applied. Its view counts when that generation is at least the one of the
    supervisor's accepted Ready: equal, the controller saw the slice fail after
    it; above, someone else's newer Down superseded it (and the controller will
    not use the slice until a newer Ready, which only a replacement brings).
    Below, the view was read before the supervisor's Ready was applied: stale,
    and acting on it would kill a fresh worker.

    Args:
      controller_state: the slice's state in the controller's `GET /v1/status`.
      controller_generation: its generation there.
      state: the supervisor's state of the slice.
      ready_generation: generation of the supervisor's Ready that this controller
        process accepted (None: it accepted none).

    Returns:
      True when the supervisor should replace the slice's worker(s).
    """
    return (controller_state == "Down" and state == "Ready" and ready_generation is not None
            and controller_generation >= ready_generation)
