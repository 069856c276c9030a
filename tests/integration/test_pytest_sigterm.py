"""A SIGTERM to a test run tears its fixtures down, so no process a test started outlives the run."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

PROBE = textwrap.dedent('''
    import subprocess, time, pathlib, pytest

    OUT = pathlib.Path(__file__).parent

    @pytest.fixture
    def child():
        p = subprocess.Popen(["sleep", "300"])
        (OUT / "child.pid").write_text(str(p.pid))
        yield p
        p.kill()
        p.wait()
        (OUT / "torn-down").write_text("yes")

    def test_long(child):
        time.sleep(120)
''')


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_sigterm_runs_fixture_teardown(tmp_path):
    (tmp_path / "test_probe.py").write_text(PROBE)
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.support.sigterm",
         "--rootdir", str(tmp_path), "-c", os.devnull, str(tmp_path / "test_probe.py")],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        # A shell started in the background ignores SIGINT/SIGTERM for its children; start clean.
        preexec_fn=lambda: signal.signal(signal.SIGTERM, signal.SIG_DFL))
    child_pid = None
    try:
        deadline = time.monotonic() + 120
        while child_pid is None and time.monotonic() < deadline and run.poll() is None:
            try:
                child_pid = int((tmp_path / "child.pid").read_text())
            except (FileNotFoundError, ValueError):
                time.sleep(0.1)
        assert child_pid is not None, "the probe test never started its child"
        run.send_signal(signal.SIGTERM)
        out, _ = run.communicate(timeout=60)
        assert (tmp_path / "torn-down").exists(), f"fixture teardown did not run on SIGTERM:\n{out}"
        assert not _alive(child_pid), "the test's child outlived the SIGTERMed run"
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        if child_pid is not None and _alive(child_pid):
            os.kill(child_pid, signal.SIGKILL)
