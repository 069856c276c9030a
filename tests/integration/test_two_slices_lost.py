"""Two slices lost at once (their workers SIGKILLed together) on a job of 3 slices with a minimum of 2: the step
that fails names one of them; the other is found down while that loss waits for slices (its health check fails),
and the run pauses below its minimum. Every record of the run must say both slices went down and the pause:
the recovery record (the controller's status, SUMMARY), the history the timeline draws (the active slices dip
to the 1 up), the report. A trial found only the first slice and no pause anywhere but controller.log."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import yaml

from elastic_jax import timeline
from tests.support.runs import CLI, ROOT, CliRun, interrupt_when, job_manifest, leftover_processes, worker_pid

STEPS_BEFORE_KILL = 10  # on 3 slices: every worker is up and in the mesh
STEPS_AFTER_REJOIN = 5  # on 3 slices again: both replaced workers rejoined


def _history(run_dir) -> list[dict]:
    try:
        return timeline.read_history(run_dir)
    except timeline.TimelineError:  # (no step yet)
        return []


def _steps_on_3(run_dir) -> int:
    return sum(1 for r in _history(run_dir) if r["kind"] == "step" and r["active"] == 3)


def test_two_workers_killed_at_once_are_both_in_the_recovery_and_the_pause_is_recorded(tmp_path):
    manifest = job_manifest("twodown", tmp_path, slices={"count": 3, "minSlices": 2},
                            # (never reached: the run is stopped once both slices rejoined)
                            training={"steps": 100_000, "globalBatchSize": 12, "logEverySteps": 10})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    workdir = tmp_path / "run"
    proc = subprocess.Popen([CLI, "run", str(path), "--workdir", str(workdir), "--no-failure"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)
    try:
        while proc.poll() is None and _steps_on_3(workdir) < STEPS_BEFORE_KILL:
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        victims = [worker_pid(tmp_path, 1), worker_pid(tmp_path, 2)]
        for pid in victims:  # (back to back: both gone before the controller's next look)
            os.kill(pid, signal.SIGKILL)
        on_3_at_kill = _steps_on_3(workdir)

        def rejoined() -> bool:
            return _steps_on_3(workdir) >= on_3_at_kill + STEPS_AFTER_REJOIN + 1

        out, err = interrupt_when(proc, rejoined, str(tmp_path))
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        for p in leftover_processes(str(tmp_path)):
            p.kill()
    run = CliRun(proc.returncode, out, err, workdir)
    assert run.returncode == 130, run.stderr[-3000:]
    s = run.summary

    # The recovery record (the controller's books: its status's recoveryHistory, the SUMMARY): both slices.
    data = timeline.timeline_data(timeline.read_history(workdir))
    downs = [r for r in data.recoveries if r.cause == "slice_down"]
    assert sorted({i for r in downs for i in r.slices}) == [1, 2], data.recoveries
    assert s["slices_lost"] == 2, s
    # The pause below minSlices: in the history (1 of 3 slices up), the summary and the report.
    assert len(data.pauses) >= 1 and data.pauses[0].up == 1 and data.pauses[0].desired == 3, data.pauses
    assert data.pauses[0].t_end is not None and data.pauses[0].t_end > data.pauses[0].t
    assert data.pauses[0].at_step == downs[0].at_step
    assert s["paused_seconds"] > 0, s
    assert "2 slices lost" in run.stderr and "paused" in run.stderr, run.stderr[-2000:]
    # The active slices the picture draws dip to the 1 up while paused (not 3 until the next step on 2).
    t, _, _, active, _ = timeline.drawn_series(data)
    assert min(active) == 1 and active[:active.index(1)].count(3) >= STEPS_BEFORE_KILL
    assert "Traceback" not in run.stderr
