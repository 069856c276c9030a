"""Faults of issue 9 rebuilt with real parts: real controller and worker processes,
real signals, real Orbax checkpoints on disk.

Every test runs `elastic-jax run` as a user would and polls for conditions with
generous deadlines (the machine is shared and loaded); none asserts a duration.
Every process a test starts is stopped by the test, by PID.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import psutil
import yaml

from elastic_jax.local.launcher import RUN_DIR_ENV
from elastic_jax.logs import read_events
from tests.support.runs import CLI, ROOT, TINY_TRAINER, job_manifest, leftover_processes, run_cli

POLL_DEADLINE_S = 300


def _events(log: Path) -> list[dict]:
    return read_events(log.read_text()) if log.exists() else []


def _logged_step(log: Path) -> int:
    return max((e["step"] for e in _events(log) if e["event"] == "step"), default=0)


def _ready_pids(workdir: Path) -> list[int]:
    """PIDs of every controller that logged `ready`, in order."""
    return [int(e["pid"]) for e in _events(workdir / "controller.log") if e["event"] == "ready"]


def _wait_for(predicate, what: str, timeout_s: float = POLL_DEADLINE_S, interval_s: float = 0.05):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    raise AssertionError(f"timed out waiting for {what}")


def _worker_pid(run_dir: Path, slice_index: int) -> int | None:
    """PID of the live worker process of one slice of the run in `run_dir`."""
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = p.info["cmdline"] or []
            if (any(part.endswith("elastic-jax-worker") for part in cmd) and "--slice-index" in cmd
                    and cmd[cmd.index("--slice-index") + 1] == str(slice_index)
                    and p.environ().get(RUN_DIR_ENV) == str(run_dir.resolve())):
                return p.pid
        except (psutil.Error, IndexError):
            continue
    return None


def _committed_steps(ckpt: Path) -> list[int]:
    return sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit()) if ckpt.exists() else []


def _start_cli(manifest: dict, tmp_path: Path, *flags: str) -> subprocess.Popen:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return subprocess.Popen([CLI, "run", str(path), "--workdir", str(tmp_path / "run"), *flags],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)


def _summary(stdout: str) -> dict:
    last = stdout.strip().splitlines()[-1]
    assert last.startswith("SUMMARY "), last
    return json.loads(last.removeprefix("SUMMARY "))


def _run_beside(action, manifest: dict, tmp_path: Path, join_s: float, *flags: str):
    """`run_cli(manifest, tmp_path, *flags)` with `action()` on a thread beside it (a fault to inject),
    joined for up to `join_s` seconds after the run ends."""
    thread = threading.Thread(target=action, daemon=True)
    thread.start()
    try:
        return run_cli(manifest, tmp_path, *flags)
    finally:
        thread.join(timeout=join_s)


def _signal_first_controller(tmp_path: Path, sig: int, at_step: int, into: dict):
    """An action for `_run_beside`: `sig` to the run's first controller once it logged `at_step`; its PID is
    put in `into["pid"]` (or why not in `into["error"]`)."""
    def action():
        try:
            _wait_for(lambda: _logged_step(tmp_path / "run" / "controller.log") >= at_step, f"step {at_step}")
            pid = _ready_pids(tmp_path / "run")[0]
            os.kill(pid, sig)
            into["pid"] = pid
        except AssertionError as e:
            into["error"] = str(e)
    return action


def _continue(pid: int) -> None:
    """SIGCONT to `pid`, if it still exists (the run may have stopped it meanwhile)."""
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


# -- item 1: a signal to the controller is a controller loss, not the end of the job ----------------


def test_sigterm_to_the_controller_is_a_loss_it_checkpoints_restarts_and_resumes(tmp_path):
    """`kill -TERM <controller>` mid-run (node shutdown, preemption): checkpoint the step reached,
    exit RESTART, the launcher starts a new controller that resumes from that very step."""
    ckpt = tmp_path / "ckpt"
    # 200 steps (400 before): the signal at step >= 60 leaves as many steps after it as
    # test_steps_a_restarted_controller_redid_are_booked_recovering_not_productive's SIGKILL has
    m = job_manifest("ctrlterm", tmp_path, training={"steps": 200, "globalBatchSize": 8, "logEverySteps": 10},
                     checkpoint={"uri": str(ckpt), "intervalSteps": 1000})  # no periodic save: only the stop's
    signalled: dict = {}
    run = _run_beside(_signal_first_controller(tmp_path, signal.SIGTERM, 60, signalled), m, tmp_path, 10,
                      "--no-failure")
    assert "pid" in signalled, signalled
    assert run.returncode == 0, run.stderr[-3000:]
    s = run.summary
    assert s["succeeded"] and s["steps"] == 200
    assert s["controller_restarts"] == 1 and s["controller_pid_changed"]
    log = run.controller_log()
    events = read_events(log)
    finished = [e for e in events if e["event"] == "finished"]
    assert finished[0]["exit_code"] == 75 and finished[0]["stop"] == "signal", finished[0]
    # The first controller saved the step it had reached (not a periodic step: there was none).
    stopped_at = finished[0]["steps"]
    assert stopped_at >= 60 and finished[0]["last_committed_checkpoint_step"] == stopped_at
    assert s["restored_from_step"] == stopped_at
    assert "controller interrupted by SIGTERM" in finished[0]["failure_reason"]
    # A controller restart is not a slice recovery: the summary had `recovery_seconds: [null]` and counted
    # a recovery the progress line never showed. It says what happened instead.
    assert s["recoveries"] == 0 and s["recovery_seconds"] == [] and s["unfinished_recoveries"] == 0
    assert s["controller_losses"] == [{"cause": "interrupted", "exit_code": 75, "at_step": s["controller_losses"][0]["at_step"],
                                       "resumed_from_step": stopped_at, "steps_lost": 0}]
    assert 60 <= s["controller_losses"][0]["at_step"] <= stopped_at
    assert "null" not in json.dumps(s["recovery_seconds"])
    assert (f"controller interrupted by a signal (it checkpointed the step it reached) at step "
            f"{s['controller_losses'][0]['at_step']}; its successor resumed from step {stopped_at}") in run.stderr
    assert "recoveries 0 (-)" in run.stderr and "controller restarts 1" in run.stderr


def test_steps_a_restarted_controller_redid_are_booked_recovering_not_productive(tmp_path):
    """A new-user trial: `elastic-jax run` booked the steps a restarted controller redid as `productive`,
    where the operator re-books them `recovering` (`steps_lost`). The controller SIGKILLed at step >= 60
    with nothing committed (a local checkpoint every 1000 steps): its successor resumes from 0, so every
    training second of the first controller was lost and is booked `recovering` (the shared rule,
    `elastic_jax.supervision.steps_lost`); the summary's productive seconds are the successor's own."""
    m = job_manifest("redone", tmp_path, training={"steps": 200, "globalBatchSize": 8, "logEverySteps": 10},
                     checkpoint={"uri": str(tmp_path / "ckpt"), "intervalSteps": 1000})
    killed: dict = {}
    run = _run_beside(_signal_first_controller(tmp_path, signal.SIGKILL, 60, killed), m, tmp_path, 10,
                      "--no-failure")
    assert "pid" in killed, killed
    assert run.returncode == 0, run.stderr[-3000:]
    s = run.summary
    assert s["succeeded"] and s["controller_restarts"] == 1
    loss = s["controller_losses"][0]
    # (at_step: the last step the launcher polled, up to 0.1 s before the kill)
    assert loss["cause"] == "lost" and loss["resumed_from_step"] == 0 and loss["at_step"] >= 30
    assert loss["steps_lost"] == loss["at_step"] and s["steps_lost"] == loss["at_step"]
    # The successor's own ledger (its summary.json): all that is left productive once the lost steps moved.
    own = json.loads((tmp_path / "run" / "summary.json").read_text())["goodput_seconds"]
    booked = s["goodput_seconds"]
    assert abs(booked["productive"] - own["productive"]) < 0.01, (booked, own)
    assert abs(booked.get("reduced", 0.0) - own.get("reduced", 0.0)) < 0.01, (booked, own)
    # The first controller trained >= 60 steps: those seconds are now recovering, beside the successor's own.
    assert booked["recovering"] > own.get("recovering", 0.0) + 0.05, (booked, own)
    wall = sum(booked.values())
    assert abs(s["goodput"] - own["productive"] / wall) < 0.01, (s["goodput"], booked)


# -- a frozen controller is not a hung worker ---------------------------------------------------------


def test_a_frozen_machine_blames_no_worker_and_the_frozen_controller_is_reported_not_booked_productive(tmp_path):
    """The whole machine frozen for 20 s mid-step (a VM pause: workers, then the controller SIGSTOPped), its
    step deadline 5 s; the controller resumes 1.5 s before its workers (new-user trial: a 50 s freeze of the
    controller got both healthy workers replaced and charged to their restart budgets). Every deadline the
    controller set has expired and no worker can answer yet, but the controller did not run for ~20 of those
    seconds: the step is sent again and answered; no slice goes down, no worker restarts.

    The same freeze, from the launcher's side (another new-user trial: a controller SIGSTOPped under
    `elastic-jax run`, alive and making no step, was not reported and its frozen seconds counted as productive,
    its ledger's clock running on while it is stopped): the launcher applies the operator's
    ControllerUnresponsive rule (`supervision.controller_watch`): once the controller that answered goes 10 s
    without an answer it says so on the progress output, the summary lists the spell, and its seconds are
    booked recovering. (One run shows both; each had a run of its own, the same 600 steps frozen at step 60.)"""
    # 600 steps, frozen at step 60: the run cannot end inside the freeze, and the 2400 more it trained
    # afterwards (3000 steps before) showed nothing more (~25 s).
    m = job_manifest("frozen", tmp_path, training={"steps": 600, "globalBatchSize": 8, "logEverySteps": 10},
                     checkpoint={"uri": str(tmp_path / "ckpt"), "intervalSteps": 1000})
    frozen: dict = {}

    def freezer():
        pids: list[int] = []
        try:
            run_dir = tmp_path / "run"
            _wait_for(lambda: _logged_step(run_dir / "controller.log") >= 10, "step 10")
            workers = [_wait_for(lambda i=i: _worker_pid(run_dir, i), f"worker {i}") for i in range(2)]
            controller = _ready_pids(run_dir)[0]
            _wait_for(lambda: _logged_step(run_dir / "controller.log") >= 60, "step 60")
            for pid in (*workers, controller):  # workers first: the step in flight stays unanswered
                os.kill(pid, signal.SIGSTOP)
                pids.append(pid)
            frozen.update(pids=list(pids), controller=controller)
            time.sleep(20)
            os.kill(controller, signal.SIGCONT)
            time.sleep(1.5)
        except AssertionError as e:
            frozen["error"] = str(e)
        finally:
            for pid in pids:
                _continue(pid)

    run = _run_beside(freezer, m, tmp_path, 60, "--no-failure")
    assert "pids" in frozen, frozen
    assert run.returncode == 0, run.stderr[-3000:]
    s = run.summary
    assert s["succeeded"] and s["steps"] == 600 and s["steps_lost"] == 0
    assert s["recoveries"] == 0 and s["worker_restarts"] == 0 and s["controller_restarts"] == 0, s
    events = read_events(run.controller_log())
    # The freeze usually lands inside a step (then the expired deadline is excused, logged below); when it
    # lands between two, the next step is sent after it and nothing expires. Without the fix 2 of 2 runs
    # here replaced a worker.
    stalls = [e for e in events if e["event"] == "controller_stalled"]
    assert all(e["stalled_s"] >= 15 for e in stalls), stalls
    # The launcher's side: the spell reported, said and booked recovering.
    pid = frozen["controller"]
    [spell] = s["controller_unresponsive"]
    assert spell["pid"] == pid and spell["ended"] == "answered" and 14 <= spell["seconds"] <= 60, spell
    assert spell["at_step"] >= 30
    assert f"controller (pid {pid}) is alive but its control API has not answered for" in run.stderr
    assert f"controller (pid {pid}) answers again after" in run.stderr
    # The run's books never count the freeze productive: whatever the controller's own ledger booked it as
    # (productive: its clock ran on while it was stopped; under load partly not: a run at load 20 booked only
    # 12.1 s of the spell as training), the launcher re-books what it booked as training,
    # so the productive seconds and the spell fit in the wall together. (Without the re-booking a quiet run
    # fails this: the ledger's non-productive seconds, a few of start-up, are fewer than the spell's.)
    own = json.loads((tmp_path / "run" / "summary.json").read_text())["goodput_seconds"]
    booked = s["goodput_seconds"]
    assert booked["productive"] <= own["productive"], (booked, own)
    assert booked["productive"] + spell["seconds"] <= sum(booked.values()) + 1.0, (booked, own, spell)
    assert sum(booked.values()) - booked["productive"] >= 14, (booked, own)
    assert abs(sum(booked.values()) - sum(own.values())) < 0.05  # (the wall is unchanged)
    assert "unresponsive at step" in run.stderr and "booked recovering, not productive" in run.stderr


def test_a_health_check_that_expired_while_the_controller_was_frozen_blames_no_slice(worker_factory, tmp_path):
    """The manager pings every Ready slice, the active ones too, at the start of each attempt (the scale-up
    after a replacement joins, say) and marks those that do not answer within 5 s Down: a supervisor then
    replaces their workers. Here the controller (this test process, its `CpuBackend`) and the worker are
    frozen (SIGSTOP) mid-ping for 6 s, the controller resumed 0.5 s first: the ping's 4 s deadline expired
    while the controller did not run. Before, that failed the health check, as the step deadline did before
    the stall clock (e2e/test_slice_truth.py, now a step of e2e/test_status_truth.py: the surviving slice 1 was replaced at a rejoin under load, in
    2 of 5 runs of session 12; that this was the cause is not shown). Now it is pinged again and answers."""
    from elastic_jax.api.control import SliceReport
    from elastic_jax.controller.backend_cpu import CpuBackend
    from elastic_jax.controller.elastic.slice_set import SliceSet
    from tests.support.workers import TOKEN

    worker = worker_factory.start_many(1)[0]
    slices = SliceSet(1)
    slices.apply_report(0, SliceReport(state="Ready", generation=1, addresses=[worker.address]))
    backend = CpuBackend(slices, token=TOKEN)
    try:
        assert backend.health_check([0], timeout_s=2.0) == frozenset({0})  # connected, answering
        os.kill(worker.popen.pid, signal.SIGSTOP)  # the ping below stays unanswered until the end
        # The freeze must begin inside the ping's deadline: the freezer is running (it said so) before it is
        # told to go, and the deadline (4 s) leaves room for a loaded machine's scheduling delays (CI under
        # load failed this with a 2 s deadline and a freezer that first had to start).
        freezer = subprocess.Popen(["sh", "-c", f"echo ready; read go; sleep 0.3; kill -STOP {os.getpid()}; "
                                    f"sleep 6; kill -CONT {os.getpid()}; sleep 0.5; kill -CONT {worker.popen.pid}"],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            assert freezer.stdout.readline() == b"ready\n"
            freezer.stdin.write(b"go\n")
            freezer.stdin.flush()
            started = time.monotonic()
            assert backend.health_check([0], timeout_s=4.0) == frozenset({0})
            assert time.monotonic() - started >= 6.0  # the freeze happened during the check
        finally:
            freezer.stdin.close()  # (a freezer still at `read` ends: it never freezes anything)
            freezer.wait(timeout=30)
            freezer.stdout.close()
            os.kill(worker.popen.pid, signal.SIGCONT)
        # a worker frozen on its own (the controller runs) is still unhealthy (once it is seen stopped: CI under
        # load once read it healthy here, cause not found; a stop not yet in effect is the one thing ruled out)
        os.kill(worker.popen.pid, signal.SIGSTOP)
        _wait_for(lambda: psutil.Process(worker.popen.pid).status() == psutil.STATUS_STOPPED, "the worker stopped")
        try:
            assert backend.health_check([0], timeout_s=1.0) == frozenset()
        finally:
            os.kill(worker.popen.pid, signal.SIGCONT)
    finally:
        backend.close()


# -- item 4: a stop during a hung step abandons the step and checkpoints the last completed one -----


def test_stop_during_a_hung_step_checkpoints_the_last_completed_step(tmp_path):
    """A worker SIGSTOPped (step deadline 600 s), then SIGTERM to `elastic-jax run`: the controller
    abandons the stuck step at once, commits the last completed step and reports it truthfully."""
    ckpt = tmp_path / "ckpt"
    m = job_manifest("hungstop", tmp_path, slices={"count": 2, "minSlices": 2},
                     training={"steps": 5000, "globalBatchSize": 8, "logEverySteps": 5},
                     checkpoint={"uri": str(ckpt), "intervalSteps": 1000},
                     elasticity={"stepDeadlineSeconds": 600, "firstStepDeadlineSeconds": 600})
    proc = _start_cli(m, tmp_path, "--no-failure")
    stopped_pid = None
    try:
        run_dir = tmp_path / "run"
        _wait_for(lambda: _logged_step(run_dir / "controller.log") >= 20, "step 20")
        stopped_pid = _wait_for(lambda: _worker_pid(run_dir, 1), "worker 1")
        os.kill(stopped_pid, signal.SIGSTOP)
        # The controller's step stops advancing: a step is now stuck on the stopped worker.
        metrics = run_dir / "metrics.prom"

        def stuck_step():
            before = _metric_step(metrics)
            time.sleep(3.0)
            after = _metric_step(metrics)
            return after if before is not None and before == after else None

        hung_at = _wait_for(stuck_step, "the step to hang")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=POLL_DEADLINE_S)
    finally:
        if stopped_pid is not None:
            for sig in (signal.SIGCONT, signal.SIGKILL):
                try:
                    os.kill(stopped_pid, sig)
                except ProcessLookupError:
                    pass
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        for p in leftover_processes(str(tmp_path)):
            p.kill()
    assert proc.returncode == 130, err[-3000:]
    s = _summary(out)
    assert s["steps"] == hung_at, (s, hung_at)
    assert s["last_committed_checkpoint_step"] == hung_at
    assert hung_at in _committed_steps(ckpt)
    finished = [e for e in _events(tmp_path / "run" / "controller.log") if e["event"] == "finished"]
    assert finished and finished[-1]["stop"] == "requested" and finished[-1]["exit_code"] == 4, finished
    assert "step abandoned" in (tmp_path / "run" / "controller.log").read_text()
    assert f"last committed step {hung_at}" in err or f"checkpoint step {hung_at}" in err or str(hung_at) in err


def _metric_step(path: Path) -> int | None:
    """`elastic_jax_step` from the launcher's last /metrics scrape."""
    try:
        for line in path.read_text().splitlines():
            if line.startswith("elastic_jax_step "):
                return int(float(line.split()[1]))
    except OSError:
        return None
    return None


# -- item 2: an error no slice caused is the user's: fail at once -----------------------------------


def test_host_callback_error_in_the_optimizer_fails_at_once_naming_the_exception(tmp_path):
    """An optax transform whose host callback raises KeyError after 5 updates: JAX reports
    `INTERNAL: CpuCallback error`. No slice caused it: the job fails at once, no recovery,
    with one line naming the KeyError and the step."""
    m = job_manifest("cberror", tmp_path, training={"steps": 60, "globalBatchSize": 8, "logEverySteps": 1},
                     elasticity={"maxRestarts": 3, "stepDeadlineSeconds": 30, "firstStepDeadlineSeconds": 120})
    m["spec"]["controller"]["trainer"]["entryPoint"] = "tests.support.trainers:callback_error_trainer"
    run = run_cli(m, tmp_path, "--no-failure")
    assert run.returncode == 1, run.stderr[-3000:]
    s = run.summary
    assert not s["succeeded"] and s["steps"] == 5
    assert s["recoveries"] == 0 and s["worker_restarts"] == 0
    reason = s["failure_reason"]
    assert "\n" not in reason and len(reason) < 600, reason
    assert "host callback raised KeyError: 5" in reason and "step 6" in reason, reason
    assert "elastic event" not in run.controller_log()


# -- item 9: never commit non-finite state ----------------------------------------------------------


def test_nan_state_is_never_committed_and_resume_uses_the_last_finite_step(tmp_path):
    """The 25th update makes the parameters NaN (its loss is still finite): the run fails naming
    step 25, step 25 is not committed, and a resume starts from step 20, the last finite one."""
    ckpt = tmp_path / "ckpt"
    m = job_manifest("nanstate", tmp_path, training={"steps": 60, "globalBatchSize": 8, "logEverySteps": 5},
                     checkpoint={"uri": str(ckpt), "intervalSteps": 5, "maxToKeep": 20})
    m["spec"]["controller"]["trainer"]["entryPoint"] = "tests.support.trainers:nan_update_trainer"
    first = run_cli(m, tmp_path, "--no-failure")
    assert first.returncode == 1, first.stderr[-3000:]
    s = first.summary
    assert not s["succeeded"] and s["steps"] == 24
    assert "step 25" in s["failure_reason"] and "non-finite" in s["failure_reason"], s["failure_reason"]
    assert s["last_committed_checkpoint_step"] == 20
    assert max(_committed_steps(ckpt)) == 20 and 25 not in _committed_steps(ckpt)
    again = run_cli(m, tmp_path, "--no-failure")
    assert again.returncode == 1
    assert again.summary["restored_from_step"] == 20 and "step 25" in again.summary["failure_reason"]


# -- item 11: a save that fails (read-only or full storage) still reaches the summary ---------------


def test_save_failure_reaches_the_summary_with_the_last_committed_step(tmp_path):
    """After the first commit the checkpoint directory becomes immutable (`chattr +i`: a real
    EPERM from the file system even for root, as a read-only mount gives): the next save fails,
    and the summary still carries the reason and the last committed step."""
    ckpt = tmp_path / "ckpt"
    m = job_manifest("rofs", tmp_path, training={"steps": 3000, "globalBatchSize": 8, "logEverySteps": 10},
                     checkpoint={"uri": str(ckpt), "intervalSteps": 20, "maxToKeep": 50})
    frozen: dict = {}

    def freezer():
        try:
            _wait_for(lambda: 20 in _committed_steps(ckpt), "step 20 committed", interval_s=0.01)
            subprocess.run(["chattr", "+i", str(ckpt)], check=True)
            frozen["steps"] = _committed_steps(ckpt)
        except (AssertionError, subprocess.CalledProcessError) as e:
            frozen["error"] = str(e)

    try:
        run = _run_beside(freezer, m, tmp_path, 10, "--no-failure")
    finally:
        subprocess.run(["chattr", "-i", str(ckpt)], check=False)
    assert "steps" in frozen, frozen
    assert run.returncode == 1, run.stderr[-3000:]
    s = run.summary
    assert not s["succeeded"] and s["steps"] < 3000
    reason = s["failure_reason"]
    assert "checkpoint save of step" in reason and "Operation not permitted" in reason, reason
    assert f"last committed step: {s['last_committed_checkpoint_step']}" in reason, reason
    assert s["last_committed_checkpoint_step"] == max(_committed_steps(ckpt)) >= 20
    assert f"last committed step {s['last_committed_checkpoint_step']}" in run.stderr or \
        str(s["last_committed_checkpoint_step"]) in run.stderr


# -- item 10: a corrupt newest step does not block resume ------------------------------------------


def test_corrupt_newest_steps_fall_back_to_the_newest_intact_one(tmp_path):
    """Step 40 loses a file of its array data, step 30's array metadata is truncated: the resume
    skips both with a warning naming them and continues from step 20, and the run succeeds."""
    ckpt = tmp_path / "ckpt"
    spec = {"checkpoint": {"uri": str(ckpt), "intervalSteps": 10, "maxToKeep": 10}}
    first = run_cli(job_manifest("corrupt", tmp_path, training={"steps": 40, "globalBatchSize": 8}, **spec),
                    tmp_path, "--no-failure")
    assert first.returncode == 0, first.stderr[-3000:]
    assert _committed_steps(ckpt) == [10, 20, 30, 40]
    data_files = sorted((p for p in (ckpt / "40" / "state").rglob("*") if p.is_file() and p.parent.name == "d"),
                        key=lambda p: p.stat().st_size)
    data_files[-1].unlink()  # the largest array data file
    metadata = ckpt / "30" / "state" / "_METADATA"
    metadata.write_bytes(metadata.read_bytes()[: metadata.stat().st_size // 2])
    again = run_cli(job_manifest("corrupt", tmp_path, training={"steps": 60, "globalBatchSize": 8}, **spec),
                    tmp_path, "--no-failure")
    assert again.returncode == 0, again.stderr[-3000:]
    s = again.summary
    assert s["succeeded"] and s["steps"] == 60 and s["restored_from_step"] == 20
    resumed = [e for e in read_events(again.controller_log()) if e["event"] == "resumed"]
    assert resumed and resumed[0]["step"] == 20, resumed
    reason = resumed[0]["fallback_reason"]
    assert "step 40:" in reason and "step 30:" in reason and "\n" not in reason
    assert "another job" not in again.controller_log()
    assert 40 in _committed_steps(ckpt) and 60 in _committed_steps(ckpt)  # 40 re-saved from good state


# -- item 3: a stuck controller must not look healthy: tests/integration/test_stall_notice.py (one run with the
# stall notice: a blocked data read, /healthz 200 until progressTimeoutSeconds, then 503 and the log's reason)


# -- item 6: exit code 0 means "trained every step", never "user code quit early" -----------------


def test_user_code_calling_sys_exit_zero_mid_training_fails_instead_of_succeeding(tmp_path):
    """`sys.exit(0)` in the trainer's data pipeline at step 5 of 200: the controller exits FAILED
    naming it, so on a cluster the pod is Failed with the reason, not Succeeded with the job unfinished."""
    m = job_manifest("sysexit", tmp_path, training={"steps": 200, "globalBatchSize": 8, "logEverySteps": 1},
                     controller={"trainer": {"entryPoint": "tests.support.trainers:sys_exit_trainer",
                                             "config": dict(TINY_TRAINER)}})
    run = run_cli(m, tmp_path)
    assert run.returncode != 0, run.stdout[-2000:]
    s = run.summary
    assert not s["succeeded"] and s["steps"] < 200
    assert "sys.exit(0)" in s["failure_reason"] and "training did not finish" in s["failure_reason"]
    finished = [e for e in read_events(run.controller_log()) if e["event"] == "finished"]
    assert finished[-1]["exit_code"] == 1


# -- a rerun: nothing to train is not 0% goodput; an injected failure fires only when passed -------


def test_reruns_report_goodput_as_not_applicable_and_inject_failures_only_when_passed(tmp_path):
    """Found by a new-user trial: a finished job run again (resumed at its last step, nothing to do)
    reported goodput 0.0%; and `--kill-at-step` (or its default, a third of the run) fired in the first
    step after a resume that was already past it."""
    ckpt = {"uri": str(tmp_path / "ckpt"), "intervalSteps": 10}
    first = run_cli(job_manifest("rerun", tmp_path, training={"steps": 20, "globalBatchSize": 8}, checkpoint=ckpt),
                    tmp_path, "--no-failure")
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.summary["goodput"] > 0

    again = run_cli(job_manifest("rerun", tmp_path, training={"steps": 20, "globalBatchSize": 8}, checkpoint=ckpt),
                    tmp_path)  # the default failure is armed: nothing may be killed
    assert again.returncode == 0, again.stderr[-3000:]
    s = again.summary
    assert s["restored_from_step"] == 20 and s["goodput"] is None
    assert "goodput n/a (no steps run)" in again.stderr and "goodput 0.0%" not in again.stderr
    # (said at once: no process was started to restore and train nothing)
    assert s["already_finished"] and s["injected_failure"] is None and "nothing was started" in again.stderr

    longer = run_cli(job_manifest("rerun", tmp_path, training={"steps": 40, "globalBatchSize": 8}, checkpoint=ckpt),
                     tmp_path, "--kill-at-step", "10")
    assert longer.returncode == 0, longer.stderr[-3000:]
    s = longer.summary
    assert s["restored_from_step"] == 20 and s["steps"] == 40
    assert s["injected_failure"] is None and s["worker_restarts"] == 0 and s["recoveries"] == 0
    assert s["injected_failure_skipped"] == ("the run resumed at step 20, already past --kill-at-step 10; "
                                             "no failure injected")
    assert "injected failure: none (the run resumed at step 20" in longer.stderr
    assert 0 < s["goodput"] <= 1

    # Past the resumed step, the failure fires once training passes it. (300 steps, not 70: under load the
    # launcher's kill at step >= 50 landed after step 70 and the run ended before it saw the loss.)
    later = run_cli(job_manifest("rerun", tmp_path, training={"steps": 300, "globalBatchSize": 8}, checkpoint=ckpt),
                    tmp_path, "--kill-at-step", "50")
    assert later.returncode == 0, later.stderr[-3000:]
    s = later.summary
    assert s["restored_from_step"] == 40 and s["injected_failure"]["at_step"] >= 50
    assert s["injected_failure_skipped"] is None and s["worker_restarts"] >= 1 and s["recoveries"] >= 1
