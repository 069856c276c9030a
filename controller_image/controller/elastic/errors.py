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

# Which `JaxRuntimeError`s are a lost slice (issue 29; the table and its reasons: docs/pathways.md
# "Which errors are a lost slice"). pathways-utils 0.1.13 (`elastic.is_error_due_to_slice_down`) treats
# DATA_LOSS anywhere in the message as a lost slice, and DEADLINE_EXCEEDED, NOT_FOUND and INTERNAL
# anywhere as one too, with a warning that they may not be.
#   * DATA_LOSS: lost, wherever it appears (Pathways may wrap it in another status), as pathways-utils.
#   * DEADLINE_EXCEEDED, UNAVAILABLE as the status: lost (a slice's hosts stop answering, its connection
#     drops; UNAVAILABLE is not in pathways-utils' list but is what a dropped connection raises).
#   * INTERNAL, NOT_FOUND as the status: suspect. XLA raises INTERNAL for errors no slice caused, above all
#     a host callback that raised (`INTERNAL: CpuCallback error ...`): retrying those as slice losses retried
#     the user's bug until the restart budget ran out (issue 9, item 2). A suspect error is a lost slice only
#     when an active slice is down right after it (reported down, or failing the health check:
#     `Manager.confirms_slice_loss`); otherwise it is the user's error, not retried.
#   * a host callback's error (any status), any other status, any other exception type: not a lost slice.
SLICE_DOWN_ANYWHERE = ("DATA_LOSS",)
SLICE_DOWN_PREFIXES = ("DATA_LOSS", "DEADLINE_EXCEEDED", "UNAVAILABLE")
SUSPECT_PREFIXES = ("INTERNAL", "NOT_FOUND")

# Markers of an error raised by the user's own Python inside a jitted program
# (jax.pure_callback / io_callback / debug.callback): never a slice loss.
_HOST_CALLBACK_MARKERS = ("CpuCallback error", "CallbackError", "callback error")


class SliceDownError(jax.errors.JaxRuntimeError):
    """One or more slices were lost during a step (recoverable).

    Attributes:
      slice_indices: the slices that failed.
      cause: "slice_down" (connection lost / process gone), "step_deadline" (hang),
        or "draining" (the operator announced the slice is going away).
      failed_since: `time.monotonic()` when the failure began, if earlier than
        when it was raised (a hang began when the stuck step was sent); None otherwise.
      deadline_s, generations: for a cpu-backend "step_deadline" raised inside one dispatch: the
        deadline (seconds) and the slices' generations, so the backend can still decide whether to
        blame the slices (`backend_cpu.CpuBackend.map_sum`); None otherwise.
    """

    def __init__(self, message: str, slice_indices: Iterable[int], cause: str = "slice_down"):
        super().__init__(message if message.startswith("DATA_LOSS") else f"DATA_LOSS: {message}")
        self.slice_indices = tuple(sorted(set(slice_indices)))
        self.cause = cause
        self.failed_since: float | None = None
        self.deadline_s: float | None = None
        self.generations: dict[int, int] | None = None


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


def slice_down_verdict(error: BaseException) -> str:
    """Whether `error` means a lost slice, by the table above (`SLICE_DOWN_*`, `SUSPECT_PREFIXES`).

    Args:
      error: any exception.

    Returns:
      "lost" (a `SliceDownError`, or a `JaxRuntimeError` of a slice-down status), "suspect" (a
      `JaxRuntimeError` whose status is INTERNAL or NOT_FOUND, not from a host callback: a lost slice
      only if a slice is down right after it), or "no".
    """
    if isinstance(error, SliceDownError):
        return "lost"
    if not isinstance(error, jax.errors.JaxRuntimeError) or is_host_callback_error(error):
        return "no"
    text = str(error).lstrip()
    if text.startswith(SLICE_DOWN_PREFIXES) or any(f"{code}:" in text for code in SLICE_DOWN_ANYWHERE):
        return "lost"
    return "suspect" if text.startswith(SUSPECT_PREFIXES) else "no"


def is_slice_down(error: BaseException) -> bool:
    """True when `error` certainly means a lost slice (either backend): `slice_down_verdict` is "lost".

    A "suspect" error (INTERNAL, NOT_FOUND) is not: the elastic manager confirms it first
    (`Manager.confirms_slice_loss`).
    """
    return slice_down_verdict(error) == "lost"


def is_host_callback_error(error: BaseException) -> bool:
    """True when `error` is XLA reporting that a Python host callback raised (user code)."""
    head = str(error).lstrip()[:200]
    # JaxRuntimeError when raised by the computation; jax re-raises it as ValueError when
    # the failed result is read back (e.g. `bool(array)`): the message is what tells.
    return isinstance(error, (jax.errors.JaxRuntimeError, ValueError)) and any(m in head for m in _HOST_CALLBACK_MARKERS)


def one_line_reason(error: BaseException, limit: int = 500) -> str:
    """A one-line description of `error` that names the original exception.

    For a host-callback error XLA's message is the callback's whole traceback;
    its last line (`KeyError: 'x'`) is the user's exception, so that is what
    is shown, with where it came from: `host callback raised KeyError: 'x'
    (JaxRuntimeError INTERNAL: CpuCallback error)`. Other errors become
    `Type: message` with whitespace folded.

    Args:
      error: any exception.
      limit: the longest text returned (characters).

    Returns:
      One line, at most `limit` characters.
    """
    text = str(error).strip()
    if is_host_callback_error(error):
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        original = lines[-1] if lines else "?"
        kind = text.split(":", 1)[0]
        line = f"host callback raised {original} ({type(error).__name__} {kind}: CpuCallback error)"
    else:
        line = f"{type(error).__name__}: {' '.join(text.split()) or type(error).__name__}"
    return line if len(line) <= limit else line[: limit - 3] + "..."
