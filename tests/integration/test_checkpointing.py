"""Checkpointer against real Orbax, on local disk and on the GCS emulator.

Child processes (tests/integration/checkpoint_child.py) stand in for a
controller that is SIGKILLed mid-save and for one that restarts with a
different number of devices.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from google.cloud import storage

from elastic_jax.api.identity import JobIdentity
from elastic_jax.controller.checkpointing import (
    CheckpointNotFoundError,
    Checkpointer,
    CheckpointUriError,
)

CHILD = Path(__file__).with_name("checkpoint_child.py")
REPO_ROOT = Path(__file__).resolve().parents[2]


def _train_state(seed: int = 0) -> dict:
    """A small but real train state: params, adam state, step."""
    k1, k2 = jax.random.split(jax.random.key(seed))
    params = {"dense": {"w": jax.random.normal(k1, (16, 8)), "b": jax.random.normal(k2, (8,))}}
    opt = optax.adam(1e-3)
    opt_state = opt.init(params)
    grads = jax.tree.map(jnp.ones_like, params)
    _, opt_state = opt.update(grads, opt_state, params)  # non-zero moments
    return {"params": params, "opt_state": opt_state, "step": jnp.asarray(7, jnp.int32)}


def _assert_trees_equal(a, b) -> None:
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _round_trip(uri: str) -> None:
    state = _train_state()
    data_state = {"next_batch_index": 120, "global_batch_size": 24, "seed": 0}
    writer = JobIdentity(namespace="ml", name="job-a", uid="a1b2")
    with Checkpointer(uri, interval_steps=10, max_to_keep=3, writer=writer) as ckpt:
        assert ckpt.latest_committed_step() is None
        assert ckpt.maybe_save(10, state, data_state)
        ckpt.wait_until_finished()
        assert ckpt.latest_committed_step() == 10
        assert ckpt.last_committed_step == 10
    # A fresh Checkpointer, as after a controller restart.
    with Checkpointer(uri, interval_steps=10, max_to_keep=3) as ckpt:
        assert ckpt.last_committed_step == 10
        target = jax.tree.map(jnp.zeros_like, state)
        restored, restored_data, step = ckpt.restore(target)
        assert step == 10
        assert restored_data == data_state
        _assert_trees_equal(restored, state)
        assert isinstance(restored["opt_state"][0], optax.ScaleByAdamState)
        assert ckpt.last_restore_seconds is not None and ckpt.last_restore_seconds > 0
        # Issue 9 item 13: the writer committed with the step, inside Orbax's step metadata.
        assert ckpt.writer_of(10) == writer
        # A checkpointer without an identity (as elastic-jax before it) saves steps with none.
        assert ckpt.maybe_save(20, state, data_state)
        ckpt.wait_until_finished()
        assert ckpt.writer_of(20) is None


def test_round_trip_local(tmp_path: Path) -> None:
    _round_trip(str(tmp_path / "ckpt"))


def test_round_trip_gcs(gcs_emulator) -> None:
    gcs_emulator.make_bucket("ckpt-roundtrip")
    _round_trip("gs://ckpt-roundtrip/run/1")
    names = {b.name for b in storage.Client().list_blobs("ckpt-roundtrip")}
    # GCS has no rename: the commit marker, written last, is what makes a step count.
    assert "run/1/10/commit_success.txt" in names


def test_interval_max_to_keep_and_commit_callback(tmp_path: Path) -> None:
    committed: list[int] = []
    with Checkpointer(str(tmp_path), interval_steps=2, max_to_keep=2, on_commit=committed.append) as ckpt:
        started = [step for step in range(1, 10) if ckpt.maybe_save(step, {"x": jnp.full((3,), float(step))}, {"i": step})]
        assert started == [2, 4, 6, 8]
        assert ckpt.maybe_save(9, {"x": jnp.zeros(3)}, {"i": 9}, force=True)
        # A step that is not newer than the newest saved one is skipped, even forced.
        assert not ckpt.maybe_save(9, {"x": jnp.zeros(3)}, {"i": 9}, force=True)
        ckpt.wait_until_finished()
        assert committed == [2, 4, 6, 8, 9]
        assert ckpt.committed_steps() == [8, 9]
        state, data, step = ckpt.restore({"x": jnp.zeros(3)}, step=8)
        assert step == 8 and data == {"i": 8}
        np.testing.assert_array_equal(state["x"], np.full(3, 8.0))
        with pytest.raises(CheckpointNotFoundError, match="step 2"):
            ckpt.restore({"x": jnp.zeros(3)}, step=2)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == ["8", "9"]


def test_async_save_returns_before_commit(tmp_path: Path) -> None:
    # 64 MiB: big enough that writing takes clearly longer than the device-to-host copy.
    state = {"w": jax.random.normal(jax.random.key(1), (16 * 1024, 1024), jnp.float32)}
    with Checkpointer(str(tmp_path), interval_steps=1, max_to_keep=1) as ckpt:
        ckpt.maybe_save(1, {"w": jnp.zeros(4)}, {})  # first save pays one-time setup
        ckpt.wait_until_finished()
        assert ckpt.maybe_save(2, state, {"next_batch_index": 2})
        blocking = ckpt.last_save_blocking_seconds
        ckpt.wait_until_finished()
        total = ckpt.last_save_seconds
    assert ckpt.last_committed_step == 2
    assert blocking is not None and total is not None
    assert blocking < total, (blocking, total)
    assert blocking < 2.0, blocking


def test_a_state_that_does_not_fit_is_refused_from_the_metadata_naming_the_array(tmp_path: Path) -> None:
    """A changed model: refused before any array is read (Orbax's own refusal came mid-restore, and its reads
    still in flight then printed "Event loop is closed" tracebacks), naming the array and both shapes."""
    state = _train_state()
    with Checkpointer(str(tmp_path / "ck"), interval_steps=10, max_to_keep=3) as ckpt:
        assert ckpt.maybe_save(10, state, {"next_batch_index": 0})
        ckpt.wait_until_finished()
        wider = jax.tree.map(jnp.zeros_like, state)
        wider["params"]["dense"]["b"] = jnp.zeros((9,))
        with pytest.raises(ValueError, match=r"Requested shape: \(9,\) is not compatible with the stored shape: "
                                             r"\(8,\) \(array params/dense/b\)"):
            ckpt.restore(wider)
        restored, _, step = ckpt.restore(jax.tree.map(jnp.zeros_like, state))  # the fitting state still restores
        assert step == 10
        _assert_trees_equal(restored, state)


def test_restore_without_checkpoint_raises(tmp_path: Path) -> None:
    with Checkpointer(str(tmp_path), interval_steps=1, max_to_keep=1) as ckpt:
        with pytest.raises(CheckpointNotFoundError, match="no committed checkpoint"):
            ckpt.restore({"x": jnp.zeros(3)})


def _child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return env


def test_sigkill_during_async_save_keeps_previous_step(tmp_path: Path) -> None:
    directory = tmp_path / "ckpt"
    log_path = tmp_path / "child.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, str(CHILD), "save-and-hang", str(directory), "256"],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=_child_env(),
        )
    try:
        deadline = time.monotonic() + 60
        tmp_dirs: list[Path] = []
        while time.monotonic() < deadline and proc.poll() is None:
            tmp_dirs = list(directory.glob("2.orbax-checkpoint-tmp*")) if directory.exists() else []
            if tmp_dirs:
                break
            time.sleep(0.005)
        assert tmp_dirs, f"no partial step appeared; child log:\n{log_path.read_text(errors='replace')[-3000:]}"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    # The kill landed mid-save: the partial directory is still there, step 2 never committed.
    assert list(directory.glob("2.orbax-checkpoint-tmp*")), "save finished before the kill; test proves nothing"
    assert not (directory / "2").exists()

    with Checkpointer(str(directory), interval_steps=1, max_to_keep=3) as ckpt:
        assert ckpt.latest_committed_step() == 1
        assert ckpt.committed_steps() == [1]
        state, data, step = ckpt.restore({"w": jnp.zeros(4)})
        assert step == 1 and data == {"next_batch_index": 10}
        np.testing.assert_array_equal(state["w"], np.ones(4))
        with pytest.raises(CheckpointNotFoundError):
            ckpt.restore({"w": jnp.zeros(4)}, step=2)
        # Training resumes: step 2 can be saved again over the debris.
        assert ckpt.maybe_save(2, {"w": jnp.full((4,), 5.0)}, {"next_batch_index": 20})
        ckpt.wait_until_finished()
        assert ckpt.committed_steps() == [1, 2]


def test_restore_onto_a_different_device_layout(tmp_path: Path) -> None:
    """1 device -> 2 devices (sharded) -> 1 device, each restore through a target."""
    directory = str(tmp_path / "ckpt")
    w = jnp.arange(32, dtype=jnp.float32).reshape(8, 4)
    with Checkpointer(directory, interval_steps=1, max_to_keep=5) as ckpt:
        ckpt.maybe_save(3, {"w": w}, {"next_batch_index": 30})

    result = subprocess.run(
        [sys.executable, str(CHILD), "reshard", directory],
        capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
        env=_child_env({"XLA_FLAGS": "--xla_force_host_platform_device_count=2", "JAX_PLATFORMS": "cpu"}),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    child = json.loads(result.stdout.strip().splitlines()[-1])
    assert child["step"] == 3 and child["data"] == {"next_batch_index": 30}
    assert child["restored_devices"] == [0, 1]
    assert child["restored_shard_shapes"] == [[4, 4], [4, 4]]
    assert child["restored_sum"] == float(jnp.sum(w))

    # Back in this process: a checkpoint written 2-way sharded, restored onto one device.
    device = jax.devices()[0]
    with Checkpointer(directory, interval_steps=1, max_to_keep=5) as ckpt:
        target = {"w": jax.ShapeDtypeStruct((8, 4), jnp.float32, sharding=jax.sharding.SingleDeviceSharding(device))}
        state, data, step = ckpt.restore(target)
    assert step == 4 and data == {"next_batch_index": 31}
    assert state["w"].sharding.device_set == {device}
    np.testing.assert_array_equal(state["w"], np.asarray(w) * 2)


def _assert_uri_error(uri: str, match: str, max_seconds: float = 15.0) -> None:
    started = time.monotonic()
    with pytest.raises(CheckpointUriError) as info:
        Checkpointer(uri, interval_steps=1, max_to_keep=1, probe_timeout_s=3.0)
    elapsed = time.monotonic() - started
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith("spec.checkpoint.uri: ")
    assert match in message, message
    assert elapsed < max_seconds, f"{uri}: took {elapsed:.1f}s"


def test_unusable_uris_fail_fast_with_one_line(gcs_emulator, monkeypatch: pytest.MonkeyPatch) -> None:
    assert isinstance(CheckpointUriError("x"), ValueError)
    _assert_uri_error("gs://no-such-bucket/ckpt", "bucket 'no-such-bucket' does not exist")
    _assert_uri_error("/proc/x/ckpt", "cannot be created: directory '/proc' is not writable")
    _assert_uri_error("s3://bucket/ckpt", "unsupported scheme")
    # An endpoint nobody listens on (as a GCS outage or a wrong network would look).
    from elastic_jax.local.processes import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", dead)
    _assert_uri_error("gs://ckpt-roundtrip/x", "GCS unreachable")


def test_fresh_deletes_only_this_jobs_steps(tmp_path: Path) -> None:
    """`--fresh` must not destroy another job's checkpoints (found by a new-user trial: it did)."""
    from elastic_jax.controller.checkpointing import CheckpointUriError, clear_local_checkpoints

    state = _train_state()
    data_state = {"next_batch_index": 0, "global_batch_size": 8, "seed": 0}
    job_a = JobIdentity(namespace="local", name="job-a", uid="uid-a")
    job_b = JobIdentity(namespace="local", name="job-b", uid="uid-b")
    uri = str(tmp_path / "ck")
    with Checkpointer(uri, interval_steps=10, max_to_keep=3, writer=job_a) as ckpt:
        assert ckpt.maybe_save(10, state, data_state)
        ckpt.wait_until_finished()
    with pytest.raises(CheckpointUriError, match=r"step 10 .*written by local/job-a \(uid uid-a\), not local/job-b"):
        clear_local_checkpoints(uri, job_b)
    assert (tmp_path / "ck" / "10").is_dir()  # untouched
    assert clear_local_checkpoints(uri, job_b, allow_foreign=True).delete == ["10"]
    with Checkpointer(uri, interval_steps=10, max_to_keep=3, writer=job_b) as ckpt:
        assert ckpt.maybe_save(20, state, data_state)
        ckpt.wait_until_finished()
    assert clear_local_checkpoints(uri, job_b).delete == ["20"]
