"""Connecting the controller to the Pathways proxy beside it (the pathways backend's start-up).

Order matters: under `JAX_PLATFORMS=proxy` (as the operator renders it) JAX
knows no `proxy` backend until `pathwaysutils.initialize()` registers it, so
anything that touches a JAX backend first (Orbax's checkpointer asks
`jax.default_backend()`, a trainer module may build an array) fails with
`Unable to initialize backend 'proxy'` and the job ended Failed at its first
start (issue 29 fault 1). `initialize` is therefore the first thing the
controller (`main.py`), `elastic_jax.connect()` and `run_module` do on this
backend, and it connects at once, so a proxy that does not answer is a
controller loss (`ProxyUnavailableError`, exit `ControllerExit.RESTART`), not
a failure of the job (fault 4).
"""

from __future__ import annotations

import logging
import os

# Pathways persistence: Orbax saves and restores arrays on the TPU workers, straight to and from
# GCS, instead of pulling every array through the proxy into this process (a 135 GB checkpoint
# exhausted the proxy's memory without it). pathwaysutils.initialize() registers its Orbax
# handlers only when this is "1" at that moment.
PERSISTENCE_ENV = "ENABLE_PATHWAYS_PERSISTENCE"
# The proxy client's connection timeout in seconds (pathwaysutils' proxy_backend reads it; its default: 120 s).
PROXY_TIMEOUT_ENV = "PATHWAYS_PROXY_CONNECTION_TIMEOUT_SECS"

_logger = logging.getLogger("elastic_jax.controller")


class ProxyUnavailableError(RuntimeError):
    """The Pathways proxy did not answer (not listening yet, or slower than the client's connection timeout).

    A controller loss, not a failure of the job: the controller exits with
    `ControllerExit.RESTART` and its supervisor starts it again (counted).
    """


def initialize() -> None:
    """Registers Pathways with JAX and connects to the proxy; call before anything touches a JAX backend.

    Turns Pathways persistence on (`PERSISTENCE_ENV`, unless the environment
    sets it) before `pathwaysutils.initialize()`, so every checkpoint this
    process writes or restores goes from the workers to GCS directly; then
    lists the devices, which connects to the proxy. Safe to call again (both
    steps are done once).

    Raises:
      ImportError: pathwaysutils is not installed (`pip install 'elastic-jax[tpu]'`).
      ProxyUnavailableError: the proxy backend could not be initialized (no answer within the client's
        timeout, `PROXY_TIMEOUT_ENV`); the message names the address and JAX's reason.
    """
    try:
        import pathwaysutils
    except ImportError:
        raise ImportError("pathwaysutils is not installed; use the controller image or pip install 'elastic-jax[tpu]'") from None
    if os.environ.setdefault(PERSISTENCE_ENV, "1") != "1":
        _logger.warning(
            "%s=%r: checkpoints pass through the Pathways proxy and this pod's memory", PERSISTENCE_ENV,
            os.environ[PERSISTENCE_ENV], extra={"event": "pathways_persistence_off"})
    pathwaysutils.initialize()
    import jax

    _say_compilation_cache_is_off(jax)
    try:
        jax.devices()
    except RuntimeError as e:  # (JaxRuntimeError is one too) jax could not open the backend: the proxy
        target = jax.config.read("jax_backend_target") or "(JAX_BACKEND_TARGET unset)"
        raise ProxyUnavailableError(
            f"the Pathways proxy at {target} did not answer within the client's connection timeout "
            f"({os.environ.get(PROXY_TIMEOUT_ENV) or 120} s): {' '.join(str(e).split())}") from e


_CACHE_NOTED: list[bool] = []


def _say_compilation_cache_is_off(jax) -> None:
    """Logs once that JAX's persistent compilation cache is not used here, when a cache folder is configured.

    `pathwaysutils.initialize()` sets `jax_enable_compilation_cache` False under the proxy ("Pathways
    handles its own compilation cache", pathwaysutils `_initialize.py`), so the operator's
    `JAX_COMPILATION_CACHE_DIR` is read by nothing on this backend (issue 29 fault 5).
    """
    folder = os.environ.get("JAX_COMPILATION_CACHE_DIR") or jax.config.jax_compilation_cache_dir
    if not folder or jax.config.jax_enable_compilation_cache or _CACHE_NOTED:
        return
    _CACHE_NOTED.append(True)
    _logger.info("JAX's persistent compilation cache is off on Pathways (pathwaysutils.initialize() turns it off); "
                 "%s is not used", folder, extra={"event": "compilation_cache_off", "folder": folder})


def connect(slice_set):
    """Connects to the Pathways proxy beside this container (`initialize`) and builds the backend.

    Raises:
      ImportError: pathwaysutils is not installed (`pip install 'elastic-jax[tpu]'`).
      ProxyUnavailableError: as `initialize`.
      ValueError: devices of a slice index beyond `spec.slices.count + spares`, or CPU devices.
    """
    initialize()
    from elastic_jax.controller.backend_pathways import PathwaysBackend

    return PathwaysBackend(slice_set)
