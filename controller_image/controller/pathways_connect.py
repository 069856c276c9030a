"""Connecting the controller to the Pathways proxy beside it (the pathways backend's start-up)."""

from __future__ import annotations

import logging
import os

# Pathways persistence: Orbax saves and restores arrays on the TPU workers, straight to and from
# GCS, instead of pulling every array through the proxy into this process (a 135 GB checkpoint
# exhausted the proxy's memory without it). pathwaysutils.initialize() registers its Orbax
# handlers only when this is "1" at that moment.
PERSISTENCE_ENV = "ENABLE_PATHWAYS_PERSISTENCE"


def connect(slice_set):
    """Connects to the Pathways proxy beside this container and builds the backend.

    Turns Pathways persistence on (`PERSISTENCE_ENV`, unless the environment
    sets it) before `pathwaysutils.initialize()`, so every checkpoint this
    controller writes or restores goes from the workers to GCS directly.

    Raises:
      ImportError: pathwaysutils is not installed (`pip install 'elastic-jax[tpu]'`).
      ValueError: devices of a slice index beyond `spec.slices.count + spares`, or devices without a slice index.
    """
    try:
        import pathwaysutils
    except ImportError:
        raise ImportError("pathwaysutils is not installed; use the controller image or pip install 'elastic-jax[tpu]'") from None
    if os.environ.setdefault(PERSISTENCE_ENV, "1") != "1":
        logging.getLogger("elastic_jax.controller").warning(
            "%s=%r: checkpoints pass through the Pathways proxy and this pod's memory", PERSISTENCE_ENV,
            os.environ[PERSISTENCE_ENV], extra={"event": "pathways_persistence_off"})
    pathwaysutils.initialize()
    from elastic_jax.controller.backend_pathways import PathwaysBackend

    return PathwaysBackend(slice_set)
