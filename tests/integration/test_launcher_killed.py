"""A launcher killed by SIGKILL, and the next `elastic-jax run` of the same job (real processes, real signals).

The launcher's children get SIGTERM when it dies (`PR_SET_PDEATHSIG`), and the controller checkpoints on
SIGTERM on its way out. Its locks used to die with the launcher alone, so a run started at once (a user
re-running after a crash) started a second controller that restored an older step while the first was
still writing its last checkpoint into the same folder.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import psutil
import yaml

from tests.integration.test_faults import _committed_steps, _logged_step, _ready_pids, _wait_for
from tests.support.runs import CLI, ROOT, job_manifest, leftover_processes


def _start(job: Path, tmp_path: Path, name: str) -> tuple[subprocess.Popen, Path, Path]:
    """`elastic-jax run` in its own session, stdout and stderr to files (read while it runs)."""
    out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen([CLI, "run", str(job), "--workdir", str(tmp_path / "run"), "--no-failure"],
                                stdout=o, stderr=e, stdin=subprocess.DEVNULL, cwd=tmp_path, start_new_session=True,
                                env={**os.environ, "PYTHONPATH": str(ROOT)})
    return proc, out, err


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_the_next_run_waits_for_a_killed_launchers_controller_and_resumes_its_last_checkpoint(tmp_path):
    """Run 1's controller is frozen (SIGSTOP, so its way out takes as long as the test wants) and its
    launcher SIGKILLed; run 2 of the same job must say it waits, start no controller while the first one
    lives, and once that one has checkpointed and exited, resume from its checkpoint. A Ctrl-C (SIGINT)
    then ends run 2 with its SUMMARY (the trial's intermittent "no SUMMARY")."""
    m = job_manifest("killedlauncher", tmp_path, training={"steps": 100000, "globalBatchSize": 8, "logEverySteps": 10},
                     checkpoint={"uri": str(tmp_path / "ckpt"), "intervalSteps": 100000})  # only stops save
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(m))
    run1, run2 = None, None
    first = None
    try:
        run1, _, _ = _start(job, tmp_path, "run1")
        _wait_for(lambda: _logged_step(tmp_path / "run" / "controller.log") >= 50, "run 1 at step 50", 300)
        [first] = _ready_pids(tmp_path / "run")
        os.kill(first, signal.SIGSTOP)
        os.kill(run1.pid, signal.SIGKILL)
        run1.wait(timeout=30)
        assert _committed_steps(tmp_path / "ckpt") == []  # (nothing saved yet: the stop's save comes next)

        run2_at = time.time()
        run2, out2, err2 = _start(job, tmp_path, "run2")
        _wait_for(lambda: "waiting up to" in err2.read_text(), "run 2 saying it waits", 120)
        assert f"launcher pid {run1.pid}" in err2.read_text(), err2.read_text()
        time.sleep(3)
        # the frozen controller still holds the job: run 2 started nothing (run 1's workers may still be
        # on their way out)
        assert run2.poll() is None and _alive(first)
        started = [p for p in leftover_processes(str(tmp_path)) if p.pid != run2.pid and p.create_time() >= run2_at]
        assert started == [], [p.cmdline() for p in started]

        os.kill(first, signal.SIGCONT)  # its pending SIGTERM: it checkpoints the step reached and exits
        _wait_for(lambda: not _alive(first), "run 1's controller to exit", 120)
        saved = _committed_steps(tmp_path / "ckpt")
        assert saved and saved[-1] >= 50, saved
        _wait_for(lambda: len(_ready_pids(tmp_path / "run")) == 1 and _ready_pids(tmp_path / "run")[0] != first,
                  "run 2's controller", 300)
        _wait_for(lambda: _logged_step(tmp_path / "run" / "controller.log") >= saved[-1] + 20,
                  "run 2 training past the resumed step", 300)
        run2.send_signal(signal.SIGINT)
        assert run2.wait(timeout=120) == 130, err2.read_text()[-3000:]
        last = out2.read_text().strip().splitlines()[-1]
        assert last.startswith("SUMMARY "), (last, err2.read_text()[-3000:])
        summary = yaml.safe_load(last[len("SUMMARY "):])
        assert summary["interrupted"] and summary["restored_from_step"] == saved[-1], summary
    finally:
        if first is not None and _alive(first):
            os.kill(first, signal.SIGCONT)
        for proc in (run1, run2):
            if proc is not None and proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        left = leftover_processes(str(tmp_path))
        for p in left:
            p.kill()
    assert not left, f"processes left running: {[p.pid for p in left]}"
