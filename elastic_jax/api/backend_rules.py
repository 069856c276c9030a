"""What each backend requires of a job before the operator renders it, and the fields it derives.

Pure (no Kubernetes client), so that the operator's renderers
(`elastic_jax.k8s_operator.backends`), `elastic-jax validate --cluster` and the
CRD's CEL rules (`elastic_jax.api.crd`) apply one set of rules with one set of
messages, and the CLI and the CRD generator need nothing of the operator:

- `check_backend`: a backend the operator renders;
- `check_node_selectors` (pathways): user node selectors never replace the TPU
  ones the renderer sets (`node_selector_cel_rules` is the same rule as CEL);
- `resolve`: the job with backend-derived fields filled in (pathways: hosts per
  slice and chips per host from the TPU table, `elastic_jax.api.tpu_shapes`).

Every refusal is an `UnsupportedBackend` (`elastic_jax.api.cluster`) whose
message names the field.
"""

from __future__ import annotations

from elastic_jax.api import cluster, images
from elastic_jax.api import job as job_api
from elastic_jax.api.cluster import UnsupportedBackend
from elastic_jax.api.job import ElasticTrainingJob, batch_shares_problem
from elastic_jax.api.tpu_shapes import SliceShape, slice_shape

SUPPORTED_BACKENDS = ("cpu", "pathways")
PATHWAYS_SERVER_IMAGE = images.pathways_image("server")
"""The Pathways server image (resource manager and workers) at the pinned JAX's tag."""

HOSTS_FIELD = "spec.slices.hostsPerSlice"
DEVICES_FIELD = "spec.slices.devicesPerHost"
CHECKPOINT_FIELD = "spec.checkpoint.uri"
# The GKE TPU node labels the pathways renderer selects a slice's node pool by.
TPU_ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
TPU_TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"

# Node labels the pathways renderer decides: a user selector naming one would move the slices off
# their TPU pools (or the controller onto one). Refused, naming the field.
_WORKER_SELECTOR_FIELD = "spec.worker.nodeSelector"
_CONTROLLER_SELECTOR_FIELD = "spec.controller.nodeSelector"


def check_backend(backend: str) -> None:
    """`backend` is one the operator renders.

    Raises:
      UnsupportedBackend: it is not (names spec.backend and the supported ones).
    """
    if backend not in SUPPORTED_BACKENDS:
        raise UnsupportedBackend(f"spec.backend {backend!r} is not supported by this operator version "
                                 f"(supported: {', '.join(SUPPORTED_BACKENDS)})")


def check_node_selectors(job: ElasticTrainingJob) -> None:
    """User node selectors may add labels, never replace the TPU ones the operator sets.

    Raises:
      UnsupportedBackend: spec.worker.nodeSelector names the TPU accelerator or topology label, or
        spec.controller.nodeSelector names the TPU accelerator label (the controller must stay off TPU pools).
    """
    for key in (TPU_ACCELERATOR_LABEL, TPU_TOPOLOGY_LABEL):
        if key in job.spec.worker.node_selector:
            raise UnsupportedBackend(
                f"{_WORKER_SELECTOR_FIELD}[{key!r}]: the operator sets this TPU selector from spec.slices "
                "(accelerator, topology); remove it from the nodeSelector")
    if TPU_ACCELERATOR_LABEL in job.spec.controller.node_selector:
        raise UnsupportedBackend(
            f"{_CONTROLLER_SELECTOR_FIELD}[{TPU_ACCELERATOR_LABEL!r}]: the pathways controller runs off the TPU "
            "node pools (the operator requires that label to be absent); remove it")


def node_selector_cel_rules() -> list[dict[str, str]]:
    """CEL rules for the CRD's spec: the API server refuses what `check_node_selectors` refuses (backend pathways)."""
    rules = [{"rule": (f"self.backend != 'pathways' || !has(self.worker) || !has(self.worker.nodeSelector) || "
                       f"!('{key}' in self.worker.nodeSelector)"),
              "message": (f"{_WORKER_SELECTOR_FIELD}[{key!r}]: the operator sets this TPU selector from spec.slices "
                          "(accelerator, topology); remove it from the nodeSelector"),
              "fieldPath": ".worker.nodeSelector"} for key in (TPU_ACCELERATOR_LABEL, TPU_TOPOLOGY_LABEL)]
    rules.append({"rule": (f"self.backend != 'pathways' || !has(self.controller) || "
                           f"!has(self.controller.nodeSelector) || !('{TPU_ACCELERATOR_LABEL}' in "
                           "self.controller.nodeSelector)"),
                  "message": (f"{_CONTROLLER_SELECTOR_FIELD}[{TPU_ACCELERATOR_LABEL!r}]: the pathways controller runs "
                              "off the TPU node pools (the operator requires that label to be absent); remove it"),
                  "fieldPath": ".controller.nodeSelector"})
    return rules


def check_batch_shares(job: ElasticTrainingJob, shape: SliceShape) -> None:
    """The built-in loop's batch over slices x chips (`job.batch_shares_problem`): the pathways backend shards
    it over every chip only when it divides, and otherwise runs the whole share on every chip of a slice.

    Raises:
      UnsupportedBackend: naming spec.training.globalBatchSize and the numbers (library mode: never, your
        program shards its own batches).
    """
    if job.spec.controller.command is not None:
        return
    s = job.spec.slices
    problem = batch_shares_problem(job.spec.training.global_batch_size, s.count, shape.chips,
                                   f"the chips of {s.accelerator} {s.topology}")
    if problem:
        raise UnsupportedBackend(problem[0])


def resolve_pathways(job: ElasticTrainingJob) -> ElasticTrainingJob:
    """`job` (backend pathways) with hostsPerSlice and devicesPerHost derived from the slice topology.

    The CRD defaults both fields to 1, so 1 means "derive"; any other value
    must equal the derived one.

    Returns:
      A copy with `hosts_per_slice` = hosts per slice and `devices_per_host`
      = TPU chips per host.

    Raises:
      UnsupportedBackend: unknown accelerator or bad topology (`SliceShapeError`,
        naming spec.slices.accelerator / spec.slices.topology), a TPU node selector
        (`check_node_selectors`), a conflicting spec.slices.hostsPerSlice or
        spec.slices.devicesPerHost, a spec.training.globalBatchSize the slices' chips do not share
        equally (`check_batch_shares`), or a spec.checkpoint.uri that is not gs://
        (Pathways needs a GCS scratch location, placed under it).
    """
    s = job.spec.slices
    shape = slice_shape(s.accelerator, s.topology)
    check_node_selectors(job)
    for field, value, derived, what in ((HOSTS_FIELD, s.hosts_per_slice, shape.hosts, "hosts"),
                                        (DEVICES_FIELD, s.devices_per_host, shape.chips_per_host, "chips per host")):
        if value not in (1, derived):
            raise UnsupportedBackend(
                f"{field} is {value} but {s.accelerator} {s.topology} has {derived} {what}; omit it or set {derived}"
            )
    check_batch_shares(job, shape)
    if not job.spec.checkpoint.uri.startswith("gs://"):
        raise UnsupportedBackend(
            f"{CHECKPOINT_FIELD} {job.spec.checkpoint.uri!r} must be gs://bucket/prefix for backend pathways "
            "(pods on different nodes share it, and Pathways keeps its GCS scratch under it)"
        )
    slices = s.model_copy(update={"hosts_per_slice": shape.hosts, "devices_per_host": shape.chips_per_host})
    return job.model_copy(update={"spec": job.spec.model_copy(update={"slices": slices})})


def pathways_server_image(job: ElasticTrainingJob) -> str:
    """The image of a pathways job's resource manager and workers: spec.worker.image unless left at the cpu
    worker's default, then `PATHWAYS_SERVER_IMAGE`."""
    image = job.spec.worker.image
    return PATHWAYS_SERVER_IMAGE if image == job_api.DEFAULT_WORKER_IMAGE else image


def resolve(job: ElasticTrainingJob) -> ElasticTrainingJob:
    """`job` as the operator will render it, with backend-derived fields filled in.

    pathways: hostsPerSlice and devicesPerHost come from the TPU topology, so
    the slice tracker counts the right number of pods. cpu: `job` unchanged
    (a local spec.checkpoint.uri must be a path the controller pod can mount).

    Raises:
      UnsupportedBackend: the operator cannot render this spec (message names the field).
    """
    check_backend(job.spec.backend)
    cluster.check_job(job)  # the cluster rules, for every backend (pathways: gs:// only)
    if job.spec.backend == "pathways":
        return resolve_pathways(job)
    return job
