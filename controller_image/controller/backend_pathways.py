"""The pathways backend: one jitted step over the devices of every active slice.

With Pathways (`pathwaysutils.initialize()`), `jax.devices()` in the
controller spans all slices and `device.slice_index` tells them apart. A step
is one data-parallel `jax.jit` over a mesh `("slice", "data")` of the active
slices' devices; XLA reduces gradients across slices over DCN. A lost slice
surfaces as `jax.errors.JaxRuntimeError` (`DATA_LOSS: ...`): the backend then
runs a small computation on each active slice (pathways-utils'
`DefaultSliceHealthChecker` idea) to find which ones are gone, marks them
down and raises `SliceDownError`, so the same `Manager` handles it. Unlike
the cpu backend, device-resident state on a lost slice is gone: the loop
restores it from the newest host snapshot or committed checkpoint
(`keeps_state_on_slice_loss = False`).

A slice whose node pool is still provisioning when the controller starts
has no devices in `jax.devices()` yet. That is not bad input: the slice is
simply not there, as after any later loss. The backend starts with the
slices it sees (`visible_slices`), the manager waits for `minSlices` of them
(pause) or trains on fewer, and the device list is read again while a slice
is missing, so the slice joins at a step boundary once its workers have
registered with the resource manager and the operator reported it Ready.

Without TPUs this module is exercised on CPU devices with an explicit
device → slice mapping (tests), which runs the same mesh, sharding and error
paths; the Pathways proxy itself needs Google Cloud.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from elastic_jax.controller.elastic.errors import SliceDownError, is_slice_down
from elastic_jax.controller.elastic.slice_set import SliceSet

_logger = logging.getLogger(__name__)

SliceOf = Callable[[Any], int]
Devices = Sequence[Any] | Callable[[], Sequence[Any]]
# While a slice is missing, how often to list the devices again (a step boundary asks each step).
DEVICE_REFRESH_S = 5.0
# pathways-utils checks devices with x + 1 on a value of 99 (elastic.py, _SIMPLE_EXECUTION_TEST_VALUE = 100).
_PROBE_VALUE = 99.0


def default_slice_of(device: Any) -> int:
    """The slice a device belongs to: `device.slice_index` (Pathways and multi-slice TPU devices set it).

    A TPU device without one (`None`: a single-host TPU VM, measured on a v5e)
    is slice 0: its chips are one slice. A CPU device is refused: the pathways
    backend needs TPUs (tests map CPU devices to slices explicitly, `slice_of`).

    Raises:
      ValueError: a CPU device (message names the device and the way out).
    """
    index = getattr(device, "slice_index", None)
    if index is not None:
        return int(index)
    if getattr(device, "platform", None) == "cpu":
        raise ValueError(f"device {device} is a CPU device with no slice_index: the pathways backend needs TPU "
                         "devices (through the Pathways proxy, or a TPU VM's own chips); use spec.backend cpu")
    return 0


def slice_to_devices(devices: Iterable[Any], slice_of: SliceOf = default_slice_of) -> dict[int, list[Any]]:
    """Groups devices by slice, keeping device order within a slice."""
    out: dict[int, list[Any]] = collections.defaultdict(list)
    for d in devices:
        out[slice_of(d)].append(d)
    return dict(sorted(out.items()))


def mesh_for(slices: Mapping[int, Sequence[Any]], active: Sequence[int]) -> Mesh:
    """A `("slice", "data")` mesh over the devices of the active slices.

    Raises:
      ValueError: no active slices, or active slices with different device counts.
    """
    if not active:
        raise ValueError("no active slices")
    groups = [list(slices[i]) for i in sorted(active)]
    if len({len(g) for g in groups}) != 1:
        raise ValueError(f"active slices have different device counts: {[len(g) for g in groups]}")
    return Mesh(np.array(groups, dtype=object), ("slice", "data"))


def batch_spec(global_batch_size: int, mesh: Mesh) -> PartitionSpec:
    """How to shard the batch's leading axis: over every device when it divides, else over slices, else replicate."""
    n_slices, per_slice = mesh.devices.shape
    if global_batch_size % (n_slices * per_slice) == 0:
        return PartitionSpec(("slice", "data"))
    if global_batch_size % n_slices == 0:
        return PartitionSpec("slice")
    return PartitionSpec()


class PathwaysBackend:
    """Runs the step over all active slices' devices in one program.

    Args:
      slice_set: slice states; the operator's reports still arrive here and are
        preferred over polling, health checks confirm them.
      devices: all devices, or a function listing them now (default `jax.devices`).
      slice_of: device → slice index (default `device.slice_index`).

    Raises:
      ValueError: a device of a slice index outside 0..count+spares-1 (the
        resource manager runs `--instance_count` = count + spares slices, so
        that is a misconfigured head, not a slice to wait for).
    """

    keeps_state_on_slice_loss = False

    def __init__(self, slice_set: SliceSet, devices: Devices | None = None,
                 slice_of: SliceOf = default_slice_of):
        self.slice_set = slice_set
        if devices is None:
            self._list_devices = jax.devices
        elif callable(devices):
            self._list_devices = devices
        else:
            self._list_devices = lambda: devices
        self._slice_of = slice_of
        self._listed_at = 0.0
        self.slices: dict[int, list[Any]] = {}
        self._refresh(force=True)
        extra = sorted(set(self.slices) - set(range(slice_set.total)))
        if extra:
            raise ValueError(f"spec.slices.count + spares is {slice_set.total} but the devices include slices {extra}")
        missing = self.missing_slices()
        if missing:
            _logger.warning("slices %s have no devices yet (node pool provisioning, or workers not registered); "
                            "waiting for them as for any lost slice", missing,
                            extra={"event": "slices_missing_at_start", "slices": missing})
        self._compiled: dict[tuple[int, ...], Any] = {}

    # -- which slices exist -------------------------------------------------

    def _refresh(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._listed_at < DEVICE_REFRESH_S:
            return
        self._listed_at = now
        before = set(self.slices)
        self.slices = slice_to_devices(self._list_devices(), self._slice_of)
        appeared = sorted(set(self.slices) - before)
        if before and appeared:
            _logger.info("slices %s now have devices", appeared, extra={"event": "slices_appeared", "slices": appeared})

    def missing_slices(self) -> list[int]:
        """Slice indices of 0..count+spares-1 with no device in the last device list."""
        return sorted(set(range(self.slice_set.total)) - set(self.slices))

    def visible_slices(self) -> frozenset[int]:
        """Slices with devices, listing the devices again (at most every `DEVICE_REFRESH_S`) while one is missing."""
        if self.missing_slices():
            self._refresh()
        return frozenset(i for i in self.slices if i < self.slice_set.total)

    def prepare(self, indices: Iterable[int]) -> frozenset[int]:
        """Every one of `indices`: the step program is compiled here, for the mesh of the next attempt (a new
        mesh needs a new program, so there is nothing to compile on an idle slice ahead)."""
        return frozenset(indices)

    # -- health ------------------------------------------------------------

    def _probe(self, index: int) -> jax.Array:
        devices = self.slices[index]
        mesh = Mesh(np.array(devices, dtype=object), ("data",))
        x = jax.device_put(np.full(len(devices), _PROBE_VALUE, np.float32), NamedSharding(mesh, PartitionSpec("data")))
        return x + 1

    def health_check(self, indices: Iterable[int]) -> frozenset[int]:
        """Dispatches a tiny computation on each slice, then validates them all.

        Returns:
          The slices whose devices computed the right answer. A slice-down
          error marks a slice unhealthy; any other error propagates.
        """
        indices = sorted(i for i in indices if i in self.slices)  # a slice without devices is not healthy
        pending = {}
        healthy = set()
        for i in indices:
            try:
                pending[i] = self._probe(i)
            except jax.errors.JaxRuntimeError as e:
                if not is_slice_down(e):
                    raise
        for i, x in pending.items():
            try:
                if np.allclose(np.asarray(jax.block_until_ready(x)), _PROBE_VALUE + 1):
                    healthy.add(i)
            except jax.errors.JaxRuntimeError as e:
                if not is_slice_down(e):
                    raise
        return frozenset(healthy)

    # -- state placement ----------------------------------------------------

    def place_state(self, state: Any, active: Sequence[int]) -> Any:
        """Replicates the state onto the mesh of the active slices (after a resize)."""
        replicated = NamedSharding(mesh_for(self.slices, active), PartitionSpec())
        return jax.device_put(state, replicated)

    # -- the step -----------------------------------------------------------

    def _step_fn(self, fn: Any, active: tuple[int, ...], batch_size: int):
        key = (fn, *active, batch_size)
        jitted = self._compiled.get(key)
        if jitted is None:
            mesh = mesh_for(self.slices, active)
            replicated = NamedSharding(mesh, PartitionSpec())
            jitted = jax.jit(
                fn,
                in_shardings=(replicated, NamedSharding(mesh, batch_spec(batch_size, mesh))),
                out_shardings=replicated,
            )
            self._compiled[key] = jitted
        return jitted

    def map_sum(self, fn: Any, params: Any, batch: Mapping[str, np.ndarray], active: Sequence[int]) -> Any:
        """`fn(params, batch)` as one program over the active slices' devices, the batch sharded across them.

        `fn` returns sums over its examples (as on the cpu backend), so XLA's reduction across the
        slices (over DCN) makes the result the sum over the global batch. Jitted once per `fn`
        (by identity), mesh and batch size; `cleanup` drops the programs of an old mesh.

        Args:
          fn: `(params, batch) -> pytree of arrays`, jit-traceable.
          params: placed on the active slices' mesh (`place_state`).
          batch: the global batch, dict of arrays with leading axis = global batch size.
          active: active slice indices.

        Returns:
          `fn`'s output tree as replicated jax arrays, computed (blocked on: a lost slice raises here).

        Raises:
          SliceDownError: a slice-down `JaxRuntimeError`; the slices that fail
            the health check afterwards are named and marked down.
          jax.errors.JaxRuntimeError: any other runtime error (user code), unchanged.
        """
        active = tuple(sorted(active))
        batch_size = next(iter(batch.values())).shape[0]
        try:
            return jax.block_until_ready(self._step_fn(fn, active, batch_size)(params, dict(batch)))
        except jax.errors.JaxRuntimeError as e:
            if not is_slice_down(e):
                raise
            lost = sorted(set(active) - self.health_check(active)) or list(active)
            gens = {i: self.slice_set.record(i).generation for i in lost}
            self.slice_set.mark_down(lost, str(e).splitlines()[0], gens)
            raise SliceDownError(f"slices {lost} lost: {str(e).splitlines()[0]}", lost) from e

    def interrupt(self) -> None:
        """Nothing to do: one Pathways program cannot be cut short from here; a stop waits for the step to end
        (or for the slice loss that ends it)."""

    def cleanup(self) -> None:
        """After an elastic event: drop compiled programs for the old mesh (pathways-utils does the same)."""
        self._compiled.clear()
        jax.clear_caches()

    def close(self) -> None:
        """Nothing to close (Pathways owns the connections)."""
