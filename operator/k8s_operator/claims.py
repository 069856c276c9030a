"""One operator per job: the first operator to reconcile a job claims it; any other leaves it alone (pure).

Two Helm releases whose watched namespaces overlap both see the same jobs;
without this both would create children, tell the controller about slices
and write status, and fight. The claim is the annotation `CLAIM_ANNOTATION`
on the job, holding the operator's identity (the chart sets
`<release namespace>/<release name>`, so a restarted or upgraded operator of
the same release keeps its jobs). It is written with the job's
resourceVersion as a precondition (`Kube.claim`), so of two operators that
race for an unclaimed job exactly one wins; the other sees the claim on its
next pass. An operator that sees another's claim does nothing to the job,
and says so once: a Warning Event on the job, a log line and the metric
`elasticjax_operator_jobs_claimed_elsewhere`.

Handing a job to another release (the claiming one was uninstalled):
`kubectl annotate ejob NAME elasticjax.dev/claimed-by-`.
"""

from __future__ import annotations

import dataclasses
from typing import Literal, Mapping

from elastic_jax.api.job import GROUP

# On an ElasticTrainingJob: the identity of the operator that reconciles it.
CLAIM_ANNOTATION = f"{GROUP}/claimed-by"
REASON_CLAIMED_ELSEWHERE = "ClaimedByAnotherOperator"


@dataclasses.dataclass(frozen=True)
class Claim:
    """What this operator does with a job.

    Attributes:
      action: "ours" (reconcile), "claim" (unclaimed: claim it first), "other" (leave it alone).
      owner: the identity in the annotation ("" when unclaimed).
    """

    action: Literal["ours", "claim", "other"]
    owner: str


def decide(annotations: Mapping[str, str] | None, me: str) -> Claim:
    """This operator's (`me`) claim decision for a job with `annotations`."""
    owner = (annotations or {}).get(CLAIM_ANNOTATION, "")
    if not owner:
        return Claim("claim", "")
    return Claim("ours" if owner == me else "other", owner)


def elsewhere_message(me: str, owner: str) -> str:
    """The Event/log text of a job another operator claimed."""
    return (f"operator {me} leaves this job alone: it is reconciled by operator {owner} ({CLAIM_ANNOTATION}); "
            "two elastic-jax releases watch this namespace. Give each release its own namespaces "
            "(watchNamespaces), or hand the job over with "
            f"`kubectl annotate ejob <name> {CLAIM_ANNOTATION}-` once {owner} is gone")
