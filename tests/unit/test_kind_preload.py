"""The kind cluster's image preload and side-by-side steps (e2e/kind/cluster.py), with a fake docker CLI.

A failed copy is said by ``wait()`` (``load_images`` then loads the usual way) and leaves no tar;
a cancelled one stops its process by PID; side-by-side steps all end before the first error is raised.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from e2e.kind import cluster as kind


class _Engine:
    def env(self) -> dict[str, str]:
        return dict(os.environ)


def _fake_docker(tmp_path, monkeypatch, body: str) -> None:
    path = tmp_path / "docker"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    monkeypatch.setattr("e2e.kind.engine.docker_client", lambda: str(path))


def test_a_failed_save_is_said_by_wait_and_leaves_no_tar(tmp_path, monkeypatch):
    _fake_docker(tmp_path, monkeypatch, 'echo "no such image: $4" >&2\nexit 1\n')
    preload = kind.ImagePreload(_Engine(), ["img:1"], tmp_path / "preload")
    preload.load_into("c", ["c-worker"])
    error = preload.wait()
    assert error and "no such image: img:1" in error, error
    assert not (tmp_path / "preload").exists()


def test_a_preload_never_told_its_nodes_says_so(tmp_path, monkeypatch):
    _fake_docker(tmp_path, monkeypatch, 'touch "$3"\n')  # docker save -o PATH: a tar, nothing else
    preload = kind.ImagePreload(_Engine(), ["img:1"], tmp_path / "preload")
    assert preload.wait() == "the nodes were never named"
    assert not (tmp_path / "preload").exists()


def test_cancel_stops_the_save_by_pid(tmp_path, monkeypatch):
    pid_file = tmp_path / "pid"
    _fake_docker(tmp_path, monkeypatch, f'echo $$ > {pid_file}\nexec sleep 600\n')
    preload = kind.ImagePreload(_Engine(), ["img:1"], tmp_path / "preload")
    deadline = time.monotonic() + 30
    while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = int(pid_file.read_text())
    preload.cancel()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not preload.wait()  # cancelled: nothing to say, the caller loads the usual way


def test_side_by_side_steps_all_end_before_the_first_error_is_raised():
    ended = threading.Event()

    def fails():
        raise ValueError("coredns")

    def slow():
        time.sleep(0.3)
        ended.set()
    timings: dict[str, float] = {}
    with pytest.raises(ValueError, match="coredns"):
        kind._side_by_side({"coredns": fails, "jobset": slow}, timings)
    assert ended.is_set()
    assert set(timings) == {"coredns", "jobset"}
