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

    def controller_pod(self, job: ElasticTrainingJob, attempt: int) -> dict[str, Any]:
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
    raise UnsupportedBackend(
        f"spec.backend {backend!r} is not supported by this operator version (supported: cpu)"
    )
