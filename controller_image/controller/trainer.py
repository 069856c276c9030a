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
import os
import traceback
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import jax
import optax

PyTree = Any
Batch = Mapping[str, jax.Array]


class TrainerConfigError(ValueError):
    """The trainer's config is invalid. The message names the field, e.g.
    `spec.controller.trainer.config.data: no files match '/x/*.py'`.

    Raised with several problems (`TrainerConfigError(first, second, ...)`) it keeps each in `problems`
    (one line each, naming its field: what `elastic-jax validate --trainer` prints one `error:` line per);
    the message is then all of them on one line, joined by "; " (the controller's log and termination
    message).
    """

    def __init__(self, *problems: str) -> None:
        self.problems: tuple[str, ...] = problems or ("spec.controller.trainer.config: invalid",)
        super().__init__("; ".join(self.problems))


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


def _raised(error: BaseException) -> str:
    """`KeyError: 'loss' at /path/mod.py:12`: the exception and the innermost frame that raised it."""
    frames = traceback.extract_tb(error.__traceback__)
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    return f"{type(error).__name__}: {error}{where}"


def _not_on_path(field: str, entry_point: str, module_name: str, error: ModuleNotFoundError,
                 manifest_dir: Path | None) -> str:
    """The one line for an entry point whose module (or a package above it) is not on the Python path."""
    top = module_name.split(".")[0]
    where = os.environ.get("PYTHONPATH") or "unset"
    message = (f"{field} {entry_point!r}: cannot import module {module_name!r} ({error}): the module must be "
               f"installed in the controller's Python environment or its folder be on PYTHONPATH (now {where})")
    if manifest_dir is None:
        return message + "; on a cluster, build it into the controller image"
    folder = manifest_dir.resolve()
    beside = next((p for p in (folder / f"{top}.py", folder / top) if p.exists()), None)
    if beside is None:
        return message + f"; not found beside the manifest either (looked in {folder})"
    return (message + f"; {beside.name} is beside the manifest in {folder}, which is not on the path (the "
            f"manifest's folder is not searched: a cluster's controller has none): run with PYTHONPATH={folder}, "
            "or install the module")


def load_trainer(entry_point: str, config: Mapping[str, Any], manifest_dir: Path | None = None) -> Trainer:
    """Imports `module:function` and calls it with `config`.

    The module is imported from the Python path only (installed packages, PYTHONPATH): never from the
    manifest's folder, which a cluster's controller pod does not have (it mounts the manifest alone), so a
    job that trains locally must not start to depend on it.

    Args:
      entry_point: `package.module:function`.
      config: passed as the only argument.
      manifest_dir: the folder of the manifest as the user wrote it (`elastic-jax run` / `validate`), or
        None (a cluster): a module that is not importable but sits there is named in the error, with the
        PYTHONPATH that would find it.

    Returns:
      The `Trainer` the function built.

    Raises:
      TrainerConfigError: the module or function does not exist, importing the module or
        calling the function raised (the message names the field, the exception and where it
        was raised, without a traceback), the function does not return a `Trainer`, or it raised
        `TrainerConfigError` itself.
    """
    module_name, _, func_name = entry_point.partition(":")
    field = "spec.controller.trainer.entryPoint"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name is not None and (module_name == e.name or module_name.startswith(e.name + ".")):
            raise TrainerConfigError(_not_on_path(field, entry_point, module_name, e, manifest_dir)) from None
        # (a module the user's module imports is missing: that is the user's module's import failing)
        raise TrainerConfigError(f"{field}: importing module {module_name!r} raised {_raised(e)}") from None
    except Exception as e:  # noqa: BLE001 - the user's module failed while importing: one line naming it
        raise TrainerConfigError(f"{field}: importing module {module_name!r} raised {_raised(e)}") from None
    func = getattr(module, func_name, None)
    if not callable(func):
        raise TrainerConfigError(f"{field}: module {module_name!r} has no function {func_name!r}")
    try:
        trainer = func(dict(config))
    except TrainerConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - the entry point's own failure: one line, not a traceback
        hint = " (a key missing from spec.controller.trainer.config?)" if isinstance(e, KeyError) else ""
        raise TrainerConfigError(
            f"{field}: {entry_point}(spec.controller.trainer.config) raised {_raised(e)}{hint}") from None
    if not isinstance(trainer, Trainer):
        raise TrainerConfigError(
            f"{field}: {entry_point} returned {type(trainer).__name__}, expected elastic_jax.controller.trainer.Trainer"
        )
    return trainer
