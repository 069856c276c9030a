"""What the training loop needs from a backend, and the table that builds one per `spec.backend`.

Two backends implement `Backend`:

* ``cpu`` (`backend_cpu.CpuBackend`): the state stays in this process; each
  step's per-slice work runs on worker processes over gRPC. A lost slice
  costs no state.
* ``pathways`` (`backend_pathways.PathwaysBackend`): one JAX program over the
  active slices' TPU devices through the Pathways proxy; state on a lost
  slice's devices is gone (host snapshots or a checkpoint restore it).

The loop (`loop.TrainingRun`) and the manager (`elastic.manager.Manager`)
call only what is declared here.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from elastic_jax.api.job import ElasticTrainingJob
from elastic_jax.controller.elastic.slice_set import SliceSet


class Backend(Protocol):
    """A way to run one training step over the active slices.

    Attributes:
      keeps_state_on_slice_loss: True when the training state survives the
        loss of any slice (it lives in the controller); False when it must be
        restored from a host snapshot or checkpoint after a loss.
    """

    keeps_state_on_slice_loss: bool

    def health_check(self, indices: Iterable[int]) -> frozenset[int]:
        """The subset of `indices` whose slices answer now (before they join the mesh)."""

    def visible_slices(self) -> frozenset[int] | None:
        """Slices this backend can place work on now; None: every Ready slice (no restriction)."""

    def prepare(self, indices: Iterable[int]) -> frozenset[int]:
        """The subset of `indices` (Ready slices outside the mesh) that can join without compiling first; starts
        readying the others in the background (the cpu backend compiles the step programs there: warm spares)."""

    def place_state(self, state: Any, active: Sequence[int]) -> Any:
        """`state` (a pytree) laid out for a mesh of the `active` slices; the cpu backend returns it as is."""

    def map_sum(self, fn: Callable[[Any, Mapping[str, Any]], Any], params: Any, batch: Mapping[str, np.ndarray],
                active: Sequence[int]) -> Any:
        """`fn(params, examples)` over the global `batch` on the `active` slices, summed over the examples' shares.

        `fn` returns sums over the examples it is given (a pytree of arrays), so the result does not
        depend on how many slices run it (the trainer's step: `backend_cpu.make_slice_step`, loss
        sum, weight, gradient sum). The library's `Runtime.map_sum` and the built-in trainer call it.

        Raises:
          SliceDownError: a slice was lost, hung past its deadline, or reported down during the step.
          UserCodeError: the step failed the same way on every slice (the trainer's error).
          StopRequested: `interrupt` was called.
        """

    def interrupt(self) -> None:
        """Makes the in-flight `map_sum` end with `StopRequested` as soon as it can (thread-safe)."""

    def cleanup(self) -> None:
        """After an elastic event, before the next attempt (drop what belongs to the old mesh)."""

    def close(self) -> None:
        """Releases connections at the end of the run."""


@dataclasses.dataclass(frozen=True)
class BackendContext:
    """What a backend is built from.

    Attributes:
      job: the validated manifest.
      slice_set: the slices, fed by the control API.
      token: the job's control/worker token (the cpu backend's workers require it).
    """

    job: ElasticTrainingJob
    slice_set: SliceSet
    token: str


def _cpu(ctx: BackendContext) -> Backend:
    from elastic_jax.controller.backend_cpu import CpuBackend

    e = ctx.job.spec.elasticity
    return CpuBackend(ctx.slice_set, devices_per_host=ctx.job.spec.slices.devices_per_host,
                      step_deadline_s=e.step_deadline_seconds, first_step_deadline_s=e.first_step_deadline_seconds,
                      token=ctx.token)


def _pathways(ctx: BackendContext) -> Backend:
    from elastic_jax.controller.pathways_connect import connect

    return connect(ctx.slice_set)


BACKENDS: dict[str, Callable[[BackendContext], Backend]] = {"cpu": _cpu, "pathways": _pathways}
"""`spec.backend` -> factory. A factory raises ImportError or ValueError when it cannot build (the reason is
the job's failure reason, prefixed with `spec.backend <name>:`)."""


def build(ctx: BackendContext) -> Backend:
    """The backend `ctx.job.spec.backend` names.

    Raises:
      ImportError, ValueError: from the factory (e.g. pathwaysutils missing, devices that do not fit the spec).
      KeyError: a backend name without a factory (the manifest model refuses those first).
    """
    return BACKENDS[ctx.job.spec.backend](ctx)
