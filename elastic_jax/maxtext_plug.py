"""MaxText's elastic manager fed by the operator's slice reports (library mode under `run_module`).

MaxText (0.2.5, `maxtext/utils/elastic_utils.py`, read from its wheel and its
repository) keeps its pathways-utils `Manager` in the module global
`elastic_manager` and builds `manager.Manager()` only while that global is
None. Left alone, that `Manager` finds lost and returning slices itself, by
probing devices on its poll interval. `plug` sets the global, before MaxText's
trainer runs, to a `LazyManager` that becomes a `SliceReportManager` over the
runtime's slice set on first use: MaxText's `elastic_retry` then waits for the
operator's Ready reports, and a returning slice is seen when it is reported.

Lazy because building the manager lists `jax.devices()`, which must not happen
before MaxText's `train.py` has called `pathwaysutils.initialize()` (JAX would
start on the wrong backend); MaxText first touches the manager inside its
training entry point, after that call.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import threading
from collections.abc import Callable
from typing import Any

_logger = logging.getLogger(__name__)

ELASTIC_UTILS = "maxtext.utils.elastic_utils"
MANAGER_GLOBAL = "elastic_manager"


class LazyManager:
    """Stands for a manager that is built on first attribute access, then forwards every attribute to it.

    Args:
      build: makes the manager (called once, on the first attribute read or write other than this
        class's own); its exceptions reach the caller of that access.
    """

    def __init__(self, build: Callable[[], Any]):
        object.__setattr__(self, "_build", build)
        object.__setattr__(self, "_manager", None)
        object.__setattr__(self, "_lock", threading.Lock())

    @property
    def built(self) -> bool:
        """True once the manager exists."""
        return self._manager is not None

    def manager(self) -> Any:
        """The manager, built now if it was not."""
        with self._lock:
            if self._manager is None:
                object.__setattr__(self, "_manager", self._build())
            return self._manager

    def __getattr__(self, name: str) -> Any:
        # Only for names not found on this object: everything MaxText reads is the manager's.
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.manager(), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self.manager(), name, value)


def plug(module: str, backend: str, slice_set: Any,
         build: Callable[[Any], Any] | None = None) -> LazyManager | None:
    """Makes MaxText's elastic manager a `SliceReportManager` over `slice_set`, if `module` is MaxText's.

    Args:
      module: the module `run_module` runs (`spec.controller.args[0]`); only a `maxtext.*` module is plugged.
      backend: `spec.backend`; only `pathways` (MaxText's elastic mode needs Pathways).
      slice_set: the runtime's `SliceSet` (count + spares slices), fed by the control API.
      build: makes the manager from `slice_set` (default `SliceReportManager(slice_set)`, which lists
        `jax.devices()` by `slice_index`).

    Returns:
      The `LazyManager` now in MaxText's global, or None when nothing was plugged: not a MaxText module,
      not pathways, MaxText's elastic_utils not installed or without the `elastic_manager` global (a
      MaxText whose layout differs: its own Manager then probes devices, logged as a warning), or the
      global already set.
    """
    if backend != "pathways" or module.split(".", 1)[0] != "maxtext":
        return None
    try:
        found = importlib.util.find_spec(ELASTIC_UTILS) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        return None
    elastic_utils = importlib.import_module(ELASTIC_UTILS)
    if not hasattr(elastic_utils, MANAGER_GLOBAL):
        _logger.warning("%s has no %s global: MaxText's own elastic Manager finds slices by probing devices, "
                        "not from the operator's reports", ELASTIC_UTILS, MANAGER_GLOBAL)
        return None
    if getattr(elastic_utils, MANAGER_GLOBAL) is not None:
        return None
    if build is None:
        from elastic_jax.controller.elastic.pathways_utils import SliceReportManager as build  # noqa: N813
    lazy = LazyManager(lambda: build(slice_set))
    setattr(elastic_utils, MANAGER_GLOBAL, lazy)
    return lazy
