"""Names of an ElasticTrainingJob's children (one place, so every module agrees)."""

from __future__ import annotations

from elastic_jax import contract
from elastic_jax.api import cluster

# Port the controller's control API listens on inside its pod.
CONTROLLER_PORT = contract.CONTROLLER_PORT
# gRPC port of a cpu slice worker inside its pod (each pod has its own IP).
WORKER_PORT = contract.WORKER_PORT
# The replicated job inside each slice's JobSet.
WORKER_REPLICATED_JOB = "worker"

# Folders the operator mounts in child pods (defined with the cluster rules that keep checkpoints off them).
MANIFEST_DIR = cluster.MANIFEST_DIR
TOKEN_DIR = cluster.TOKEN_DIR
SCRATCH_DIR = cluster.SCRATCH_DIR


def secret(job: str) -> str:
    """The Secret holding the control-API token."""
    return f"{job}-token"


def configmap(job: str) -> str:
    """The ConfigMap holding the job's manifest for the controller."""
    return f"{job}-manifest"


def service(job: str) -> str:
    """The Service in front of the controller pod (for real clusters; the operator uses the pod IP)."""
    return f"{job}-controller"


def pathways_head(job: str) -> str:
    """The headless Service naming the Pathways head (the controller pod) for its TPU workers.

    Published before the pod is Ready (publishNotReadyAddresses): the workers
    must reach the resource manager for the controller to become Ready.
    """
    return f"{job}-pathways-head"


def controller_pod(job: str, attempt: int) -> str:
    """The controller pod of one incarnation: a new name per recreation, so a
    replacement never waits for the old pod's deletion to finish."""
    return f"{job}-controller-{attempt}"


def slice_jobset(job: str, index: int) -> str:
    """The JobSet of slice `index`."""
    return f"{job}-slice-{index}"


def controller_policy(job: str) -> str:
    """The NetworkPolicy limiting who reaches the job's controller pods (`network_policies`)."""
    return f"{job}-controller-ingress"


def worker_policy(job: str) -> str:
    """The NetworkPolicy limiting who reaches the job's worker pods (`network_policies`)."""
    return f"{job}-worker-ingress"
