"""How the pathways backend lays training state over a `("slice", "data")` mesh, and rebuilds it from survivors.

State is sharded within a slice (FSDP over the slice's devices, axis
"data") and replicated across slices (axis "slice"): each slice holds one
full copy of the state, split over its devices, so a slice needs only
1 / devices-per-slice of the state per device, and every surviving slice
still holds the whole state after another slice is lost.

`relayout` moves a state onto a new mesh (a slice lost, a slice joining, a
spare swapped in) using only the shards on the devices it is told are alive:
a surviving slice's device keeps its own shard (no copy), a joining slice's
device gets a device-to-device copy of the same shard from a survivor. It
never reads a shard that lived on a lost slice (on Pathways those reads fail
or hang), so a slice loss costs no restore from a host snapshot or checkpoint
as long as one slice of the old mesh survives.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec


def fsdp_spec(shape: tuple[int, ...], devices_per_slice: int) -> PartitionSpec:
    """The partition of one state leaf: its largest axis divisible by `devices_per_slice` over "data".

    Ties go to the earlier axis. A leaf with no such axis (a scalar such as
    Adam's step count, an odd-sized vector) and every leaf when a slice has one
    device is replicated. "slice" is never named: each slice holds a full copy.

    Args:
      shape: the leaf's shape.
      devices_per_slice: devices in each slice of the mesh (>= 1).

    Returns:
      e.g. `PartitionSpec(None, "data")` for shape (3, 64) and 2 devices.
    """
    if devices_per_slice <= 1:
        return PartitionSpec()
    axes = [a for a, n in enumerate(shape) if n >= devices_per_slice and n % devices_per_slice == 0]
    if not axes:
        return PartitionSpec()
    axis = max(axes, key=lambda a: (shape[a], -a))
    return PartitionSpec(*[("data" if a == axis else None) for a in range(len(shape))])


def state_shardings(state: Any, mesh: Mesh) -> Any:
    """The tree of `NamedSharding`s `fsdp_spec` gives each leaf of `state` (arrays or `ShapeDtypeStruct`s) on `mesh`."""
    per_slice = mesh.devices.shape[1]
    return jax.tree_util.tree_map(lambda x: NamedSharding(mesh, fsdp_spec(tuple(np.shape(x)), per_slice)), state)


def abstract_state(state: Any, mesh: Mesh) -> Any:
    """`state`'s leaves as `jax.ShapeDtypeStruct`s with their FSDP sharding on `mesh` (what a program compiles for)."""
    return jax.tree_util.tree_map(
        lambda x, s: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=s), state, state_shardings(state, mesh))


class NoReplicaError(RuntimeError):
    """No live device holds some shard of the state: every copy went with the lost slices."""


def relayout(x: Any, target: NamedSharding, alive: Collection[Any]) -> Any:
    """Leaf `x` laid out as `target`, reading only shards held by devices in `alive`.

    Args:
      x: a `jax.Array` (any sharding), a host array (numpy; copied to the devices), or a
        `jax.ShapeDtypeStruct` (returned with `target` as its sharding).
      target: the new sharding (a `NamedSharding` on the new mesh).
      alive: devices whose memory is still readable (the surviving slices').

    Returns:
      A `jax.Array` with sharding `target` and `x`'s values; `x` itself when it is laid out so already.

    Raises:
      NoReplicaError: some shard of `target` is held by no alive device (nor contained in a full copy there).
    """
    if isinstance(x, jax.ShapeDtypeStruct):  # an abstract restore target: the layout only
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=target)
    if not isinstance(x, jax.Array):
        return jax.device_put(x, target)
    if x.sharding.is_equivalent_to(target, x.ndim):
        return x
    alive = set(alive)
    shape = x.shape
    whole = _index_key(tuple(slice(None) for _ in shape), shape)
    sources: dict[tuple, list[Any]] = {}
    for shard in x.addressable_shards:
        if shard.device in alive:
            sources.setdefault(_index_key(shard.index, shape), []).append(shard)
    wanted = target.addressable_devices_indices_map(shape)
    if all(_index_key(index, shape) in sources for index in wanted.values()):
        pieces = []
        for device, index in wanted.items():
            found = sources[_index_key(index, shape)]
            own = [s for s in found if s.device == device]
            # A survivor keeps its own shard; a joining device gets a device-to-device copy (no compile).
            pieces.append(own[0].data if own else jax.device_put(found[0].data, device))
        return jax.make_array_from_single_device_arrays(shape, target, pieces)
    if x.sharding.device_set <= alive:
        return jax.device_put(x, target)  # another layout, every copy readable: let JAX reshard it
    if whole in sources:
        # Another layout (e.g. replicated) with lost devices: cut each shard from a surviving full copy on the host.
        host = np.asarray(sources[whole][0].data)
        return jax.make_array_from_single_device_arrays(
            shape, target, [jax.device_put(host[index], device) for device, index in wanted.items()])
    raise NoReplicaError(f"no surviving device holds every shard of an array of shape {shape}")


def _index_key(index: tuple, shape: tuple[int, ...]) -> tuple:
    """A hashable form of a shard's index (slices normalised to (start, stop) per axis)."""
    return tuple(s.indices(n)[:2] for s, n in zip(index, shape))
