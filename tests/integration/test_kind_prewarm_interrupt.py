"""An interrupted session stops the kind prewarm's real dockerd by its PID, without waiting for the builds.

A pytest interrupted within seconds of its start left the prewarm's background dockerd running: the
session's end waited for the image builds (minutes) and the daemon thread's engine outlived an exit.
Here the engine is real (its own temp image store, not the warm cache); the first build step is a
stand-in that runs, like `docker build`, until its engine goes away.
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from e2e.kind import engine as engine_mod
from e2e.kind import prewarm

pytestmark = pytest.mark.skipif(engine_mod.why_unavailable() is not None,
                                reason=str(engine_mod.why_unavailable()))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return not open(f"/proc/{pid}/stat").read().split(")")[-1].split()[0] == "Z"


@pytest.mark.timeout(300)
@pytest.mark.parametrize("when", ["while a build runs", "as soon as dockerd is spawned"])
def test_an_interrupted_session_stops_the_prewarm_engine_by_pid(tmp_path, monkeypatch, when):
    monkeypatch.setenv("E2E_DOCKER_DATA_ROOT", str(tmp_path / "docker"))
    building = threading.Event()
    after: list[str] = []

    def build_until_the_engine_goes(engine, log):
        building.set()
        while engine.docker("version", check=False, timeout=20).returncode == 0:
            time.sleep(0.2)
        raise RuntimeError("docker build: Cannot connect to the Docker daemon")
    monkeypatch.setattr(prewarm.images, "python_base", build_until_the_engine_goes)
    monkeypatch.setattr(prewarm.images, "build_project_images", lambda *a, **k: after.append("images"))
    monkeypatch.setattr(prewarm.nodeimage, "rootfs_image", lambda *a, **k: after.append("rootfs"))

    p = prewarm.Prewarm(tmp_path / "prewarm.log")
    try:
        deadline = time.monotonic() + 120  # a bound on the wait, not an assertion on its length
        while p.spawned_pid is None and time.monotonic() < deadline and p.error is None:
            time.sleep(0.05)
        pid = p.spawned_pid
        assert pid is not None, (tmp_path / "prewarm.log").read_text()
        if when == "while a build runs":
            assert building.wait(120), (tmp_path / "prewarm.log").read_text()
        run_dir = p._spawned.run_dir
        p.close(interrupted=True)  # the session's end after Ctrl-C: must not wait for the builds
    finally:
        if p._spawned is not None:  # a failed assertion above must not leave the engine behind
            engine_mod.stop(p._spawned, log=lambda m: None)
    assert not _alive(pid), f"dockerd {pid} still runs"
    assert engine_mod._pids_using(run_dir) == [], "its containerd still runs"
    assert not run_dir.exists()
    assert engine_mod._mounts_under(tmp_path) == [], "a mount of the engine's is left"
    assert after == [], "a step started after the interrupt"
