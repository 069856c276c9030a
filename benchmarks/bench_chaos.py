"""Chaos benchmark: goodput when a worker dies every 15 s (issue 12, items 1 and 2), locally and on the local cluster.

Side by side in one run, same job (the built-in LM, 2 slices, checkpoint
every `--ckpt-interval` steps), alternating arms, repeated `--repeats` times;
every arm draws its victims from its own ``random.Random(--seed)`` (seeded
alike for every arm of a repeat), so the arms meet the same schedule:

* (a) ``none``: no failure; the reference time to N steps and final loss.
* (b) ``elastic``: ``elastic-jax run`` with replica resize (minSlices 1); every
  `--period` seconds from the job's first completed step a worker process of a slice drawn
  at random (among slices whose worker is alive) is
  SIGKILLed by this script, as a hardware loss would. The launcher replaces
  the worker, the controller carries on with one slice and scales back up.
* (d) ``spare``: as (b) with one hot spare slice (``spec.slices.spares: 1``);
  the victim is drawn among the slices training at that moment (killing
  the idle spare would cost nothing).
* (c) ``restart``: what a synchronous job does. On the same schedule the
  launcher, controller and workers are all SIGKILLed (a crash, not a stop:
  the launcher is frozen first so the controller gets no SIGTERM and cannot
  checkpoint on the way out) and the job is started again, restoring its
  latest committed Orbax checkpoint. The schedule does not wait for the
  restart: a restart slower than `--period` is killed before its first step
  (counted as unrecovered), and the arm fails after 1800 s.

Per arm: wall seconds to N steps (from starting ``elastic-jax run`` to its
exit), the seconds from its first completed step to its last (``train s``:
the schedule starts at the first step, and the start-up before it, the same
work in every arm, varies by seconds on 2 shared cores; a full restart's later
start-ups are inside it), each as a ratio to the arm's no-failure reference, goodput, steps lost, failures injected, recovery seconds (median /
p95 / max; elastic: from the SIGKILL to the first step completed after the
controller logged the slice loss; restart: from the SIGKILL to the restarted
job's first step), final loss, and the ratios (b)/(a), (c)/(a). A restart
arm's steps lost are the steps re-done: per restart, the steps completed
before it beyond the checkpoint step the restarted job restored.

Goodput here = N x (arm (a)'s median seconds per step) / the arm's wall
seconds: the fraction of the time spent on steps a failure-free run would
also have spent. Steps at reduced capacity count as productive (on this
machine both slices share 2 cores, so a step on one slice is not slower).

Also per arm: steps that ran on fewer than 2 slices (from the controllers'
per-step log lines), and per failure (from one kill to the next; median/max
printed for the elastic and spare arms), and the load average at the arm's end.
`--keep DIR` keeps every arm's logs (controller, workers; cluster arms: every controller's, the operator's) under DIR.

Cluster arms (the operator path, `e2e/chaos.py`): the same job as an
ElasticTrainingJob through the operator (a least-privilege process) on the
local control plane (`e2e.harness`; started for the run unless one is up,
and stopped after), the controller and workers pods of the node agent, the
workers on a pool of four one-worker nodes added for the run. Every failing
cluster arm gets the same ticks: every `--period` seconds from the first step
a training slice's worker drawn at random; at tick `--node-loss-tick` that
worker's node lost instead (`LocalCluster.fail_node`, out-of-service taint;
restored `--node-down` s later); the operator SIGKILLed half a period after
tick `--operator-kill-tick` and restarted `--operator-down` s later; no tick
once the job has logged its last step. `--cluster-unit step` counts
`--period` in the job's step number instead, so two runs under different
loads inject the same failures at the same steps.

* ``cluster-none``: no failure; the reference for the cluster arms.
* ``cluster`` (b): each tick's worker process SIGKILLed (or its node lost);
  its JobSet replaces it, the controller carries on with one slice.
* ``cluster-spare`` (d): as ``cluster`` with one hot spare slice (a third
  worker JobSet, kept out of the mesh); steps below 2 slices per failure as
  for ``spare``.
* ``cluster-restart`` (c): what a synchronous job does: at each tick the
  controller's process is SIGKILLed first (no SIGTERM: nothing saved on the
  way out), then the drawn worker (or its node), then every other worker;
  the operator recreates the controller pod, which restores the latest
  committed checkpoint, and the JobSets replace the workers. Steps lost are
  the steps re-done and recoveries run from the kill to the first step of
  the recreated controller, as for ``restart``. The operator's controller
  restart back-off (`elastic_jax/supervision/backoff.py`: the kubelet's
  CrashLoopBackOff, 10 s doubling to 300 s, reset once a controller trains a
  step) applies: in seconds, a restart slower than `--period` is killed
  again before it trains, each such loss waits longer, and the arm reaches
  its 1800 s bound; it then ends, not finished (the job deleted), and its
  ratio is a lower bound. With `--cluster-unit step` each tick needs a step
  number the job has not reached since the last restart, so every restarted
  controller trains between ticks (no back-off unless the operator had not
  seen that step yet: the arm reports the ControllerBackOff Events) and the
  arm measures the cost of each restart under the same failures as ``cluster``.

Every cluster arm keeps its checkpoints in `gs://` (a bucket per arm on one
fake-gcs-server on loopback that this run starts; `e2e.chaos.GcsCheckpoints`):
a local `spec.checkpoint.uri` is the controller pod's own emptyDir, gone with
the pod, and the same store for every arm keeps the ratios like for like.
The job's workers share a compilation cache (`spec.compilationCache` on a
claim the arm makes, as an admin would: `e2e.chaos.cache_claim`), so a
replaced worker pod loads its step program instead of compiling it again;
`--no-compilation-cache` measures without it.

Their time to N is from `kubectl apply` to the job's `Succeeded` in status;
ratio = arm / cluster-none; steps lost (elastic arms) and final loss from
the last controller's run summary (its `finished` log record).

Targets (issue 12): elastic time-to-N within 1.05x of no failures, 0 steps
lost, final loss identical to (a); with one spare, at most one step per
failure below the desired slice count; cluster arm within 1.15x of
cluster-none, 0 steps lost, final loss identical.

Usage:
  .venv/bin/python benchmarks/bench_chaos.py [--steps 600] [--period 15] [--repeats 1] [--seed 0] [--keep DIR]
      [--arms none,elastic,spare,restart,cluster,cluster-spare,cluster-restart]
      (cluster arms: root, E2E_BUILD_DIR with the Go binaries) [--cluster-unit step] [--no-compilation-cache]

Prints a table, then one ``BENCH {...}`` JSON line.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from bench_recovery import CLI, EVENT_RE, RESTORE_RE, _pids_under, crash, step_times

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SUMMARY_PREFIX = "SUMMARY "
# A full-restart arm that makes no progress (restart slower than the failure period) must still end.
MAX_ARM_SECONDS = 1800.0


def manifest(workdir: Path, steps: int, ckpt_interval: int, spares: int = 0) -> Path:
    """The benchmark job: 2 slices (+ `spares`), replica resize down to 1, checkpoint every `ckpt_interval` steps."""
    job = {
        "apiVersion": "elasticjax.dev/v1alpha1",
        "kind": "ElasticTrainingJob",
        "metadata": {"name": "bench-chaos"},
        "spec": {
            "slices": {"count": 2, "minSlices": 1, "spares": spares},
            "training": {"steps": steps, "globalBatchSize": 24, "logEverySteps": 1},
            "checkpoint": {"uri": str(workdir / "ckpt"), "intervalSteps": ckpt_interval, "maxToKeep": 2},
            "elasticity": {"stepDeadlineSeconds": 30, "maxRestarts": 1000, "maxRestartsPerSlice": 1000},
        },
    }
    path = workdir / "job.yaml"
    path.write_text(yaml.safe_dump(job))
    return path


def _summary(stdout: str) -> dict | None:
    lines = [ln for ln in stdout.splitlines() if ln.startswith(SUMMARY_PREFIX)]
    return json.loads(lines[-1].removeprefix(SUMMARY_PREFIX)) if lines else None


def _start(path: Path, run_dir: Path, out: Path) -> subprocess.Popen:
    # Own session: the restart arm freezes and kills the whole group.
    with open(out, "wb") as f:
        return subprocess.Popen([CLI, "run", str(path), "--workdir", str(run_dir), "--no-failure"], stdout=f,
                                stderr=subprocess.STDOUT, cwd=path.parent, start_new_session=True)


def _worker_pids(run_dir: Path) -> dict[int, int]:
    """{slice index: pid} of the live worker processes of one run."""
    import psutil

    found = {}
    for pid in _pids_under(run_dir):
        try:
            argv = psutil.Process(pid).cmdline()
        except psutil.Error:
            continue
        if any(a.endswith("elastic-jax-worker") for a in argv) and "--slice-index" in argv:
            found[int(argv[argv.index("--slice-index") + 1])] = pid
    return found


def _step_events(log: Path) -> list[dict]:
    """The controller's per-step log events (logEverySteps 1: one per step)."""
    from elastic_jax.logs import read_events

    return [e for e in read_events(log.read_text()) if e.get("event") == "step"] if log.exists() else []


def _train_s(logs: list[Path]) -> float:
    """Seconds from the first completed step to the last one, over one arm's controller logs in order.

    The failure schedule starts at the first completed step, so what comes before it (process start-up,
    imports, the first compile: the same work in every arm, and its noise on 2 shared cores is seconds)
    is left out; a full restart's later start-ups fall inside it and count.
    """
    times = [t for log in logs if log.exists() for t, _ in step_times(log)]
    return times[-1] - times[0] if len(times) > 1 else float("nan")


def _reduced_steps(log: Path, count: int = 2) -> int:
    """Steps completed on fewer than `count` slices."""
    return sum(1 for e in _step_events(log) if len(e.get("active_slices", [])) < count)


def _reduced_per_failure(log: Path, kills: list[float], count: int = 2) -> list[int]:
    """Per injected failure: steps completed on fewer than `count` slices from that kill to the next one.

    The warm-spare target (issue 12 item 2): with one spare, at most 1 each.
    """
    events = _step_events(log)
    out = []
    for k, t in enumerate(kills):
        until = kills[k + 1] if k + 1 < len(kills) else float("inf")
        out.append(sum(1 for e in events if t <= float(e.get("ts", 0)) < until
                       and len(e.get("active_slices", [])) < count))
    return out


def _recoveries_elastic(log: Path, kills: list[float]) -> list[float]:
    """Seconds from each kill to the first step completed after the controller logged the loss.

    A kill the controller logged no loss for before the next kill (a worker
    killed between attempts, while the controller was already recovering)
    has no recovery of its own and is left out.
    """
    text = log.read_text()
    events = sorted(float(ts) for ts, _ in EVENT_RE.findall(text))
    steps = step_times(log)
    out = []
    for k, t in enumerate(kills):
        until = kills[k + 1] if k + 1 < len(kills) else float("inf")
        handled = next((e for e in events if t <= e < until), None)
        after = next((ts for ts, _ in steps if handled is not None and ts > handled), None)
        if after is not None:
            out.append(after - t)
    return out


def _restart_costs(logs: list[Path], kills: list[float]) -> tuple[int, list[float], int]:
    """What the kills of a full-restart arm cost, read from its controllers' logs.

    Args:
      logs: one controller log per start of the job, in the order they ran (a missing file: it logged nothing).
      kills: the times everything was SIGKILLed, in order.

    Returns:
      (steps lost, recoveries, kills unrecovered): steps lost sums, over each restart, the steps the job had
      completed beyond the checkpoint step the restarted controller restored (re-done work; a controller that
      neither restored nor trained before it was killed moved nothing); a recovery is the seconds from a kill
      to the first step completed after it by any controller; a kill followed by the next one before any step
      completed has none and counts as unrecovered.
    """
    lost, reached, step_ts = 0, None, []
    for log in logs:
        done = step_times(log) if log.exists() else []
        restored = RESTORE_RE.search(log.read_text(errors="replace")) if log.exists() else None
        if not done and restored is None:
            continue
        start = int(restored.group(1)) if restored else 0
        if reached is not None:
            lost += max(0, reached - start)
        reached = done[-1][1] if done else start
        step_ts += [ts for ts, _ in done]
    step_ts.sort()
    recoveries, unrecovered = [], 0
    for k, t in enumerate(kills):
        until = kills[k + 1] if k + 1 < len(kills) else float("inf")
        first = next((ts for ts in step_ts if ts > t), None)
        if first is not None and first < until:
            recoveries.append(first - t)
        else:
            unrecovered += 1
    return lost, recoveries, unrecovered


def run_none(workdir: Path, args) -> dict:
    """Arm (a): no failure."""
    path = manifest(workdir, args.steps, args.ckpt_interval)
    t0 = time.time()
    out = subprocess.run([CLI, "run", str(path), "--workdir", str(workdir / "run"), "--no-failure"],
                         capture_output=True, text=True, cwd=workdir, timeout=MAX_ARM_SECONDS)
    wall = time.time() - t0
    s = _summary(out.stdout) or {}
    steps = step_times(workdir / "run" / "controller.log")
    per_step = statistics.median(b[0] - a[0] for a, b in zip(steps, steps[1:])) if len(steps) > 1 else float("nan")
    return {"wall_s": wall, "train_s": _train_s([workdir / "run" / "controller.log"]),
            "succeeded": s.get("succeeded", False), "final_loss": s.get("final_loss"),
            "steps_lost": s.get("steps_lost", 0), "failures": 0, "recoveries_s": [], "step_s": per_step,
            "reduced_steps": _reduced_steps(workdir / "run" / "controller.log"), "load_avg": os.getloadavg()}


def run_elastic(workdir: Path, args, rng: random.Random, spares: int = 0) -> dict:
    """Arm (b) (`spares` 0) or (d): a random training slice's worker SIGKILLed every `period` seconds."""
    path = manifest(workdir, args.steps, args.ckpt_interval, spares)
    run_dir = workdir / "run"
    t0 = time.time()
    proc = _start(path, run_dir, workdir / "stdout")
    kills: list[float] = []
    next_kill = None  # the schedule starts at the first completed step: start-up is the same in every arm
    try:
        while proc.poll() is None:
            if next_kill is None:
                first = step_times(run_dir / "controller.log") if (run_dir / "controller.log").exists() else []
                next_kill = first[0][0] + args.period if first else None
            if time.time() - t0 > MAX_ARM_SECONDS:
                raise RuntimeError("elastic arm did not finish")
            if next_kill is not None and time.time() >= next_kill:
                alive = _worker_pids(run_dir)
                steps = _step_events(run_dir / "controller.log")
                training = set(steps[-1].get("active_slices", [])) if steps else set()
                if training & set(alive):
                    alive = {i: p for i, p in alive.items() if i in training}
                if alive:
                    victim = rng.choice(sorted(alive))
                    try:
                        os.kill(alive[victim], signal.SIGKILL)
                        kills.append(time.time())
                    except ProcessLookupError:
                        pass
                next_kill += args.period
            time.sleep(0.05)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(60)
    wall = time.time() - t0
    s = _summary((workdir / "stdout").read_text()) or {}
    return {"wall_s": wall, "train_s": _train_s([run_dir / "controller.log"]), "succeeded": s.get("succeeded", False),
            "failure_reason": s.get("failure_reason"),
            "final_loss": s.get("final_loss"), "steps_lost": s.get("steps_lost", 0), "failures": len(kills),
            "recoveries_s": _recoveries_elastic(run_dir / "controller.log", kills),
            "reduced_steps": _reduced_steps(run_dir / "controller.log"),
            "reduced_per_failure": _reduced_per_failure(run_dir / "controller.log", kills),
            "load_avg": os.getloadavg()}


def run_restart(workdir: Path, args) -> dict:
    """Arm (c): everything SIGKILLed every `period` seconds and started again from the latest checkpoint."""
    path = manifest(workdir, args.steps, args.ckpt_interval)
    t0 = time.time()
    kills: list[float] = []
    attempt = 0  # run-<attempt> is the attempt now running
    next_kill = float("inf")  # set at the first completed step, as in the elastic arms
    summary: dict | None = None
    while summary is None:
        if time.time() - t0 > MAX_ARM_SECONDS:
            raise RuntimeError("full-restart arm did not finish")
        run_dir = workdir / f"run-{attempt}"
        proc = _start(path, run_dir, workdir / f"stdout-{attempt}")
        while proc.poll() is None and time.time() < next_kill:
            if next_kill == float("inf") and (run_dir / "controller.log").exists():
                first = step_times(run_dir / "controller.log")
                if first:
                    next_kill = first[0][0] + args.period
            time.sleep(0.05)
        done = step_times(run_dir / "controller.log") if (run_dir / "controller.log").exists() else []
        if proc.poll() is None and done and done[-1][1] >= args.steps:
            # No failure after the last step (as on the cluster arms): a crash between the final save and
            # the summary left the next attempt "already finished", with no final loss to compare.
            proc.wait(MAX_ARM_SECONDS)
            next_kill = float("inf")
        if proc.poll() is None:
            kills.append(time.time())
            crash(proc, run_dir)
            next_kill += args.period
            attempt += 1
        else:
            summary = _summary((workdir / f"stdout-{attempt}").read_text()) or {}
    wall = time.time() - t0
    logs = [workdir / f"run-{k}" / "controller.log" for k in range(attempt + 1)]
    lost, recoveries, unrecovered = _restart_costs(logs, kills)
    return {"wall_s": wall, "train_s": _train_s(logs), "succeeded": bool(summary and summary.get("succeeded")),
            "final_loss": summary.get("final_loss") if summary else None, "steps_lost": lost,
            "failures": len(kills), "recoveries_s": recoveries, "unrecovered": unrecovered,
            "reduced_steps": sum(_reduced_steps(log) for log in logs if log.exists()), "load_avg": os.getloadavg()}


# The cluster arms: what each injects (e2e/chaos.py `Plan`) and how many hot spare slices its job has.
CLUSTER_ARMS = {"cluster-none": (False, False, 0), "cluster": (True, False, 0), "cluster-spare": (True, False, 1),
                "cluster-restart": (True, True, 0)}  # arm: (failures, whole job, spares)


def run_cluster(cluster_ctx, workdir: Path, args, rng: random.Random, arm: str) -> dict:
    """A cluster arm (`CLUSTER_ARMS`): the job through the operator (e2e/chaos.py), its checkpoints in `gs://`."""
    from e2e.chaos import Plan, run_arm

    cluster, kubeconfig, checkpoints = cluster_ctx()
    chaos, whole_job, spares = CLUSTER_ARMS[arm]
    plan = Plan(every=args.period, unit=args.cluster_unit, node_loss_tick=args.node_loss_tick,
                operator_kill_tick=args.operator_kill_tick, node_down_s=args.node_down,
                operator_down_s=args.operator_down, whole_job=whole_job) if chaos else Plan()
    run = run_arm(cluster, kubeconfig, workdir, args.steps, plan, rng, ckpt_interval=args.ckpt_interval,
                  timeout_s=MAX_ARM_SECONDS, compilation_cache=not args.no_compilation_cache, spares=spares,
                  checkpoints=checkpoints)
    logs = [log for log in run.controller_logs if log.exists()]
    log = logs[-1] if logs else None
    losses = run.kills("pod", "node")
    steps = step_times(log) if log is not None else []
    per_step = statistics.median(b[0] - a[0] for a, b in zip(steps, steps[1:])) if len(steps) > 1 else float("nan")
    if whole_job:
        lost, recoveries, unrecovered = _restart_costs(run.controller_logs, losses)
        reduced_per_failure: list[int] = []
    else:
        lost, unrecovered = run.finished.get("steps_lost", 0), 0
        recoveries = _recoveries_elastic(log, losses) if log is not None else []
        reduced_per_failure = _reduced_per_failure(log, losses) if log is not None else []
    reason = (f"not finished within {MAX_ARM_SECONDS:.0f} s (at step {run.status.get('step')})" if run.timed_out
              else run.status.get("message"))
    return {"wall_s": run.wall_s, "train_s": _train_s(list(run.controller_logs)),
            "succeeded": run.phase == "Succeeded", "failure_reason": reason,
            "timed_out": run.timed_out, "final_loss": run.finished.get("final_loss"), "steps_lost": lost,
            "status_steps_lost": run.status.get("stepsLost"), "failures": len(run.failures),
            "failure_kinds": [k for _, k, _ in run.failures], "failure_log": run.failures,  # (unix time, kind, what)
            "controller_restarts": int(run.status.get("controllerRestarts") or 0),
            "controller_backoffs": run.controller_backoffs, "recoveries_s": recoveries, "unrecovered": unrecovered,
            "step_s": per_step, "reduced_steps": sum(_reduced_steps(x) for x in logs),
            "reduced_per_failure": reduced_per_failure,
            "status_goodput": (run.status.get("goodput") or {}).get("fraction"),
            # (GCS clients that looked for cloud credentials instead of the emulator, this run so far: 0 expected)
            "gcs_metadata_connections": checkpoints.emulator.metadata_connections, "load_avg": os.getloadavg()}


@contextlib.contextmanager
def _cluster(workdir: Path):
    """A callable giving (local cluster, operator kubeconfig, `e2e.chaos.GcsCheckpoints`), set up at its first call
    (the pool of e2e/chaos.py added, the CRD installed, a fake-gcs-server on loopback started: every cluster arm
    keeps its checkpoints in `gs://`, like for like, since the restart arm needs them to outlive the controller
    pod); torn down on exit, the cluster stopped if this run started it."""
    stack = contextlib.ExitStack()
    made: list = []

    def get():
        if not made:
            from e2e.chaos import chaos_nodes, gcs_checkpoints, setup
            from e2e.harness.cluster import LocalCluster

            cluster = LocalCluster()
            if not cluster.is_running():
                cluster.start()
                stack.callback(cluster.stop)
            stack.enter_context(chaos_nodes(cluster))
            checkpoints = stack.enter_context(gcs_checkpoints(workdir / "fake-gcs"))
            made.extend([cluster, setup(cluster, workdir), checkpoints])
        return made[0], made[1], made[2]
    with stack:
        yield get


def _pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, math.ceil(q * len(xs)) - 1)]


ARMS = ("none", "elastic", "spare", "restart", *CLUSTER_ARMS)


def _check_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Ends with a usage error naming the flag (exit 2) for an arm that does not exist (it was dropped
    silently) or a count or time out of range (0 repeats ended in a StatisticsError traceback)."""
    unknown = [a for a in args.arms.split(",") if a not in ARMS]
    if unknown:
        parser.error(f"--arms: unknown arm {', '.join(map(repr, unknown))} (one of {', '.join(ARMS)})")
    for flag, value, least in (("--steps", args.steps, 1), ("--repeats", args.repeats, 1),
                               ("--ckpt-interval", args.ckpt_interval, 1), ("--node-loss-tick", args.node_loss_tick, 0),
                               ("--operator-kill-tick", args.operator_kill_tick, 0)):  # (ticks count from 0)
        if value < least:
            parser.error(f"{flag}: {value} is below {least}")
    for flag, value in (("--period", args.period), ("--node-down", args.node_down),
                        ("--operator-down", args.operator_down)):
        if not (math.isfinite(value) and value > 0):
            parser.error(f"{flag}: {value} is not a number of seconds > 0")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=600, help="N: steps of the job")
    parser.add_argument("--period", type=float, default=15.0, help="seconds between injected failures")
    parser.add_argument("--ckpt-interval", type=int, default=50, help="checkpoint every this many steps")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--arms", default="none,elastic,spare,restart",
                        help=f"comma-separated subset of {','.join(ARMS)} (none always runs; each cluster arm "
                             "brings cluster-none)")
    parser.add_argument("--node-loss-tick", type=int, default=2,
                        help="failing cluster arms: the failure that is a node loss")
    parser.add_argument("--operator-kill-tick", type=int, default=3,
                        help="failing cluster arms: the operator is killed half a period after this failure")
    parser.add_argument("--node-down", type=float, default=20.0,
                        help="failing cluster arms: seconds before the node is back")
    parser.add_argument("--operator-down", type=float, default=5.0,
                        help="failing cluster arms: seconds before the operator is restarted")
    parser.add_argument("--cluster-unit", choices=("s", "step"), default="s",
                        help="cluster arms: --period in seconds (default) or in completed steps (the same failures "
                             "at the same steps whatever the machine's load; the job's step number, so a restart "
                             "arm's re-done steps do not move it)")
    parser.add_argument("--no-compilation-cache", action="store_true",
                        help="cluster arms: no spec.compilationCache (replaced worker pods compile again; the "
                             "measurement before the shared cache)")
    parser.add_argument("--keep", type=Path, help="write the arms' logs under this directory (kept) instead of a temporary one")
    args = parser.parse_args()
    _check_args(parser, args)
    chosen = {"none", *args.arms.split(",")}
    if chosen & set(CLUSTER_ARMS):
        chosen.add("cluster-none")
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
    with (tempfile.TemporaryDirectory(prefix="bench-chaos-") if args.keep is None else contextlib.nullcontext(args.keep)) as tmp, \
            _cluster(Path(tmp)) as cluster_ctx:
        arms = {"none": lambda wd, rng: run_none(wd, args), "elastic": lambda wd, rng: run_elastic(wd, args, rng),
                "spare": lambda wd, rng: run_elastic(wd, args, rng, spares=1),
                "restart": lambda wd, rng: run_restart(wd, args),
                **{arm: (lambda wd, rng, arm=arm: run_cluster(cluster_ctx, wd, args, rng, arm)) for arm in CLUSTER_ARMS}}
        arms = {k: v for k, v in arms.items() if k in chosen}
        results: dict[str, list[dict]] = {arm: [] for arm in arms}
        for r in range(args.repeats):
            for arm, run in arms.items():
                wd = Path(tmp) / f"{arm}-{r}"
                wd.mkdir()
                res = run(wd, random.Random(args.seed + r))  # the same draws in every arm of a repeat
                results[arm].append(res)
                print(f"  {arm:12s} run {r}: {res['wall_s']:7.1f} s, {res['failures']} failures, "
                      f"{res['steps_lost']} steps lost, final loss {res['final_loss']}, "
                      f"load average {' '.join(f'{x:.1f}' for x in res['load_avg'])}"
                      + ("" if res["succeeded"] else f", FAILED: {res.get('failure_reason')}"), flush=True)
    rows = {}
    for arm, runs in results.items():
        ref = "cluster-none" if arm.startswith("cluster") else "none"  # each arm against its own no-failure arm
        base_wall = statistics.median(x["wall_s"] for x in results[ref])
        step_s = statistics.median(x["step_s"] for x in results[ref])
        base_loss = results[ref][0]["final_loss"]
        wall = statistics.median(x["wall_s"] for x in runs)
        base_train = statistics.median(x["train_s"] for x in results[ref])
        train = statistics.median(x["train_s"] for x in runs)
        rec = [s for x in runs for s in x["recoveries_s"]]
        rows[arm] = {
            "reference": ref, "wall_s": wall, "ratio": wall / base_wall, "goodput": args.steps * step_s / wall,
            "train_s": train, "train_ratio": train / base_train,
            "steps_lost": max(x["steps_lost"] for x in runs), "failures": sum(x["failures"] for x in runs),
            "recovery_median_s": statistics.median(rec) if rec else float("nan"),
            "recovery_p95_s": _pct(rec, 0.95), "recovery_max_s": max(rec) if rec else float("nan"),
            "final_loss": runs[-1]["final_loss"],
            "loss_matches_none": all(x["final_loss"] is not None and base_loss is not None
                                     and math.isclose(x["final_loss"], base_loss, rel_tol=1e-5) for x in runs),
            "succeeded": all(x["succeeded"] for x in runs),
            "reduced_steps": max(x["reduced_steps"] for x in runs),
            "reduced_per_failure": [n for x in runs for n in x.get("reduced_per_failure", [])],
        }
    print()
    print(f"{'arm':13s}{'time to N s':>12s}{'x ref':>7s}{'train s':>9s}{'x ref':>7s}{'goodput':>9s}{'lost':>6s}{'fails':>6s}"
          f"{'rec med':>8s}{'p95':>7s}{'max':>7s}{'<2 sl':>6s}  final loss (= ref's?)")
    for arm, row in rows.items():
        print(f"{arm:13s}{row['wall_s']:12.1f}{row['ratio']:7.2f}{row['train_s']:9.1f}{row['train_ratio']:7.2f}"
              f"{row['goodput']:9.2f}{row['steps_lost']:6d}"
              f"{row['failures']:6d}{row['recovery_median_s']:8.2f}{row['recovery_p95_s']:7.2f}"
              f"{row['recovery_max_s']:7.2f}{row['reduced_steps']:6d}  {row['final_loss']} ({row['loss_matches_none']}; "
              f"ref {row['reference']})")
    if "elastic" in rows:
        print(f"elastic/none {rows['elastic']['ratio']:.3f}, first step to last {rows['elastic']['train_ratio']:.3f} "
              "(target <= 1.05, 0 steps lost, same loss)")
    for arm in ("elastic", "spare", "cluster", "cluster-spare"):
        per = rows.get(arm, {}).get("reduced_per_failure")
        if per:
            print(f"{arm}: steps below 2 slices per failure: median {statistics.median(per):g}, max {max(per)} ({per})")
    if "spare" in rows:
        print(f"spare/none {rows['spare']['ratio']:.3f} ({rows['spare']['reduced_steps']} steps on 1 slice for "
              f"{rows['spare']['failures']} failures; target <= 1 per failure)")
    if "restart" in rows:
        print(f"restart/none {rows['restart']['ratio']:.3f} (full restart: {rows['restart']['steps_lost']} steps "
              f"re-done; {sum(x['unrecovered'] for x in results['restart'])} kills came before the restarted job's "
              "first step)")
    targets = {"cluster": "target <= 1.15, 0 steps lost, same loss", "cluster-spare": "target: <= 1 step below 2 "
               "slices per failure", "cluster-restart": "full restart: everything SIGKILLed at each failure"}
    for arm in (a for a in targets if a in rows):
        runs = results[arm]
        kinds = [k for x in runs for k in x["failure_kinds"]]
        print(f"{arm}/cluster-none {rows[arm]['ratio']:.3f}, first step to last {rows[arm]['train_ratio']:.3f}" + (" (a lower bound: timed out)" if any(
              x["timed_out"] for x in runs) else "") + f" ({targets[arm]}; {kinds.count('pod')} worker kills, "
              f"{kinds.count('node')} node loss, {kinds.count('operator')} operator kill; controller restarts "
              f"{max(x['controller_restarts'] for x in runs)}, back-offs {max(x['controller_backoffs'] for x in runs)}"
              + (f"; steps re-done {rows[arm]['steps_lost']} (operator's status.stepsLost "
                 f"{[x['status_steps_lost'] for x in runs]}), {sum(x['unrecovered'] for x in runs)} kills came "
                 "before the restarted job's first step" if arm == "cluster-restart" else "") + ")")
    print("BENCH " + json.dumps({"args": vars(args), "arms": rows, "runs": results}, default=str))


if __name__ == "__main__":
    sys.exit(main())
