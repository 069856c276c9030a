"""Label and annotation keys the operator puts on an ElasticTrainingJob's children.

One module, one comment each, as jobset's `jobset.sigs.k8s.io/*` constants:
selectors, the operator's watches and users' `kubectl get -l` all read these.
"""

from __future__ import annotations

from elastic_jax.api.job import GROUP

# Name of the ElasticTrainingJob that owns the object (on every child and on worker pods).
JOB_NAME = f"{GROUP}/job-name"
# metadata.uid of the ElasticTrainingJob that owns the object (on every child, and through the JobSet's
# templates on its Jobs and worker pods): a job deleted and created again under the same name is a
# new job, and the operator counts, notifies and deletes only its own incarnation's pods and JobSets.
JOB_UID = f"{GROUP}/job-uid"
# "controller" or "worker": which part of the job the object is.
ROLE = f"{GROUP}/role"
# Slice index (0-based) of a worker JobSet and its pods.
SLICE_INDEX = f"{GROUP}/slice-index"
# Which incarnation of the controller pod this is (0 first, +1 per recreation).
CONTROLLER_ATTEMPT = f"{GROUP}/controller-attempt"
# On the controller pod: hash of the spec it was started with, so a later spec
# edit the operator refuses to apply never leaks into a recreated controller.
SPEC_HASH = f"{GROUP}/spec-hash"

ROLE_CONTROLLER = "controller"
ROLE_WORKER = "worker"

# Labels the JobSet controller sets on pods (sigs.k8s.io/jobset v1alpha2).
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
JOBSET_RESTART_ATTEMPT = "jobset.sigs.k8s.io/restart-attempt"
# The Job controller's per-pod completion index (indexed Jobs): host index within a slice.
JOB_COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
# On a pathways worker JobSet: the Pathways head incarnation (controller pod and resource
# manager restart count) its workers registered with; another head restarts the JobSet.
PATHWAYS_HEAD = f"{GROUP}/pathways-head"
# JobSet annotation: one replicated job per node pool (TPU slice exclusivity).
JOBSET_EXCLUSIVE_TOPOLOGY = "alpha.jobset.sigs.k8s.io/exclusive-topology"

# Finalizer on the ElasticTrainingJob itself (kopf's, named by the operator): removed once the operator's
# timer for the job stopped; a job that keeps it past its delete waits for a running operator.
FINALIZER = f"{GROUP}/operator"

# Key in the job's Secret holding the control-API bearer token.
TOKEN_KEY = "token"
# Key in the job's ConfigMap holding the whole ElasticTrainingJob manifest.
MANIFEST_KEY = "job.yaml"


def job_selector(job_name: str, job_uid: str | None = None) -> dict[str, str]:
    """Labels every child of `job_name` carries (for label selectors); with its UID when known."""
    return {JOB_NAME: job_name, **({JOB_UID: job_uid} if job_uid else {})}
