"""`status.stepsLost`: steps a new controller pod did not resume, and their goodput seconds (pure).

A new controller pod (a controller loss, a resume after `spec.suspend`) resumes
from the newest committed checkpoint it can read; the job had reached
`status.step` before. The steps in between were trained and thrown away: a
local `spec.checkpoint.uri` restores nothing (step 0), a `gs://` one the last
checkpoint committed before the loss. So, per controller pod:

  lost at its start = max(0, `counterBase.stepReached` - the step it resumed from)

counted once it has reported where it resumed (its phase is no longer `Starting`:
`resumedFrom.step`, or 0 when it resumed nothing). A pod replaced before it said so
(suspended or lost while starting) passes the step reached on to the next pod
(`counterBase.resumeCounted`), so a suspend/resume toggled faster than a pod starts
still counts the steps it loses. `status.stepsLost` is the
earlier pods' total (`counterBase.stepsLost`) + that + the steps the live
controller itself re-did after restoring lost state (pathways; `stepsLost` of
`GET /v1/status`).

Their seconds: the earlier controllers' ledger (`counterBase.goodput`) booked the
steps from `counterBase.trainedFromStep` to `stepReached` as `productive` or
`reduced`. The lost share of those steps, lost / (stepReached - trainedFromStep),
of each of the two categories (and of `reducedEquivalentSeconds`) is re-booked
as `recovering`: the lost steps are booked at the mean training seconds per step
of the work they were part of. The re-booking is applied to the total each pass
from the same base, so it is never applied twice; the total written becomes the
next controller's base with it.

Not seen (as for every counter, `counters`): steps the old controller trained
after the operator's last read of it.
"""

from __future__ import annotations

import dataclasses

from elastic_jax.api.control import ControllerStatus
from elastic_jax.api.status import CounterBase, ElasticTrainingJobStatus, Goodput, GoodputBase, GoodputSeconds
from elastic_jax.k8s_operator import goodput as gp
from elastic_jax.k8s_operator.counters import Counts
from elastic_jax.supervision import steps_lost as rule


def resumed_step(controller: ControllerStatus) -> int | None:
    """The step `controller` resumed from: its `resumedFrom.step`, 0 when it resumed nothing; None while it is
    still `Starting` (its restore may not have ended)."""
    if controller.phase == "Starting":
        return None
    return controller.resumed_from.step if controller.resumed_from is not None else 0


def carry_steps_lost(previous: ElasticTrainingJobStatus, counts: Counts, controller: ControllerStatus | None,
                     controller_uid: str) -> Counts:
    """`counts` (from `counters.carry`) with `stepsLost`, its base fields and the lost steps' goodput re-booked.

    Args:
      previous: the job's `.status` before this pass.
      counts: this pass's counts; `counts.base.controller_uid` is the live controller's pod UID.
      controller: the answer of this pass (None: none).
      controller_uid: the pod UID `controller` came from ("" when none).

    Returns:
      The counts; `steps_lost` never lower than `previous.steps_lost`.
    """
    before = previous.counter_base
    base = counts.base
    if base.controller_uid and (before is None or before.controller_uid != base.controller_uid):
        # a new controller pod took over: the job's total so far is its base, the step it had reached is
        # what it must resume (unknown for a status an older operator wrote: nothing is counted)
        reached = previous.step if before is not None else None
        if before is not None and before.step_at_resume is not None:
            reached = before.step_at_resume  # (a resume: `step` shows where this pod starts, `status_builder`)
        if before is not None and before.step_reached is not None and not _resume_counted(before):
            # The pod before never said where it resumed (stopped or lost while starting): its loss was
            # never counted, and STEP showed where it would start. A suspend/resume toggled a second apart
            # lost the steps reached before it, uncounted.
            reached = before.step_reached if reached is None else max(reached, before.step_reached)
        base = base.model_copy(update={"steps_lost": previous.steps_lost, "step_reached": reached,
                                       "step_at_resume": None, "resume_counted": False})
    live = controller if controller is not None and controller_uid and controller_uid == base.controller_uid else None
    resumed = resumed_step(live) if live is not None else None
    lost_at_start = 0
    goodput = counts.goodput
    if resumed is not None:
        trained_from = base.trained_from_step
        if trained_from is None:
            # the first resume reported: the ledger's training seconds (none yet, unless an older operator
            # wrote them, then taken as from step 0) start at this controller's step
            trained_from = resumed if _training_seconds(base.goodput) == 0 else 0
        trained_from = min(trained_from, resumed)
        # (a `stepAtResume` still set now is stale: this pod's step reached is `stepReached`)
        base = base.model_copy(update={"trained_from_step": trained_from, "resume_counted": True,
                                       "step_at_resume": None})
        if base.step_reached is not None:
            lost_at_start = rule.lost_at_resume(base.step_reached, resumed)
            if goodput is not None and lost_at_start:
                goodput = rebook_lost(goodput, base.goodput,
                                      rule.lost_share(lost_at_start, base.step_reached, trained_from))
    total = base.steps_lost + lost_at_start + (live.steps_lost if live is not None else 0)
    if live is None:
        total = previous.steps_lost  # (nobody answered for the live controller: the total written stays)
    return dataclasses.replace(counts, base=base, goodput=goodput, steps_lost=max(previous.steps_lost, total))


def _resume_counted(base: CounterBase) -> bool:
    """Whether the steps the pod of `base` lost at its start are counted (`counterBase.resumeCounted`).

    An operator older than the field wrote no `resumeCounted` (this one always writes it, False too): its
    `stepReached` is the step reached when that pod took over, whose loss it counted once the pod said where
    it resumed; read as not counted, the next loss after an upgrade counted from that stale, higher step
    (an overcount). Its pods are taken as counted, as that operator took them.
    """
    return base.resume_counted or "resume_counted" not in base.model_fields_set


def newly_lost(previous: ElasticTrainingJobStatus, written: int | None) -> int:
    """Steps lost since the status written before (for `elasticjax_operator_steps_lost_total`): the growth of
    `status.stepsLost` from `previous` to `written` (this pass's value, None: not counted), never negative.

    Carried like the goodput seconds (`goodput.increments`): the status is the memory, so a restarted
    operator counts only losses its predecessor did not write.
    """
    return max(0, (written or 0) - previous.steps_lost) if written is not None else 0


def rebook_lost(total: Goodput, earlier: GoodputBase | None, share: float) -> Goodput:
    """`total` with `share` (0..1) of the earlier controllers' productive and reduced seconds booked `recovering`
    (the shared rule, `elastic_jax.supervision.steps_lost.rebook_lost`, which `elastic-jax run` applies too).

    Args:
      total: `status.goodput` of this pass (earlier controllers + the live one).
      earlier: the earlier controllers' ledger (`counterBase.goodput`); None: nothing to re-book.
      share: the lost steps over the steps that ledger trained (`lost_share`).
    """
    if earlier is None or share <= 0:
        return total
    seconds, equivalent = rule.rebook_lost(total.seconds.model_dump(), earlier.seconds.model_dump(), share,
                                           total.reduced_equivalent_seconds, earlier.reduced_equivalent_seconds)
    # (gp.total recomputes fraction, percent and wall from the seconds)
    return gp.total(GoodputBase(seconds=GoodputSeconds(**seconds), reduced_equivalent_seconds=equivalent),
                    GoodputBase())


def _training_seconds(ledger: GoodputBase | None) -> float:
    return 0.0 if ledger is None else ledger.seconds.productive + ledger.seconds.reduced

