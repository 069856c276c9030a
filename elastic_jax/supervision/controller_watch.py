"""Whether a live controller has stopped answering, and what its ledger booked meanwhile (pure; both supervisors).

A controller process that lives but does not answer its control API (SIGSTOPped,
a VM pause, wedged in a native call holding the GIL) makes no steps; its
process does not exit, so no exit code tells. Both supervisors watch the same
thing: the seconds since its last answer, counted once it answered at least
once (before that it is starting, which the pod or the process start tells).
The operator says so in condition `ControllerUnresponsive`
(`elastic_jax.k8s_operator.tracker`, grace `UNRESPONSIVE_GRACE_S`: above one
status long poll's wait); `elastic-jax run` on its progress output and in its
summary (`elastic_jax.local.launcher`, grace `LOCAL_UNRESPONSIVE_GRACE_S`: it
polls every 0.1 s with a 2 s timeout, so a few missed polls are no news).

The controller's own goodput ledger cannot see the freeze: its monotonic clock
ran on while it was stopped, so the frozen seconds land in the category it was
in, `productive` for a training controller. `rebook_frozen` moves them to
`recovering` (a fault's time until training goes on), so a freeze is never
counted as goodput.
"""

from __future__ import annotations

from collections.abc import Mapping

from elastic_jax.supervision.steps_lost import TRAINING

# Seconds (cluster) a controller may go without answering before the job says so: above one status long
# poll's wait (25 s, its deadline 27 s: a frozen controller's watch fails once), well under the bound of the
# controller pod's livenessProbe (~150 s).
UNRESPONSIVE_GRACE_S = 20.0
# Seconds (`elastic-jax run`): the launcher polls every 0.1 s with a 2 s timeout; several failed polls in a
# row, not one slow answer on a loaded machine.
LOCAL_UNRESPONSIVE_GRACE_S = 10.0


def unresponsive_seconds(answered_at: float | None, now: float, grace_s: float) -> float | None:
    """Seconds the controller has gone without answering, once that reached `grace_s`; else None.

    Args:
      answered_at: when it last answered (monotonic seconds); None when it never answered (starting:
        not this rule's to tell) or answers now.
      now: monotonic seconds.
      grace_s: `UNRESPONSIVE_GRACE_S` or `LOCAL_UNRESPONSIVE_GRACE_S`.
    """
    if answered_at is None or now - answered_at < grace_s:
        return None
    return now - answered_at


def freeze_booked_as(last_phase: str | None, stepped: bool, active: int, desired: int) -> str | None:
    """The category a controller's ledger books a freeze in, from its last answer before the freeze: `productive`,
    `reduced` (training on fewer slices than desired), or None (not training: paused, starting, stopping; its
    ledger books the freeze `waiting` or `starting`, which is no goodput, so nothing is re-booked).

    Args:
      last_phase: the phase of its last answer (None: none).
      stepped: that answer had a goodput ratio (a step completed; before it, time is `starting`).
      active, desired: its active slices and `desired_slices` in that answer.
    """
    if last_phase not in ("Running", "Recovering") or not stepped:
        return None
    return "reduced" if active < desired else "productive"


def freeze_training_s(before: Mapping[str, float], after: Mapping[str, float], spell_s: float) -> float:
    """The seconds of a freeze its ledger booked as training, which the supervisors re-book `recovering`.

    At most the freeze (`spell_s`, seconds) and at most what the ledger's training categories grew between its
    last answer before the freeze (`before`, goodput seconds per category) and the first after (`after`): a
    controller whose own ledger booked the freeze otherwise (`stalled`: its stall notice saw the loop outside
    the slices' step all along) keeps it so. Before, the whole freeze was re-booked from training seconds
    either way, and the training after the freeze read `recovering` for as long again (a CI run).
    """
    grown = sum(after.get(c, 0.0) - before.get(c, 0.0) for c in TRAINING)
    return max(0.0, min(spell_s, grown))


def rebook_freezes(seconds: Mapping[str, float], frozen_s: float, frozen_reduced_s: float,
                   equivalent: float = 0.0) -> tuple[dict[str, float], float]:
    """`rebook_frozen` of `frozen_s` seconds of freezes, `frozen_reduced_s` of them booked `reduced` (frozen on
    fewer slices than desired), the rest booked `productive`. Both supervisors re-book a ledger with it.

    Returns:
      (seconds, equivalent), as `rebook_frozen`.
    """
    seconds, equivalent = rebook_frozen(seconds, min(frozen_reduced_s, frozen_s), equivalent, reduced=True)
    return rebook_frozen(seconds, max(0.0, frozen_s - frozen_reduced_s), equivalent)


def rebook_frozen(seconds: Mapping[str, float], frozen_s: float,
                  equivalent: float = 0.0, reduced: bool = False) -> tuple[dict[str, float], float]:
    """`seconds` (per goodput category) with `frozen_s` taken from the training category the freeze was booked
    in (productive, or reduced when `reduced`), then from the other, into recovering.

    Args:
      seconds: a ledger that booked a freeze as training (the controller answered again after it).
      frozen_s: the freeze's seconds.
      equivalent: the ledger's reduced seconds x active/desired; lowered by the same share of reduced taken.
      reduced: the controller trained on fewer slices than desired when it froze, so its ledger booked the
        freeze `reduced` (a trial: taken from productive, full-capacity training was re-booked instead).

    Returns:
      (seconds, equivalent); the wall is unchanged, no category goes negative (at most the training seconds
      move).
    """
    out = dict(seconds)
    left = max(0.0, frozen_s)
    for category in (reversed(TRAINING) if reduced else TRAINING):
        taken = min(left, out.get(category, 0.0))
        if category == "reduced" and taken > 0:
            equivalent = max(0.0, equivalent * (1 - taken / out["reduced"]))
        out[category] = out.get(category, 0.0) - taken
        out["recovering"] = out.get("recovering", 0.0) + taken
        left -= taken
    return out, equivalent
