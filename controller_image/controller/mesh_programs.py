"""Compiled step programs per mesh, kept for the whole run and compiled ahead off the training thread.

A slice loss or a rejoin changes the mesh, and a new mesh needs its own
executable. Dropping them (`jax.clear_caches()`, as pathways-utils does after
every elastic event) made a slice loss cost a full recompile on the critical
path (37 s for a 25M-parameter LM on a v5e chip). `ProgramCache` keeps every
executable it built, keyed by `ProgramKey` (the function, the active slices,
the state's and the batch's shapes and dtypes), and compiles the programs of
the likely next meshes on one background thread (JAX ahead-of-time:
`jax.jit(...).lower(abstract args with shardings).compile()`), so the
attempt after a slice loss or a rejoin finds its program ready.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

_logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class ProgramKey:
    """What one compiled program is for.

    Attributes:
      kind: "step" (state in, new state and replicated outputs out) or "map_sum" (replicated outputs).
      fn: the traced function (compared by identity).
      active: the active slice indices, sorted (the mesh's rows).
      state: (treedef, ((shape, dtype name), ...)) of the state argument.
      batch: ((name, shape, dtype name), ...) of the batch, sorted by name.
    """

    kind: str
    fn: Any
    active: tuple[int, ...]
    state: tuple
    batch: tuple

    def with_active(self, active: Iterable[int]) -> ProgramKey:
        """The same program for another mesh."""
        return dataclasses.replace(self, active=tuple(sorted(active)))


class ProgramCache:
    """Executables by `ProgramKey`, built by `compile_fn` on demand or ahead in the background.

    Args:
      compile_fn: `key -> compiled executable` (a `jax.stages.Compiled`); may raise.

    Attributes:
      compiled_here: keys compiled on a caller's thread because they were not ready (a compile on the
        critical path), in order.
    """

    def __init__(self, compile_fn: Callable[[ProgramKey], Any]):
        self._compile = compile_fn
        self._lock = threading.Lock()
        self._programs: dict[ProgramKey, concurrent.futures.Future] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="compile-ahead")
        self.compiled_here: list[ProgramKey] = []

    def get(self, key: ProgramKey) -> Any:
        """The executable for `key`: the kept one, the one compiling ahead (waited for), or compiled now.

        Raises:
          Exception: whatever `compile_fn` raises for `key` on this call (it is not kept).
        """
        with self._lock:
            future = self._programs.get(key)
            mine = future is None
            if mine:
                future = self._programs[key] = concurrent.futures.Future()
        if mine:
            self.compiled_here.append(key)
            self._run(key, future)
        return future.result()

    def _run(self, key: ProgramKey, future: concurrent.futures.Future) -> None:
        try:
            future.set_result(self._compile(key))
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits; not kept, so a later get retries
            with self._lock:
                self._programs.pop(key, None)
            future.set_exception(e)

    def ready(self, key: ProgramKey) -> bool:
        """True when `key`'s executable is built (a call runs without compiling)."""
        with self._lock:
            future = self._programs.get(key)
        return future is not None and future.done() and future.exception() is None

    def ahead(self, keys: Iterable[ProgramKey]) -> None:
        """Starts compiling each of `keys` not kept or compiling yet, in order, on the background thread.

        A failure is logged and forgotten (that mesh may never come; if it does, `get` compiles it then).
        """
        for key in keys:
            with self._lock:
                if key in self._programs:
                    continue
                future = self._programs[key] = concurrent.futures.Future()
            try:
                self._pool.submit(self._ahead_one, key, future)
            except RuntimeError:  # shut down
                with self._lock:
                    self._programs.pop(key, None)
                return

    def _ahead_one(self, key: ProgramKey, future: concurrent.futures.Future) -> None:
        self._run(key, future)
        if future.exception() is not None:
            _logger.info("compiling ahead for slices %s failed: %s", list(key.active),
                         str(future.exception()).splitlines()[0] if str(future.exception()) else future.exception())

    def wait(self, timeout_s: float | None = None) -> bool:
        """Waits until no program is compiling; True when none is left within `timeout_s` seconds."""
        with self._lock:
            pending = [f for f in self._programs.values() if not f.done()]
        done, not_done = concurrent.futures.wait(pending, timeout=timeout_s)
        return not not_done

    def close(self) -> None:
        """Stops compiling ahead (queued compiles are dropped; one in progress finishes)."""
        self._pool.shutdown(wait=False, cancel_futures=True)
