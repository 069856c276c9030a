"""The background Go build of the e2e suite (e2e/harness/background_build.py), with real processes."""

from __future__ import annotations

import time

import pytest

from e2e.harness.background_build import BackgroundBuild
from tests.support.workers import pid_alive


def test_wait_returns_seconds_of_a_successful_build(tmp_path):
    build = BackgroundBuild(tmp_path / "build.log", ["bash", "-c", "echo compiled; sleep 0.3"])
    seconds = build.wait()
    assert seconds >= 0.3
    assert build.wait() == seconds  # the second wait does not wait again
    assert "compiled" in (tmp_path / "build.log").read_text()


def test_a_failed_build_raises_with_its_log(tmp_path):
    build = BackgroundBuild(tmp_path / "build.log", ["bash", "-c", "echo 'go: cannot find module'; exit 3"])
    with pytest.raises(RuntimeError, match=r"failed \(3\)(.|\n)*go: cannot find module"):
        build.wait()


def test_a_build_over_its_time_is_stopped_and_raises(tmp_path):
    build = BackgroundBuild(tmp_path / "build.log", ["sleep", "60"])
    with pytest.raises(RuntimeError, match="timeout"):
        build.wait(timeout_s=0.5)
    assert build.proc.poll() is not None


def test_stop_ends_the_build_and_its_children(tmp_path):
    pid_file = tmp_path / "child.pid"
    build = BackgroundBuild(tmp_path / "build.log",
                            ["bash", "-c", f"sleep 300 & echo $! > {pid_file}; wait"])
    deadline = time.monotonic() + 10
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.monotonic() < deadline, "the build's child never started"
        time.sleep(0.05)
    child = int(pid_file.read_text())
    assert pid_alive(child)
    build.stop()
    assert build.proc.poll() is not None
    deadline = time.monotonic() + 10
    while pid_alive(child):  # reaped by init once its parent is gone
        assert time.monotonic() < deadline, f"child {child} of the stopped build still runs"
        time.sleep(0.05)


def test_a_build_that_ended_before_the_wait_reports_its_own_length_not_the_wait(tmp_path):
    """Session 24: a CI log's "Go binaries ready 1551s after the build started" was read as a 25-minute build;
    its log said `built in 36s` (the first test needing it came after the unit and integration tiers)."""
    build = BackgroundBuild(tmp_path / "build.log", ["bash", "-c", "echo built"])
    build.proc.wait()
    time.sleep(1.5)
    assert build.wait() < 1.0
