"""The restart budgets and the restart delay: what a supervisor counts, and when it gives up (pure).

What counts against `spec.elasticity`:
- `maxRestarts` bounds two things. Controller losses: a controller that ended
  without ending the job (`elastic_jax.exit_codes.ends_job` false) is started
  again while fewer than `maxRestarts` were started before. Slice
  replacements: every death of a slice's worker that the supervisor did not
  cause for a teardown, summed over the slices (on a cluster, the JobSets'
  restarts; locally, worker process deaths), may not exceed it.
- `maxRestartsPerSlice` bounds one slice's replacements.
A worker that dies before it was ever Ready counts (on a cluster its JobSet
restarts all the same), spares count like any slice, and a teardown (finished,
suspended, deleted) counts nothing. The controller keeps its own budget of
slice *losses while training* (`controller/elastic/policy.py`).
"""

from __future__ import annotations

from typing import Sequence

# A local worker's restart delay never exceeds this (seconds).
MAX_RESTART_DELAY_S = 30.0


def controller_restart_allowed(restarts_so_far: int, max_restarts: int) -> bool:
    """Whether a lost controller may be started again.

    Args:
      restarts_so_far: controller restarts this job already had (over every incarnation).
      max_restarts: `spec.elasticity.maxRestarts`.
    """
    return restarts_so_far < max_restarts


def slice_budget_failure(replacements: Sequence[int], max_restarts: int, max_restarts_per_slice: int) -> str | None:
    """Why the job fails for its slice replacements, or None while they are within the budgets.

    Args:
      replacements: replacements per slice index (spares included), over the whole job.
      max_restarts: `spec.elasticity.maxRestarts` (the job's total).
      max_restarts_per_slice: `spec.elasticity.maxRestartsPerSlice`.

    Returns:
      A one-line reason naming the slice or the total and the field it exceeds.
    """
    for i, n in enumerate(replacements):
        if n > max_restarts_per_slice:
            return f"slice {i} replaced {n} times, more than elasticity.maxRestartsPerSlice={max_restarts_per_slice}"
    total = sum(replacements)
    if total > max_restarts:
        return f"{total} slice replacements exceed elasticity.maxRestarts={max_restarts}"
    return None


def failures_after_loss(was_ready: bool, consecutive_failures: int) -> int:
    """A slice's consecutive failures after its worker died (the count `restart_delay_s` reads).

    A worker lost after it was Ready is a fresh failure (1); one that dies
    before Ready is a crash loop, one more failure in a row.
    """
    return 1 if was_ready else consecutive_failures + 1


def restart_delay_s(consecutive_failures: int, base_s: float) -> float:
    """Seconds before a dead local worker is started again: the kubelet's rule for a container that exits.

    0 after a loss of a worker that was Ready, every time: the kubelet's first restart of a container is
    immediate (`supervision.backoff`, the same rule for controllers), and every second a lost slice waits
    is a second the job trains on fewer slices (the chaos benchmark: a worker SIGKILLed every 15 s). A
    worker that dies again before Ready is a crash loop: `base_s` for its second start, doubling per
    further death, capped at `MAX_RESTART_DELAY_S`.

    Args:
      consecutive_failures: from `failures_after_loss` (>= 1; smaller reads as 1).
      base_s: the delay before the second start of a crash loop (seconds).
    """
    if consecutive_failures <= 1:
        return 0.0
    return min(MAX_RESTART_DELAY_S, base_s * 2 ** min(consecutive_failures - 2, 32))
