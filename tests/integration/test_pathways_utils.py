"""pathways-utils' own elastic `Manager` (the real package, 0.1.13) fed by the operator's slice reports.

Runs in a child process with 4 CPU devices (2 fake slices of 2 chips), as
test_backend_pathways.py does; only the device -> slice mapping is substituted
(CPU devices have no `slice_index`, so pathways-utils' plain `Manager()` cannot
start on them, which the child also records).
"""

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
ROOT = HERE.parents[1]


def test_pathways_utils_manager_on_slice_reports(tmp_path):
    proc = subprocess.run([sys.executable, str(HERE / "pathways_utils_child.py")], capture_output=True, text=True,
                          timeout=600, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    r = json.loads(lines[-1][len("RESULT "):])
    # Replica resize: lost at step 10 (reported Down), on slice 0 alone, back at step 15, scaled up.
    assert r["initial_active"] == [0, 1]
    assert [a["active"] for a in r["resize_attempts"]] == [[0, 1], [0], [0, 1]]
    assert [a["at_step"] for a in r["resize_attempts"]] == [0, 10, 15]
    assert [a["devices"] for a in r["resize_attempts"]] == [4, 2, 4]
    assert r["resize_steps"] == 30 and r["resize_events"] == [[0, 1], [0]] and r["monitor_stopped"]
    # The returning slice came from the report: the monitor's poll interval is an hour, one check ran.
    assert r["seen_after_report"] == [1] and r["monitor_checks_for_report"] == 1
    # Pause and resume: the second attempt waited for the Ready report (generation 5), although
    # pathways-utils' own device probe finds both CPU "slices" healthy all along.
    assert r["pause_attempts"] == [{"active": [0, 1], "slice1_generation": 1},
                                   {"active": [0, 1], "slice1_generation": 5}]
    assert r["pause_result"] == [28.0, 4]
    # A slice reported Down is not active; errors name the argument.
    assert r["down_at_start_active"] == [0]
    assert r["bad_minimum"] == "minimum_slice_count 3: must be 1..2"
    assert r["timeout"].startswith("timed out waiting for 2 slices reported Ready")
    assert "slice indices [1] are not in 0..0" in r["bad_devices"]
    # pathways-utils' public wait_for_slices takes the checker as is; its default probe sees both.
    assert r["wait_with_checker"] == [0] and r["default_probe"] == [0, 1]
    assert r["pathways_utils_own_manager_on_cpu"].startswith("AttributeError")


def test_maxtexts_calls_on_the_plugged_manager_follow_the_operators_reports():
    """`elastic_jax.maxtext_plug` in MaxText's `elastic_manager` global, driven the way MaxText 0.2.5's
    elastic_utils drives it: built on first use, a Down report ends the attempt's slices, the retry runs on
    slice 0, and the replacement's Ready report is what `available_inactive_slices` (MaxText's scale-up
    check) shows."""
    proc = subprocess.run([sys.executable, str(HERE / "maxtext_plug_child.py")], capture_output=True, text=True,
                          timeout=600, cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    r = json.loads(lines[-1][len("RESULT "):])
    assert r["plugged"] and r["built_by"] == "SliceReportManager" and r["total_slice_count"] == 2
    assert r["attempts"] == [[0, 1], [0]] and len(r["events"]) == 1  # one elastic event, then the retry on slice 0
    assert r["scale_up_seen"] == [1] and r["result"] == "done"
