"""Steps a new controller did not resume, and where their goodput seconds go (pure; both supervisors).

A controller that ends without ending the job (the operator's lost controller
pod, the local launcher's killed controller process) is replaced by one that
resumes from the newest committed checkpoint it can read. The steps between
that step and the step the job had reached were trained and thrown away, so
their seconds, which the earlier controllers' ledgers booked `productive` or
`reduced`, were not goodput: they are re-booked `recovering`, as the
controller's own ledger books steps it re-does after restoring lost state
(`controller.goodput`, "recovering").

The lost steps are booked at the mean training seconds per step of the work
they were part of: their share of the steps the earlier ledger trained,
lost / (reached - trained_from), of its productive and reduced seconds (and of
its reduced-capacity equivalent seconds, which goodput counts).

Used by the operator (`elastic_jax.k8s_operator.steps_lost`, over
`status.counterBase`) and by `elastic-jax run` (`elastic_jax.local.launcher`,
over the ledgers of the controller processes it restarted), so a restart costs
the same goodput on a cluster and on one machine.
"""

from __future__ import annotations

from collections.abc import Mapping

TRAINING = ("productive", "reduced")


def lost_at_resume(step_reached: int, resumed: int) -> int:
    """Steps lost when a controller resumes from step `resumed` after the job had reached `step_reached`
    (0 when it resumed at or past it)."""
    return max(0, step_reached - resumed)


def lost_share(lost: int, step_reached: int, trained_from: int) -> float:
    """The share (0..1) of the earlier ledger's training seconds that `lost` steps account for.

    Args:
      lost: steps lost (`lost_at_resume`).
      step_reached: the step the job had reached.
      trained_from: the step the earlier ledger started training from (the first controller's resumed step).

    Returns:
      lost / (step_reached - trained_from), clipped to [0, 1]; 0 when the ledger trained no step.
    """
    trained = step_reached - trained_from
    if lost <= 0 or trained <= 0:
        return 0.0
    return min(1.0, lost / trained)


def rebook_lost(seconds: Mapping[str, float], earlier: Mapping[str, float], share: float,
                equivalent: float = 0.0, earlier_equivalent: float = 0.0) -> tuple[dict[str, float], float]:
    """`seconds` with `share` of `earlier`'s productive and reduced seconds moved to `recovering`.

    Args:
      seconds: the ledger to correct (seconds per goodput category: the earlier controllers' alone, or
        theirs plus the live controller's, which re-booked nothing of theirs).
      earlier: the earlier controllers' ledger, whose steps were lost.
      share: `lost_share`.
      equivalent: `seconds`' reduced seconds x active/desired slices (what goodput counts of them).
      earlier_equivalent: the same of `earlier`.

    Returns:
      (the seconds per category, never negative; the equivalent seconds less the lost share of
      `earlier_equivalent`). Unchanged when `share` is 0.
    """
    out = dict(seconds)
    if share <= 0:
        return out, equivalent
    share = min(1.0, share)
    moved = 0.0
    for category in TRAINING:
        part = earlier.get(category, 0.0) * share
        out[category] = max(0.0, out.get(category, 0.0) - part)
        moved += part
    out["recovering"] = out.get("recovering", 0.0) + moved
    return out, max(0.0, equivalent - earlier_equivalent * share)


def goodput_fraction(seconds: Mapping[str, float], equivalent: float) -> float | None:
    """(productive + reduced equivalent) / wall over `seconds` (the goodput ledger's definition), in [0, 1];
    None while no second was booked. (Whether a step was made, when goodput is "n/a", is the caller's:
    after a re-booking a job that trained may have no training second left.)"""
    wall = sum(seconds.values())
    if wall <= 0:
        return None
    return min(1.0, (seconds.get("productive", 0.0) + min(equivalent, seconds.get("reduced", 0.0))) / wall)
