"""The controller's exit codes: one contract between the controller and its supervisors.

`elastic-jax-controller` ends with one of these; the local launcher
(`elastic_jax.local.launcher`) and the operator (`k8s_operator.reconcile`)
read them. Only `SUCCEEDED`, `FAILED` and `BAD_INPUT` end a job. Anything
else (`RESTART`, `STOPPED`, death by a signal, a code not listed here) means
the controller process is gone while the job is not done: a supervisor that
still wants the job running starts a new controller, which resumes from the
newest committed checkpoint.
"""

from __future__ import annotations

import enum
import signal


class ControllerExit(enum.IntEnum):
    """Exit codes of `elastic-jax-controller`."""

    SUCCEEDED = 0
    """Trained `spec.training.steps`; the final checkpoint is committed."""

    FAILED = 1
    """Training failed for a reason a restart cannot fix (user code, non-finite
    state, a budget exhausted, unusable checkpoints); the reason is in the
    summary, the log and `/v1/status`."""

    BAD_INPUT = 2
    """The manifest, trainer config or checkpoint URI is wrong; one `error:` line
    on stderr, nothing trained."""

    STOPPED = 4
    """Stopped on request (`POST /v1/stop`: Ctrl-C of `elastic-jax run`, a suspend)
    after checkpointing the last completed step. Not finished, not failed."""

    RESTART = 75  # sysexits.h EX_TEMPFAIL: "temporary failure, retry"
    """The process was told to end by a signal that was not a stop request
    (a node's graceful shutdown, spot preemption, a stray `kill`), or the
    Pathways proxy did not answer at start (`pathways_connect.ProxyUnavailableError`):
    a loss of the controller, not the end of the job. It checkpointed the last completed step
    if it could; restart it and it resumes from there."""


JOB_ENDING = frozenset({ControllerExit.SUCCEEDED, ControllerExit.FAILED, ControllerExit.BAD_INPUT})
"""Exit codes after which a supervisor must not start the controller again."""


def ends_job(code: int | None) -> bool:
    """True when a controller that exited with `code` ended its job (succeeded or failed for good).

    Args:
      code: the process exit code; negative (killed by that signal, as
        `subprocess` reports it) or None (unknown) counts as a loss.

    Returns:
      False for `RESTART`, `STOPPED`, signals and unknown codes: the controller
      is lost and should be started again.
    """
    return code is not None and code in JOB_ENDING


# What a death by each signal usually means, for a supervisor's one-line report.
_SIGNAL_MEANING = {
    signal.SIGKILL: "killed (e.g. out of memory, or by its node)",
    signal.SIGTERM: "terminated",
    signal.SIGSEGV: "crashed (segmentation fault)",
    signal.SIGABRT: "aborted",
    signal.SIGBUS: "crashed (bus error)",
    signal.SIGINT: "interrupted",
}


def signal_exit(code: int | None) -> str:
    """Names the signal that ended a process, from its exit code; "" when the code is not a signal's.

    Args:
      code: a container's exit code (128+n for signal n, as the kubelet and shells report it) or a
        `subprocess` return code (-n).

    Returns:
      e.g. "SIGKILL: killed (e.g. out of memory, or by its node)"; "" for None, 0-128 and codes
      above 128 that no signal has.
    """
    if code is None or 0 <= code <= 128:
        return ""
    number = -code if code < 0 else code - 128
    try:
        sig = signal.Signals(number)
    except ValueError:
        return ""
    meaning = _SIGNAL_MEANING.get(sig)
    return f"{sig.name}: {meaning}" if meaning else sig.name
