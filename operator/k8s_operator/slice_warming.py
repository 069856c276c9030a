"""What the controller says of slices outside its mesh, in the job's status (pure).

A replaced slice (or a hot spare) is Ready to the operator once its pods are, but the controller lets it
join only after its worker compiled the step programs (cpu backend: 20-34 s under load). The controller
says `Warming` for it (`SliceStatus.state`); here that becomes the slice's `status.slices[i].reason`
(its state stays Ready: its pods are up), and a warming slice outside a full mesh still counts as a spare.
"""

from __future__ import annotations

from collections.abc import Sequence

from elastic_jax.api.control import ControllerStatus
from elastic_jax.api.status import SliceStatusEntry

# `status.slices[i].reason` of a Ready slice the controller is warming.
WARMING_TO_JOIN = "warming: its worker compiles the step programs; the slice joins the training mesh after that"
WARMING_SPARE = "warming: its worker compiles the step programs; a warm hot spare after that"


def _full(c: ControllerStatus) -> bool:
    return len(c.active_slices) >= c.desired_slices


def spare_indices(c: ControllerStatus) -> list[int]:
    """`status.spareSlices`: slices the controller keeps out of a full mesh, warm (`Spare`) or warming."""
    return sorted(s.index for s in c.slices if s.state == "Spare" or (s.state == "Warming" and _full(c)))


def with_warming(entries: Sequence[SliceStatusEntry], c: ControllerStatus | None) -> list[SliceStatusEntry]:
    """`entries` (`status.slices`) with the reason of each Ready slice the controller `c` says is `Warming`.

    Args:
      entries: the operator's slice entries (not modified).
      c: the current controller's status; None (unreachable, suspended, finished): `entries` as they are.

    Returns:
      Copies of the entries, a warming Ready slice's reason set (`WARMING_TO_JOIN`, or `WARMING_SPARE` while
      the mesh is full); a slice the operator holds in another state keeps its own reason.
    """
    if c is None:
        return list(entries)
    warming = {s.index for s in c.slices if s.state == "Warming"}
    reason = WARMING_SPARE if _full(c) else WARMING_TO_JOIN
    return [e.model_copy(update={"reason": reason}) if e.index in warming and e.state == "Ready" else e
            for e in entries]
