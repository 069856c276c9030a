"""`e2e/kind/run.sh --air-gapped` (`python -m e2e.kind.demo`) SIGTERMed cleans up as Ctrl-C does.

A new user's trial (session 24): `kill -TERM` of the demo ended the process at once (Python's default action),
leaving its Docker engine, the kind nodes and the bridge behind. The engine is a stand-in here (this is the
demo's own clean-up logic; the real engine's stop is the kind tier's)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

_CHILD = r"""
import sys, time
from pathlib import Path
from e2e.kind import demo, engine as engine_mod, images
marks = Path(sys.argv[1])
engine_mod.why_unavailable = lambda: None
engine_mod.start = lambda log=print: "engine"
engine_mod.stop = lambda engine, log=print: (marks / "stopped").write_text(engine)
def build(engine, log=print):
    (marks / "building").write_text("")
    time.sleep(60)  # (the image builds: minutes on a real engine)
images.build_project_images = build
sys.exit(demo.main([]))
"""


def test_sigterm_stops_the_demos_own_engine(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "DOCKER_HOST"}
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(tmp_path)], env=env,
                            cwd=Path(__file__).parents[2], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "building").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read().decode()
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (tmp_path / "stopped").read_text() == "engine"
