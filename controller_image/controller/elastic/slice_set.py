"""The controller's view of its slices: which exist, which are up, which train.

Two threads touch it: the control-API thread applies the operator's reports
(`PUT /v1/slices/{i}`), and the training thread reads the active set and marks
slices down when a step fails. A condition variable lets the training thread
wait for slices; listeners let an in-flight step abort as soon as the operator
says a slice it depends on is gone.

States per slice (`SliceRecord.state`):
  Unknown  never reported yet
  Ready    the operator says all hosts are up (addresses valid)
  Down     lost (reported by the operator, or seen by a failed step)
  Draining about to go away (preemption); leaves at the next step boundary

Hot spares (`spec.slices.spares`): the set holds `count + spares` slices, of
which at most `count` are active. A Ready slice outside the active set is a
scale-up signal only while fewer than `count` slices train; otherwise it is a
spare (`Spare` in status), swapped in by the manager's next attempt when an
active slice is lost.

Warming (`set_warming`): a Ready slice outside the mesh whose worker still
compiles the step programs (the manager's `prepare` has not found it ready)
reads `Warming` in status, not `Ready`/`Spare`: it joins, or is a warm spare,
once that compile ended (a replaced slice sat `Ready` with no word for the
20-34 s of its compile).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterable

from elastic_jax.api.control import SliceReport, SliceStatus

Listener = Callable[[int, str], None]


@dataclasses.dataclass
class SliceRecord:
    """Mutable state of one slice (guarded by the SliceSet lock).

    Attributes:
      index: slice index, 0..count-1.
      state: Unknown, Ready, Down or Draining.
      generation: generation of the last applied report (-1: none yet).
      addresses: host:port per host (from the last Ready report).
      failures: times this slice was lost while active.
      reason: last reason given.
    """

    index: int
    state: str = "Unknown"
    generation: int = -1
    addresses: tuple[str, ...] = ()
    failures: int = 0
    reason: str | None = None


class SliceSet:
    """Thread-safe set of slices with an active subset.

    Args:
      count: desired number of active slices (the training mesh at full size).
      spares: hot spare slices kept Ready outside the mesh; indices are
        0..count+spares-1 (`total`).

    Raises:
      ValueError: `count` < 1 or `spares` < 0.
    """

    def __init__(self, count: int, spares: int = 0):
        if count < 1:
            raise ValueError(f"slice count must be >= 1, got {count}")
        if spares < 0:
            raise ValueError(f"spares must be >= 0, got {spares}")
        self.count = count
        self.spares = spares
        self.total = count + spares
        self._records = [SliceRecord(i) for i in range(self.total)]
        self._active: frozenset[int] = frozenset()
        self._warming: dict[int, int] = {}  # slice index -> the generation (worker) that compiles
        self._cond = threading.Condition()
        self._listeners: list[Listener] = []

    # -- operator reports -------------------------------------------------

    def apply_report(self, index: int, report: SliceReport) -> tuple[bool, int]:
        """Applies one operator report unless it is stale.

        Args:
          index: slice index.
          report: the report; applied only if `report.generation` is greater
            than the last applied generation of that slice.

        Returns:
          (applied, generation now in force).

        Raises:
          IndexError: `index` is not in 0..total-1.
          ValueError: a Ready report without addresses.
        """
        self._check_index(index)
        if report.state == "Ready" and not report.addresses:
            raise ValueError("addresses: a Ready report needs the slice's worker addresses")
        with self._cond:
            rec = self._records[index]
            if report.generation <= rec.generation:
                return False, rec.generation
            rec.generation = report.generation
            rec.state = report.state
            rec.reason = report.reason
            if report.state == "Ready":
                rec.addresses = tuple(report.addresses)
            if report.state == "Down" and index in self._active:
                self._active = self._active - {index}
                rec.failures += 1
            self._cond.notify_all()
            listeners = list(self._listeners)
        for listener in listeners:
            listener(index, report.state)
        return True, report.generation

    # -- training-thread side ----------------------------------------------

    def mark_down(self, indices: Iterable[int], reason: str, generations: dict[int, int] | None = None) -> None:
        """Marks slices down after a failed step (the controller's own observation).

        Args:
          indices: slices that failed.
          reason: why, for status.
          generations: the generation each slice had when the failed step was
            dispatched. A slice whose generation has moved on since (the
            operator already reported a replacement Ready) is left alone.
        """
        with self._cond:
            for i in indices:
                rec = self._records[i]
                if generations is not None and generations.get(i, rec.generation) != rec.generation:
                    continue
                if i in self._active:
                    rec.failures += 1
                    self._active = self._active - {i}
                rec.state = "Down"
                rec.reason = reason
            self._cond.notify_all()

    def set_warming(self, indices: Iterable[int]) -> None:
        """The Ready slices outside the mesh that are compiling the step programs now (all others are not).

        Held per worker: a slice reported again (a new generation, a replaced worker) is no longer
        warming until the next call names it.
        """
        with self._cond:
            self._warming = {i: self._records[i].generation for i in indices if 0 <= i < self.total}

    def set_active(self, indices: Iterable[int]) -> None:
        """Sets the slices that train (called by the manager at an attempt start)."""
        with self._cond:
            self._active = frozenset(indices)
            self._cond.notify_all()

    @property
    def active(self) -> frozenset[int]:
        """Slices in the training mesh."""
        with self._cond:
            return self._active

    def ready(self) -> frozenset[int]:
        """Slices the operator reported Ready (active or not)."""
        with self._cond:
            return frozenset(r.index for r in self._records if r.state == "Ready")

    def available_inactive(self) -> frozenset[int]:
        """Ready slices not in the active set while it is below `count`: the scale-up signal.

        Empty while `count` slices train: the Ready ones outside are spares.
        """
        with self._cond:
            if len(self._active) >= self.count:
                return frozenset()
            return frozenset(r.index for r in self._records if r.state == "Ready" and r.index not in self._active)

    def spare_indices(self) -> frozenset[int]:
        """Ready slices kept out of a full mesh (hot spares)."""
        with self._cond:
            if len(self._active) < self.count:
                return frozenset()
            return frozenset(r.index for r in self._records if r.state == "Ready" and r.index not in self._active)

    def choose_active(self, healthy: Iterable[int], prefer: Iterable[int] = ()) -> frozenset[int]:
        """At most `count` of `healthy` to train on: the active ones first (no needless reshuffle), then those
        in `prefer` (warm spares), then the lowest indices."""
        healthy = set(healthy)
        with self._cond:
            keep = sorted(healthy & self._active)
        preferred = sorted((healthy & set(prefer)) - set(keep))
        rest = sorted(healthy - set(keep) - set(preferred))
        return frozenset((keep + preferred + rest)[: self.count])

    def draining_active(self) -> frozenset[int]:
        """Active slices the operator announced are going away."""
        with self._cond:
            return frozenset(i for i in self._active if self._records[i].state == "Draining")

    def addresses(self, index: int) -> tuple[tuple[str, ...], int]:
        """(addresses, generation) of a slice."""
        with self._cond:
            rec = self._records[index]
            return rec.addresses, rec.generation

    def record(self, index: int) -> SliceRecord:
        """A copy of one slice's record."""
        with self._cond:
            return dataclasses.replace(self._records[index])

    def wait_for(self, predicate: Callable[[], bool], timeout_s: float | None) -> bool:
        """Blocks until `predicate()` (evaluated under the lock) is true.

        Args:
          predicate: called with the (re-entrant) lock held whenever the set
            changes, so it may call the other SliceSet methods.
          timeout_s: seconds; None waits forever.

        Returns:
          Whether the predicate became true before the timeout.
        """
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while not predicate():
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(timeout=remaining if remaining is None else min(remaining, 1.0))
            return True

    def add_listener(self, listener: Listener) -> Callable[[], None]:
        """Registers `listener(index, state)` for applied reports; returns an unsubscribe function."""
        with self._cond:
            self._listeners.append(listener)

        def remove() -> None:
            with self._cond:
                if listener in self._listeners:
                    self._listeners.remove(listener)

        return remove

    def statuses(self) -> list[SliceStatus]:
        """Per-slice status for `GET /v1/status`."""
        with self._cond:
            out = []
            for r in self._records:
                state = "Active" if r.index in self._active and r.state == "Ready" else r.state
                if state == "Ready" and self._warming.get(r.index) == r.generation:
                    state = "Warming"
                elif state == "Ready" and len(self._active) >= self.count:
                    state = "Spare"
                out.append(
                    SliceStatus(
                        index=r.index, state=state, generation=r.generation, addresses=list(r.addresses), failures=r.failures
                    )
                )
            return out

    def _check_index(self, index: int) -> None:
        if not 0 <= index < self.total:
            raise IndexError(f"slice index {index} out of range 0..{self.total - 1}")
