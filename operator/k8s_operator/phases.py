"""The job's `status.phase`: the one place a phase is chosen (pure).

Everything else reads it: the status builder writes what `phase` returns, and the job's finish
(`Succeeded`/`Failed`) is decided by the reconcile plan and handed in as `finished`.
"""

from __future__ import annotations

from elastic_jax.api.control import ENDED_PHASES
from elastic_jax.api.status import Phase

TRAINING_PHASES = ("Running", "Degraded", "Recovering")


def phase(
    *,
    finished: str | None,
    suspended: bool,
    controller_phase: str | None,
    slice_states: list[str],
    active_slices: int,
    desired_slices: int,
    trained: bool = True,
    stopping: bool = False,
    previous: str = "",
    restarting: bool = False,
    unresponsive: bool = False,
) -> Phase:
    """The job's phase from what the operator observed in this pass.

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
      previous: the phase the job's status holds before this pass. While it is `Pending` and `trained` is
        False the job stays Pending whatever the controller says: a first step that fails while it compiles
        is no recovery of a job that never trained (it flapped Pending/Recovering).
      restarting: the controller pod is being replaced (`controller_restart.restarting`; never while suspended
        or finished).
      unresponsive: the controller stopped answering while its pod runs (frozen or wedged).

    Returns:
      Succeeded/Failed when finished; Suspending while a suspended job's controller still runs, then
      Suspended. Otherwise, for a job that was training (`previous` in `TRAINING_PHASES`): Recovering while its
      controller is replaced; its previous phase while the controller is briefly unreachable or has ended and
      not exited yet (a job that succeeded read Running -> Degraded -> Succeeded); Degraded (or Recovering, if
      it was) while the controller is unresponsive (no step is seen to move; not a phase of its own: an older
      CRD's phase enum refuses a new one). Else from the controller's answer: Pending until the controller
      trains (also while it waits at start for slices still coming up, some Ready and some not: a pool added
      late); Recovering while a lost slice is being handled, or the controller waits for slices after it
      trained; Degraded while training on fewer slices than desired; Running otherwise.
    """
    if finished:
        return finished  # type: ignore[return-value]
    if suspended:
        return "Suspending" if stopping else "Suspended"
    was_training = previous in TRAINING_PHASES
    if restarting and was_training:
        return "Recovering"
    if was_training and (controller_phase is None or controller_phase in ENDED_PHASES):
        chosen: Phase = previous  # type: ignore[assignment]
    else:
        chosen = _from_answer(controller_phase, slice_states, active_slices, desired_slices, trained,
                              started=previous != "Pending")
    if unresponsive and not restarting and chosen in TRAINING_PHASES:
        return "Recovering" if chosen == "Recovering" else "Degraded"
    return chosen


def _from_answer(controller_phase: str | None, slice_states: list[str], active_slices: int, desired_slices: int,
                 trained: bool, started: bool) -> Phase:
    """The phase the controller's answer and the slices say (`phase`'s last case)."""
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
