"""The pause before a lost controller is started again: the kubelet's CrashLoopBackOff rule (pure).

A controller that exits with a code asking to be restarted (`exit_codes.ends_job` false: a user's
`sys.exit(3)`, a signal) was recreated at once, every time: a new-user trial saw 21 controller pods in
25 s, the restart budget spent before anyone could read a log. The rule is the kubelet's for a
container that keeps exiting (kubernetes `pkg/kubelet/kubelet.go`: `backOffPeriod = 10 * time.Second`,
`MaxContainerBackOff = 300 * time.Second`; `kuberuntime_manager.go` `doBackOff` with
`util/flowcontrol.Backoff`): the first restart is immediate, each one after it in the same crash loop
waits twice as long as the one before, from 10 s up to 300 s, counted from the moment the container
finished; a container that ran for twice the cap without dying starts the loop afresh. Here the loop is
also ended by what the kubelet cannot see: a controller that completed a training step.

Both drivers use it: the operator (`k8s_operator.reconcile.decide`) and the local launcher
(`elastic_jax.local.launcher`).
"""

from __future__ import annotations

# kubelet backOffPeriod: the wait before the second start of a container in a crash loop (seconds).
INITIAL_DELAY_S = 10.0
# kubelet MaxContainerBackOff: the longest wait (seconds).
MAX_DELAY_S = 300.0
# A controller that ran this long before it was lost ends its crash loop (seconds): the kubelet forgets a
# container's back-off once it has run for twice the cap (`flowcontrol.Backoff` `hasExpired`).
RESET_AFTER_S = 2 * MAX_DELAY_S


def restart_delay_s(losses_in_a_row: int) -> float:
    """Seconds to wait, from the lost controller's finish, before starting its replacement.

    Args:
      losses_in_a_row: controller losses since a controller last trained a step or ran `RESET_AFTER_S`,
        this one included (>= 1; smaller reads as 1).

    Returns:
      0 for the first loss (a preemption or a node loss costs no pause); then `INITIAL_DELAY_S` doubled
      per further loss, at most `MAX_DELAY_S`.
    """
    if losses_in_a_row <= 1:
        return 0.0
    return min(MAX_DELAY_S, INITIAL_DELAY_S * 2.0 ** min(losses_in_a_row - 2, 32))


def losses_after(previous_in_a_row: int, ran_s: float | None) -> int:
    """Losses in a row once a controller is lost, this one included.

    Args:
      previous_in_a_row: losses in a row before this one (0 once a controller trained a step).
      ran_s: seconds the lost controller ran (its pod's creation to its finish); None: not known.

    Returns:
      1 when it ran `RESET_AFTER_S` or longer (the loop is over: this is a fresh loss), else
      `previous_in_a_row` + 1.
    """
    if ran_s is not None and ran_s >= RESET_AFTER_S:
        return 1
    return max(0, previous_in_a_row) + 1
