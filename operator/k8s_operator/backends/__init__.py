"""Per-backend rendering of the controller pod and worker JobSets.

Each backend module exposes a `Renderer`; `renderer_for(spec.backend)` picks
it. Secret, ConfigMap and Service are backend-independent (`children`).
"""

from __future__ import annotations

from typing import Any, Protocol

from elastic_jax.api.backend_rules import check_backend, resolve
from elastic_jax.api.cluster import UnsupportedBackend
from elastic_jax.api.job import ElasticTrainingJob
from elastic_jax.k8s_operator.backends.cpu import CpuRenderer
from elastic_jax.k8s_operator.backends.pathways import PathwaysRenderer

# The rules and their error live in the api (`elastic-jax validate` applies them without the operator);
# the renderers' callers import them from here too.
__all__ = ["Renderer", "UnsupportedBackend", "renderer_for", "resolve"]


class Renderer(Protocol):
    """Renders the backend-specific children of a job (pure: no API calls)."""

    def controller_pod(self, job: ElasticTrainingJob, attempt: int, job_uid: str = "") -> dict[str, Any]:
        """The controller Pod of incarnation `attempt` (restartPolicy Never)."""

    def worker_jobset(self, job: ElasticTrainingJob, index: int) -> dict[str, Any]:
        """The JobSet of slice `index`."""


# One renderer per backend of `backend_rules.SUPPORTED_BACKENDS` (tests/unit/test_operator_render.py).
RENDERERS: dict[str, type[Renderer]] = {"cpu": CpuRenderer, "pathways": PathwaysRenderer}


def renderer_for(backend: str) -> Renderer:
    """The renderer of `backend`.

    Raises:
      UnsupportedBackend: no renderer for it in this operator version.
    """
    check_backend(backend)
    return RENDERERS[backend]()
