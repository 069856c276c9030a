"""Each job's reconcile daemon sleeps until something its pass reads changed (issue 12 item 4).

The per-job 1 s timer woke kopf's timer machinery 60 times a minute per healthy job; the daemon
(`handlers.reconcile_job`) waits on the job's `wake.Waker`, woken by the job's object, pods, JobSets,
the not-Ready nodes and its controller link's news. Here: the `Waker` itself, the schedule, the
tracker's news (a failed exchange is always news; an answer the same as the last is none), and the
daemon with the pass and kopf's patch step stood in for: it sleeps out a quiet job's window and runs
its pass when a pod event wakes it.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from elastic_jax.api import labels as lbl
from elastic_jax.api.client import ControlApiError
from elastic_jax.api.control import ControllerStatus
from elastic_jax.k8s_operator import handlers, operator_state, tracker as tracker_mod, wake
from elastic_jax.k8s_operator.job_state import JobState
from elastic_jax.k8s_operator.tracker import JobTracker
from tests.support.fake_kube import FakeKube

STATUS = {"phase": "Running", "step": 3, "totalSteps": 10, "desiredSlices": 1, "minSlices": 1, "activeSlices": [0],
          "inactiveSlices": [], "slices": [], "pid": 7, "version": 5}


def test_a_wake_before_the_wait_returns_at_once_and_wakes_coalesce():
    waker = wake.Waker()

    async def run():
        waker.wake()
        waker.wake()
        return await waker.wait(0), await waker.wait(0)

    assert asyncio.run(run()) == (True, False)  # two wakes, one pass


def test_a_wake_from_another_thread_ends_a_wait_in_progress():
    waker = wake.Waker()

    async def run():
        loop = asyncio.get_running_loop()
        # (runs once the wait below has started: the cross-thread path, not a pending wake)
        loop.call_soon(lambda: threading.Thread(target=waker.wake).start())
        return await waker.wait(600)  # (the bound only ends a broken test)

    assert asyncio.run(run()) is True


def test_a_stop_ends_the_wait_unwoken():
    waker = wake.Waker()

    async def run():
        stop = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(stop.set_result, None)
        return await waker.wait(600, stop)

    assert asyncio.run(run()) is False


def test_the_schedule_a_quiet_job_sleeps_its_window_a_busy_one_the_pass_interval():
    assert wake.next_pass_delay(100.0, None, None) == 0.0  # first pass: at once
    assert wake.next_pass_delay(100.0, 99.5, None) == pytest.approx(wake.PASS_INTERVAL_S - 0.5)
    assert wake.next_pass_delay(100.0, 99.0, 125.0) == 25.0  # quiet: the rest of its window, not 1 s
    assert wake.next_pass_delay(130.0, 99.0, 125.0) == 0.0  # window over: the resync pass
    assert wake.woken_pass_delay(100.0, 99.95) == pytest.approx(wake.MIN_PASS_GAP_S - 0.05)
    assert wake.woken_pass_delay(100.0, None) == 0.0



def test_the_quiet_resync_doubles_while_nothing_moves_up_to_its_bound():
    assert tracker_mod.next_resyncs(None, True) == 0  # the pass before was not quiet: the first window
    assert tracker_mod.next_resyncs(0, False) == 0  # something moved: back to the first window
    assert tracker_mod.next_resyncs(3, False) == 0
    assert tracker_mod.next_resyncs(0, True) == 1  # a resync that found nothing: the next window doubles
    assert tracker_mod.next_resyncs(3, True) == 4
    windows = [tracker_mod.resync_window_s(n) for n in range(6)]
    assert windows == [30.0, 60.0, 120.0, 240.0, 240.0, 240.0]
    assert tracker_mod.resync_window_s(10_000) == tracker_mod.QUIET_RESYNC_MAX_S  # no overflow


def test_a_quiet_jobs_window_backs_off_across_resyncs_and_resets_when_its_inputs_move():
    t = JobTracker("ns", "j", 1, 1)
    calm, moved = ("rv-1", (), (), 0, "c", "c", False), ("rv-2", (), (), 0, "c", "c", False)
    now = 0.0
    t.settle(calm, True, now)
    expected = [30.0, 60.0, 120.0, 240.0, 240.0]
    for window in expected:  # each resync (the window ran out, same inputs) finds it quiet again
        assert t.quiet_until() == now + window
        assert t.quiet(calm, now + window - 0.01) and not t.quiet(calm, now + window)
        now += window
        t.settle(calm, True, now)
    assert t.quiet_until() == now + 240.0
    # a pod, the job object, the controller's news ...: other inputs; that pass is quiet, the window starts over
    assert not t.quiet(moved, now + 1)
    t.settle(moved, True, now + 1)
    assert t.quiet_until() == now + 1 + 30.0
    # a pass that was not quiet (it wrote, created or found a slice down) forgets the window altogether
    t.settle(moved, False, now + 2)
    assert t.quiet_until() is None and not t.quiet(moved, now + 2)
    t.settle(moved, True, now + 3)
    assert t.quiet_until() == now + 3 + 30.0

class _Client:
    """A stand-in for the controller's HTTP API: the answers the test scripts, in order."""

    def __init__(self, answers):
        self.answers = list(answers)

    def status(self, after=None, wait_s=0.0):
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return ControllerStatus.model_validate(answer)

    def close(self):
        pass


def _job_with(answers) -> tuple[JobState, JobTracker]:
    t = JobTracker("ns", "j", 1, 1)
    js = JobState("ns", "j", "uid-j", "", t)  # (wires the tracker's news to the job's waker)
    t.client, t.controller_uid = _Client(answers), "ctrl-uid"
    return js, t


def _woken(js: JobState) -> bool:
    return asyncio.run(js.waker.wait(0))


def test_the_links_news_wakes_the_pass_and_an_unchanged_answer_does_not():
    js, t = _job_with([STATUS, STATUS, {**STATUS, "version": 6, "step": 4},
                       ControlApiError("connection refused", kind=ControlApiError.UNREACHABLE)])
    t.poll_status()
    assert _woken(js) and t.answers == 1  # the first answer
    t.poll_status()
    assert not _woken(js) and t.answers == 1  # a long poll's end, the same status: no pass
    t.poll_status()
    assert _woken(js) and t.answers == 2  # a new version
    t.poll_status()  # the controller died (SIGKILL: the connection refused): the pass at once
    assert _woken(js) and t.answers == 3 and t.poll_result is None


class _Stopped:
    """kopf's `stopped` for an async daemon: falsy until set; `wait(timeout)` awaits the stop."""

    def __init__(self):
        self.event = asyncio.Event()

    def __bool__(self):
        return self.event.is_set()

    async def wait(self, timeout=None):
        try:
            await asyncio.wait_for(self.event.wait(), timeout)
        except asyncio.TimeoutError:
            pass


def _daemon_job():
    """(state, memo, body) of one job `ns/j` for a test that runs its reconcile daemon."""
    state = operator_state.OperatorState(kube=FakeKube(), key=b"k" * 32)
    state.kopf_settings = handlers.kopf.OperatorSettings()
    return state, {"elasticjax": state}, {"metadata": {"name": "j", "namespace": "ns", "uid": "uid-j"}}


def test_the_daemon_sleeps_out_a_quiet_jobs_window_and_a_pod_event_runs_its_pass(monkeypatch):
    state, memo, body = _daemon_job()
    waits: list[float] = []
    passes: list[int] = []
    stop: list[_Stopped] = []

    async def one_pass(**kwargs):
        if not passes:  # the first pass makes the job's state, and finds it quiet
            t = JobTracker("ns", "j", 1, 1, clock=state.clock)
            state.jobs.add(JobState("ns", "j", "uid-j", "", t))
            t.settle(("inputs",), True, state.clock.monotonic())
        passes.append(1)
        if len(passes) == 2:
            stop[0].event.set()

    real_wait = wake.Waker.wait

    async def recorded_wait(self, timeout_s, stop=None):
        waits.append(timeout_s)
        # the daemon now sleeps: a worker pod of the job changes
        asyncio.get_running_loop().call_soon(lambda: asyncio.ensure_future(handlers.job_pod_event(
            namespace="ns", labels={lbl.JOB_NAME: "j", lbl.JOB_UID: "uid-j"}, memo=memo)))
        return await real_wait(self, timeout_s, stop)

    monkeypatch.setattr(handlers, "reconcile_once", one_pass)
    monkeypatch.setattr(wake.Waker, "wait", recorded_wait)

    async def run():
        stop.append(_Stopped())
        await asyncio.wait_for(handlers.reconcile_job(
            body=body, namespace="ns", name="j", memo=memo, stopped=stop[0], resource=None,
            logger=handlers._logger, patch=handlers.kopf.Patch()), 600)  # (the bound only ends a broken test)

    asyncio.run(run())
    assert len(passes) == 2  # the first pass, then the one the pod event woke
    # quiet: it slept for (most of) the resync window, not the old timer's 1 s
    assert len(waits) == 1 and waits[0] > wake.PASS_INTERVAL_S


def test_the_patch_kopf_applies_when_the_daemon_returns_holds_nothing_already_written(monkeypatch):
    """kopf writes the daemon's `patch` kwarg once more after the daemon returns (an operator stop). Two trials:
    an operator restarted twice soon after a job's creation counted every step lost, because the stop wrote the
    first pass's status again (Pending conditions, slices Provisioning, counterBase without the controller's
    UID) over the live one. Each pass's patch is written by the daemon itself (through its `Kube`); kopf's is
    left empty."""
    state, memo, body = _daemon_job()
    written = state.kube.status_patches
    stop: list[_Stopped] = []

    async def one_pass(patch, **kwargs):
        patch.status["step"] = len(written)  # each pass's status
        if len(written) == 2:
            stop[0].event.set()

    monkeypatch.setattr(handlers, "reconcile_once", one_pass)
    kopfs = handlers.kopf.Patch()

    async def run():
        stop.append(_Stopped())
        await asyncio.wait_for(handlers.reconcile_job(
            body=body, namespace="ns", name="j", memo=memo, stopped=stop[0], resource=None,
            logger=handlers._logger, patch=kopfs), 600)

    asyncio.run(run())
    assert [w["status"]["step"] for w in written] == [0, 1, 2]  # every pass written, by the daemon
    assert not kopfs, kopfs  # before: {'status': {'step': 0}}, the first pass's status, written again at exit


def test_the_job_object_and_a_change_in_the_not_ready_nodes_wake_the_pass():
    state = operator_state.OperatorState(kube=object(), key=b"k" * 32)
    memo = {"elasticjax": state}
    js = state.jobs.add(JobState("ns", "j", "uid-j", "", JobTracker("ns", "j", 1, 1)))
    asyncio.run(handlers.job_event(namespace="ns", name="j", uid="uid-old", memo=memo))
    assert not _woken(js)  # an earlier job of the name: not this one's news
    asyncio.run(handlers.job_event(namespace="ns", name="j", uid="uid-j", memo=memo))
    assert _woken(js)
    asyncio.run(handlers.node_event(memo=memo, unready_nodes={"node-a": ["view"]}))
    assert _woken(js)  # a node went not Ready: every job's pass reads the lost nodes
    asyncio.run(handlers.node_event(memo=memo, unready_nodes={"node-a": ["view"]}))
    assert not _woken(js)  # a heartbeat of the same node: no news
    asyncio.run(handlers.node_event(memo=memo, unready_nodes={}))
    assert _woken(js)  # Ready again


def test_a_new_controllers_first_step_wakes_the_pass_within_its_long_poll_not_at_its_end():
    """Session 12's trial: STEP and ACTIVE lagged a resume by 8-10 s. The operator's half of that path, with the
    job's real link threads (`ControllerLink`) and a controller that holds each long poll until its status
    changes: the new controller is asked at once, and each change (its first step among them) wakes the pass
    within a poll pause (`MIN_POLL_INTERVAL_S`), not at the end of the 25 s wait."""
    import time

    from elastic_jax.k8s_operator import controller_link
    from elastic_jax.k8s_operator.slices import pod_view

    status = {**STATUS, "phase": "Starting", "step": 0, "activeSlices": [], "inactiveSlices": [0], "version": 1}
    changed = threading.Condition()

    class LongPolling:
        def __init__(self, url, token):
            pass

        def status(self, after=None, wait_s=0.0, **_):
            end = time.monotonic() + wait_s
            with changed:
                while after is not None and status["version"] == after and time.monotonic() < end:
                    changed.wait(end - time.monotonic())
                return ControllerStatus.model_validate(status)

        def report_slice(self, *args, **kwargs):
            pass

        def close(self):
            pass

    t = JobTracker("ns", "j", 1, 1, client_factory=LongPolling, background=True)
    woken: list[float] = []
    t.on_news = lambda: woken.append(time.monotonic())
    t.token = "token"
    try:
        t.set_controller(pod_view({"metadata": {"name": "j-controller-1", "uid": "c1", "labels": {}},
                                   "status": {"phase": "Running", "podIP": "10.0.0.1"}}))
        deadline = time.monotonic() + 10
        while not woken and time.monotonic() < deadline:
            time.sleep(0.01)
        assert woken, "the new controller was not asked at once"
        for change in ({"phase": "Running", "activeSlices": [0], "inactiveSlices": []}, {"step": 1}):
            time.sleep(controller_link.MIN_POLL_INTERVAL_S + 0.2)  # (the watch is inside its long poll now)
            before = len(woken)
            with changed:
                status.update(change, version=status["version"] + 1)
                changed.notify_all()
                at = time.monotonic()
            while len(woken) == before and time.monotonic() < at + 10:
                time.sleep(0.01)
            assert len(woken) > before and woken[before] - at < 3.0, (change, woken, at)
        assert t.refresh_status().step == 1 and t.refresh_status().active_slices == [0]
    finally:
        t.close()
