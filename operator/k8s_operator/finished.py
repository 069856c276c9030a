"""Whether a job's finished phase is the operator's own (pure).

The operator owns `.status` (tenants cannot write it: RBAC), and every finish it writes carries its
evidence in the same patch: `completionTime` and the condition of the phase's type (`Succeeded`/`Failed`
True, reason JobSucceeded, JobFailed or InvalidSpec; an unparseable spec's `Failed` has the condition
only). A `Succeeded` or `Failed` phase without either was written by someone else (a cluster admin's
`kubectl edit --subresource=status`, a buggy tool). Believed, it stopped the job, wrote `step` as
`spec.training.steps` and never set `completionTime`, so `ttlSecondsAfterFinished` never deleted it.
It is not believed: the pass recomputes the phase from what it observes (the controller's answer,
its pod's exit), with one Warning Event saying so.
"""

from __future__ import annotations

from elastic_jax.api import status as st

# Event reason: a finished phase the operator did not write was replaced by the observed one.
REASON_FOREIGN_PHASE_IGNORED = "ForeignPhaseIgnored"


def finished_phase(status: st.ElasticTrainingJobStatus) -> str | None:
    """The job's finished phase ("Succeeded" | "Failed") when the operator wrote it, else None.

    Args:
      status: the job's `.status` (`ElasticTrainingJobStatus.from_kube`).
    """
    if status.phase not in st.FINISHED_PHASES:
        return None
    if status.completion_time:
        return status.phase
    own = any(c.type == status.phase and c.status == "True" for c in status.conditions)
    return status.phase if own else None


def foreign_finish_message(status: st.ElasticTrainingJobStatus) -> str | None:
    """The Warning Event's message when `status.phase` is a finish the operator did not write, else None."""
    if status.phase not in st.FINISHED_PHASES or finished_phase(status) is not None:
        return None
    return (f"status.phase {status.phase} was not written by the operator (no completionTime, no {status.phase} "
            "condition): the operator owns .status; the phase is recomputed from what it observes. To stop a job "
            "use spec.suspend or delete it")
