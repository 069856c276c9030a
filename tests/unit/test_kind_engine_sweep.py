"""The kind tier's temp image stores: one a killed session left is deleted, one in use or being made is not.

Each temp store is a whole Docker image store (~19 GB on the kind tier); two
left behind by killed sessions once filled this machine's disk.
"""

from __future__ import annotations

import fcntl
import os
import time

from e2e.kind import engine


def _store(tmp_path, name: str, age_s: float):
    root = tmp_path / f"{engine.TEMP_DATA_ROOT_PREFIX}{name}"
    (root / "overlay2" / "layer").mkdir(parents=True)
    (root / "overlay2" / "layer" / "blob").write_bytes(b"x" * 1024)
    (root / ".lock").touch()
    then = time.time() - age_s
    os.utime(root, (then, then))
    return root


def test_a_store_nobody_locks_is_deleted_once_old_and_kept_while_locked_or_young(tmp_path):
    old = engine.STALE_TEMP_ROOT_AGE_S + 60
    stale = _store(tmp_path, "stale", old)
    in_use = _store(tmp_path, "in-use", old)
    young = _store(tmp_path, "young", 5)
    other = tmp_path / "not-a-store"
    other.mkdir()
    os.utime(other, (time.time() - old,) * 2)
    held = os.open(in_use / ".lock", os.O_RDWR)
    fcntl.flock(held, fcntl.LOCK_EX)  # as a running dockerd holds it (inherited fd)
    try:
        said: list[str] = []
        removed = engine.sweep_stale_temp_roots(tmp_path, log=said.append)
    finally:
        os.close(held)
    assert removed == [stale] and not stale.exists()
    assert in_use.exists() and young.exists() and other.exists()
    assert len(said) == 1 and str(stale) in said[0] and "killed" in said[0]


def test_the_lock_fallback_makes_a_locked_temp_store_and_marks_it_temporary(tmp_path, monkeypatch):
    monkeypatch.setattr(engine.tempfile, "tempdir", str(tmp_path))
    cache = tmp_path / "cache" / "docker"
    first, fd1, temp1 = engine._lock_data_root(cache)
    try:
        second, fd2, temp2 = engine._lock_data_root(cache)
        try:
            assert (first, temp1) == (cache, False)
            assert temp2 and second.name.startswith(engine.TEMP_DATA_ROOT_PREFIX) and second.parent == tmp_path
            # its lock is held, so a sweep (even once it is old) leaves it alone
            os.utime(second, (time.time() - 10 * engine.STALE_TEMP_ROOT_AGE_S,) * 2)
            assert engine.sweep_stale_temp_roots(tmp_path) == [] and second.exists()
        finally:
            os.close(fd2)
        assert engine.sweep_stale_temp_roots(tmp_path) == [second] and not second.exists()
    finally:
        os.close(fd1)
