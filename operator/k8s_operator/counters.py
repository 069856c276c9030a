"""Status counters that survive the job's incarnations (pure).

The sources of `status.recoveries` and the slices' `restarts` start again at 0
whenever they are replaced: a new controller pod (a controller loss, a resume
after `spec.suspend`) reports only its own recoveries, and a worker JobSet
created again (resume after suspend; pathways: a new head) has
`status.restarts` 0. `status.counterBase` keeps, per source, what its
predecessors counted and which source the live count comes from (the
controller pod's UID, each slice's JobSet UID); the totals in status are that
base plus the live count. A source whose identity differs from the one
recorded is new: the last total written becomes its base.

Counts the old source made after the operator's last pass and before it went
(at most one 1 s pass of recoveries or JobSet restarts) are not seen.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Iterable, Mapping

from elastic_jax.api.control import ControllerStatus
from elastic_jax.api.status import CounterBase, ElasticTrainingJobStatus, Goodput, GoodputBase, SliceCounterBase
from elastic_jax.k8s_operator import goodput as gp
from elastic_jax.k8s_operator.slices import JobSetView

if TYPE_CHECKING:
    from elastic_jax.k8s_operator.tracker import Freeze


@dataclasses.dataclass(frozen=True)
class Counts:
    """The counters of one pass.

    Attributes:
      recoveries: `status.recoveries`, over every controller pod of the job.
      slice_restarts: `status.slices[i].restarts` by slice index, over every JobSet of slice i.
      base: `status.counterBase` to write with them.
      goodput: `status.goodput` over every controller pod; None keeps the one written (no controller answered).
      steps_lost: `status.stepsLost` over every controller pod (`steps_lost.carry_steps_lost`).
    """

    recoveries: int
    slice_restarts: list[int]
    base: CounterBase
    goodput: Goodput | None = None
    steps_lost: int = 0

    @property
    def slice_replacements(self) -> int:
        """`status.sliceReplacements`: every slice's restarts added up."""
        return sum(self.slice_restarts)


def controller_recoveries(status: ControllerStatus | None) -> int | None:
    """The recoveries one controller process reports, scale-ups excluded (a slice rejoining is no
    recovery); None when it did not answer."""
    if status is None:
        return None
    return sum(n for cause, n in status.recoveries.items() if cause != "scale_up")


def _previous_restarts(previous: ElasticTrainingJobStatus) -> dict[int, int]:
    return {s.index: s.restarts for s in previous.slices}


def carry_slices(previous: ElasticTrainingJobStatus, slice_count: int,
                 jobsets: Mapping[int, JobSetView]) -> tuple[list[int], list[SliceCounterBase]]:
    """Each slice's restarts over all its JobSets, and the per-slice bases to record.

    Args:
      previous: the job's `.status` before this pass (may be empty).
      slice_count: spec.slices.total (spares included: each is a JobSet).
      jobsets: the job's worker JobSets by slice index (this pass).

    Returns:
      (restarts by slice index, the bases). A slice without a JobSet keeps the
      last total written; a JobSet whose UID is not the recorded one is new,
      so the last total becomes its base. A status written before bases
      existed (an operator upgrade) is read as all from the current JobSet.
    """
    had_base = previous.counter_base is not None
    base = previous.counter_base or CounterBase()
    recorded = {b.index: b for b in base.slices}
    last = _previous_restarts(previous)
    totals, bases = [], []
    for i in range(slice_count):
        total_before = last.get(i, 0)
        b = recorded.get(i)
        js = jobsets.get(i)
        if js is None:
            totals.append(total_before)
            if b is not None:
                bases.append(b)
            continue
        if b is None or b.jobset_uid != js.uid:
            # (before bases existed, the total written was this JobSet's own count)
            carried = max(0, total_before - js.restarts) if not had_base else total_before
            b = SliceCounterBase(index=i, jobset_uid=js.uid, restarts=carried)
        bases.append(b)
        totals.append(b.restarts + js.restarts)
    return totals, bases


def carry(previous: ElasticTrainingJobStatus, slice_count: int, controller_uid: str, controller_recoveries: int | None,
          jobsets: Mapping[int, JobSetView], controller_ledger: GoodputBase | None = None,
          unwritten_goodput: Goodput | None = None, freezes: Iterable[Freeze] = ()) -> Counts:
    """This pass's counters, carried over every controller pod and JobSet the job had.

    Args:
      previous: the job's `.status` before this pass (may be empty).
      slice_count: spec.slices.total (spares included: each is a JobSet).
      controller_uid: UID of the controller pod `controller_recoveries` comes from ("" when none).
      controller_recoveries: that controller's recoveries (scale-ups excluded), None when it did
        not answer this pass (the total written stays).
      jobsets: the job's worker JobSets by slice index (this pass).
      controller_ledger: that controller's goodput ledger (`goodput.live_ledger`), None when it did not
        answer (the `status.goodput` written stays).
      unwritten_goodput: a newer total than `status.goodput` that a pass held back (`goodput.held_back`;
        the operator's memory, None after its restart): a new controller's base starts from the newer of
        the two, so the seconds its predecessor booked since the last write are not lost.
      freezes: that controller's freezes while training (`tracker.Freeze`, the tracker's memory): each one
        that ended after `counterBase.frozenUntil` is added to `counterBase.frozenSeconds` once, and those
        seconds of the live ledger are booked `recovering` (`goodput.rebook_frozen`).

    Returns:
      The `Counts`; never lower than the totals written before.
    """
    had_base = previous.counter_base is not None
    base = previous.counter_base or CounterBase()
    total_before = previous.recoveries
    recoveries = total_before
    controller = base.controller_uid
    carried = base.recoveries
    ledger_base = base.goodput
    if controller_recoveries is not None and controller_uid:
        if controller_uid != base.controller_uid:
            # a new controller process: what the job counted so far is its base
            # (before bases existed, the total written was this controller's own count)
            carried = max(0, total_before - controller_recoveries) if not had_base else total_before
            controller = controller_uid
            ledger_base = gp.base_from_total(gp.newest(previous.goodput, unwritten_goodput))
        recoveries = carried + controller_recoveries
    frozen = {"frozen_seconds": base.frozen_seconds, "frozen_reduced_seconds": base.frozen_reduced_seconds,
              "frozen_until": base.frozen_until}
    if controller != base.controller_uid:
        frozen = {"frozen_seconds": 0.0, "frozen_reduced_seconds": 0.0, "frozen_until": None}  # (a new controller)
    goodput = None
    if controller_ledger is not None and controller_uid and controller == controller_uid:
        frozen = add_freezes(frozen, freezes)
        ledger_base = ledger_base or GoodputBase()
        live = gp.rebook_frozen(controller_ledger, frozen["frozen_seconds"], frozen["frozen_reduced_seconds"])
        goodput = gp.total(ledger_base, live)
    restarts, slice_bases = carry_slices(previous, slice_count, jobsets)
    # (the steps-lost fields are `steps_lost.carry_steps_lost`'s: kept as they were)
    out = CounterBase(controller_uid=controller, recoveries=carried, slices=slice_bases, goodput=ledger_base,
                      **base.model_dump(include={"steps_lost", "step_reached", "trained_from_step", "step_at_resume",
                                               "resume_counted"}), **frozen)
    return Counts(recoveries=recoveries, slice_restarts=restarts, base=out, goodput=goodput)


def add_freezes(frozen: Mapping[str, float | None], freezes: Iterable[Freeze]) -> dict[str, float | None]:
    """`counterBase`'s freeze fields (`frozen_seconds`, `frozen_reduced_seconds`, `frozen_until`) with each of
    `freezes` that ended after `frozen_until` added: once, whichever pass or operator process sees it."""
    out = dict(frozen)
    for f in sorted(freezes, key=lambda f: f.ended_at):
        if out["frozen_until"] is not None and f.ended_at <= out["frozen_until"]:
            continue  # (counted already: written by this pass's predecessors, or by an operator before)
        out["frozen_seconds"] = round(out["frozen_seconds"] + f.seconds, 3)
        if f.booked_as == "reduced":
            out["frozen_reduced_seconds"] = round(out["frozen_reduced_seconds"] + f.seconds, 3)
        out["frozen_until"] = f.ended_at
    return out
