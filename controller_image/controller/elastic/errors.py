"""Error types of the elastic runtime.

A lost slice surfaces as `SliceDownError`, a subclass of
`jax.errors.JaxRuntimeError` whose message starts with `DATA_LOSS:`, which is
what Pathways raises for a lost slice (pathways-utils
`elastic.is_error_due_to_slice_down` checks that prefix). One elastic code
path therefore serves both backends: the cpu backend turns a refused
connection, a lost RPC or a missed deadline into this same error.
"""

from __future__ import annotations

from collections.abc import Iterable

import jax

# Status-code prefixes that mean "a slice went away", per pathways-utils
# (pathwaysutils/elastic/elastic.py, _ELASTIC_DOWN_ERROR_TYPES and the
# additional types it accepts).
SLICE_DOWN_PREFIXES = ("DATA_LOSS", "DEADLINE_EXCEEDED", "NOT_FOUND", "INTERNAL", "UNAVAILABLE")


class SliceDownError(jax.errors.JaxRuntimeError):
    """One or more slices were lost during a step (recoverable).

    Attributes:
      slice_indices: the slices that failed.
      cause: "slice_down" (connection lost / process gone), "step_deadline" (hang),
        or "draining" (the operator announced the slice is going away).
      failed_since: `time.monotonic()` when the failure began, if earlier than
        when it was raised (a hang began when the stuck step was sent); None otherwise.
    """

    def __init__(self, message: str, slice_indices: Iterable[int], cause: str = "slice_down"):
        super().__init__(message if message.startswith("DATA_LOSS") else f"DATA_LOSS: {message}")
        self.slice_indices = tuple(sorted(set(slice_indices)))
        self.cause = cause
        self.failed_since: float | None = None


class SliceExecutionError(RuntimeError):
    """A slice answered, but running the step program failed there.

    This is the user-code failure class: when every active slice reports the
    same execution error, the job fails (`UserCodeError`) instead of retrying.

    Attributes:
      slice_index: the slice that reported the error.
      message: the error text the worker returned.
    """

    def __init__(self, slice_index: int, message: str):
        super().__init__(f"slice {slice_index}: {message}")
        self.slice_index = slice_index
        self.message = message


class UserCodeError(RuntimeError):
    """The training program itself is broken (same failure on every slice); not retried."""


class ElasticRuntimeError(RuntimeError):
    """Elasticity cannot continue: a restart budget ran out or slices never came back."""


class StopRequested(Exception):
    """The process was asked to stop (SIGTERM) while waiting for slices; not an error of the job."""


class ScaleUpSignalError(Exception):
    """Raised at a step boundary when a slice is ready to join; the manager retries with it."""


def is_slice_down(error: BaseException) -> bool:
    """True when `error` means a lost slice (either backend).

    Args:
      error: any exception.

    Returns:
      True for `SliceDownError`, and for a `jax.errors.JaxRuntimeError` whose
      message starts with one of `SLICE_DOWN_PREFIXES` (Pathways convention).
    """
    if isinstance(error, SliceDownError):
        return True
    if isinstance(error, jax.errors.JaxRuntimeError):
        return str(error).lstrip().startswith(SLICE_DOWN_PREFIXES)
    return False
