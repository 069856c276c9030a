"""SliceDown Events for worker losses that happened while no operator ran (pure).

The tracker posts `SliceDown` when it sees a slice's pods fail. A loss while the operator itself was down
(restarted, rescheduled) is never seen so: when it comes back, the slice's pods are already replaced and
look like a slice coming up. The JobSet's own `status.restarts` counted the replacement, so the job's
`status.slices[i].restarts` and `sliceReplacements` grow (`counters.carry`), but no Event said so. The
first pass of a new operator process compares the restarts it counts with the ones the previous operator
wrote, and posts one Warning per slice that grew (`JobState.missed_losses_checked`: once, not on every
resync).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from elastic_jax.api.status import EVENT_SLICE_DOWN, SliceStatusEntry

EventTuple = tuple[str, str, str]  # (type, reason, message)


def missed_loss_events(previous: Sequence[SliceStatusEntry], restarts: Sequence[int],
                       down_now: Collection[int] = ()) -> list[EventTuple]:
    """Warning `SliceDown` Events for slice replacements no operator saw.

    Args:
      previous: `status.slices` as the previous operator wrote it.
      restarts: each slice's restarts now, by index (`counters.Counts.slice_restarts`).
      down_now: slices this operator's tracker holds Down now: it posted their SliceDown itself.

    Returns:
      One (type, reason, message) per slice whose restarts grew since `previous`, less the one loss the
      previous operator announced itself when it wrote the slice `Down` (its SliceDown was posted; it went
      before it wrote the replacement's count), and less the one this operator saw itself (`down_now`).
      A slice not in `previous` (nothing written about it yet) has none.
    """
    before = {s.index: s for s in previous}
    out = []
    for index, now in enumerate(restarts):
        prev = before.get(index)
        if prev is None:
            continue
        announced = (1 if prev.state == "Down" else 0) + (1 if index in down_now else 0)
        missed = now - prev.restarts - announced
        if missed > 0:
            out.append(("Warning", EVENT_SLICE_DOWN,
                        f"slice {index} was replaced {missed} time(s) while the operator was not running "
                        f"(restarts {prev.restarts} -> {now}): its worker pods were lost and are new"))
    return out
