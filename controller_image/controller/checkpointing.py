"""Orbax checkpointing for the controller: async saves, retention, committed-only restore.

One `Checkpointer` owns one checkpoint location (`spec.checkpoint.uri`, a
local path or `gs://bucket/prefix`). Each checkpoint holds two items: `state`,
the train-state pytree of arrays (params, optimizer state, step), saved with
`StandardSave`; and `data`, the data pipeline's position as a small JSON dict,
saved with `JsonSave`, so a resumed run neither repeats nor skips batches.
Each step also carries its writer's identity (job namespace, name, UID;
`elastic_jax.api.identity`) as Orbax custom metadata, written in the step's
`_CHECKPOINT_METADATA` before the step commits, so it is atomic with the step.

Arrays are written without zstd compression (Orbax's default is on): float
weights and optimizer moments shrink by a few percent at best, while
compressing on the controller's CPU made saves about 5x slower than a plain
write of the same bytes and slowed the training steps that overlap a save
(benchmarks/bench_checkpoint.py).

Atomicity is Orbax's: on local disk a step is written under
`<step>.orbax-checkpoint-tmp-*` and renamed when complete; on GCS
`commit_success.txt` is written last. Only such committed steps are listed or
restored, so a save interrupted by a crash is never read. A step directory that
exists without its commit marker and is not this job's own save cut short (a
copy that left `commit_success.txt` out) refuses the location instead: Orbax
would list it as nothing on GCS and save over it.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from elastic_jax.api import checkpoints as _locations
from elastic_jax.api import identity
from elastic_jax.api.checkpoints import (  # noqa: F401 - re-exported: the controller's names for them
    STEP_METADATA_FILE,
    URI_FIELD,
    CheckpointDataChangeError,
    CheckpointForeignError,
    CheckpointMismatchError,
    CheckpointUncommittedError,
    CheckpointUriError,
    clear_local_checkpoints,
    fresh_plan,
    is_orbax_step_dir as _is_orbax_step_dir,
    step_writer as _step_writer,
    uri_error as _uri_error,
)
from elastic_jax.api.identity import JobIdentity

PyTree = Any

logger = logging.getLogger(__name__)

# (named in elastic_jax.api.checkpoints: --fresh deletes a step folder only when it holds nothing else)
_STATE_ITEM = _locations.STATE_ITEM
_DATA_ITEM = _locations.DATA_ITEM
_DEFAULT_PROBE_TIMEOUT_S = _locations.DEFAULT_PROBE_TIMEOUT_S


class CheckpointNotFoundError(FileNotFoundError):
    """A restore was asked for but no committed checkpoint (or not that step) exists."""


class CheckpointUnfitError(ValueError):
    """A committed step's stored state does not fit the restore target (an array's shape differs, or an array
    in both has another shape): a changed model or another job's state, not a corrupt step. Raised by
    `Checkpointer.restore` from the step's metadata, before any array is read."""


class CheckpointSaveError(RuntimeError):
    """A background (async) save failed; raised by the next call that can report it."""


def _one_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return " ".join(text.split())


def check_uri(uri: str, timeout_s: float = _DEFAULT_PROBE_TIMEOUT_S) -> epath.Path:
    """Checks that checkpoints can be written at `uri` (creating a local directory); returns it as a path.

    The same checks as `elastic-jax run` and `elastic-jax validate --trainer`
    make before anything starts (`elastic_jax.api.checkpoints.check_location`):
    local paths are created (with parents) and test-written; `gs://` URIs need
    an existing bucket and write permission, probed without retries in about
    `timeout_s` seconds per request.

    Raises:
      CheckpointUriError: the location is unusable (one-line message naming
        `spec.checkpoint.uri` and what is wrong).
    """
    return epath.Path(_locations.check_location(uri, create=True, timeout_s=timeout_s))


def step_read_problem(uri: str, step: int) -> str | None:
    """Reads every array and the data position of committed local step `step` at `uri` (as NumPy, on no
    device, with no restore target), and says why it cannot be read; None when all of it reads.

    For `elastic-jax run`'s "already finished" check: the step's metadata can be intact while its array data
    is truncated or missing, and the restore that would notice it never runs when nothing is left to train.
    It reads the whole state once, as a restore would (the local models `run` trains are small).

    Returns:
      `short_reason` of the first error (`Type: first line`, bounded), or None.

    Raises nothing: every failure is the answer.
    """
    import warnings

    import numpy as np

    path = epath.Path(_locations.local_path(uri)) / str(step)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (Orbax warns it takes the sharding from the file: unused for NumPy)
            with ocp.PyTreeCheckpointer() as checkpointer:
                meta = checkpointer.metadata(path / _STATE_ITEM).item_metadata
                tree = getattr(meta, "tree", meta)
                args = jax.tree.map(lambda m: ocp.RestoreArgs(restore_type=np.ndarray)
                                    if getattr(m, "shape", None) is not None else ocp.RestoreArgs(), tree)
                checkpointer.restore(path / _STATE_ITEM, restore_args=args)
            with ocp.Checkpointer(ocp.JsonCheckpointHandler()) as checkpointer:
                checkpointer.restore(path / _DATA_ITEM)
    except Exception as e:  # noqa: BLE001 - any read error is the step's problem
        return _locations.short_reason(e)
    return None


def _named(sharding: jax.sharding.Sharding) -> jax.sharding.Sharding:
    """`sharding` as a `NamedSharding` when it is a single device's (the same placement); others as they are.

    Orbax's Pathways array handler (registered by `pathwaysutils.initialize()` with persistence on)
    restores only onto `NamedSharding`s ("Pathways only supports jax.sharding.NamedSharding"), and a
    plain `jax.jit` output or `jax.device_put(x, device)` has a `SingleDeviceSharding` (issue 29 fault 2).
    """
    if isinstance(sharding, jax.sharding.SingleDeviceSharding):
        (device,) = sharding.device_set
        return jax.sharding.NamedSharding(jax.sharding.Mesh(np.array([device]), ("device",)),
                                          jax.sharding.PartitionSpec())
    return sharding


def _with_default_sharding(target: PyTree) -> PyTree:
    """Restore targets for Orbax: every leaf becomes a ShapeDtypeStruct with a sharding.

    Concrete arrays keep their sharding; a ShapeDtypeStruct without one gets the
    first local device, which is what a plain `jnp.zeros` would have had. A
    single device's sharding becomes the same placement as a `NamedSharding`
    (`_named`), which every Orbax array handler accepts, Pathways' too.
    """
    default = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])

    def leaf(x: Any) -> Any:
        if isinstance(x, jax.Array):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=_named(x.sharding))
        if isinstance(x, jax.ShapeDtypeStruct):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=_named(x.sharding or default))
        return x

    return jax.tree.map(leaf, target)


class Checkpointer:
    """Saves and restores (train state, data position) with an Orbax CheckpointManager.

    Saves are asynchronous: `maybe_save` returns once the arrays are copied
    off the device; a background thread writes them and commits the step.
    One save is in flight at a time (Orbax waits for the previous one before
    starting the next). Only the newest `max_to_keep` committed steps are kept.

    Attributes (read by the controller for status and metrics):
      last_save_blocking_seconds: seconds the last `maybe_save` that started a
        save blocked its caller (includes waiting for the previous save).
      last_save_seconds: seconds from the start of the last committed save
        until Orbax's background work finished (commit, then deleting steps
        beyond `max_to_keep`), or None before the first commit.
      last_committed_step: newest step known committed (read from storage at
        construction, then updated as background saves commit), or None.
      last_restore_seconds: duration of the last `restore`, or None.
    """

    def __init__(
        self,
        uri: str,
        interval_steps: int,
        max_to_keep: int,
        *,
        on_commit: Callable[[int], None] | None = None,
        probe_timeout_s: float = _DEFAULT_PROBE_TIMEOUT_S,
        writer: JobIdentity | None = None,
    ) -> None:
        """Checks the location and opens the manager.

        Args:
          uri: local directory or `gs://bucket/prefix` (`spec.checkpoint.uri`).
          interval_steps: save every this many steps (steps divisible by it).
          max_to_keep: committed steps retained; older ones are deleted after
            each commit.
          on_commit: called as `on_commit(step)` from a background thread
            when a save has committed. Must be quick and thread-safe.
          probe_timeout_s: per-request timeout of the reachability probe.
          writer: the job saving; stored with every step it saves (None: no identity saved).

        Raises:
          ValueError: `interval_steps` or `max_to_keep` is below 1.
          CheckpointUriError: the location is unusable (see `check_uri`).
          CheckpointUncommittedError: (a CheckpointUriError) the location holds step directories that were
            never committed and are not this job's own save cut short
            (`elastic_jax.api.checkpoints.uncommitted_steps`).
        """
        if interval_steps < 1:
            raise ValueError(f"interval_steps must be >= 1, got {interval_steps}")
        if max_to_keep < 1:
            raise ValueError(f"max_to_keep must be >= 1, got {max_to_keep}")
        self.uri = uri
        self.interval_steps = interval_steps
        self.max_to_keep = max_to_keep
        self._on_commit = on_commit
        self.writer = writer
        self.directory = check_uri(uri, probe_timeout_s)
        # Before Orbax opens it: it would list uncommitted steps as nothing (GCS) and save over them.
        _locations.check_committed(self.directory, uri, writer)
        self._manager = ocp.CheckpointManager(
            self.directory,
            item_names=(_STATE_ITEM, _DATA_ITEM),
            item_handlers={
                # PyTreeCheckpointHandler rather than StandardCheckpointHandler:
                # only it exposes `use_compression` (see the module docstring).
                _STATE_ITEM: ocp.PyTreeCheckpointHandler(use_compression=False),
                _DATA_ITEM: ocp.JsonCheckpointHandler(),
            },
            options=ocp.CheckpointManagerOptions(
                max_to_keep=max_to_keep,
                enable_async_checkpointing=True,
                create=True,
            ),
        )
        self.last_save_blocking_seconds: float | None = None
        self.last_save_seconds: float | None = None
        self.last_restore_seconds: float | None = None
        self._unreadable: set[int] = set()
        self.last_committed_step: int | None = self.latest_committed_step()
        self._last_started_step: int | None = self._manager.latest_step()
        self._commit_watcher: threading.Thread | None = None
        self._background_error: BaseException | None = None
        self._lock = threading.Lock()
        self._closed = False

    # -- saving -------------------------------------------------------------

    def maybe_save(self, step: int, state: PyTree, data_state: Mapping[str, Any], force: bool = False) -> bool:
        """Starts an async save of `state` and `data_state` as `step` when due.

        A save is due when `step % interval_steps == 0` or `force` is set, and
        `step` is newer than every step saved so far (saving a step twice is
        skipped, e.g. a forced save right after a restore).

        Args:
          step: the training step the state belongs to (>= 0).
          state: pytree of `jax.Array`s (any shapes, dtypes and shardings).
            The save runs on a background thread: the caller must not donate
            or delete these arrays before the next `maybe_save` or
            `wait_until_finished` returns (jax arrays are otherwise immutable).
          data_state: JSON-serializable dict, e.g.
            `{"next_batch_index": 120, "global_batch_size": 24, "seed": 0}`.
          force: save regardless of the interval (e.g. before a slice drains).

        Returns:
          True when a save was started.

        Raises:
          CheckpointSaveError: the previous background save failed.
          RuntimeError: the checkpointer is closed.
        """
        if self._closed:
            raise RuntimeError("Checkpointer is closed")
        self._raise_background_error()
        if not (force or step % self.interval_steps == 0):
            return False
        if self._last_started_step is not None and step <= self._last_started_step:
            return False
        started = time.perf_counter()
        # At most one save in flight: if the previous one is still writing,
        # wait for it here (back-pressure, as Orbax itself would).
        self._join_commit_watcher()
        self._raise_background_error()
        self._last_started_step = step
        # Orbax's save() itself costs ~20 ms of setup before it returns; run it
        # off the training thread. Safe because jax arrays are immutable and
        # the loop never donates the state it hands over here.
        self._commit_watcher = threading.Thread(
            target=self._save_and_watch, args=(step, state, dict(data_state), started),
            name=f"checkpoint-save-{step}", daemon=True,
        )
        self._commit_watcher.start()
        self.last_save_blocking_seconds = time.perf_counter() - started
        return True

    def _save_and_watch(self, step: int, state: PyTree, data_state: dict[str, Any], started: float) -> None:
        try:
            if step in self._unreadable:  # superseded by this good save of the same step
                self._manager.delete(step)
                self._unreadable.discard(step)
            self._manager.save(
                step,
                args=ocp.args.Composite(
                    **{
                        _STATE_ITEM: ocp.args.PyTreeSave(state),
                        _DATA_ITEM: ocp.args.JsonSave(data_state),
                    }
                ),
                force=True,  # the interval decision is ours (above)
                custom_metadata=None if self.writer is None else identity.to_metadata(self.writer),
            )
        except BaseException as e:  # reported to the training thread on its next call
            logger.exception("checkpoint save of step %d failed to start", step)
            self._record_save_error(step, e)
            return
        self._watch_commit(step, started)

    def _watch_commit(self, step: int, started: float) -> None:
        try:
            self._manager.wait_until_finished()
            # Orbax logs, rather than raises, some finalize failures: trust storage.
            if step not in ocp.utils.checkpoint_steps(self.directory):
                raise CheckpointSaveError(f"checkpoint step {step} at {self.uri} did not commit")
        except BaseException as e:  # reported to the training thread on its next call
            logger.exception("checkpoint save of step %d failed", step)
            self._record_save_error(step, e)
            return
        with self._lock:
            self.last_save_seconds = time.perf_counter() - started
            if self.last_committed_step is None or step > self.last_committed_step:
                self.last_committed_step = step
        logger.info("checkpoint step %d committed in %.2fs", step, self.last_save_seconds)
        if self._on_commit is not None:
            self._on_commit(step)

    def _record_save_error(self, step: int, error: BaseException) -> None:
        """Keeps a failed save's reason, naming the step and the last committed one, for the next caller."""
        wrapped = CheckpointSaveError(f"checkpoint save of step {step} failed ({_one_line(error)}); "
                                      f"last committed step: {self.last_committed_step}")
        wrapped.__cause__ = error
        with self._lock:
            self._background_error = wrapped

    def _join_commit_watcher(self) -> None:
        if self._commit_watcher is not None:
            self._commit_watcher.join()
            self._commit_watcher = None

    def _raise_background_error(self) -> None:
        with self._lock:
            error, self._background_error = self._background_error, None
        if error is not None:
            raise CheckpointSaveError(f"async checkpoint save failed: {_one_line(error)}") from error

    def wait_until_finished(self) -> None:
        """Blocks until the in-flight save (if any) has committed.

        Raises:
          CheckpointSaveError: that save failed.
        """
        self._join_commit_watcher()
        self._raise_background_error()

    # -- reading ------------------------------------------------------------

    def latest_committed_step(self) -> int | None:
        """The newest fully committed step in storage, or None.

        Reads the location every call: `*.orbax-checkpoint-tmp-*` directories
        and, on GCS, step directories without `commit_success.txt` are not
        counted.
        """
        steps = set(ocp.utils.checkpoint_steps(self.directory)) - self._unreadable
        return max(steps) if steps else None

    def committed_steps(self) -> list[int]:
        """All committed steps in storage, ascending, except those `set_aside` as unreadable."""
        return sorted(set(ocp.utils.checkpoint_steps(self.directory)) - self._unreadable)

    def set_aside(self, steps: list[int], restored_step: int) -> None:
        """Marks committed `steps` unreadable after a fallback restore of the older `restored_step`.

        They stay in storage (for inspection) but are no longer listed or
        restored by this checkpointer; saving a step with one of their numbers
        deletes the unreadable one first. Saves continue after `restored_step`.

        Args:
          steps: the committed steps that failed to restore.
          restored_step: the step the run resumed from.
        """
        self._unreadable |= set(steps)
        with self._lock:
            self._last_started_step = restored_step
            self.last_committed_step = restored_step

    def writer_of(self, step: int) -> JobIdentity | None:
        """The job that wrote committed `step`, from its Orbax custom metadata.

        Returns:
          None when the step was saved without a writer identity (by an older elastic-jax).

        Raises:
          OSError, ValueError: the step's metadata file cannot be read or is not a JSON object (a corrupt
            step: the restore skips it). Read here rather than through Orbax, which answers an empty or
            truncated file with empty metadata: that read as "no writer identity", and refused the job
            instead of falling back to an older step.
        """
        path = self.directory / str(step) / _locations.STEP_METADATA_FILE
        try:
            meta = json.loads(path.read_text())
        except ValueError as e:
            raise ValueError(f"checkpoint step {step}: {_locations.STEP_METADATA_FILE} is not JSON ({e})") from e
        if not isinstance(meta, dict):
            raise ValueError(f"checkpoint step {step}: {_locations.STEP_METADATA_FILE} is not a JSON object")
        return identity.from_metadata(meta.get("custom_metadata"))

    def data_of(self, step: int) -> Any:
        """The loop's data record saved with committed `step` (its `data` item's `data`, see
        `elastic_jax.api.checkpoints.run_data`); None when it does not read.

        Read alone, through Orbax's JSON handler (local or gs://), without the arrays."""
        try:
            with ocp.Checkpointer(ocp.JsonCheckpointHandler()) as checkpointer:
                record = checkpointer.restore(self.directory / str(step) / _DATA_ITEM)
        except Exception:  # noqa: BLE001 - an unreadable record: the restore's fallback decides about the step
            return None
        return record.get("data") if isinstance(record, dict) else None

    def check_resume(self, total_steps: int, resume_from: str, data: dict | None = None,
                     allow_data_change: bool = False) -> None:
        """Refuses, before anything trains, checkpoints this job may not resume from.

        The controller's copy of the CLI's check (`elastic_jax.api.checkpoints.check_resume`),
        read through Orbax so it covers `gs://` too: the newest committed step
        must not be beyond `total_steps`, and the newest step whose metadata
        reads must be this job's unless `resume_from` is `Any`, and (with
        `data`) must have been trained with the same global batch size and
        seed unless `allow_data_change`. Unreadable steps are left to the
        restore's fallback.

        Args:
          total_steps: `spec.training.steps`.
          resume_from: `spec.checkpoint.resumeFrom`.
          data: `elastic_jax.api.checkpoints.run_data` of the spec; None: not checked.
          allow_data_change: `spec.checkpoint.allowDataChange`.

        Raises:
          CheckpointMismatchError: a committed step is beyond `total_steps`.
          CheckpointForeignError: the step to resume from is another job's (or of no known job).
          CheckpointDataChangeError: that step was trained with another global batch size or seed.
        """
        steps = self.committed_steps()
        if not steps:
            return
        problem = _locations.beyond_steps_problem(steps[-1], total_steps, self.uri)
        if problem:
            raise CheckpointMismatchError(problem)
        for step in reversed(steps):
            try:
                writer = self.writer_of(step)
            except Exception:  # noqa: BLE001 - unreadable metadata: the restore skips this step too
                continue
            problem = _locations.writer_problem(step, writer, self.writer, resume_from, self.uri)
            if problem:
                raise CheckpointForeignError(problem)
            if data is not None:
                problem = _locations.data_change_problem(self.data_of(step), data, step, self.uri, allow_data_change)
                if problem:
                    raise CheckpointDataChangeError(problem)
            return

    def restore(self, target: PyTree, step: int | None = None) -> tuple[PyTree, dict[str, Any], int]:
        """Restores a committed checkpoint onto `target`'s structure and layout.

        Args:
          target: pytree with the saved state's structure whose leaves are
            `jax.Array`s or `jax.ShapeDtypeStruct`s; the restored arrays get
            their shapes, dtypes and shardings. This is how a checkpoint saved
            on one device layout is restored onto another (Orbax refuses a
            topology change without a target). A ShapeDtypeStruct without a
            sharding is placed on the first local device.
          step: the step to restore; the newest committed one when None.

        Returns:
          `(state, data_state, step)`.

        Raises:
          CheckpointNotFoundError: no committed checkpoint exists, or `step`
            is not one of the committed steps.
          CheckpointSaveError: a previous background save failed.
          CheckpointUnfitError: the step's stored state does not fit `target` (an array's shape differs).
          Exception: anything Orbax or TensorStore raise reading the step (a truncated or missing file:
            usually `ValueError`, `OSError`).
        """
        self.wait_until_finished()
        committed = self.committed_steps()
        if not committed:
            raise CheckpointNotFoundError(f"no committed checkpoint at {self.uri}")
        if step is None:
            step = committed[-1]
        elif step not in committed:
            raise CheckpointNotFoundError(f"no committed checkpoint for step {step} at {self.uri} (have {committed})")
        started = time.perf_counter()
        abstract_target = _with_default_sharding(target)
        # The manager caches its step list; another process may have written since.
        self._manager.reload()
        # A state that does not fit is refused from the step's metadata before any read starts: Orbax's
        # refusal comes mid-restore, and the reads still in flight then print one "Event loop is closed"
        # traceback each (over a hundred for the built-in LM) when they land on its closed event loop.
        mismatch = self._shape_mismatch(step, abstract_target)
        if mismatch:
            raise CheckpointUnfitError(mismatch)
        restored = self._manager.restore(
            step,
            args=ocp.args.Composite(
                **{
                    _STATE_ITEM: ocp.args.PyTreeRestore(
                        item=abstract_target,
                        restore_args=ocp.checkpoint_utils.construct_restore_args(abstract_target),
                    ),
                    _DATA_ITEM: ocp.args.JsonRestore(),
                }
            ),
        )
        self.last_restore_seconds = time.perf_counter() - started
        return restored[_STATE_ITEM], dict(restored[_DATA_ITEM]), step

    def _shape_mismatch(self, step: int, abstract_target: PyTree) -> str | None:
        """The first array of step `step` whose stored shape differs from `abstract_target`'s (a changed model),
        in words; None when every array both have matches, or when the step's metadata cannot be read (the
        restore itself then decides)."""
        try:
            stored = self._manager.item_metadata(step)[_STATE_ITEM]
            have = ocp.tree.to_flat_dict(getattr(stored, "tree", stored))
        except Exception:  # noqa: BLE001 - no usable metadata: Orbax's restore reports what is wrong
            return None
        want = {tuple(map(str, k)): v for k, v in
                ocp.tree.to_flat_dict(ocp.tree.serialize_tree(abstract_target, keep_empty_nodes=True)).items()}
        for key, meta in have.items():
            target = want.get(tuple(map(str, key)))
            if target is None or getattr(meta, "shape", None) is None or not hasattr(target, "shape"):
                continue
            if tuple(meta.shape) != tuple(target.shape):
                return (f"Requested shape: {tuple(target.shape)} is not compatible with the stored shape: "
                        f"{tuple(meta.shape)} (array {'/'.join(map(str, key))})")
        return None

    # -- lifetime -----------------------------------------------------------

    def close(self) -> None:
        """Waits for the in-flight save to commit, then releases Orbax's threads.

        Idempotent. Raises `CheckpointSaveError` if that last save failed (the
        manager is closed either way).
        """
        if self._closed:
            return
        self._closed = True
        try:
            self._join_commit_watcher()
        finally:
            self._manager.close()
        self._raise_background_error()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
