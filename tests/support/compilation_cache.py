"""One persistent XLA compilation cache for the integration tier's processes (issue 30 item 4).

Every `elastic-jax run` of a test used to compile the same small step programs again, in its controller and in
each worker (the launcher's per-run `WORKDIR/xla-cache` starts empty), and so did every pathways-on-CPU child: a
warm cache halves the CPU seconds of a short run (15.5 -> 7.5 s user+sys, a 60-step two-slice run). The cache is
the product's own way in: `JAX_COMPILATION_CACHE_DIR` in `elastic-jax run`'s environment (its workers use it
instead of `xla-cache`; the controller and any JAX process read it). A cache hit changes no behaviour a test
checks: JAX's compile event (`/jax/core/compile/backend_compile_duration`) and the worker's `program compiled`
line still mark every program that was not in memory, loaded or compiled.

Tests of the cache itself (the run folder's `xla-cache`, a cold start) take `without_shared_compilation_cache`.
"""

from __future__ import annotations

import os
from pathlib import Path

from elastic_jax import contract

# The variables the shared cache sets: JAX's cache folder, and every compile cached (JAX's default skips
# programs that compiled in under 1 s: all of the tests' small ones).
NAMES = (contract.JAX_ENV_COMPILATION_CACHE_DIR, contract.JAX_ENV_CACHE_MIN_COMPILE_TIME_SECS)


def shared_folder(basetemp: Path) -> Path:
    """The session's cache folder, mode 0700, one for every xdist worker of the session (their basetemps,
    `popen-gwN`, share a parent); `basetemp` is `tmp_path_factory.getbasetemp()`."""
    root = basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp
    folder = root / "xla-cache-shared"
    folder.mkdir(mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)  # (the launcher refuses a cache others can write in)
    return folder


def child_env() -> dict[str, str]:
    """The shared cache's variables as set now (none outside the integration tier, or under
    `without_shared_compilation_cache`): for a child started with an environment of its own making."""
    return {name: os.environ[name] for name in NAMES if name in os.environ}
