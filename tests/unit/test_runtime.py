"""`elastic_jax.connect()` / `Runtime`: the library's control API (real HTTP on loopback) and elastic retry.

A pathways job here: its runtime has no cpu workers to ping, so slice reports
alone decide which slices are up (the cpu backend's `map_sum` runs with real
workers in tests/integration/test_own_loop.py).
"""

from __future__ import annotations

import json
import threading
import time

import pytest
import yaml

import elastic_jax
from elastic_jax import contract
from elastic_jax.api.client import ControlApiError, ControlClient
from elastic_jax.api.control import SliceReport
from elastic_jax.api.manifest import parse_manifest
from elastic_jax.exit_codes import ControllerExit
from elastic_jax.controller.runtime import Runtime, RuntimeConfigError, connect
from tests.support.bad_manifests import pathways_job

TOKEN = "t0ken"


def _job(count=2, min_slices=1):
    manifest = pathways_job("lib")
    manifest["spec"]["slices"].update(count=count, minSlices=min_slices)
    manifest["spec"]["training"]["globalBatchSize"] = 4
    manifest["spec"]["controller"] = {"command": ["python", "train.py"]}
    manifest["spec"]["elasticity"] = {"maxRestarts": 3, "sliceWaitTimeoutSeconds": 600}
    return manifest


@pytest.fixture
def runtime():
    rt = Runtime(parse_manifest(_job()), TOKEN, host="127.0.0.1", port=0).start()
    client = ControlClient(f"http://127.0.0.1:{rt.port}", TOKEN)
    yield rt, client
    close_read_by_a_supervisor(rt, client)
    client.close()


def close_read_by_a_supervisor(rt: Runtime, client: ControlClient) -> None:
    """`rt.close()` with a supervisor polling `GET /v1/status` meanwhile, as the operator and the launcher do.

    A test that read the status makes `close` wait for the final status to be read (at most 10 s: the
    handoff of `Runtime.close`); nobody reading it cost each such test 10 s of teardown. Polls until
    `close` returned (its server stopped: the read fails).
    """
    closer = threading.Thread(target=rt.close, name="close")
    closer.start()
    while closer.is_alive():
        try:
            client.status()
        except ControlApiError:
            pass
        closer.join(0.05)


def _ready(client, index):
    client.report_slice(index, "Ready", time.time_ns(), addresses=[f"10.0.0.{index}:8471"])


def test_reports_feed_the_slice_set_behind_the_same_auth(runtime):
    rt, client = runtime
    assert client.ready()
    _ready(client, 1)
    assert rt.slice_set.ready() == {1}
    with pytest.raises(ControlApiError):  # same token check as the built-in controller
        ControlClient(f"http://127.0.0.1:{rt.port}", "wrong").report_slice(0, "Ready", time.time_ns(), ["a:1"],
                                                                          retries=0)
    assert rt.slice_set.ready() == {1}
    with pytest.raises(ControlApiError):  # index outside 0..count-1: 404
        client.report_slice(5, "Ready", time.time_ns(), ["a:1"], retries=0)


def test_status_and_metrics_show_the_reported_step(runtime):
    rt, client = runtime
    rt.report_step(7, loss=1.5)
    s = client.status()
    assert (s.step, s.loss, s.desired_slices, s.min_slices) == (7, 1.5, 2, 1)
    assert "elastic_jax_step 7.0" in client.metrics_text()
    with pytest.raises(ValueError, match="lower"):
        rt.report_step(3)


def test_stop_request_sets_the_event_and_the_stopped_exit_code(runtime):
    rt, client = runtime
    client.stop("suspend")
    assert rt.stop_requested.is_set() and rt.stop_exit_code == ControllerExit.STOPPED


def _attempts_on_two_ready_slices(rt, client, attempt):
    """Slices 0 and 1 reported Ready, then `attempt(n)` (n = 1, 2, ...) under `rt.elastic_retry` until one
    returns "done". Returns (the active slices each attempt began with, the elastic events in order)."""
    _ready(client, 0)
    _ready(client, 1)
    seen, events = [], []

    @rt.elastic_retry(on_elastic_event_callback=events.append)
    def train():
        seen.append(sorted(rt.active_slices))
        return attempt(len(seen))

    assert train() == "done"
    return seen, events


def test_elastic_retry_replica_resize_then_scale_up(runtime):
    """Attempt 1 on both slices; slice 1 lost mid-run -> attempt 2 on slice 0 alone (minSlices 1);
    slice 1 reported Ready again -> the scale-up signal -> attempt 3 on both."""
    rt, client = runtime

    def attempt(n):
        if n == 1:
            client.report_slice(1, "Down", time.time_ns(), reason="worker killed")
            raise elastic_jax.SliceDownError("slice 1 lost", [1])
        if n == 2:
            _ready(client, 1)
            rt.check_scale_up()
        return "done"

    seen, events = _attempts_on_two_ready_slices(rt, client, attempt)
    assert seen == [[0, 1], [0], [0, 1]]
    assert [type(e).__name__ for e in events] == ["SliceDownError", "ScaleUpSignalError"]
    assert client.status().recoveries == {"slice_down": 1, "scale_up": 1}  # the operator's status.recoveries
    metrics = client.metrics_text()
    assert 'elastic_jax_recoveries_total{cause="slice_down"} 1.0' in metrics
    assert 'elastic_jax_recoveries_total{cause="scale_up"} 1.0' in metrics


def test_a_slice_down_and_ready_again_between_two_steps_is_a_loss_not_a_scale_up(runtime):
    """Slice 1 of the attempt reported Down and then Ready again (a replaced worker) before the loop's next
    step boundary: both reports held by a frozen or starved controller land together, or the loop is
    slow to its next step. `check_scale_up` saw a short mesh with a Ready slice outside and raised the
    scale-up signal, booking the loss as a planned `scale_up` (no recovery, no restart budget, device
    state not marked lost); it is the attempt's slice loss, as `map_sum` raises it."""
    rt, client = runtime

    def attempt(n):
        rt.check_scale_up()
        if n == 1:
            client.report_slice(1, "Down", time.time_ns(), reason="worker killed")
            _ready(client, 1)
            rt.check_scale_up()  # the next step boundary
        return "done"

    seen, events = _attempts_on_two_ready_slices(rt, client, attempt)
    assert seen == [[0, 1], [0, 1]]  # the retry takes the replaced slice at once
    assert [type(e).__name__ for e in events] == ["SliceDownError"], events
    assert "slices [1] went down since this attempt began" in str(events[0])
    assert client.status().recoveries == {"slice_down": 1}


def test_elastic_retry_stops_on_the_restart_budget_and_passes_user_errors(runtime):
    rt, client = runtime
    _ready(client, 0)
    _ready(client, 1)

    @rt.elastic_retry()
    def always_lost():
        raise elastic_jax.SliceDownError("lost again", [0])

    def put_back():  # the supervisor replaces the slice each time
        while not rt.stop_requested.is_set():
            for index in {0, 1} - rt.slice_set.ready():
                _ready(client, index)
            rt.stop_requested.wait(0.05)

    helper = threading.Thread(target=put_back, daemon=True)
    helper.start()
    try:
        with pytest.raises(elastic_jax.ElasticRuntimeError):  # spec.elasticity.maxRestarts: 3
            always_lost()
    finally:
        rt.stop_requested.set()
        helper.join()

    @rt.elastic_retry()
    def bug():
        raise ZeroDivisionError("user bug")

    rt.stop_requested.clear()
    with pytest.raises(ZeroDivisionError):
        bug()


def test_wait_for_slices_ends_on_stop(runtime):
    rt, client = runtime

    @rt.elastic_retry()
    def train():
        raise AssertionError("must not run without slices")

    timer = threading.Timer(0.2, lambda: client.stop("Ctrl-C"))
    timer.start()
    try:
        with pytest.raises(elastic_jax.StopRequested):
            train()
    finally:
        timer.join()


def test_map_sum_needs_the_cpu_backend(runtime):
    rt, _ = runtime
    with pytest.raises(RuntimeError, match="cpu backend"):
        rt.map_sum(lambda p, b: p, {}, {})


def test_connect_reads_the_environment_and_names_what_is_missing(tmp_path):
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump(_job()))
    token = tmp_path / "token"
    token.write_text(TOKEN)
    with pytest.raises(RuntimeConfigError, match=contract.ENV_MANIFEST):
        connect({})
    with pytest.raises(RuntimeConfigError, match="token"):
        connect({contract.ENV_MANIFEST: str(manifest)})
    with pytest.raises(RuntimeConfigError, match=contract.ENV_PORT):
        connect({contract.ENV_MANIFEST: str(manifest), contract.ENV_TOKEN_FILE: str(token),
                 contract.ENV_PORT: "http"})
    with pytest.raises(RuntimeConfigError, match="spec"):
        bad = tmp_path / "bad.yaml"
        bad.write_text(yaml.safe_dump({**_job(), "spec": {"slices": {"count": 0}}}))
        connect({contract.ENV_MANIFEST: str(bad), contract.ENV_TOKEN_FILE: str(token)})
    rt = connect({contract.ENV_MANIFEST: str(manifest), contract.ENV_TOKEN_FILE: str(token),
                  contract.ENV_HOST: "127.0.0.1", contract.ENV_PORT: "0"})
    client = ControlClient(f"http://127.0.0.1:{rt.port}", TOKEN)
    try:
        assert client.status().desired_slices == 2
    finally:
        close_read_by_a_supervisor(rt, client)
        client.close()


def test_import_elastic_jax_loads_no_jax_until_the_library_is_used():
    import subprocess
    import sys

    code = ("import sys, elastic_jax; assert 'jax' not in sys.modules, 'jax loaded'; "
            "from elastic_jax.controller.runtime import connect; assert elastic_jax.connect is connect; "
            "assert elastic_jax.SliceDownError.__module__.endswith('elastic.errors')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def _summary_run(tmp_path, steps_done, error=None, stop=None):
    job = _job()
    job["spec"]["training"]["steps"] = 3
    path = tmp_path / "summary.json"
    rt = Runtime(parse_manifest(job), TOKEN, host="127.0.0.1", port=0, summary_file=str(path)).start()
    for i in range(2):
        rt.slice_set.apply_report(i, SliceReport(state="Ready", generation=1, addresses=[f"10.0.0.{i}:8471"]))
    calls = {"n": 0}

    @rt.elastic_retry()
    def train():
        calls["n"] += 1
        while rt.step < steps_done:
            if rt.step == 1 and calls["n"] == 1:
                raise elastic_jax.SliceDownError("DATA_LOSS: slice 1 lost", [1])
            rt.report_step(rt.step + 1, 2.0 / (rt.step + 1))

    train()
    if stop:
        rt._on_stop("test", requested=stop == "requested")
    rt.close(error)
    return json.loads(path.read_text()), rt.status()


def test_close_writes_the_built_in_summary_from_the_librarys_books(tmp_path):
    s, status = _summary_run(tmp_path, 3)
    assert s["succeeded"] and s["exit_code"] == ControllerExit.SUCCEEDED and s["steps"] == 3
    assert s["initial_loss"] == 2.0 and s["final_loss"] == pytest.approx(2.0 / 3)
    assert [(r["cause"], r["slices"], r["at_step"]) for r in s["recoveries"]] == [("slice_down", [1], 1)]
    assert s["recoveries"][0]["seconds"] is not None and s["goodput"] is not None
    assert s["steps_lost"] is None  # not measured: the user's loop owns its state (printed "n/a")
    assert status.phase == "Succeeded" and status.recovery_history[0].cause == "slice_down"
    assert status.initial_loss == 2.0 and status.recoveries == {"slice_down": 1}


def test_close_before_the_last_step_is_not_a_success(tmp_path):
    s, status = _summary_run(tmp_path, 2, error=ValueError("boom"))
    assert not s["succeeded"] and s["exit_code"] == ControllerExit.FAILED and "boom" in s["failure_reason"]
    assert status.phase == "Failed"
    s, status = _summary_run(tmp_path, 2, stop="requested")
    assert not s["succeeded"] and s["exit_code"] == ControllerExit.STOPPED and s["stop"] == "requested"
    assert status.phase == "Stopped"


def test_a_signal_stops_the_runtime_through_the_forwarding_thread(runtime):
    import os
    import signal

    rt, client = runtime
    errors = []
    t = threading.Thread(target=lambda: _catch(rt.install_signal_handlers, errors))
    t.start()
    t.join()
    assert errors and "main thread" in str(errors[0])
    saved = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        rt.install_signal_handlers()
        os.kill(os.getpid(), signal.SIGHUP)
        assert rt.stop_requested.wait(30)  # set by the helper thread, not inside the handler
        assert rt.stop_exit_code == ControllerExit.RESTART
        client.stop("suspend")  # the user's intent is known: it overrides the earlier signal
        assert rt.stop_exit_code == ControllerExit.STOPPED
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)


def _catch(fn, errors):
    try:
        fn()
    except ValueError as e:
        errors.append(e)


def test_an_exit_code_given_to_close_decides_the_outcome(tmp_path):
    # run_module's case: MaxText never calls report_step; its exit code 0 is the success.
    path = tmp_path / "summary.json"
    rt = Runtime(parse_manifest(_job()), TOKEN, host="127.0.0.1", port=0, summary_file=str(path)).start()
    rt.close(exit_code=0)
    s = json.loads(path.read_text())
    assert s["succeeded"] and s["exit_code"] == 0 and s["steps"] == 0 and rt.status().phase == "Succeeded"


def test_no_progress_inside_elastic_retry_makes_healthz_503_with_the_watchdogs_reason(runtime, caplog):
    import httpx

    from elastic_jax.controller.watchdog import ProgressWatchdog

    rt, client = runtime
    clock = [0.0]
    rt.watchdog = ProgressWatchdog(100.0, clock=lambda: clock[0])
    _ready(client, 0)
    _ready(client, 1)
    health = f"http://127.0.0.1:{rt.port}/healthz"
    assert rt.stall_reason() is None  # phase Starting: not watched (restoring, compiling)
    answers = []

    @rt.elastic_retry()
    def train():
        rt.report_step(3)
        assert rt.stall_reason() is None  # the clock starts at the step
        clock[0] = 150.0
        answers.extend(httpx.get(health) for _ in range(2))
        rt.report_step(4)  # progress: healthy again
        answers.append(httpx.get(health))

    train()
    assert [a.status_code for a in answers] == [503, 503, 200]
    stalled = [r for r in caplog.records if getattr(r, "event", None) == "stalled"]
    assert len(stalled) == 1 and "progressTimeoutSeconds=100" in stalled[0].getMessage()  # logged once
    assert "after step 3" in stalled[0].getMessage()


def test_check_finite_stops_on_a_nan_loss_or_state_naming_the_step(runtime):
    import jax.numpy as jnp

    rt, _ = runtime
    rt.check_finite(5, loss=0.5, state={"w": jnp.ones(3), "n": jnp.asarray(1)})
    with pytest.raises(FloatingPointError, match="loss is nan at step 5"):
        rt.check_finite(5, loss=float("nan"))
    with pytest.raises(FloatingPointError, match="update of step 6 .*non-finite"):
        rt.check_finite(6, loss=0.5, state={"w": jnp.asarray([1.0, jnp.inf])})


def test_stop_state_a_request_overrides_a_signal_and_a_signal_never_downgrades_a_request():
    from elastic_jax.controller.signals import StopState

    stop = StopState()
    assert stop.exit_code is None
    stop.note("SIGTERM", requested=False)
    assert (stop.kind, stop.reason, stop.exit_code) == ("signal", "SIGTERM", ControllerExit.RESTART)
    stop.note("suspend", requested=True)
    stop.note("SIGHUP", requested=False)
    assert (stop.kind, stop.reason, stop.exit_code) == ("requested", "suspend", ControllerExit.STOPPED)


class _FakeBackend:
    """A backend with the hooks a host brings (`Backend`'s `visible_slices`, `prepare`); records interrupts."""

    keeps_state_on_slice_loss = True

    def __init__(self):
        self.interrupted = 0
        self.prepared: list[frozenset[int]] = []

    def health_check(self, indices):
        return frozenset(indices)

    def visible_slices(self):
        return frozenset({0})  # slice 1 has no devices yet

    def prepare(self, indices):
        self.prepared.append(frozenset(indices))
        return frozenset()  # nothing warmed yet

    def interrupt(self):
        self.interrupted += 1

    def cleanup(self):
        pass


def _hosted(tmp_path, backend=None):
    from elastic_jax.controller.checkpointing import Checkpointer
    from elastic_jax.controller.elastic.slice_set import SliceSet
    from elastic_jax.controller.metrics import ControllerMetrics
    from elastic_jax.controller.runtime import HostParts

    job = parse_manifest(_job())
    parts = HostParts(SliceSet(2), ControllerMetrics(), backend or _FakeBackend(),
                      Checkpointer(str(tmp_path / "ckpt"), 10, 2), started_at=time.monotonic() - 5.0)
    return Runtime(job, "", host_parts=parts), parts


def test_an_embedded_runtime_runs_on_the_hosts_parts_and_serves_nothing(tmp_path):
    # The built-in trainer's TrainingRun holds a Runtime over what controller/main.py built.
    rt, parts = _hosted(tmp_path)
    try:
        assert rt.slice_set is parts.slice_set and rt.metrics is parts.metrics
        assert rt.checkpoints.checkpointer is parts.checkpointer  # no second Orbax location opened
        assert rt.record.ledger.seconds()["starting"] >= 5.0  # the host's start time
        with pytest.raises(RuntimeConfigError, match="embedded"):
            rt.start()
        # The host backend's hooks are the manager's: a Ready slice without devices does not join,
        # the visible ones are prepared before they may.
        for i in range(2):
            rt.slice_set.apply_report(i, SliceReport(state="Ready", generation=time.time_ns(), addresses=[f"a:{i}"]))
        assert rt.manager.available_inactive_slices() == frozenset()
        assert parts.backend.prepared == [frozenset({0})]
        rt.request_stop("SIGTERM", requested=False)
        assert rt.stop_requested.is_set() and parts.backend.interrupted == 1
        assert rt.stop_exit_code == ControllerExit.RESTART
    finally:
        parts.checkpointer.close()


def test_set_phase_rewind_and_a_precomputed_finite_check(tmp_path):
    rt, parts = _hosted(tmp_path)
    try:
        rt.set_phase("Running")
        rt.report_step(5, loss=2.0)
        assert rt.snapshot().phase == "Running" and rt.snapshot().step == 5
        assert rt.rewind(3) == 2 and rt.step == 3  # pathways: state after step 3 went down with a slice
        rt.report_step(4, loss=1.9)  # continues from there
        with pytest.raises(ValueError, match="rewind"):
            rt.rewind(9)
        with pytest.raises(FloatingPointError, match="step 5"):
            rt.check_finite(5, 1.0, finite=False)  # the finiteness a jitted update computed
        rt.check_finite(5, 1.0, finite=True)
        rt.set_phase("Stopped", "stopped on request (suspend) at step 4")
        s = rt.snapshot()
        assert (s.phase, s.failure_reason) == ("Stopped", "stopped on request (suspend) at step 4")
    finally:
        parts.checkpointer.close()


def test_a_first_step_that_fails_while_it_compiles_books_starting_not_productive(runtime):
    """Issue 11 (status truth, session 10's trial): the seconds of a first step that failed (its program
    compiling) and of its retry were booked `productive`, then `recovering`, before any step completed.
    Until the first completed step it is all `starting`; productive time starts after that step."""
    rt, client = runtime
    _ready(client, 0)
    _ready(client, 1)
    attempts = []

    @rt.elastic_retry()
    def train():
        attempts.append(sorted(rt.active_slices))
        time.sleep(0.4)  # the first step compiles ...
        if len(attempts) == 1:
            raise elastic_jax.SliceDownError("slice 1 lost in the first step", [1])
        rt.report_step(1, 2.0)  # ... the retried one completes
        time.sleep(0.2)

    train()
    seconds = client.status().goodput_seconds
    assert seconds["starting"] >= 0.8, seconds
    assert seconds["recovering"] == 0.0 and seconds["productive"] < 0.6, seconds
