"""Pytest plugin: the Go build runs beside the tests that need no Go binary.

On a fresh machine ``e2e/build.sh`` compiles Kubernetes, JobSet, Helm, kind and
crictl from modules: the longest single step of the suite on two cores. Run
synchronously before the first test it would add its whole length to the run;
started in the background right after collection (at ``nice`` 10, so the tests
beside it keep their CPU share) it overlaps ``tests/``, which needs no binary.

- Items that need the binaries: every item under ``e2e/`` and any item marked
  ``go_binaries``. They are moved after all other items (stable: their own
  order is kept), so everything that can run during the build does.
- The first such item waits for the build before its own protocol starts:
  outside pytest-timeout's per-test timer, which this hook wraps.
- A failed build ends the session with the end of its log; a build still
  running when the session ends is stopped by its process group's ID.

Up to date binaries make ``build.sh`` return at once (it checks a stamp of its
inputs), so on a warm machine all of this costs a second.

Under the lanes of :mod:`tests.support.lanes` (xdist workers) every worker
starts its own background ``build.sh`` (any worker may get a test that needs the
binaries), each with its own log (``build-gw0.log``...). ``build.sh`` holds a
lock on its build folder while it runs, so one worker builds and the others wait
for it, then find the stamp up to date: the Go build runs once.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from e2e.harness.paths import E2E_DIR, bin_dir
from tests.support.lanes import say, worker_id

MARKER = "go_binaries"
BUILD_TIMEOUT_S = 5400.0
"""Upper bound on the background build (seconds): 90 min, CI's whole budget."""


class BackgroundBuild:
    """``e2e/build.sh`` as a background process of this pytest session.

    Args:
      log_path: where the build's stdout and stderr go.
      command: the build command; default ``nice -n 10 bash e2e/build.sh``.
    """

    def __init__(self, log_path: Path, command: list[str] | None = None):
        self.log_path = log_path
        self.started, self.started_wall = time.monotonic(), time.time()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(log_path, "wb") as log:
            self.proc = subprocess.Popen(command or ["nice", "-n", "10", "bash", str(E2E_DIR / "build.sh")],
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
        self.seconds: float | None = None

    def wait(self, timeout_s: float = BUILD_TIMEOUT_S) -> float:
        """Block until the build ends; return its length in seconds (from its start to its end, also when it
        ended long before this call: then read from its log's last write, since the build's last line is its
        "built in" line; a CI log once read the first wait's 25 min as the build's own when it took 36 s).

        Raises:
          RuntimeError: the build failed or timed out (stopped then); the message
            holds the end of its log.
        """
        if self.seconds is None:
            ended_before = self.proc.poll() is not None
            try:
                code = self.proc.wait(timeout=max(0.0, self.started + timeout_s - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.stop()
                code = "timeout"
            if code != 0:
                tail = self.log_path.read_text(errors="replace")[-4000:]
                raise RuntimeError(f"e2e/build.sh failed ({code}); end of {self.log_path}:\n{tail}")
            self.seconds = time.monotonic() - self.started
            if ended_before:
                try:
                    self.seconds = min(self.seconds, max(0.0, self.log_path.stat().st_mtime - self.started_wall))
                except OSError:
                    pass
        return self.seconds

    def stop(self) -> None:
        """Stop the build and every process it started (its process group)."""
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
            except ProcessLookupError:
                pass


_build: BackgroundBuild | None = None


@functools.cache
def _kind_unavailable() -> bool:
    from e2e.kind import engine  # the kind tier skips without a Docker engine: nothing to build for it
    return engine.why_unavailable() is not None


def needs_binaries(item: pytest.Item) -> bool:
    """Whether ``item`` runs a Go binary of ``e2e/build.sh``: anything under e2e/ (the kind tier
    only where it can run), or marked ``go_binaries``."""
    if item.get_closest_marker(MARKER) is not None:
        return True
    parents = Path(item.path).parents
    if E2E_DIR / "kind" in parents:
        return not _kind_unavailable()
    return E2E_DIR in parents


def wait_for_binaries() -> float | None:
    """Wait for this session's background build, if one runs; seconds it took, else None.

    Raises:
      RuntimeError: the background build failed (see :meth:`BackgroundBuild.wait`).
    """
    return _build.wait() if _build is not None else None


def _say(config: pytest.Config, message: str) -> None:
    say(config, message)


def log_path() -> Path:
    """This process's build log: ``e2e/.build/build.log``, or ``build-<worker>.log`` in an xdist worker."""
    wid = worker_id()
    return bin_dir().parent / (f"build-{wid}.log" if wid else "build.log")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}: the test runs a binary e2e/build.sh makes; it runs "
                                       "after the tests that need none, while the build runs beside them")


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    items[:] = [i for i in items if not needs_binaries(i)] + [i for i in items if needs_binaries(i)]


def pytest_collection_finish(session: pytest.Session) -> None:
    global _build
    config = session.config
    if config.option.collectonly or not any(needs_binaries(i) for i in session.items):
        return
    _build = BackgroundBuild(log_path())
    _say(config, f"e2e: Go build started in the background (pid {_build.proc.pid}, log {_build.log_path}); "
                 "tests that need its binaries run last")


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    if _build is not None and _build.seconds is None and needs_binaries(item):
        if _build.proc.poll() is None:
            _say(item.config, "e2e: waiting for the Go build (e2e/build.sh) to finish")
        try:
            seconds = _build.wait()
        except RuntimeError as e:
            pytest.exit(str(e), returncode=1)
        _say(item.config, f"e2e: Go build took {seconds:.0f}s; its first test starts "
                          f"{time.monotonic() - _build.started:.0f}s after the build started")
    yield


def pytest_sessionfinish(session: pytest.Session) -> None:
    if _build is not None:
        _build.stop()
