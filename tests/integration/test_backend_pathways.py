"""The pathways backend on CPU devices: mesh over slices, resize, health check, snapshot recovery, hot spares.

Runs in child processes with 4 CPU devices (2 fake slices of 2 chips), and 6 for
the spare (3 slices, one kept out of the mesh); only the device → slice mapping
is substituted. Pathways itself needs TPUs.
"""

import json
import subprocess
import sys
from pathlib import Path

from tests.support import compilation_cache

HERE = Path(__file__).parent
ROOT = HERE.parents[1]


def _child(script: str, tmp_path) -> dict:
    proc = subprocess.run([sys.executable, str(HERE / script), str(tmp_path)], capture_output=True, text=True,
                          timeout=600, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", **compilation_cache.child_env()})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_pathways_backend_on_cpu_devices(tmp_path):
    r = _child("pathways_child.py", tmp_path)
    assert r["two_slices_match"] and r["one_slice_match"]
    assert r["mesh_devices"] == 4
    assert r["healthy_before"] == [0, 1] and r["healthy_after"] == [0]
    assert r["slice_down_slices"] == [1] and r["slice1_state"] == "Down"
    assert r["succeeded"], r["failure"]
    assert r["steps"] == 40 and r["loss_down"]
    # Lost at step 25 (25 steps done): slice 0's replica of the state survived, so no step is redone
    # (issue 29 item 3; it restored the host snapshot of step 20 before, 5 steps lost).
    assert r["steps_lost"] == 0
    assert r["causes"][0] == "slice_down" and "scale_up" in r["causes"]
    # issue 10 item 3: a slice absent at start is waited for; the first step runs on both slices
    assert r["missing_at_start"] == [1]
    assert r["missing_run"]["succeeded"], r["missing_run"]["failure"]
    assert r["missing_run"]["steps"] == 5 and r["missing_run"]["first_active"] == [0, 1]


def test_a_hot_spare_takes_a_lost_slices_place_at_once_on_pathways(tmp_path):
    """Issue 12 item 2 on pathways: with one spare the mesh is never below `count` slices: slice 1 is lost
    at the 16th step; the next step trains on slices 0 and 2 (the spare, its devices already registered),
    from slice 0's replica of the state (copied to the spare's devices); slice 1, replaced by the operator,
    is the new spare."""
    r = _child("pathways_spare_child.py", tmp_path)
    assert r["succeeded"], r["failure"]
    assert r["steps"] == 30 and r["loss_down"]
    assert all(len(a) == 2 for a in r["actives"]), r["actives"]  # never on one slice
    assert r["actives"][0] == [0, 1] and r["actives"][15] == [0, 2], r["actives"]
    assert r["spares_seen"][0] == [2] and r["spares_seen"][15] == [], r["spares_seen"]
    assert r["spares_seen"][-1] == [1], r["spares_seen"]
    assert r["steps_lost"] == 0  # slice 0's replica is the state of the step before the loss
    assert r["causes"][0] == "slice_down"
