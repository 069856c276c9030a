"""The pathways backend on CPU devices: mesh over slices, resize, health check, snapshot recovery.

Runs in a child process with 4 CPU devices (2 fake slices of 2 chips); only
the device → slice mapping is substituted. Pathways itself needs TPUs.
"""

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parents[1]


def test_pathways_backend_on_cpu_devices(tmp_path):
    proc = subprocess.run([sys.executable, str(HERE / "pathways_child.py"), str(tmp_path)], capture_output=True, text=True,
                          timeout=600, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    r = json.loads(lines[-1][len("RESULT "):])
    assert r["two_slices_match"] and r["one_slice_match"]
    assert r["mesh_devices"] == 4
    assert r["healthy_before"] == [0, 1] and r["healthy_after"] == [0]
    assert r["slice_down_slices"] == [1] and r["slice1_state"] == "Down"
    assert r["succeeded"], r["failure"]
    assert r["steps"] == 40 and r["loss_down"]
    # Lost at step 25 (25 steps done); the host snapshot of step 20 was newer than any checkpoint.
    assert r["steps_lost"] == 5
    assert r["causes"][0] == "slice_down" and "scale_up" in r["causes"]
    # issue 10 item 3: a slice absent at start is waited for; the first step runs on both slices
    assert r["missing_at_start"] == [1]
    assert r["missing_run"]["succeeded"], r["missing_run"]["failure"]
    assert r["missing_run"]["steps"] == 5 and r["missing_run"]["first_active"] == [0, 1]
