"""Per-backend rendering of the controller pod and worker JobSets.

Each backend module exposes a `Renderer`; `renderer_for(spec.backend)` picks
it. Secret, ConfigMap and Service are backend-independent (`children`).
"""

from __future__ import annotations

from typing import Any, Protocol

from elastic_jax.api.job import ElasticTrainingJob


class UnsupportedBackend(ValueError):
    """The operator cannot render `spec.backend`; `str()` names the field."""


class Renderer(Protocol):
    """Renders the backend-specific children of a job (pure: no API calls)."""

    def controller_pod(self, job: ElasticTrainingJob, attempt: int, job_uid: str = "") -> dict[str, Any]:
        """The controller Pod of incarnation `attempt` (restartPolicy Never)."""

    def worker_jobset(self, job: ElasticTrainingJob, index: int) -> dict[str, Any]:
        """The JobSet of slice `index`."""


def renderer_for(backend: str) -> Renderer:
    """The renderer of `backend`.

    Raises:
      UnsupportedBackend: no renderer for it in this operator version.
    """
    if backend == "cpu":
        from elastic_jax.k8s_operator.backends.cpu import CpuRenderer

        return CpuRenderer()
    if backend == "pathways":
        from elastic_jax.k8s_operator.backends.pathways import PathwaysRenderer

        return PathwaysRenderer()
    raise UnsupportedBackend(
        f"spec.backend {backend!r} is not supported by this operator version (supported: cpu, pathways)"
    )


def resolve(job: ElasticTrainingJob) -> ElasticTrainingJob:
    """`job` as the operator will render it, with backend-derived fields filled in.

    pathways: hostsPerSlice and devicesPerHost come from the TPU topology, so
    the slice tracker counts the right number of pods. cpu: `job` unchanged
    (a local spec.checkpoint.uri must be a path the controller pod can mount).

    Raises:
      UnsupportedBackend: the operator cannot render this spec (message names the field).
    """
    renderer_for(job.spec.backend)
    from elastic_jax.k8s_operator.backends import cpu

    cpu.check_local_checkpoint(job)  # the cluster rules, for every backend (pathways: gs:// only)
    if job.spec.backend == "pathways":
        from elastic_jax.k8s_operator.backends import pathways

        return pathways.resolve(job)
    return job
