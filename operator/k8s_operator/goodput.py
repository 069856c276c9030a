"""`status.goodput`: the job's goodput ledger over every controller pod it had (pure).

Each controller process keeps its own ledger (`elastic_jax.controller.goodput`)
from its start, reported in `GET /v1/status` (`goodputSeconds`, `goodput`). A
new controller pod (a controller loss, a resume after `spec.suspend`) starts
again at 0, so, as for the recovery counter (`counters`), the operator keeps
what earlier controllers booked in `status.counterBase.goodput` and writes
base + live. The totals never go down.

Not booked by any ledger: the seconds between two controllers (the old one's
last second before the operator's last poll of it, and the new pod's
scheduling and image pull before its process starts), and a suspended job's
time. Goodput is therefore over the seconds a controller process ran.
"""

from __future__ import annotations

from elastic_jax.api.control import ControllerStatus
from elastic_jax.api.status import GOODPUT_CATEGORIES, Goodput, GoodputBase, GoodputSeconds


def live_ledger(controller: ControllerStatus) -> GoodputBase:
    """One controller's ledger as a base: its seconds per category and its weighted reduced seconds.

    The controller reports `goodput` = (productive + reduced_equivalent) / wall, so
    reduced_equivalent = goodput x wall - productive (0 while goodput is None: no step yet).
    Categories this operator does not know are ignored (a newer controller image).
    """
    seconds = {c: max(0.0, float(controller.goodput_seconds.get(c, 0.0))) for c in GOODPUT_CATEGORIES}
    wall = sum(seconds.values())
    equivalent = 0.0
    if controller.goodput is not None:
        equivalent = min(seconds["reduced"], max(0.0, controller.goodput * wall - seconds["productive"]))
    return GoodputBase(seconds=GoodputSeconds(**seconds), reduced_equivalent_seconds=equivalent)


def base_from_total(total: Goodput | None) -> GoodputBase:
    """What the job booked so far (the last `status.goodput` written) as the base of a new controller."""
    if total is None:
        return GoodputBase()
    return GoodputBase(seconds=total.seconds, reduced_equivalent_seconds=total.reduced_equivalent_seconds)


def total(base: GoodputBase, live: GoodputBase) -> Goodput:
    """`status.goodput`: the base (earlier controllers) plus the live controller's ledger.

    Returns:
      Seconds per category added, and fraction = (productive + reduced
      equivalent) / wall in [0, 1]; fraction unset while no second was booked
      or no step was productive (a job still starting has no goodput yet,
      rather than 0 %).
    """
    seconds = {c: round(getattr(base.seconds, c) + getattr(live.seconds, c), 3) for c in GOODPUT_CATEGORIES}
    equivalent = round(base.reduced_equivalent_seconds + live.reduced_equivalent_seconds, 3)
    wall = round(sum(seconds.values()), 3)
    training = seconds["productive"] + seconds["reduced"]
    fraction = None
    if wall > 0 and training > 0:
        fraction = round(min(1.0, (seconds["productive"] + min(equivalent, seconds["reduced"])) / wall), 4)
    return Goodput(fraction=fraction, percent="" if fraction is None else f"{fraction * 100:.1f}%",
                   seconds=GoodputSeconds(**seconds), reduced_equivalent_seconds=equivalent, wall_seconds=wall)


def increments(previous: Goodput | None, current: Goodput | None) -> dict[str, float]:
    """Seconds per category `current` booked past `previous` (for `elasticjax_operator_goodput_seconds_total`).

    Both are `status.goodput` totals, which never go down; a category that did (a status
    edited by hand) adds nothing rather than a negative increment, which a counter refuses.
    """
    if current is None:
        return {}
    before = previous.seconds if previous is not None else GoodputSeconds()
    out = {}
    for c in GOODPUT_CATEGORIES:
        delta = getattr(current.seconds, c) - getattr(before, c)
        if delta > 0:
            out[c] = delta
    return out
