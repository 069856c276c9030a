"""The kind tier's background start (e2e/kind/prewarm.py): who owns the engine, which error surfaces.

The engine and image steps are replaced here (their own tests are the kind tier's); what is
tested is the hand-over logic.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from e2e.kind import prewarm


@pytest.fixture
def steps(monkeypatch):
    calls: list[str] = []
    stopped: list[object] = []
    engine = object()
    monkeypatch.setattr(prewarm.engine_mod, "start", lambda log, on_spawn: calls.append("engine") or engine)
    monkeypatch.setattr(prewarm.engine_mod, "stop", lambda e, log: stopped.append(e))
    monkeypatch.setattr(prewarm.images, "python_base", lambda e, log: calls.append("base") or type("B", (), {"name": "b"}))
    monkeypatch.setattr(prewarm.images, "build_project_images", lambda e, base, log: calls.append("images"))
    monkeypatch.setattr(prewarm.nodeimage, "rootfs_image", lambda e, name, *a: calls.append(name))
    return calls, stopped, engine


def test_take_hands_over_the_engine_after_every_step(tmp_path, steps):
    calls, stopped, engine = steps
    p = prewarm.Prewarm(tmp_path / "prewarm.log")
    assert p.take() is engine
    assert calls == ["engine", "base", "images", "node", "component"]
    p.close()
    assert stopped == []  # the fixture that took it stops it
    assert "prewarm done" in (tmp_path / "prewarm.log").read_text()


def test_an_engine_nobody_took_is_stopped_at_the_end(tmp_path, steps):
    _, stopped, engine = steps
    p = prewarm.Prewarm(tmp_path / "prewarm.log")
    p.close()
    assert stopped == [engine]


def test_a_failed_engine_start_is_raised_by_take(tmp_path, steps, monkeypatch):
    def refuse(log, on_spawn):
        raise prewarm.engine_mod.EngineUnavailable("no docker.io package")
    monkeypatch.setattr(prewarm.engine_mod, "start", refuse)
    p = prewarm.Prewarm(tmp_path / "prewarm.log")
    with pytest.raises(prewarm.engine_mod.EngineUnavailable, match="no docker.io"):
        p.take()
    p.close()


def test_a_failed_image_step_still_hands_over_the_engine(tmp_path, steps, monkeypatch):
    _, stopped, engine = steps
    def broken(e, base, log):
        raise RuntimeError("pip: no matching distribution")
    monkeypatch.setattr(prewarm.images, "build_project_images", broken)
    p = prewarm.Prewarm(tmp_path / "prewarm.log")
    assert p.take() is engine  # the product_images fixture runs the build again and raises its own error
    assert "pip: no matching distribution" in (tmp_path / "prewarm.log").read_text()
    p.close()
    assert stopped == []


def _building_until_stopped(monkeypatch, stopped):
    """An engine (never signalled: `stop` is a fake appending to `stopped`) whose first build step runs until
    the engine is stopped, then fails as a build without its daemon does. Returns (engine, building): an
    Event set once that step runs."""
    import threading

    engine = SimpleNamespace(pid=4242)
    gone, building = threading.Event(), threading.Event()

    def start(log, on_spawn):
        on_spawn(engine)
        return engine

    def stop(e, log):
        stopped.append(e)
        gone.set()

    def build(e, log):  # a build fails once its engine is gone, and not before
        building.set()
        gone.wait(60)
        raise RuntimeError("docker build: Cannot connect to the Docker daemon")
    monkeypatch.setattr(prewarm.engine_mod, "start", start)
    monkeypatch.setattr(prewarm.engine_mod, "stop", stop)
    monkeypatch.setattr(prewarm.images, "python_base", build)
    return engine, building


def test_an_interrupted_session_stops_the_engine_at_once_not_after_the_builds(tmp_path, steps, monkeypatch):
    """A pytest interrupted seconds after its start left the prewarm's dockerd running: the session's end
    waited for the builds (minutes), and a second Ctrl-C or the exit left the daemon thread's engine behind."""
    calls, stopped, _ = steps
    engine, building = _building_until_stopped(monkeypatch, stopped)
    p = prewarm.Prewarm(tmp_path / "prewarm.log")
    building.wait()
    p.close(interrupted=True)
    assert stopped == [engine]
    assert calls == []  # no step after the interrupted one
    assert "interrupted" in (tmp_path / "prewarm.log").read_text()


def test_an_interrupt_while_the_session_end_waits_for_the_builds_stops_the_engine(tmp_path, steps, monkeypatch):
    """A session whose tests were done waited in `close` for the MaxText build; `timeout`'s SIGTERM there
    (raised as KeyboardInterrupt) left the engine running, orphaned."""
    import threading

    _, stopped, _ = steps
    engine, building = _building_until_stopped(monkeypatch, stopped)
    p = prewarm.Prewarm(tmp_path / "prewarm.log")
    building.wait()
    joins = []

    def join_interrupted(timeout=None):  # the first join is the session's end: the signal lands in it
        joins.append(timeout)
        if len(joins) == 1:
            raise KeyboardInterrupt("signal 15")
        threading.Thread.join(p._thread, timeout)
    monkeypatch.setattr(p._thread, "join", join_interrupted)
    with pytest.raises(KeyboardInterrupt):
        p.close()
    assert stopped == [engine]


def test_an_engine_spawned_after_the_interrupt_is_stopped_as_it_spawns(tmp_path, steps, monkeypatch):
    import threading

    calls, stopped, _ = steps
    engine = SimpleNamespace(pid=4242)
    interrupted = threading.Event()

    def start(log, on_spawn):  # still installing packages when the session is interrupted
        interrupted.wait()
        on_spawn(engine)
        return engine
    monkeypatch.setattr(prewarm.engine_mod, "start", start)
    p = prewarm.Prewarm(tmp_path / "prewarm.log")
    with p._lock:
        p._cancel.set()
    interrupted.set()
    p.close(interrupted=True)
    assert stopped == [engine] and calls == []
    assert isinstance(p.error, prewarm.Cancelled)


def test_take_hands_over_before_the_maxtext_image_and_wait_done_waits_for_it(tmp_path, steps, monkeypatch):
    """Plan-ci-time row #4: the kind lane's first test waited for the MaxText image (~4 min of the prewarm's
    6); the cluster needs only the steps before it, and only the maxtext_image fixture waits for it."""
    import threading

    calls, stopped, engine = steps
    release = threading.Event()

    def maxtext(e, prefix, log):
        calls.append("maxtext")
        release.wait()
    monkeypatch.setattr(prewarm.images, "find_python312", lambda: tmp_path)
    monkeypatch.setattr(prewarm.images, "build_maxtext_image", maxtext)
    p = prewarm.Prewarm(tmp_path / "prewarm.log")
    assert p.take() is engine  # returns while the MaxText step still runs
    assert calls[:5] == ["engine", "base", "images", "node", "component"]
    p.wait_done(timeout_s=0.2)
    assert p.seconds is None, "the prewarm ended before its MaxText step was released"
    release.set()
    p.wait_done()
    assert calls[-1] == "maxtext" and p.seconds is not None
    p.close()
    assert stopped == []


def test_the_hand_over_time_is_known_when_take_returns(tmp_path, steps):
    """The docker_engine fixture prints it (it printed the whole prewarm's seconds, which, with the MaxText
    step still running, do not exist yet at the hand-over)."""
    p = prewarm.Prewarm(tmp_path / "prewarm.log")
    p.take()
    assert p.handover_seconds is not None
    p.close()
