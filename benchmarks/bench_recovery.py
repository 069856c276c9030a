"""Recovery benchmark: elastic recovery from a killed worker vs a full restart.

Side by side in one run, same job, same machine:

* elastic: a 2-slice job (replica resize, minSlices 1) runs under the local
  launcher; once it passes step K a worker is SIGKILLed. Measured: wall
  seconds from the SIGKILL to the first step completed after the controller
  handled the loss (the controller's per-step log lines), and the steps lost.
* full restart (what a synchronous job does today): the same job runs to
  step K, then the controller and every worker are SIGKILLed together; the
  job is started again from scratch, restores the latest committed Orbax
  checkpoint and runs its first step. Measured: wall seconds from the
  SIGKILL to that first completed step, and the steps lost (K minus the
  restored checkpoint step).

Each side runs `--repeats` times, alternating; medians are compared.
Target (issue 2): elastic at least 10x faster, zero steps lost.

Usage:
  .venv/bin/python benchmarks/bench_recovery.py [--repeats 3] [--kill-at 60]

Prints a table, then one `BENCH {...}` JSON line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

CLI = str(Path(sys.executable).parent / "elastic-jax")
STEP_RE = re.compile(r'"ts": ([0-9.]+),.*"event": "step", "step": (\d+)')
RESTORE_RE = re.compile(r"restored checkpoint step (\d+)")
EVENT_RE = re.compile(r'"ts": ([0-9.]+),.*elastic event at step (\d+): slice_down')


def manifest(workdir: Path, steps: int) -> Path:
    """The benchmark job: the built-in LM at its defaults, 2 slices, checkpoint every 50 steps."""
    job = {
        "apiVersion": "elasticjax.dev/v1alpha1",
        "kind": "ElasticTrainingJob",
        "metadata": {"name": "bench-recovery"},
        "spec": {
            "slices": {"count": 2, "minSlices": 1},
            "training": {"steps": steps, "globalBatchSize": 24, "logEverySteps": 1},
            "checkpoint": {"uri": str(workdir / "ckpt"), "intervalSteps": 50, "maxToKeep": 2},
            "elasticity": {"stepDeadlineSeconds": 30},
        },
    }
    path = workdir / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def step_times(log: Path) -> list[tuple[float, int]]:
    """(unix time, step) of every completed step in a controller log."""
    return [(float(ts), int(step)) for ts, step in STEP_RE.findall(log.read_text())]


def run_elastic(workdir: Path, kill_at: int, steps: int) -> dict:
    """One elastic run with a worker SIGKILLed after `kill_at` steps."""
    path = manifest(workdir, steps)
    out = subprocess.run([CLI, "run", str(path), "--workdir", str(workdir / "run"), "--kill-at-step", str(kill_at),
                          "--kill-slice", "1"], capture_output=True, text=True, cwd=workdir, timeout=900)
    summary = json.loads(out.stdout.strip().splitlines()[-1].removeprefix("SUMMARY "))
    kill = summary["injected_failure"]
    log = workdir / "run" / "controller.log"
    # A step already in flight may still complete after the kill; recovery ends
    # at the first step completed after the controller handled the loss.
    event_ts = float(EVENT_RE.search(log.read_text()).group(1))
    after = [(ts, s) for ts, s in step_times(log) if ts > event_ts]
    first_ts, first_step = after[0]
    return {"seconds": first_ts - kill["time"], "steps_lost": summary["steps_lost"], "first_step_after": first_step,
            "killed_at_step": kill["at_step"], "succeeded": summary["succeeded"]}


def _pids_under(workdir: Path) -> list[int]:
    """Every process the launcher started for this run (it marks them with ELASTIC_JAX_RUN_DIR)."""
    import psutil

    from elastic_jax.local.launcher import RUN_DIR_ENV

    pids = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.pid != os.getpid() and str(workdir) in p.environ().get(RUN_DIR_ENV, ""):
                pids.append(p.pid)
        except psutil.Error:
            pass
    return pids


def crash(proc: subprocess.Popen, workdir: Path) -> None:
    """SIGKILLs a run started in its own session, as a machine loss would.

    A crash, not a stop: the launcher's death would SIGTERM its children (PDEATHSIG) and the
    controller would checkpoint on the way out, losing nothing. So freeze the launcher,
    SIGKILL the controller and workers (their own sessions), then the launcher.
    """
    os.killpg(proc.pid, signal.SIGSTOP)
    for pid in _pids_under(workdir):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def run_full_restart(workdir: Path, kill_at: int, steps: int) -> dict:
    """Run to `kill_at`, SIGKILL everything, start again, time to the first step after restore."""
    path = manifest(workdir, steps)
    run1 = workdir / "run1"
    proc = subprocess.Popen([CLI, "run", str(path), "--workdir", str(run1), "--no-failure"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, cwd=workdir, start_new_session=True)
    log = run1 / "controller.log"
    while True:
        done = step_times(log) if log.exists() else []
        if done and done[-1][1] >= kill_at:
            break
        if proc.poll() is not None:
            raise RuntimeError("first run ended before the kill step")
        time.sleep(0.01)
    killed_step = step_times(log)[-1][1]
    t_kill = time.time()
    crash(proc, workdir)
    run2 = workdir / "run2"
    out = subprocess.run([CLI, "run", str(path), "--workdir", str(run2), "--no-failure"], capture_output=True, text=True,
                         cwd=workdir, timeout=900)
    left = _pids_under(workdir)
    if left:
        raise RuntimeError(f"processes left running after the full-restart run: {left}")
    log2 = (run2 / "controller.log").read_text()
    restored = int(RESTORE_RE.search(log2).group(1))
    first_ts, _ = step_times(run2 / "controller.log")[0]
    return {"seconds": first_ts - t_kill, "steps_lost": killed_step - restored, "restored_step": restored,
            "killed_at_step": killed_step, "succeeded": out.returncode == 0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--kill-at", type=int, default=80)
    parser.add_argument("--steps", type=int, default=150)
    args = parser.parse_args()
    elastic, full = [], []
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp:
        for r in range(args.repeats):
            for name, fn, acc in (("elastic", run_elastic, elastic), ("full", run_full_restart, full)):
                wd = Path(tmp) / f"{name}-{r}"
                wd.mkdir()
                res = fn(wd, args.kill_at, args.steps)
                acc.append(res)
                print(f"  {name:8s} run {r}: {res['seconds']:7.2f} s to next step, {res['steps_lost']} steps lost", flush=True)
    e = statistics.median(x["seconds"] for x in elastic)
    f = statistics.median(x["seconds"] for x in full)
    print()
    print(f"{'':24s}{'median s':>10s}{'steps lost (max)':>18s}")
    print(f"{'elastic (worker killed)':24s}{e:10.2f}{max(x['steps_lost'] for x in elastic):18d}")
    print(f"{'full restart':24s}{f:10.2f}{max(x['steps_lost'] for x in full):18d}")
    print(f"speed-up: {f / e:.1f}x (target >= 10x, 0 steps lost)")
    print("BENCH " + json.dumps({"elastic_median_s": e, "full_restart_median_s": f, "speedup": f / e,
                                 "elastic_steps_lost": [x["steps_lost"] for x in elastic],
                                 "full_restart_steps_lost": [x["steps_lost"] for x in full],
                                 "elastic": elastic, "full_restart": full}))


if __name__ == "__main__":
    main()
