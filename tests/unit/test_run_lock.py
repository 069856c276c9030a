"""`RunLock`: one launcher per run directory; a gone launcher's processes still holding it are waited for."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading

import pytest

from elastic_jax.local.launcher import LaunchError, RunLock


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _hold(path, pid: int) -> int:
    """Another open file of the lock holding its flock (as a controller that inherited it does)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.ftruncate(fd, 0)
    os.write(fd, str(pid).encode())
    return fd


def test_a_live_launcher_holding_the_lock_is_refused_at_once(tmp_path):
    with RunLock(tmp_path) as held:
        assert held.fd is not None
        with pytest.raises(LaunchError, match=rf"already running from {tmp_path} \(launcher pid {os.getpid()}\)"):
            RunLock(tmp_path, wait_s=30).acquire()
    assert held.fd is None


def test_a_gone_launchers_holder_is_waited_for_and_named_when_it_does_not_stop(tmp_path):
    gone = _dead_pid()
    fd = _hold(tmp_path / "launcher.lock", gone)
    said: list[str] = []
    try:
        with pytest.raises(LaunchError, match=rf"launcher pid {gone}, gone\) still has a process holding .*fuser"):
            RunLock(tmp_path, wait_s=0.3, on_wait=said.append).acquire()
        assert len(said) == 1 and f"launcher pid {gone}) is gone" in said[0] and "waiting up to" in said[0]
        # it stops while the next run waits: that run takes the lock and writes its own pid
        threading.Timer(0.3, os.close, (fd,)).start()
        fd = None
        with RunLock(tmp_path, wait_s=30, on_wait=said.append):
            assert (tmp_path / "launcher.lock").read_text() == str(os.getpid())
    finally:
        if fd is not None:
            os.close(fd)


def test_a_checkpoint_folder_is_locked_once_and_free_again_after_release(tmp_path):
    """`CheckpointLock` shares `RunLock`'s holding and release (`_HeldFlock`): a second run on the same local
    checkpoints is refused while the first holds them; gs:// is not locked."""
    from elastic_jax.local.launcher import CheckpointLock

    uri = str(tmp_path / "ckpt")
    with CheckpointLock(uri) as held:
        assert held.fd is not None
        with pytest.raises(LaunchError, match="is in use by another elastic-jax run"):
            CheckpointLock(uri).acquire()
    assert held.fd is None
    with CheckpointLock(uri) as again:
        assert again.fd is not None
    with CheckpointLock("gs://bucket/prefix") as remote:
        assert remote.fd is None
