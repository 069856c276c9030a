"""Step programs a worker holds: deserialized `jax.export.Exported`, by hash.

The controller sends a program once (`Load`) and then only its hash with
each step's inputs, like a compilation cache. A program is compiled once,
ahead of time from its recorded input shapes and shardings: either when the
controller asks for it (`Load` with `compile`, how a spare or a rejoining
slice is warmed while others train) or else on its first step. Its inputs
are placed on this worker's devices with the shardings recorded at export
time, so a step exported for a D-device slice runs sharded over the
worker's D host devices.
"""

from __future__ import annotations

import hashlib
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
import dataclasses
from dataclasses import dataclass

import jax
import numpy as np
from jax import export
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding, SingleDeviceSharding

from elastic_jax import contract


# The only XLA custom-call targets a program may name. A custom call runs native
# code inside the worker with whatever operands the program gives it, and some
# internal targets crash the process on crafted input (issue 9, item 14): so the
# default is what our own exported steps can contain, which is the sharding
# annotations (the built-in trainer's step, exported sharded or not, has none at
# all) and jax.export's own shape assertion. A user step that needs more (e.g.
# `jnp.linalg` on CPU lowers to `lapack_*_ffi`) lists them, comma-separated, in
# ELASTIC_JAX_ALLOWED_CUSTOM_CALLS on the workers.
DEFAULT_ALLOWED_CUSTOM_CALLS = frozenset({"Sharding", "SPMDFullToShardShape", "SPMDShardToFullShape", "shape_assertion"})
ALLOWED_CUSTOM_CALLS_ENV = contract.ENV_ALLOWED_CUSTOM_CALLS
_CUSTOM_CALL = re.compile(r'stablehlo\.custom_call\s+@([\w.$-]+)|call_target_name\s*=\s*"([^"]*)"')


def allowed_custom_calls() -> frozenset[str]:
    """The default allow list plus the targets named in `$ELASTIC_JAX_ALLOWED_CUSTOM_CALLS`."""
    extra = {t.strip() for t in os.environ.get(ALLOWED_CUSTOM_CALLS_ENV, "").split(",") if t.strip()}
    return DEFAULT_ALLOWED_CUSTOM_CALLS | extra


def custom_call_targets(exported: export.Exported) -> set[str]:
    """Every custom-call target named in the program's StableHLO (all functions, not only main)."""
    return {a or b for a, b in _CUSTOM_CALL.findall(exported.mlir_module())}


class ProgramNotLoadedError(KeyError):
    """A step named a program hash this worker has not been sent (or lost on restart)."""


class InvalidProgramError(ValueError):
    """A program cannot be used here: bad bytes, wrong hash, or too few devices."""


class InvalidInputsError(ValueError):
    """Step inputs do not match the program's flat input count, shapes or dtypes."""


def _mesh_for(exported: export.Exported, devices: Sequence[jax.Device]) -> Mesh:
    """A concrete mesh over this worker's devices matching the export's mesh.

    NamedShardings recorded at export time carry an abstract mesh whose axis
    names, sizes and types must match the mesh used to run (jax checks it);
    exports with HLO shardings only accept any mesh of the right size.
    """
    for aval in exported.in_avals:
        sharding = getattr(aval, "sharding", None)
        abstract = getattr(sharding, "mesh", None)
        if abstract is not None and abstract.size == exported.nr_devices:
            grid = np.array(devices).reshape(abstract.axis_sizes)
            return Mesh(grid, abstract.axis_names, axis_types=abstract.axis_types)
    return Mesh(np.array(devices), ("slice_devices",))


def _input_shardings(exported: export.Exported) -> tuple[Sharding, ...]:
    local = jax.devices()
    if exported.nr_devices > len(local):
        raise InvalidProgramError(
            f"program was exported for {exported.nr_devices} devices; this worker has "
            f"{len(local)} (start it with --host-devices {exported.nr_devices})"
        )
    devices = local[: exported.nr_devices]
    if exported.nr_devices == 1:
        return tuple(SingleDeviceSharding(devices[0]) for _ in exported.in_avals)
    mesh = _mesh_for(exported, devices)
    # An input exported without a sharding still has to live on the mesh:
    # replicate it.
    replicated = NamedSharding(mesh, PartitionSpec())
    return tuple(s if s is not None else replicated for s in exported.in_shardings_jax(mesh))


@dataclass(frozen=True)
class LoadedProgram:
    """One deserialized step program, ready to run.

    Attributes:
      program_hash: sha256 hex digest of the serialized bytes.
      exported: the deserialized program.
      in_shardings: where each flat input goes on this worker's devices.
    """

    program_hash: str
    exported: export.Exported
    in_shardings: tuple[Sharding, ...]
    _flat_call: Callable[..., list[jax.Array]]
    # The compiled executable, once compiled; a lock so concurrent first steps compile once.
    _compiled: list = dataclasses.field(default_factory=list, compare=False, repr=False)
    _compile_lock: threading.Lock = dataclasses.field(default_factory=threading.Lock, compare=False, repr=False)

    @classmethod
    def deserialize(cls, program_hash: str, blob: bytes) -> LoadedProgram:
        """Check `blob` against its hash and deserialize it (no compilation yet).

        Raises:
          InvalidProgramError: the hash does not match, the bytes are not an
            `Exported`, or the program needs more devices than this worker has.
        """
        digest = hashlib.sha256(blob).hexdigest()
        if digest != program_hash:
            raise InvalidProgramError(f"program hash mismatch: sent {program_hash}, bytes hash to {digest}")
        try:
            exported = export.deserialize(bytearray(blob))
        except Exception as error:  # flatbuffers raises assorted types on garbage
            raise InvalidProgramError(f"cannot deserialize program {program_hash}: {error}") from error
        try:
            refused = custom_call_targets(exported) - allowed_custom_calls()
        except Exception as error:  # a module that cannot be printed cannot be checked
            raise InvalidProgramError(f"cannot inspect program {program_hash}: {error}") from error
        if refused:
            raise InvalidProgramError(
                f"program {program_hash} calls custom-call target(s) {sorted(refused)} outside the allow list "
                f"{sorted(allowed_custom_calls())} (extend it with {ALLOWED_CUSTOM_CALLS_ENV} on the workers)")

        def flat_call(*flat_args: jax.Array) -> list[jax.Array]:
            args, kwargs = exported.in_tree.unflatten(flat_args)
            return jax.tree.leaves(exported.call(*args, **kwargs))

        return cls(program_hash, exported, _input_shardings(exported), jax.jit(flat_call))

    @property
    def compiled(self) -> bool:
        """True once the program is compiled here (a step runs without compiling)."""
        return bool(self._compiled)

    def compile(self) -> float:
        """Compile the program for its recorded input shapes and shardings, once (thread-safe).

        Returns:
          Seconds this call spent compiling; 0.0 when it was compiled already.

        Raises:
          Exception: whatever JAX/XLA raises while compiling.
        """
        with self._compile_lock:
            if self._compiled:
                return 0.0
            t0 = time.perf_counter()
            avals = [jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)
                     for a, s in zip(self.exported.in_avals, self.in_shardings)]
            self._compiled.append(self._flat_call.lower(*avals).compile())
            return time.perf_counter() - t0

    def run(self, flat_args: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Run one step; compiles first unless `compile` ran (a few hundred ms for a small step).

        Args:
          flat_args: the leaves of the exported function's `(args, kwargs)`,
            in `jax.tree.leaves` order, with the exported shapes and dtypes.

        Returns:
          The flat output leaves as host numpy arrays (gathered when sharded).

        Raises:
          InvalidInputsError: wrong count, shape or dtype of inputs.
          Exception: whatever JAX/XLA raises while compiling or running.
        """
        self.check_inputs(flat_args)
        self.compile()
        placed = jax.device_put(list(flat_args), list(self.in_shardings))
        return [np.asarray(leaf) for leaf in self._compiled[0](*placed)]

    def check_inputs(self, flat_args: Sequence[np.ndarray]) -> None:
        """Raises InvalidInputsError when the count, a shape or a dtype differs from the program's inputs."""
        avals = self.exported.in_avals
        if len(flat_args) != len(avals):
            raise InvalidInputsError(f"program takes {len(avals)} inputs, got {len(flat_args)}")
        for index, (arg, aval) in enumerate(zip(flat_args, avals)):
            if tuple(arg.shape) != tuple(aval.shape) or arg.dtype != aval.dtype:
                raise InvalidInputsError(
                    f"input {index}: expected {aval.dtype}{list(aval.shape)}, got {arg.dtype}{list(arg.shape)}"
                )


class ProgramCache:
    """Thread-safe map from program hash to `LoadedProgram`, bounded by bytes (least recently used evicted).

    A program's size is its serialized bytes, a proxy for the memory its
    deserialized module and compiled executable hold. An evicted program is
    simply reloaded: a Step naming it gets NOT_FOUND and the client sends it again.

    Args:
      max_bytes: the bound; a program larger than this alone is refused.
    """

    def __init__(self, max_bytes: int = 1 << 30) -> None:
        self.max_bytes = max_bytes
        self._programs: OrderedDict[str, tuple[LoadedProgram, int]] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def load(self, program_hash: str, blob: bytes) -> bool:
        """Add a program; idempotent.

        Returns:
          True when the program was new, False when it was already cached.

        Raises:
          InvalidProgramError: see `LoadedProgram.deserialize`, or the program
            alone is larger than `max_bytes`.
        """
        if len(blob) > self.max_bytes:
            raise InvalidProgramError(
                f"program {program_hash} is {len(blob)} bytes, over the worker's cache bound of {self.max_bytes}")
        with self._lock:
            if program_hash in self._programs:
                self._programs.move_to_end(program_hash)
                return False
        program = LoadedProgram.deserialize(program_hash, blob)
        with self._lock:
            if program_hash in self._programs:
                return False
            self._programs[program_hash] = (program, len(blob))
            self._bytes += len(blob)
            while self._bytes > self.max_bytes:
                _, (_, size) = self._programs.popitem(last=False)
                self._bytes -= size
            return True

    def get(self, program_hash: str) -> LoadedProgram:
        """The cached program (now the most recently used). Raises ProgramNotLoadedError when absent."""
        with self._lock:
            entry = self._programs.get(program_hash)
            if entry is not None:
                self._programs.move_to_end(program_hash)
        if entry is None:
            raise ProgramNotLoadedError(program_hash)
        return entry[0]

    def hashes(self) -> list[str]:
        """Hashes of the cached programs, least recently used first."""
        with self._lock:
            return list(self._programs)

    def compiled_hashes(self) -> list[str]:
        """Hashes of the cached programs already compiled here, least recently used first."""
        with self._lock:
            return [h for h, (program, _) in self._programs.items() if program.compiled]

