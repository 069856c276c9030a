"""The trainer API: what a user supplies to elastic-jax.

A manifest names an entry point `package.module:function`
(`spec.controller.trainer.entryPoint`). The controller imports it and calls it
with `spec.controller.trainer.config` (a dict); it returns a `Trainer`. The
same `Trainer` runs on the `cpu` backend (per-slice step exported to slice
worker processes) and on the `pathways` backend (one jitted step over all
slices' devices): user code never changes between them.

Contract of `loss_fn`, chosen so that splitting a global batch across any
number of slices, evenly or not, gives exactly the single-process gradient:
it returns the *sum* of per-example (or per-token) losses and the number of
examples (or tokens) it summed over. The runtime adds sums and counts across
slices and divides once.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Mapping
from typing import Any

import jax
import optax

PyTree = Any
Batch = Mapping[str, jax.Array]


class TrainerConfigError(ValueError):
    """The trainer's config is invalid. The message names the field, e.g.
    `spec.controller.trainer.config.data: no files match '/x/*.py'`."""


@dataclasses.dataclass(frozen=True)
class Trainer:
    """A training program, independent of backend and slice count.

    Attributes:
      init_params: `key (jax.random key) -> params`, a pytree of float arrays.
      loss_fn: `(params, batch) -> (loss_sum f32[], weight f32[])`; `batch` is a
        dict of arrays whose leading axis is this slice's share of the global
        batch (any size >= 1). Must be jittable and exportable (`jax.export`):
        no host callbacks.
      optimizer: an optax transformation applied by the controller to the
        averaged gradient (sum of gradients / sum of weights).
      dataset: a `grain.MapDataset` of single examples (dicts of numpy
        arrays of fixed shape and dtype). The runtime shuffles, repeats and
        batches it; batch `i` is the same whatever the slice count, so the
        data position is the step number.
      tokens_per_example: for throughput metrics (tokens/s); 1 for non-sequence data.
      name: shown in logs and status.
    """

    init_params: Callable[[jax.Array], PyTree]
    loss_fn: Callable[[PyTree, Batch], tuple[jax.Array, jax.Array]]
    optimizer: optax.GradientTransformation
    dataset: Any
    tokens_per_example: int = 1
    name: str = "trainer"


def load_trainer(entry_point: str, config: Mapping[str, Any]) -> Trainer:
    """Imports `module:function` and calls it with `config`.

    Args:
      entry_point: `package.module:function`.
      config: passed as the only argument.

    Returns:
      The `Trainer` the function built.

    Raises:
      TrainerConfigError: the module or function does not exist, the function
        does not return a `Trainer`, or it raised `TrainerConfigError` itself.
    """
    module_name, _, func_name = entry_point.partition(":")
    field = "spec.controller.trainer.entryPoint"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise TrainerConfigError(f"{field}: cannot import module {module_name!r} ({e})") from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise TrainerConfigError(f"{field}: module {module_name!r} has no function {func_name!r}")
    trainer = func(dict(config))
    if not isinstance(trainer, Trainer):
        raise TrainerConfigError(
            f"{field}: {entry_point} returned {type(trainer).__name__}, expected elastic_jax.controller.trainer.Trainer"
        )
    return trainer
