"""In-memory host snapshots of the training state (pathways backend).

On Pathways a lost slice takes the device copies of the state with it. A
host snapshot every K steps (a `jax.device_get` into the controller's RAM)
lets the controller restore from memory in well under a second instead of
reading the last Orbax checkpoint from gs://, whenever the snapshot is newer.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """One host copy of the state.

    Attributes:
      step: the step the state belongs to (steps completed).
      state: pytree of numpy arrays.
      data_state: the data position (JSON dict, as saved in checkpoints).
    """

    step: int
    state: Any
    data_state: dict


class HostSnapshotter:
    """Keeps the newest host snapshot.

    Args:
      every_steps: take a snapshot when `step % every_steps == 0` (0 disables).
    """

    def __init__(self, every_steps: int):
        if every_steps < 0:
            raise ValueError("every_steps must be >= 0")
        self.every_steps = every_steps
        self.latest: Snapshot | None = None

    def maybe_take(self, step: int, state: Any, data_state: dict) -> bool:
        """Copies `state` to host memory when due; returns whether it did."""
        if not self.every_steps or step % self.every_steps:
            return False
        self.latest = Snapshot(step, jax.device_get(state), dict(data_state))
        return True


def choose_restore_source(snapshot_step: int | None, committed_step: int | None) -> str:
    """Where to restore lost state from: the newer of the host snapshot and the last committed checkpoint.

    Returns:
      "snapshot", "checkpoint", or "init" (neither exists: start over).
      A tie goes to the snapshot (memory is faster than storage).
    """
    if snapshot_step is None and committed_step is None:
        return "init"
    if committed_step is None or (snapshot_step is not None and snapshot_step >= committed_step):
        return "snapshot"
    return "checkpoint"
