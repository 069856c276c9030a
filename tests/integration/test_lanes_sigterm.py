"""A SIGTERM to the pytest process of a run in lanes (tests/support/lanes.py) reaches its xdist workers, and
the run ends only after they tore their fixtures down, even a teardown longer than xdist's own 10-s kill
(a kind cluster's deletion, an engine's stop), so no process a test started outlives the run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]
TEARDOWN_S = 15
"""The probe's teardown: longer than xdist's EXIT_TIMEOUT (10 s), after which it kills the workers."""

PROBE = textwrap.dedent(f'''
    import os, pathlib, subprocess, time, pytest

    OUT = pathlib.Path(os.environ["PROBE_OUT"])

    @pytest.fixture(scope="package")
    def child():
        p = subprocess.Popen(["sleep", "300"])
        (OUT / "child.pid").write_text(str(p.pid))
        yield p
        time.sleep({TEARDOWN_S})  # a cluster's slow teardown
        p.kill()
        p.wait()
        (OUT / "torn-down").write_text("yes")

    def test_long(child):
        time.sleep(300)
''')


def _pid(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def test_sigterm_to_the_controller_tears_the_workers_fixtures_down(tmp_path):
    tree = tmp_path / "tree"
    (tree / "e2e" / "kind").mkdir(parents=True)
    (tree / "pyproject.toml").write_text('[tool.pytest.ini_options]\ntestpaths = ["e2e"]\n')
    (tree / "conftest.py").write_text('pytest_plugins = ["tests.support.tiers", "tests.support.lanes", '
                                      '"tests.support.sigterm"]\n')
    (tree / "e2e" / "kind" / "test_probe.py").write_text(PROBE)
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--runslow", "--rootdir", str(tree)],
        cwd=tree, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(os.environ, PROBE_OUT=str(tmp_path), PYTHONPATH=str(REPO)),
        # A shell started in the background ignores SIGINT/SIGTERM for its children; start clean.
        preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
    child_pid = None
    workers: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 120  # a bound on the start, not an assertion on its length
        while child_pid is None and time.monotonic() < deadline and run.poll() is None:
            child_pid = _pid(tmp_path / "child.pid")
            time.sleep(0.1)
        assert child_pid is not None, "the probe test never started its child"
        workers = psutil.Process(run.pid).children()
        assert len(workers) == 2, f"expected 2 xdist workers, got {workers}"
        run.send_signal(signal.SIGTERM)  # to the controller alone, as CI's timeout or `kill PID` does
        out, _ = run.communicate(timeout=TEARDOWN_S + 120)
        assert (tmp_path / "torn-down").exists(), f"the worker's fixture teardown did not finish:\n{out}"
        assert not psutil.pid_exists(child_pid) or psutil.Process(child_pid).status() == psutil.STATUS_ZOMBIE
        assert not [w.pid for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        for proc in workers:
            if proc.is_running():
                proc.kill()
        if child_pid is not None and psutil.pid_exists(child_pid):
            os.kill(child_pid, signal.SIGKILL)
