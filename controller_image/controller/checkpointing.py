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
restored, so a save interrupted by a crash is never read.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import jax
import orbax.checkpoint as ocp
from etils import epath

from elastic_jax.api import identity
from elastic_jax.api.identity import JobIdentity

PyTree = Any

logger = logging.getLogger(__name__)

URI_FIELD = "spec.checkpoint.uri"

_STATE_ITEM = "state"
_DATA_ITEM = "data"
# The reachability probe must answer in seconds: a wrong bucket name is a bad
# spec, reported at start-up, not something to retry for minutes.
_DEFAULT_PROBE_TIMEOUT_S = 10.0


class CheckpointUriError(ValueError):
    """The checkpoint location cannot be used.

    The message is one line and names the field, e.g.
    `spec.checkpoint.uri: 'gs://x/ckpt': bucket 'x' does not exist`.
    """


class CheckpointNotFoundError(FileNotFoundError):
    """A restore was asked for but no committed checkpoint (or not that step) exists."""


class CheckpointMismatchError(ValueError):
    """The checkpoints at `spec.checkpoint.uri` are not this job's: a step beyond
    `spec.training.steps`, or a state that does not fit the trainer's. The
    message is one line naming the field and the step."""


class CheckpointForeignError(CheckpointMismatchError):
    """The checkpoint to resume from was written by another job (or by an unknown one) and
    `spec.checkpoint.resumeFrom` is `SameJob`. The message is one line naming the field,
    the step and the writer."""


class CheckpointSaveError(RuntimeError):
    """A background (async) save failed; raised by the next call that can report it."""


def _one_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return " ".join(text.split())


def _uri_error(uri: str, reason: str) -> CheckpointUriError:
    return CheckpointUriError(f"{URI_FIELD}: {uri!r}: {reason}")


def _probe_local(uri: str) -> epath.Path:
    """Creates the directory and writes, then removes, a probe file in it."""
    path = epath.Path(uri.removeprefix("file://")).expanduser().absolute()
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".elastic-jax-probe-{uuid.uuid4().hex}"
        probe.write_text("probe")
        probe.unlink()
    except OSError as e:
        raise _uri_error(uri, f"not a writable directory ({e.strerror or _one_line(e)})") from None
    return path


def _probe_gcs(uri: str, timeout_s: float) -> epath.Path:
    """Checks that the bucket exists and that an object can be written under the prefix.

    Uses google-cloud-storage with `retry=None` and a short timeout, so a
    missing bucket or an unreachable endpoint fails in about `timeout_s`.
    """
    from google.api_core import exceptions as gexc
    from google.auth import exceptions as auth_exc
    from google.cloud import storage

    bucket_name, _, prefix = uri.removeprefix("gs://").partition("/")
    if not bucket_name:
        raise _uri_error(uri, "no bucket name")
    try:
        client = storage.Client()
        bucket = client.get_bucket(bucket_name, timeout=timeout_s, retry=None)
        blob = bucket.blob(f"{prefix.rstrip('/')}/.elastic-jax-probe-{uuid.uuid4().hex}".lstrip("/"))
        blob.upload_from_string(b"probe", timeout=timeout_s, retry=None)
        blob.delete(timeout=timeout_s, retry=None)
    except gexc.NotFound:
        raise _uri_error(uri, f"bucket {bucket_name!r} does not exist") from None
    except gexc.Forbidden as e:
        raise _uri_error(uri, f"no write permission on bucket {bucket_name!r} ({_one_line(e)})") from None
    except auth_exc.DefaultCredentialsError as e:
        raise _uri_error(uri, f"no Google Cloud credentials ({_one_line(e)})") from None
    except Exception as e:  # connection refused, DNS, timeout, 5xx: all "unreachable"
        raise _uri_error(uri, f"GCS unreachable ({type(e).__name__}: {_one_line(e)})") from None
    return epath.Path(uri.rstrip("/"))


def check_uri(uri: str, timeout_s: float = _DEFAULT_PROBE_TIMEOUT_S) -> epath.Path:
    """Checks that checkpoints can be written at `uri`; returns it as a path.

    Local paths are created (with parents) and test-written. `gs://` URIs need
    an existing bucket and write permission; the probe makes no retries and
    gives up after about `timeout_s` seconds per request.

    Raises:
      CheckpointUriError: the location is unusable (one-line message naming
        `spec.checkpoint.uri`).
    """
    if not uri:
        raise _uri_error(uri, "empty")
    if uri.startswith("gs://"):
        return _probe_gcs(uri, timeout_s)
    if "://" in uri and not uri.startswith("file://"):
        raise _uri_error(uri, "unsupported scheme (use a local path or gs://bucket/prefix)")
    return _probe_local(uri)


def clear_local_checkpoints(uri: str, writer: JobIdentity | None = None, allow_foreign: bool = False) -> list[str]:
    """Deletes this job's checkpoints in a local checkpoint directory (`--fresh`), and nothing else.

    Only entries Orbax itself recognises are deleted: committed step
    directories (the name is the step number *and* the directory holds Orbax's
    step metadata file, `_CHECKPOINT_METADATA`), interrupted saves
    (`<step>.orbax-checkpoint-tmp-*`) and Orbax's root `metadata/`. A folder
    whose name is only digits (a user's `2024/`) is not a step.
    The directory itself stays (a launcher may hold a lock on it). If it holds
    anything else, nothing is deleted: a `spec.checkpoint.uri` pointed at a
    project folder must never be emptied. Nor is anything deleted when a
    committed step was written by another job (its Orbax custom metadata names
    a different writer, or none), unless `allow_foreign` (`spec.checkpoint.
    resumeFrom: Any`): `--fresh` must not destroy another job's checkpoints.

    Args:
      uri: `spec.checkpoint.uri`.
      writer: this job's identity; None skips the ownership check.
      allow_foreign: delete steps other jobs wrote too.

    Returns:
      The names deleted, sorted.

    Raises:
      CheckpointUriError: `uri` is not a local path, is not a directory,
        holds entries that are not checkpoints, or holds another job's steps
        (the message names some).
    """
    import shutil
    from pathlib import Path

    if "://" in uri:
        raise _uri_error(uri, "--fresh clears local checkpoint directories only")
    root = Path(uri)
    if not root.exists():
        return []
    if not root.is_dir():
        raise _uri_error(uri, "not a directory")
    names = sorted(p.name for p in root.iterdir())
    # Orbax's CheckpointManager writes step directories, `<step>.orbax-checkpoint-tmp-*` while
    # saving, and `metadata/` (its METADATA_ITEM_NAME) when given root metadata.
    orbax_root_metadata = ocp.checkpoint_manager.METADATA_ITEM_NAME
    ours = [n for n in names if _is_orbax_step_dir(root / n) or ".orbax-checkpoint-tmp" in n or n == orbax_root_metadata]
    foreign = [n for n in names if n not in ours]
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        raise _uri_error(uri, f"--fresh deletes checkpoints only, and this directory also holds {shown}; "
                              "give the job a checkpoint directory of its own")
    if writer is not None and not allow_foreign:
        others = {}
        for name in ours:
            if _is_orbax_step_dir(root / name):
                step_writer = _step_writer(root / name)
                if step_writer is None or step_writer.uid != writer.uid:
                    others[name] = step_writer
        if others:
            step, by = next(iter(sorted(others.items(), key=lambda kv: int(kv[0]))))
            who = by.describe() if by else "a job that saved no writer identity"
            raise _uri_error(uri, f"--fresh deletes this job's checkpoints only, and step {step} "
                                  f"({len(others)} step(s) in all) was written by {who}, not {writer.describe()}; "
                                  "give the job a checkpoint directory of its own, or set "
                                  "spec.checkpoint.resumeFrom: Any to treat them as this job's")
    for name in ours:
        shutil.rmtree(root / name)
    return ours


def _step_writer(step_dir) -> JobIdentity | None:
    """The writer in a committed step's Orbax step metadata (`custom_metadata`); None if absent or unreadable."""
    import json

    try:
        meta = json.loads((step_dir / STEP_METADATA_FILE).read_text())
    except (OSError, ValueError):
        return None
    return identity.from_metadata(meta.get("custom_metadata") if isinstance(meta, dict) else None)


# The file Orbax's CheckpointManager writes into every step directory it saves.
STEP_METADATA_FILE = "_CHECKPOINT_METADATA"


def _is_orbax_step_dir(path) -> bool:
    """True for a directory named by a step number that holds Orbax's step metadata file."""
    return path.name.isdigit() and path.is_dir() and (path / STEP_METADATA_FILE).is_file()


def _with_default_sharding(target: PyTree) -> PyTree:
    """Restore targets for Orbax: every leaf becomes a ShapeDtypeStruct with a sharding.

    Concrete arrays keep their sharding; a ShapeDtypeStruct without one gets the
    first local device, which is what a plain `jnp.zeros` would have had.
    """
    default = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])

    def leaf(x: Any) -> Any:
        if isinstance(x, jax.Array):
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
        if isinstance(x, jax.ShapeDtypeStruct) and x.sharding is None:
            return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=default)
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
          OSError, ValueError: the step's metadata cannot be read (a corrupt step).
        """
        self._manager.reload()
        return identity.from_metadata(getattr(self._manager.metadata(step), "custom_metadata", None))

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
