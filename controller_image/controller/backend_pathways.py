"""The pathways backend: one jitted step over the devices of every active slice.

With Pathways (`pathwaysutils.initialize()`), `jax.devices()` in the
controller spans all slices and `device.slice_index` tells them apart. A step
is one program over a mesh `("slice", "data")` of the active slices'
devices: the batch is split over every device, the state is sharded within a
slice (FSDP over "data") and replicated across slices (`state_layout`); XLA
reduces gradients across slices over DCN. The built-in loop's step is fused
(`step`: gradients and the optimizer update in one program). A lost slice
surfaces as `jax.errors.JaxRuntimeError` (`DATA_LOSS: ...`): the backend then
runs a small computation on each active slice (pathways-utils'
`DefaultSliceHealthChecker` idea) to find which ones are gone, marks them
down and raises `SliceDownError`, so the same `Manager` handles it.

Recovery keeps compiling and restoring off the critical path: the programs of
every mesh are kept for the run, and those of the likely next meshes (one
slice fewer, a missing slice back, a spare in) are compiled ahead on a
background thread (`mesh_programs`); the state of the next mesh is rebuilt
from the replicas on the surviving slices (`recover_state`). The state on a
lost slice's devices is gone (`keeps_state_on_slice_loss = False`): only
when no slice of the mesh survives does the loop restore it from the newest
host snapshot or committed checkpoint.

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
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from elastic_jax.controller.elastic.errors import SliceDownError, is_slice_down
from elastic_jax.controller.elastic.slice_set import SliceSet
from elastic_jax.controller.mesh_programs import ProgramCache, ProgramKey
from elastic_jax.controller.state_layout import NoReplicaError, relayout, state_shardings

_logger = logging.getLogger(__name__)

SliceOf = Callable[[Any], int]


class Launched(NamedTuple):
    """A program dispatched and not waited for (`PathwaysBackend.launch`).

    Attributes:
      outputs: the program's outputs, `jax.Array` futures.
      active: the slices of its mesh (sorted).
    """

    outputs: Any
    active: tuple[int, ...]


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
        self._programs = ProgramCache(self._compile)
        self._last_key: ProgramKey | None = None  # the program of the last step (its mesh's neighbours compile ahead)
        self._held_by: dict[int, tuple[int, int]] = {}  # slices of the last completed step -> (generation, failures)

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

    # -- health ------------------------------------------------------------

    def _probe(self, index: int) -> jax.Array:
        devices = self.slices[index]
        mesh = Mesh(np.array(devices, dtype=object), ("data",))
        # The default device is part of JAX's compile cache key: the probe's program, compiled at the first
        # health check (outside any attempt), would compile again inside an attempt (its default device on
        # an active slice), on the training thread, during a recovery. The probe names its devices anyway.
        with jax.default_device(None):
            x = jax.device_put(np.full(len(devices), _PROBE_VALUE, np.float32),
                               NamedSharding(mesh, PartitionSpec("data")))
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

    def default_device(self, active: Iterable[int]) -> Any:
        """A device of an active slice, for `jax.default_device` during an attempt (and initialisation).

        `jax.devices()[0]` may belong to a lost slice: state initialised or computed there would be on
        no mesh device, or fail (pathways-utils' `Manager.default_device` makes the same choice).

        Raises:
          ValueError: no active slice has devices.
        """
        for i in sorted(active):
            if self.slices.get(i):
                return self.slices[i][0]
        raise ValueError(f"no devices for the active slices {sorted(active)}")

    def state_shardings(self, state: Any, active: Sequence[int]) -> Any:
        """The `NamedSharding` per leaf of `state` on the mesh of `active`: FSDP over each slice's devices
        ("data"), replicated across slices (`state_layout.fsdp_spec`)."""
        return state_shardings(state, mesh_for(self.slices, active))

    def _lost_slices(self) -> set[int]:
        """Slices whose device memory cannot be read: Down now, or lost since they ran the last completed
        step (another report generation or loss count: a slice back already holds none of that state)."""
        lost = set()
        for i in self.slices:
            rec = self.slice_set.record(i)
            mark = self._held_by.get(i)
            if rec.state == "Down" or (mark is not None and (rec.generation, rec.failures) != mark):
                lost.add(i)
        return lost

    def _surviving_devices(self) -> set[Any]:
        """Devices of the slices that ran the last completed step and were not lost since: each holds its
        shards of that step's state."""
        lost = self._lost_slices()
        return {d for i in self._held_by if i not in lost and i in self.slices for d in self.slices[i]}

    def _readable_devices(self) -> set[Any]:
        """Every device but those of slices Down now: an array made since the last loss (an initial state, a
        restored checkpoint) is readable wherever it lives, also on a slice that was lost and is back (a
        single slice lost and replaced: the only slice there is). The last step's state is read only from
        `_surviving_devices` (`recover_state`)."""
        return {d for i, group in self.slices.items() if self.slice_set.record(i).state != "Down" for d in group}

    def place_state(self, state: Any, active: Sequence[int], readable: set[Any] | None = None) -> Any:
        """`state` laid out on the mesh of the active slices: sharded within a slice, replicated across slices.

        Every shard is taken from a device that still holds it (a slice of the last completed step's mesh
        that was not lost since): a surviving slice keeps its shards, a joining or spare slice gets
        device-to-device copies of them; nothing is compiled and no lost shard is read. Host arrays
        (numpy: a host snapshot) and arrays that live elsewhere (an initial state, a restored checkpoint)
        are put there as they are.

        Args:
          state: a pytree of `jax.Array`s or numpy arrays.
          active: the active slice indices.
          readable: the devices shards may be read from (default: every device of a slice not Down now).

        Raises:
          NoReplicaError: a leaf on no readable device (`recover_state` answers None then).
        """
        shardings = self.state_shardings(state, active)
        if readable is None:
            readable = self._readable_devices()
        return jax.tree_util.tree_map(lambda x, s: relayout(x, s, readable), state, shardings)

    def recover_state(self, state: Any, active: Sequence[int]) -> Any | None:
        """After a slice loss: `state` (the last completed step's) on the mesh of `active`, from the
        surviving slices' replicas, or None when no slice of its mesh survived (restore it then).

        Each surviving slice holds a full copy (`place_state`), so losing any but the last slice of the
        mesh loses no step.
        """
        survivors = self._surviving_devices() if self._held_by else set()
        if not survivors:
            return None
        try:
            return self.place_state(state, active, readable=survivors)
        except NoReplicaError as e:
            _logger.warning("no surviving replica of the state: %s", e)
            return None

    # -- the programs -------------------------------------------------------

    def _key(self, kind: str, fn: Any, state: Any, batch: Mapping[str, Any], active: Sequence[int]) -> ProgramKey:
        leaves, treedef = jax.tree_util.tree_flatten(state)
        return ProgramKey(
            kind, fn, tuple(sorted(active)),
            (treedef, tuple((tuple(np.shape(x)), np.dtype(x.dtype).name) for x in leaves)),
            tuple(sorted((k, tuple(np.shape(v)), np.dtype(v.dtype).name) for k, v in batch.items())))

    def _compile(self, key: ProgramKey) -> Any:
        """Ahead-of-time compile of `key`'s program for its mesh (any thread)."""
        mesh = mesh_for(self.slices, key.active)
        treedef, leaves = key.state
        state = jax.tree_util.tree_unflatten(treedef, [jax.ShapeDtypeStruct(shape, np.dtype(d)) for shape, d in leaves])
        shardings = state_shardings(state, mesh)
        state = jax.tree_util.tree_map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), state, shardings)
        batch_size = key.batch[0][1][0]
        batch_sharding = NamedSharding(mesh, batch_spec(batch_size, mesh))
        batch = {k: jax.ShapeDtypeStruct(shape, np.dtype(d), sharding=batch_sharding) for k, shape, d in key.batch}
        replicated = NamedSharding(mesh, PartitionSpec())
        out = (shardings, replicated) if key.kind == "step" else replicated
        jitted = jax.jit(key.fn, in_shardings=(shardings, batch_sharding), out_shardings=out)
        return jitted.lower(state, batch).compile()

    def _next_meshes(self, active: tuple[int, ...]) -> list[tuple[int, ...]]:
        """The meshes an elastic event can lead to from `active`, likeliest first: a missing slice back (a
        rejoin), one slice fewer (a loss), one slice swapped for an idle one (a loss with a spare)."""
        idle = [i for i in self.slices if i < self.slice_set.total and i not in active]
        out: list[tuple[int, ...]] = []
        if len(active) < self.slice_set.count:
            out += [tuple(sorted((*active, p))) for p in idle]
        out += [tuple(i for i in active if i != s) for s in active if len(active) > 1]
        if len(active) == self.slice_set.count:
            out += [tuple(sorted((*(i for i in active if i != s), p))) for s in active for p in idle]
        return out

    def _program(self, kind: str, fn: Any, state: Any, batch: Mapping[str, Any], active: tuple[int, ...]):
        key = self._key(kind, fn, state, batch, active)
        program = self._programs.get(key)
        if self._last_key != key:
            self._last_key = key
            self._programs.ahead(key.with_active(m) for m in self._next_meshes(active))
        return key, program

    def prepare(self, indices: Iterable[int]) -> frozenset[int]:
        """The slices of `indices` (Ready, outside the mesh) whose mesh with the active slices has its step
        program compiled; starts compiling it (in the background) for the others, so a rejoin never
        compiles on the training thread. Every one of them before the first step (nothing to compile yet)."""
        indices = frozenset(indices)
        key = self._last_key
        if key is None:
            return indices
        prepared = set()
        base = {i for i in key.active if self.slice_set.record(i).state != "Down"}
        for i in indices:
            target = key.with_active(self.slice_set.choose_active(base | {i}, prefer={i}))
            if self._programs.ready(target):
                prepared.add(i)
            else:
                self._programs.ahead([target])
        return frozenset(prepared)

    def wait_for_programs(self, timeout_s: float | None = None) -> bool:
        """Waits for the programs compiling ahead; True when none is left within `timeout_s` seconds."""
        return self._programs.wait(timeout_s)

    # -- the step -----------------------------------------------------------

    def _execute(self, program: Any, state: Any, batch: dict[str, Any]) -> Any:
        """Launches `program` (JAX dispatches asynchronously: the outputs are futures; an error of the run
        surfaces when they are waited for, `_wait`)."""
        return program(state, batch)

    def _wait(self, out: Any) -> Any:
        return jax.block_until_ready(out)

    def _lost(self, error: jax.errors.JaxRuntimeError, active: tuple[int, ...]) -> SliceDownError:
        """A slice-down error of a program over `active`: the slices lost, marked down (else `error` itself
        is re-raised: not a lost slice, the user's program)."""
        if not is_slice_down(error):
            raise error
        # Lost: what fails the health check, and what the operator reported not Ready meanwhile (a slice
        # whose workers are being replaced may still answer a probe on Pathways' side for a moment).
        reported = {i for i in active if self.slice_set.record(i).state != "Ready"}
        lost = sorted((set(active) - self.health_check(active)) | reported) or list(active)
        gens = {i: self.slice_set.record(i).generation for i in lost}
        self.slice_set.mark_down(lost, str(error).splitlines()[0], gens)
        return SliceDownError(f"slices {lost} lost: {str(error).splitlines()[0]}", lost)

    def _start(self, kind: str, fn: Any, state: Any, batch: Mapping[str, np.ndarray], active: Sequence[int]
               ) -> Launched:
        active = tuple(sorted(active))
        try:
            # (no-op while the state is laid out on this mesh already; after a resize, from the survivors)
            state = self.place_state(state, active)
            _, program = self._program(kind, fn, state, batch, active)
            return Launched(self._execute(program, state, dict(batch)), active)
        except jax.errors.JaxRuntimeError as e:
            raise self._lost(e, active) from e

    def _finish(self, launched: Launched) -> Any:
        try:
            out = self._wait(launched.outputs)
        except jax.errors.JaxRuntimeError as e:
            raise self._lost(e, launched.active) from e
        self._held_by = {i: (r.generation, r.failures) for i in launched.active
                         for r in [self.slice_set.record(i)]}
        return out

    def _run(self, kind: str, fn: Any, state: Any, batch: Mapping[str, np.ndarray], active: Sequence[int]) -> Any:
        return self._finish(self._start(kind, fn, state, batch, active))

    def map_sum(self, fn: Any, params: Any, batch: Mapping[str, np.ndarray], active: Sequence[int]) -> Any:
        """`fn(params, batch)` as one program over the active slices' devices, the batch sharded across them.

        `fn` returns sums over its examples (as on the cpu backend), so XLA's reduction across the
        slices (over DCN) makes the result the sum over the global batch. Compiled once per `fn`
        (by identity), mesh and shapes, and kept for the run (`mesh_programs.ProgramCache`).

        Args:
          fn: `(params, batch) -> pytree of arrays`, jit-traceable.
          params: the parameters (laid out on the active slices' mesh by `place_state` if not already).
          batch: the global batch, dict of arrays with leading axis = global batch size.
          active: active slice indices.

        Returns:
          `fn`'s output tree as replicated jax arrays, computed (blocked on: a lost slice raises here).

        Raises:
          SliceDownError: a slice-down `JaxRuntimeError`; the slices that fail
            the health check afterwards are named and marked down.
          jax.errors.JaxRuntimeError: any other runtime error (user code), unchanged.
        """
        return self._run("map_sum", fn, params, batch, active)

    def launch(self, fn: Any, state: Any, batch: Mapping[str, np.ndarray], active: Sequence[int]) -> Launched:
        """One fused training step `fn(state, batch) -> (new_state, outputs)` as one program over the mesh,
        dispatched without waiting (its outputs are futures; `wait` returns them computed).

        The built-in loop's step: gradients and the optimizer update in one program, so each mesh has one
        executable. `new_state` has `state`'s structure and layout (sharded within a slice, replicated
        across slices); `outputs` (e.g. loss sum, weight, a finite flag) come back replicated. The input
        state is not donated: it is what a slice loss during this step recovers from.

        The built-in loop launches step n+1 on step n's (not yet computed) state before it reads step n's
        loss, so the host's work between steps (the loss, metrics, snapshots, the next batch) runs while the
        chip computes instead of between programs (on a v5e chip that host work was 12% of a step).
        `wait(launched)` returns the outputs. A launch never waited for is simply dropped.

        Args:
          fn: jit-traceable; pass the same object every step (programs are kept by its identity).
          state: a pytree of arrays (laid out on the mesh by `place_state` if not already), e.g. the
            `new_state` future of the previous launch.
          batch: the global batch, dict of arrays with leading axis = global batch size.
          active: active slice indices.

        Returns:
          A `Launched`: `outputs` (`(new_state, outputs)` as futures; `new_state` may be passed to the next
          `launch`) and the mesh's `active` slices.

        Raises:
          SliceDownError, jax.errors.JaxRuntimeError: as `map_sum`, for what fails before the program runs
            (tracing, a compile, a lost slice at dispatch).
        """
        return self._start("step", fn, state, batch, active)

    def wait(self, launched: Launched) -> Any:
        """The outputs of a `launch`, computed.

        Raises:
          SliceDownError: the program's run hit a lost slice (the slices that fail the health check
            afterwards are named and marked down).
          jax.errors.JaxRuntimeError: any other runtime error (user code), unchanged.
        """
        return self._finish(launched)

    def interrupt(self) -> None:
        """Nothing to do: one Pathways program cannot be cut short from here; a stop waits for the step to end
        (or for the slice loss that ends it)."""

    def cleanup(self) -> None:
        """After an elastic event: nothing is dropped. The compiled programs of every mesh are kept (the same
        mesh comes back with the slice) and the state's arrays are what the next attempt recovers from
        (pathways-utils clears JAX's caches and deletes every live array here)."""

    def close(self) -> None:
        """Stops compiling ahead (Pathways owns the connections)."""
        self._programs.close()
