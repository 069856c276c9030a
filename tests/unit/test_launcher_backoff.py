"""The local launcher as a driver of the supervision core: restart delay, reports, the replace rule and
the slice budgets (stand-in children and no controller)."""

import json
import os
import signal
import time
from pathlib import Path

import pytest

from elastic_jax import contract
from elastic_jax.api.manifest import parse_manifest
from elastic_jax.local.launcher import LaunchError, LaunchOptions, LocalLauncher, _Slice
from elastic_jax.local.processes import Child


class _Child:
    """A worker process that is alive until `die()`."""

    def __init__(self):
        self.up = True

    def alive(self):
        return self.up

    def exit_code(self):
        return None if self.up else -9

    def wait(self, timeout_s):
        return self.exit_code()

    def stopped(self):
        return False

    def die(self):
        self.up = False


def _launcher(tmp_path: Path, elasticity: dict | None = None) -> tuple[LocalLauncher, _Slice, list]:
    job = parse_manifest({"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob",
                          "metadata": {"name": "b"},
                          "spec": {"slices": {"count": 1}, "training": {"steps": 10, "globalBatchSize": 1},
                                   "checkpoint": {"uri": str(tmp_path / "ck")}, "elasticity": elasticity or {}}})
    launcher = LocalLauncher(job, tmp_path / "job.yaml", LaunchOptions(workdir=tmp_path / "run"))
    s = _Slice(0, _Child())
    launcher.slices = [s]
    reports = []
    launcher._report = lambda sl, state, reason=None: reports.append(state)
    starts = []

    def start(sl):
        starts.append(sl.index)
        sl.child = _Child()
        sl.listening = False
        sl.restart_at = None

    launcher._start_worker = start
    return launcher, s, reports


def test_a_worker_lost_after_ready_is_reported_down_and_restarted_at_once_every_time(tmp_path, monkeypatch):
    launcher, s, reports = _launcher(tmp_path)
    monkeypatch.setattr("elastic_jax.local.launcher.port_open", lambda host, port: True)
    now = 0.0
    for _ in range(6):  # killed every 15 s, each time after it was Ready: never a growing wait
        launcher._supervise_workers(now)  # Starting -> Ready
        assert s.state == "Ready"
        s.child.die()
        launcher._supervise_workers(now)
        assert s.state == "Down" and s.restart_at == now  # reported Down, restarted by the next pass
        launcher._supervise_workers(now)  # restarted
        assert s.restart_at is None
        now += 15.0
    assert reports.count("Down") == 6


def test_a_worker_that_dies_before_ready_backs_off(tmp_path, monkeypatch):
    launcher, s, _ = _launcher(tmp_path)
    monkeypatch.setattr("elastic_jax.local.launcher.port_open", lambda host, port: False)
    delays = []
    now = 0.0
    for _ in range(7):  # a crash loop: it never listens
        s.child.die()
        launcher._supervise_workers(now)
        delays.append(s.restart_at - now)
        now = s.restart_at
        launcher._supervise_workers(now)
    assert delays == [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0]


def test_a_worker_that_never_listened_is_not_reported_until_it_dies(tmp_path, monkeypatch):
    launcher, s, reports = _launcher(tmp_path)
    monkeypatch.setattr("elastic_jax.local.launcher.port_open", lambda host, port: False)
    launcher._supervise_workers(0.0)
    assert s.state == "Provisioning" and reports == []
    s.child.die()
    launcher._supervise_workers(0.0)
    assert s.state == "Down" and reports == ["Down"]


def _status(state: str, generation: int):
    """The part of `GET /v1/status` the replace rule reads."""
    from types import SimpleNamespace
    return SimpleNamespace(slices=[SimpleNamespace(index=0, state=state, generation=generation)], recovery_history=[])


def test_a_down_read_before_the_ready_was_accepted_kills_no_worker(tmp_path, monkeypatch):
    """Before the core, the launcher killed a worker on the controller's Down of any generation."""
    launcher, s, _ = _launcher(tmp_path)
    s.state, s.ready_generation = "Ready", 7
    killed = []
    s.child.signal = killed.append
    launcher._replace_slices_seen_down(_status("Down", 6))
    assert killed == []
    launcher._replace_slices_seen_down(_status("Down", 7))
    assert len(killed) == 1 and s.ready_generation is None


def test_worker_deaths_count_against_the_slice_budget_before_ready_too(tmp_path, monkeypatch):
    """Before the core the launcher restarted a dying worker forever; the operator fails the job once a
    slice's JobSet restarts exceed maxRestartsPerSlice. Now both count every death."""
    launcher, s, _ = _launcher(tmp_path, {"maxRestarts": 20, "maxRestartsPerSlice": 2})
    monkeypatch.setattr("elastic_jax.local.launcher.port_open", lambda host, port: False)
    now = 0.0
    for _ in range(2):
        s.child.die()
        launcher._supervise_workers(now)
        now = s.restart_at
        launcher._supervise_workers(now)
        assert launcher._slice_budget_failure() is None
    s.child.die()
    launcher._supervise_workers(now)
    assert launcher._slice_budget_failure() == "slice 0 replaced 3 times, more than elasticity.maxRestartsPerSlice=2"


def test_the_controller_restart_budget_is_the_specs_unless_the_option_sets_one(tmp_path):
    launcher, _, _ = _launcher(tmp_path, {"maxRestarts": 5})
    assert launcher._max_controller_restarts() == 5
    launcher.options.max_controller_restarts = 1
    assert launcher._max_controller_restarts() == 1


def test_workers_share_a_private_compilation_cache_in_the_run_folder(tmp_path, monkeypatch):
    """A restarted worker reads its step program from the run's XLA cache instead of compiling it again."""
    monkeypatch.delenv(contract.JAX_ENV_COMPILATION_CACHE_DIR, raising=False)
    launcher, _, _ = _launcher(tmp_path)
    launcher.workdir.mkdir(parents=True, exist_ok=True)
    env = launcher._worker_env()
    cache = Path(env[contract.JAX_ENV_COMPILATION_CACHE_DIR])
    assert cache == (tmp_path / "run" / "xla-cache").resolve() and cache.is_dir()
    assert cache.stat().st_mode & 0o077 == 0  # not readable or writable by other users
    assert env[contract.JAX_ENV_CACHE_MIN_COMPILE_TIME_SECS] == "0"


def test_workers_use_the_compilation_cache_named_in_the_launchers_environment(tmp_path, monkeypatch):
    """JAX_COMPILATION_CACHE_DIR set for `elastic-jax run`: one cache kept across runs (as JAX reads it) instead
    of the run folder's, created 0700; a URL is passed on as given."""
    mine = tmp_path / "caches" / "xla"
    monkeypatch.setenv(contract.JAX_ENV_COMPILATION_CACHE_DIR, str(mine))
    launcher, _, _ = _launcher(tmp_path)
    launcher.workdir.mkdir(parents=True, exist_ok=True)
    env = launcher._worker_env()
    assert env[contract.JAX_ENV_COMPILATION_CACHE_DIR] == str(mine.resolve()) and mine.is_dir()
    assert mine.stat().st_mode & 0o077 == 0 and not (launcher.workdir / "xla-cache").exists()
    assert env[contract.JAX_ENV_CACHE_MIN_COMPILE_TIME_SECS] == "0"
    monkeypatch.setenv(contract.JAX_ENV_COMPILATION_CACHE_DIR, "gs://bucket/xla")
    assert launcher._worker_env()[contract.JAX_ENV_COMPILATION_CACHE_DIR] == "gs://bucket/xla"


def test_a_compilation_cache_others_can_write_is_refused_naming_the_variable(tmp_path, monkeypatch):
    """A world-writable cache could hand the workers another user's executables: refused like the run folder's."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv(contract.JAX_ENV_COMPILATION_CACHE_DIR, str(shared))
    launcher, _, _ = _launcher(tmp_path)
    with pytest.raises(LaunchError, match=rf"^JAX_COMPILATION_CACHE_DIR={shared}: is writable by others"):
        launcher._worker_env()


@pytest.mark.parametrize("case", ["a file", "under a file", "in a folder others may rename in"])
def test_a_compilation_cache_that_cannot_be_a_private_folder_is_one_error_naming_the_variable(tmp_path, monkeypatch,
                                                                                              case):
    """A new user's trial: a file (or a path under one) gave a FileExistsError / NotADirectoryError traceback;
    a folder inside a world-writable, non-sticky parent was taken (another user could swap it for a link)."""
    a_file = tmp_path / "afile"
    a_file.write_text("")
    loose = tmp_path / "loose"
    loose.mkdir()
    os.chmod(loose, 0o777)
    cache, fragment = {"a file": (a_file, "is not a directory"),
                       "under a file": (a_file / "sub", "cannot be created"),
                       "in a folder others may rename in": (loose / "sub", "without the sticky bit")}[case]
    monkeypatch.setenv(contract.JAX_ENV_COMPILATION_CACHE_DIR, str(cache))
    launcher, _, _ = _launcher(tmp_path)
    with pytest.raises(LaunchError, match=rf"^JAX_COMPILATION_CACHE_DIR={cache}: .*{fragment}"):
        launcher._worker_env()


def test_a_refused_compilation_cache_leaves_the_earlier_runs_records(tmp_path, monkeypatch):
    """The trial: the refusal came after the launcher had deleted the earlier run's logs, history and picture in
    the same --workdir. The cache is checked first, so a refused run changes none of them."""
    launcher, _, _ = _launcher(tmp_path)
    launcher.workdir.mkdir(parents=True, exist_ok=True)
    earlier = {name: f"earlier {name}\n" for name in ("controller.log", "worker-0.log", "history.jsonl")}
    for name, text in earlier.items():
        (launcher.workdir / name).write_text(text)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    monkeypatch.setenv(contract.JAX_ENV_COMPILATION_CACHE_DIR, str(shared))
    with pytest.raises(LaunchError, match="is writable by others"):
        launcher.run()
    assert {name: (launcher.workdir / name).read_text() for name in earlier} == earlier


class _FlakyClient:
    """A control client whose first `fails` slice reports get no usable answer (ControlApiError)."""

    def __init__(self, fails: int):
        self.fails, self.sent = fails, []

    def report_slice(self, index, state, generation, addresses, reason, retries=0):
        from elastic_jax.api.client import ControlApiError
        self.sent.append((state, generation))
        if len(self.sent) <= self.fails:
            raise ControlApiError("PUT /v1/slices/0: answer not complete within 2.0 s")


def _real_reports(tmp_path, fails):
    launcher, s, _ = _launcher(tmp_path)
    del launcher._report  # the launcher's own, against the stand-in client
    launcher.client = _FlakyClient(fails)
    launcher.RESEND_S = 0.0  # sent again at the next status read
    return launcher, s, launcher.client


def test_a_ready_the_controller_did_not_take_is_sent_again_until_it_holds_it(tmp_path, monkeypatch):
    """Before, a slice's state was sent only when it changed: a Ready whose report failed was never sent
    again, and the restarted worker never rejoined (the controller held it Down)."""
    launcher, s, client = _real_reports(tmp_path, fails=2)
    monkeypatch.setattr("elastic_jax.local.launcher.port_open", lambda host, port: True)
    launcher._supervise_workers(0.0)  # Ready: its report fails
    assert s.state == "Ready" and s.unsent is not None and s.ready_generation is None
    launcher._resend_unsent(_status("Down", 5))  # the controller still has an older generation: again
    launcher._resend_unsent(_status("Down", 5))
    assert [state for state, _ in client.sent] == ["Ready"] * 3
    assert s.unsent is None and s.ready_generation == client.sent[-1][1]
    launcher._resend_unsent(_status("Active", s.generation))
    assert len(client.sent) == 3  # taken: nothing more


def test_a_ready_applied_though_its_answer_was_lost_is_not_sent_again(tmp_path, monkeypatch):
    """The controller applied the report but its answer came too late: the status shows the generation sent.
    It is not sent again (a new generation of an active slice would reconnect the controller to it), and
    the replace rule works for it (before, its accepted generation stayed unknown: a later hang of that
    worker was never replaced)."""
    launcher, s, client = _real_reports(tmp_path, fails=1)
    monkeypatch.setattr("elastic_jax.local.launcher.port_open", lambda host, port: True)
    launcher._supervise_workers(0.0)
    launcher._resend_unsent(_status("Active", s.generation))
    assert len(client.sent) == 1 and s.unsent is None and s.ready_generation == s.generation


def test_a_lost_controllers_step_is_the_last_it_logged_when_the_poll_lagged(tmp_path):
    """CI under load: a controller SIGKILLed after logging step 60 was recorded `at_step` 0 (its status
    poll had not answered yet), so the steps its successor redid were counted 0. The step it logged counts
    too; lines before its start (an earlier controller's, in the appended log) do not."""
    launcher, _, _ = _launcher(tmp_path)
    log = tmp_path / "controller.log"
    earlier = json.dumps({"event": "step", "step": 500}) + "\n"
    log.write_text(earlier)
    launcher.controller = Child("controller", ["true"], log)
    launcher._controller_log_offset = len(earlier)
    with open(log, "a") as f:
        f.write("not json: a library's own line\n")
        f.writelines(json.dumps({"event": "step", "step": n, "loss": 1.0}) + "\n" for n in (10, 30, 60))
    launcher.last_status = None  # (its poll never answered)
    launcher._carry_over_from_dead_controller(-9)
    assert launcher.controller_losses[-1]["at_step"] == 60


class _ExitedController:
    """A controller process that exited with `code` at once (a `sys.exit(3)` at start-up)."""

    log_path = Path("controller.log")

    def __init__(self, code):
        self.code = code

    def alive(self):
        return False

    def exit_code(self):
        return self.code

    def last_error_line(self):
        return ""


def test_a_controller_exiting_3_at_once_is_restarted_with_the_operators_growing_back_off(tmp_path, monkeypatch):
    """The crash-loop rule the operator uses (`supervision.backoff`), the same here: the first restart at
    once, then the initial delay doubling (shrunk here from the kubelet's 10 s, read at each call)."""
    import pytest

    from elastic_jax.local.launcher import LaunchError
    from elastic_jax.supervision import backoff

    monkeypatch.setattr(backoff, "INITIAL_DELAY_S", 0.3)
    monkeypatch.setattr(backoff, "MAX_DELAY_S", 10.0)
    launcher, _, _ = _launcher(tmp_path, {"maxRestarts": 3})
    started = []

    def start_controller():
        started.append(time.monotonic())
        launcher.controller = _ExitedController(3)

    launcher._start_controller = start_controller
    launcher._carry_over_from_dead_controller = lambda code: None
    launcher.stop_all = lambda: None
    with pytest.raises(LaunchError, match="controller lost 4 times"):
        launcher.run()
    gaps = [b - a for a, b in zip(started, started[1:])]
    assert len(gaps) == 3, gaps
    assert gaps[0] < 0.3, gaps  # the first loss: at once
    assert gaps[1] >= 0.3 and gaps[2] >= 0.6, gaps  # then 0.3 s, doubling


# A worker's end as the real one does it: on SIGTERM it stops serving, says so, takes a moment, exits 143.
_STOPS_ON_SIGTERM = """
import signal, sys, time
def stop(*_):
    print("stopping", flush=True)
    time.sleep(0.7)
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
print("serving", flush=True)
while True:
    time.sleep(0.1)
"""


def _real_worker(tmp_path: Path) -> Child:
    import sys

    child = Child("worker-0", [sys.executable, "-c", _STOPS_ON_SIGTERM], tmp_path / "worker-0.log")
    child.start()
    deadline = time.monotonic() + 60
    while "serving" not in child.log_path.read_text():
        assert time.monotonic() < deadline and child.alive(), child.log_path.read_text()
        time.sleep(0.05)
    return child


def _down_view(generation: int):
    from types import SimpleNamespace

    return SimpleNamespace(slices=[SimpleNamespace(index=0, state="Down", generation=generation)],
                           recovery_history=[SimpleNamespace(slices=[0], cause="slice_down")])


def _ended_reasons(launcher) -> list:
    reasons = []
    launcher._observe = lambda sl, observation, reason=None: reasons.append(reason)
    return reasons


def test_a_worker_stopped_by_sigterm_is_reported_as_sigterm_not_killed_by_the_launcher(tmp_path, monkeypatch):
    """New-user trial: `kill -TERM` of a worker was reported `worker exited (-9)`: the worker closed its server
    (the controller reported the slice down at once) and the launcher SIGKILLed it while it was exiting."""
    launcher, s, _ = _launcher(tmp_path)
    s.child = _real_worker(tmp_path)
    s.state, s.ready_generation = "Ready", 5
    reasons = _ended_reasons(launcher)
    try:
        s.child.signal(signal.SIGTERM)
        while "stopping" not in s.child.log_path.read_text():
            time.sleep(0.05)
        launcher._replace_slices_seen_down(_down_view(5))  # the controller's RPC failed: it says Down
        launcher._supervise_workers(time.monotonic())
    finally:
        s.child.stop(grace_s=5)
    assert reasons == ["worker process ended: exit 143 (stopped by SIGTERM)"], reasons


def test_a_hung_worker_the_controller_reports_down_is_killed_and_the_report_says_by_whom(tmp_path):
    launcher, s, _ = _launcher(tmp_path)
    s.child = _real_worker(tmp_path)
    s.state, s.ready_generation = "Ready", 5
    reasons = _ended_reasons(launcher)
    try:
        s.child.signal(signal.SIGSTOP)  # hung: it ends only when killed
        while not s.child.stopped():
            time.sleep(0.01)
        launcher._replace_slices_seen_down(_down_view(5))
        assert s.child.wait(10) == -signal.SIGKILL
        launcher._supervise_workers(time.monotonic())
    finally:
        s.child.stop(grace_s=1)
    assert reasons == ["worker process ended: killed by SIGKILL (by the launcher: the controller reported slice 0 "
                       "down (slice_down))"], reasons


def test_describe_exit_names_the_real_signal():
    from elastic_jax.local.processes import describe_exit

    assert describe_exit(-15) == "killed by SIGTERM" and describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(143) == "exit 143 (stopped by SIGTERM)" and describe_exit(130) == "exit 130 (stopped by SIGINT)"
    assert describe_exit(1) == "exit 1" and describe_exit(None) == "still running"
