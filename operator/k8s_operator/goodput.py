"""`status.goodput`: the job's goodput ledger over every controller pod it had (pure).

Each controller process keeps its own ledger (`elastic_jax.controller.goodput`)
from its start, reported in `GET /v1/status` (`goodputSeconds`, `goodput`). A
new controller pod (a controller loss, a resume after `spec.suspend`) starts
again at 0, so, as for the recovery counter (`counters`), the operator keeps
what earlier controllers booked in `status.counterBase.goodput` and writes
base + live. The booked seconds (`wallSeconds`) never go down; the steps a new controller
does not resume move their share of `productive`/`reduced` to `recovering` (`steps_lost`).

When it is written: a ledger's seconds move every second a controller runs, but
a user sees nothing of that on `kubectl get ejob` until the GOODPUT column
(`percent`) moves. So `status.goodput` is written with every other status
change (a step, a phase, a condition, the GOODPUT column), and when only its
time counters moved (`seconds`, `wallSeconds`, `reducedEquivalentSeconds`,
`fraction` below the column's 0.1 %) at most once per `QUIET_WRITE_S` of booked
time (`held_back`): a quiet job (Pending while its slices come up, paused for
slices) is not rewritten every status long poll with an identical line. What is
held back is kept by the operator (`JobState.unwritten_goodput`) and carried
into a new controller's base (`counters.carry`), so the job's totals lose
nothing when a controller goes between two writes (unless the operator
restarted meanwhile: then at most `QUIET_WRITE_S` of that controller's quiet
seconds). `GET /v1/status` and the controller's metrics have the live ledger.

Not booked by any ledger: the seconds between two controllers (the old one's
last second before the operator's last poll of it, and the new pod's
scheduling and image pull before its process starts), and a suspended job's
time. Goodput is therefore over the seconds a controller process ran.
"""

from __future__ import annotations

from elastic_jax.api.control import ControllerStatus
from elastic_jax.api.status import GOODPUT_CATEGORIES, Goodput, GoodputBase, GoodputSeconds
from elastic_jax.supervision import controller_watch

# Seconds of booked time (`wallSeconds`) a job's `status.goodput` may move by before it is written on its own,
# when nothing else of the status changed (`held_back`).
QUIET_WRITE_S = 300.0
# Categories that need a completed step: before a controller's first one, their seconds are `starting` (`live_ledger`).
_BEFORE_FIRST_STEP = ("productive", "reduced", "recovering")


def live_ledger(controller: ControllerStatus) -> GoodputBase:
    """One controller's ledger as a base: its seconds per category and its weighted reduced seconds.

    The controller reports `goodput` = (productive + reduced_equivalent) / wall, so
    reduced_equivalent = goodput x wall - productive (0 while goodput is None: no step yet).
    Categories this operator does not know are ignored (a newer controller image).
    A controller that completed no step yet (goodput None) has made no progress: what it booked as
    training or recovering (a controller image before session 12 booked a first step that failed while it
    compiled so) is `starting` here.
    """
    seconds = {c: max(0.0, float(controller.goodput_seconds.get(c, 0.0))) for c in GOODPUT_CATEGORIES}
    wall = sum(seconds.values())
    equivalent = 0.0
    if controller.goodput is None:
        for c in _BEFORE_FIRST_STEP:
            seconds["starting"] += seconds[c]
            seconds[c] = 0.0
    else:
        equivalent = min(seconds["reduced"], max(0.0, controller.goodput * wall - seconds["productive"]))
    return GoodputBase(seconds=GoodputSeconds(**seconds), reduced_equivalent_seconds=equivalent)


def rebook_frozen(ledger: GoodputBase, frozen_s: float, frozen_reduced_s: float) -> GoodputBase:
    """The live controller's ledger with the seconds it was frozen while training booked `recovering`.

    A controller that runs but does not answer (SIGSTOP, a VM pause) makes no step, but its ledger's monotonic
    clock runs on: after it answers again, its frozen seconds are in `productive` (or `reduced`). The rule
    `elastic-jax run` applies (`controller_watch.rebook_freezes`) moves them, applied to the whole ledger each
    pass from `counterBase.frozenSeconds`, so never twice.

    Args:
      ledger: `live_ledger` of the controller.
      frozen_s: its frozen seconds while training (`counterBase.frozenSeconds`).
      frozen_reduced_s: of those, the seconds frozen on fewer slices than desired (`frozenReducedSeconds`).
    """
    if frozen_s <= 0:
        return ledger
    seconds, equivalent = controller_watch.rebook_freezes(ledger.seconds.model_dump(), frozen_s, frozen_reduced_s,
                                                          ledger.reduced_equivalent_seconds)
    return GoodputBase(seconds=GoodputSeconds(**seconds), reduced_equivalent_seconds=equivalent)


def base_from_total(total: Goodput | None) -> GoodputBase:
    """What the job booked so far (the last `status.goodput` written) as the base of a new controller."""
    if total is None:
        return GoodputBase()
    return GoodputBase(seconds=total.seconds, reduced_equivalent_seconds=total.reduced_equivalent_seconds)


def newest(*totals: Goodput | None) -> Goodput | None:
    """The total with the most booked seconds (`wallSeconds`) of `totals` (None when all are): a job's totals
    never go down, so that is the latest one. On a tie, the first."""
    known = [t for t in totals if t is not None]
    return max(known, key=lambda t: t.wall_seconds) if known else None


def held_back(previous: Goodput | None, current: Goodput | None, running: bool) -> bool:
    """Whether `current` (this pass's total) is left unwritten in favour of `previous` (the one written).

    Args:
      previous, current: `status.goodput` as written and as computed now.
      running: the job runs on (neither finished, finishing, nor suspended): a stop's last seconds are
        always written.

    Returns:
      True when the two differ only in time counters the GOODPUT column does not show (the same
      `percent`) and `current` booked less than `QUIET_WRITE_S` more than `previous`. The caller
      writes it anyway when another status field changes.
    """
    if not running or previous is None or current is None or current.percent != previous.percent:
        return False
    return current.wall_seconds - previous.wall_seconds < QUIET_WRITE_S


def total(base: GoodputBase, live: GoodputBase) -> Goodput:
    """`status.goodput`: the base (earlier controllers) plus the live controller's ledger.

    Returns:
      Seconds per category added, and fraction = (productive + reduced
      equivalent) / wall in [0, 1]; fraction unset while no second was booked
      or no step was ever completed (a job still starting has no goodput yet,
      rather than 0 %). A job whose trained steps were all lost (a new
      controller pod from step 0: their seconds re-booked `recovering`) has
      0 %, not a blank GOODPUT column while its new controller starts.
    """
    seconds = {c: round(getattr(base.seconds, c) + getattr(live.seconds, c), 3) for c in GOODPUT_CATEGORIES}
    equivalent = round(base.reduced_equivalent_seconds + live.reduced_equivalent_seconds, 3)
    wall = round(sum(seconds.values()), 3)
    training = seconds["productive"] + seconds["reduced"]
    fraction = None
    if wall > 0 and (training > 0 or seconds["recovering"] > 0):  # (`recovering` needs a completed step)
        fraction = round(min(1.0, (seconds["productive"] + min(equivalent, seconds["reduced"])) / wall), 4)
    return Goodput(fraction=fraction, percent="" if fraction is None else f"{fraction * 100:.1f}%",
                   seconds=GoodputSeconds(**seconds), reduced_equivalent_seconds=equivalent, wall_seconds=wall)


def rebooked(previous: Goodput | None, current: Goodput | None) -> dict[str, float]:
    """Seconds per category `current` moved out of it into `recovering` since `previous` (both `status.goodput`
    totals), for `elasticjax_operator_goodput_rebooked_seconds_total`: the re-booking of lost steps
    (`steps_lost`), which `increments` leaves in the category first booked.

    Only what `recovering` took in counts (at most its growth), shared over the categories that shrank in
    proportion to their shrinking: a category that went down with nothing moved into recovering (a status
    edited by hand) is no re-booking.
    """
    if current is None or previous is None:
        return {}
    shrunk = {c: getattr(previous.seconds, c) - getattr(current.seconds, c) for c in GOODPUT_CATEGORIES
              if c != "recovering" and getattr(current.seconds, c) < getattr(previous.seconds, c)}
    moved = min(sum(shrunk.values()), max(0.0, current.seconds.recovering - previous.seconds.recovering))
    total = sum(shrunk.values())
    if moved <= 1e-9 or total <= 0:
        return {}
    return {c: round(moved * d / total, 6) for c, d in shrunk.items() if moved * d / total > 1e-9}


def increments(previous: Goodput | None, current: Goodput | None) -> dict[str, float]:
    """Seconds per category `current` booked past `previous` (for `elasticjax_operator_goodput_seconds_total`).

    Both are `status.goodput` totals. The metric counts each booked second once, in the category it was first
    booked in, so its categories add up to `wallSeconds`: a counter cannot go down, so when status re-books
    seconds (the steps a new controller pod did not resume move from productive/reduced to recovering,
    `steps_lost`), the category that shrank adds nothing and recovering's growth counts only past the seconds
    moved into it (the trial's metric counted them twice: 498 s over 327 s booked). The steps lost are in
    `elasticjax_operator_steps_lost_total`; `status.goodput` has the re-booked ledger. A category that went
    down otherwise (a status edited by hand) adds nothing either.
    """
    if current is None:
        return {}
    before = previous.seconds if previous is not None else GoodputSeconds()
    deltas = {c: getattr(current.seconds, c) - getattr(before, c) for c in GOODPUT_CATEGORIES}
    moved = sum(-d for d in deltas.values() if d < 0)  # (seconds re-booked out of a category: into recovering)
    out = {}
    for c, delta in deltas.items():
        if c == "recovering":
            delta -= moved
        if delta > 1e-9:
            out[c] = round(delta, 6)
    return out
