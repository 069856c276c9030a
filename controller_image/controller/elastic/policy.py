"""Retry policies: decide, after an elastic event, whether to try again.

A policy is a callable `(attempt: int, error: Exception) -> bool`, as in
pathways-utils' `Manager.elastic_retry(retry_policy=...)`; `attempt` is
1-indexed. Policies here also keep the restart budgets that `spec.elasticity`
sets, and say why they refused (`reason`), so the job's failure message can
name the budget that ran out.
"""

from __future__ import annotations

import collections

from elastic_jax.controller.elastic.errors import ScaleUpSignalError, SliceDownError


class RestartBudget:
    """Allows retries until a job-wide or per-slice budget of slice losses runs out.

    Scale-up signals and draining are planned changes and never count.

    Args:
      max_restarts: slice-loss recoveries allowed for the whole job.
      max_restarts_per_slice: losses allowed for any one slice.

    Attributes:
      restarts: slice-loss recoveries counted so far.
      per_slice: losses counted per slice index.
      reason: why the last call returned False (None if it did not).
    """

    def __init__(self, max_restarts: int, max_restarts_per_slice: int):
        if max_restarts < 0 or max_restarts_per_slice < 0:
            raise ValueError("restart budgets must be >= 0")
        self.max_restarts = max_restarts
        self.max_restarts_per_slice = max_restarts_per_slice
        self.restarts = 0
        self.per_slice: collections.Counter[int] = collections.Counter()
        self.reason: str | None = None

    def __call__(self, attempt: int, error: Exception) -> bool:
        del attempt  # Budgets count slice losses, not attempts.
        if isinstance(error, ScaleUpSignalError):
            return True
        if isinstance(error, SliceDownError) and error.cause == "draining":
            return True
        self.restarts += 1
        if self.restarts > self.max_restarts:
            self.reason = (
                f"restart budget exhausted: {self.restarts} slice failures > "
                f"spec.elasticity.maxRestarts={self.max_restarts} (last: {error})"
            )
            return False
        for index in getattr(error, "slice_indices", ()):
            self.per_slice[index] += 1
            if self.per_slice[index] > self.max_restarts_per_slice:
                self.reason = (
                    f"restart budget exhausted for slice {index}: {self.per_slice[index]} failures > "
                    f"spec.elasticity.maxRestartsPerSlice={self.max_restarts_per_slice} (last: {error})"
                )
                return False
        return True
