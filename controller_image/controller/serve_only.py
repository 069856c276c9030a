"""Serve-only mode (`elastic-jax-controller --serve-only`): the control API and slice set, no training loop.

The operator's side of a job (reconcile, pod events, slice reports, status)
needs a controller that answers `PUT /v1/slices/{i}` and `GET /v1/status`; it
does not need one that trains. A serve-only controller is the same
`create_app` and the same `SliceSet` as a training controller, without the
trainer, checkpointer, backend or JAX (about 60 MiB instead of a JAX process),
so many jobs fit on one machine: the operator scale benchmark
(`benchmarks/bench_operator_scale.py`) runs 50 of them.

What stands in for the loop: after each applied report the active set is the
Ready slices (`SliceSet.choose_active`, at most `count`), as the manager's next
attempt would choose it; the phase is `Running` while at least
`spec.slices.minimum` slices are active, else `WaitingForSlices`. The step
stays 0: no step runs.
"""

from __future__ import annotations

import os
import threading

from elastic_jax.api.control import ControllerStatus
from elastic_jax.controller.elastic.slice_set import SliceSet


class ServeOnly:
    """The slice set of a job served without training.

    Args:
      slice_set: the job's slices (`count + spares`).
      min_slices: `spec.slices.minimum`: fewer active slices read `WaitingForSlices`.
      total_steps: `spec.training.steps`, reported as is.
    """

    def __init__(self, slice_set: SliceSet, min_slices: int, total_steps: int):
        self.slice_set = slice_set
        self.min_slices = min_slices
        self.total_steps = total_steps
        self.stopped = threading.Event()
        self.stop_reason: str | None = None
        # The listener runs on the API thread after each applied report, outside the set's lock.
        slice_set.add_listener(lambda _index, _state: self._choose())

    def _choose(self) -> None:
        self.slice_set.set_active(self.slice_set.choose_active(self.slice_set.ready()))

    def status(self) -> ControllerStatus:
        """`GET /v1/status` of a serve-only controller (step 0, active = Ready slices)."""
        active = self.slice_set.active
        return ControllerStatus(
            phase="Running" if len(active) >= self.min_slices else "WaitingForSlices",
            step=0, total_steps=self.total_steps, desired_slices=self.slice_set.count,
            min_slices=self.min_slices, active_slices=sorted(active),
            inactive_slices=sorted(set(range(self.slice_set.total)) - active),
            slices=self.slice_set.statuses(), pid=os.getpid(),
        )

    def stop(self, reason: str) -> bool:
        """`POST /v1/stop`: ends `wait()`; always accepted."""
        self.stop_reason = reason
        self.stopped.set()
        return True

    def wait(self) -> None:
        """Blocks until `stop()` (the API or a signal)."""
        while not self.stopped.wait(timeout=1.0):
            pass
