"""The slice tracker: transitions become Events and controller reports, re-sent to a new controller."""

from __future__ import annotations

import dataclasses

from elastic_jax.api.client import ControlApiError
from elastic_jax.api.control import ControllerStatus, SliceStatus
from elastic_jax.k8s_operator.tracker import JobTracker
from tests.support.pod_views import controller_view, worker_view


class FakeClient:
    """Records reports; `down` makes it unreachable (a unit-test stand-in for ControlClient)."""

    def __init__(self, url, token):
        self.url, self.token, self.reports, self.down = url, token, [], False

    def report_slice(self, index, state, generation, addresses, reason, retries, backoff_s):
        if self.down:
            raise ControlApiError("unreachable")
        self.reports.append((index, state, generation, tuple(addresses)))

    def status(self, after=None, wait_s=0.0):
        if self.down:
            raise ControlApiError("GET /v1/status: timed out")  # (no status code: UNREACHABLE)
        return ControllerStatus(phase="Running", step=3, total_steps=9, desired_slices=2, min_slices=1,
                                active_slices=[0, 1], inactive_slices=[], slices=[], pid=1)

    def close(self):
        pass


def _worker(i, name, phase="Running", ready=True, exit_code=None, attempt=0):
    return worker_view(name, i, attempt=attempt, phase=phase, ready=ready, ip=f"127.0.10.{i + 2}", exit_code=exit_code)


def _ctrl(uid):
    return controller_view(name=f"c-{uid}", uid=uid, ip="127.0.11.2")


def _tracker():
    clients = []
    t = JobTracker("ns", "job", 2, 1, client_factory=lambda u, tok: clients.append(FakeClient(u, tok)) or clients[-1])
    t.token = "tok"
    return t, clients


def test_down_then_ready_reach_the_controller_with_increasing_generations():
    from elastic_jax.k8s_operator import metrics

    replaced = metrics.SLICE_REPLACEMENTS._value.get()
    t, clients = _tracker()
    events = []
    t.set_controller(_ctrl("u1"))
    t.sync([_worker(0, "a"), _worker(1, "b")], lambda *e: events.append(e))
    t.sync([_worker(0, "a", "Failed", False, 137), _worker(1, "b")], lambda *e: events.append(e))
    t.sync([_worker(0, "a2", attempt=1), _worker(1, "b")], lambda *e: events.append(e))
    reports = [(i, s) for i, s, _, _ in clients[0].reports]
    assert reports == [(0, "Ready"), (1, "Ready"), (0, "Down"), (0, "Ready")]
    generations = [g for i, _, g, _ in clients[0].reports if i == 0]
    assert generations == sorted(generations) and len(set(generations)) == 3
    assert clients[0].url == "http://127.0.11.2:8080"
    assert ("Warning", "SliceDown", "slice 0 Ready -> Down: pod a: exit code 137") in events
    assert metrics.SLICE_REPLACEMENTS._value.get() == replaced + 1


def test_unreachable_controller_is_retried_on_the_next_sync():
    t, clients = _tracker()
    t.set_controller(_ctrl("u1"))
    clients[0].down = True
    t.sync([_worker(0, "a"), _worker(1, "b")], lambda *e: None)
    assert clients[0].reports == []
    clients[0].down = False
    t.sync([_worker(0, "a"), _worker(1, "b")], lambda *e: None)
    assert [(i, s) for i, s, _, _ in clients[0].reports] == [(0, "Ready"), (1, "Ready")]
    t.sync([_worker(0, "a"), _worker(1, "b")], lambda *e: None)
    assert len(clients[0].reports) == 2, "acknowledged states are not re-sent"


def test_a_new_controller_process_is_told_everything_again():
    t, clients = _tracker()
    t.set_controller(_ctrl("u1"))
    t.sync([_worker(0, "a"), _worker(1, "b")], lambda *e: None)
    t.set_controller(_ctrl("u2"))
    t.sync([_worker(0, "a"), _worker(1, "b")], lambda *e: None)
    assert [(i, s) for i, s, _, _ in clients[1].reports] == [(0, "Ready"), (1, "Ready")]


def test_slice_the_controller_saw_fail_is_flagged_for_replacement():
    t, clients = _tracker()
    t.set_controller(_ctrl("u1"))
    t.sync([_worker(0, "a"), _worker(1, "b")], lambda *e: None)
    gen0 = clients[0].reports[0][2]
    status = ControllerStatus(phase="Recovering", step=3, total_steps=9, desired_slices=2, min_slices=1,
                              active_slices=[1], inactive_slices=[0],
                              slices=[SliceStatus(index=0, state="Down", generation=gen0),
                                      SliceStatus(index=1, state="Active", generation=clients[0].reports[1][2])], pid=1)
    assert t.slices_down_by_controller(status) == [0]
    stale = status.model_copy(update={"slices": [SliceStatus(index=0, state="Down", generation=gen0 - 1)]})
    assert t.slices_down_by_controller(stale) == []


def test_a_controller_being_stopped_by_a_suspend_is_still_polled():
    t, clients = _tracker()
    stopping = dataclasses.replace(_ctrl("u1"), deleting=True)
    t.set_controller(stopping)
    assert t.client is None and t.controller_uid == ""  # a deleted controller pod is no longer the job's
    t.set_controller(stopping, stopping=True)
    assert t.client is clients[-1] and t.controller_uid == "u1"  # ... unless a suspend stops it: read until it exits


def test_a_down_about_the_pods_before_a_replacement_not_yet_told_replaces_nothing():
    """Trial: slice 0's worker was SIGKILLed while the controller was frozen; the operator's Down and the
    replacement's Ready both timed out; once it ran again the controller held slice 0 Down at the generation
    of the old pod, and the operator deleted the fresh, healthy replacement (two replacements for one loss).
    The replacement here even has the old pod's address."""
    t, clients = _tracker()
    t.set_controller(_ctrl("u1"))
    t.sync([_worker(0, "a"), _worker(1, "b")], lambda *e: None)
    gen0 = clients[0].reports[0][2]
    clients[0].down = True  # frozen
    t.sync([_worker(0, "a", "Failed", False, 137), _worker(1, "b")], lambda *e: None)
    t.sync([_worker(0, "a2", attempt=1), _worker(1, "b")], lambda *e: None)
    clients[0].down = False
    saw_old_pod_fail = ControllerStatus(phase="Recovering", step=3, total_steps=9, desired_slices=2, min_slices=1,
                                        active_slices=[1], inactive_slices=[0],
                                        slices=[SliceStatus(index=0, state="Down", generation=gen0)], pid=1)
    assert t.slices_down_by_controller(saw_old_pod_fail) == []
    t.sync([_worker(0, "a2", attempt=1), _worker(1, "b")], lambda *e: None)  # the replacement's Ready arrives
    new_gen = clients[0].reports[-1][2]
    assert clients[0].reports[-1][:2] == (0, "Ready") and new_gen > gen0
    assert t.slices_down_by_controller(saw_old_pod_fail) == []  # older than the Ready it accepted: stale
    saw_new_pod_fail = saw_old_pod_fail.model_copy(
        update={"slices": [SliceStatus(index=0, state="Down", generation=new_gen)]})
    assert t.slices_down_by_controller(saw_new_pod_fail) == [0]


def test_a_newer_down_from_another_reporter_is_flagged_too():
    """The supervision core's replace rule: a Down above our accepted Ready's generation (someone else's)
    leaves the controller without the slice until a newer Ready; before, the operator waited forever."""
    t, clients = _tracker()
    t.set_controller(_ctrl("u1"))
    t.sync([_worker(0, "a"), _worker(1, "b")], lambda *e: None)
    gen0 = clients[0].reports[0][2]
    status = ControllerStatus(phase="Recovering", step=3, total_steps=9, desired_slices=2, min_slices=1,
                              active_slices=[1], inactive_slices=[0],
                              slices=[SliceStatus(index=0, state="Down", generation=gen0 + 1)], pid=1)
    assert t.slices_down_by_controller(status) == [0]


def test_reports_go_out_without_the_trackers_lock_held():
    """HTTP to the controller (seconds with retries) must not block the other path (pod events vs the
    1 s timer) on the tracker's lock."""
    import threading

    t, clients = _tracker()
    t.set_controller(_ctrl("u1"))
    held = []

    def report_slice(index, state, generation, addresses, reason, retries, backoff_s):
        other = []

        def try_lock():  # from another thread, as the other handler would
            got = t.lock.acquire(blocking=False)
            if got:
                t.lock.release()
            other.append(got)

        thread = threading.Thread(target=try_lock)
        thread.start()
        thread.join()
        held.append(not other[0])
        clients[0].reports.append((index, state, generation, tuple(addresses)))

    clients[0].report_slice = report_slice
    t.sync([_worker(0, "a"), _worker(1, "b")], lambda *e: None)
    assert held == [False, False]
    assert [t.slices[i].acked[1] for i in (0, 1)] == ["Ready", "Ready"]


def test_generations_of_one_slice_increase_even_when_the_clock_does_not(monkeypatch):
    """The operator used `time.time_ns()` alone: two reports in one clock tick had one generation and
    the controller dropped the second as stale."""
    t, clients = _tracker()
    t.set_controller(_ctrl("u1"))
    monkeypatch.setattr("elastic_jax.supervision.slice_state.time.time_ns", lambda: 1_000)
    t.sync([_worker(0, "a"), _worker(1, "b")], lambda *e: None)
    t.sync([_worker(0, "a", "Failed", False, 137), _worker(1, "b")], lambda *e: None)
    gens = [g for i, _, g, _ in clients[0].reports if i == 0]
    assert gens == [1_000, 1_001]


def test_a_controller_that_answered_then_stops_answering_is_unresponsive_after_the_grace_until_it_answers():
    """Timeouts of a controller that answered before (the trial: SIGSTOPped) are news, its polls' and reports'."""
    import time

    from elastic_jax.k8s_operator import tracker as tracker_module

    grace = tracker_module.UNRESPONSIVE_GRACE_S
    t, clients = _tracker()
    t.set_controller(_ctrl("u1"))
    assert t.poll_status() is not None
    clients[0].down = True
    assert t.poll_status() is None
    assert t.unresponsive_message(time.monotonic()) is None, "within the grace: no news"
    message = t.unresponsive_message(time.monotonic() + grace + 1)
    assert message is not None and "has not answered for" in message and "timed out" in message
    clients[0].down = False
    t.sync([_worker(0, "a"), _worker(1, "b")], lambda *e: None)  # a report answered: responsive again
    assert t.unresponsive_message(time.monotonic() + grace + 1) is None
    clients[0].down = True
    t.sync([_worker(0, "a", "Failed", False, 137), _worker(1, "b")], lambda *e: None)  # a failed report counts
    assert t.unresponsive_message(time.monotonic() + grace + 1) is not None
    t.set_controller(_ctrl("u2"))  # a new controller starts afresh
    assert t.unresponsive_message(time.monotonic() + grace + 1) is None


def test_an_unresponsive_spell_ends_as_answered_or_as_its_controller_gone():
    """The condition's clearing said "the controller answers again" also when the frozen controller had been
    replaced (its pod deleted, a new one started) and nothing had answered."""
    from elastic_jax.api.status import REASON_CONTROLLER_ANSWERING, REASON_CONTROLLER_GONE

    t, clients = _tracker()
    t.set_controller(_ctrl("u1"))
    assert t.poll_status() is not None
    clients[0].down = True
    assert t.poll_status() is None  # unanswered
    clients[0].down = False
    assert t.poll_status() is not None
    assert t.unresponsive_ended()[0] == REASON_CONTROLLER_ANSWERING
    clients[0].down = True
    assert t.poll_status() is None  # unanswered again, then the pod is replaced
    t.set_controller(_ctrl("u2"))
    reason, message = t.unresponsive_ended()
    assert reason == REASON_CONTROLLER_GONE and "controller pod c-u2 is the current one" in message, message
    assert t.poll_status() is not None  # the new controller's answer is not the old one answering again
    assert t.unresponsive_ended()[0] == REASON_CONTROLLER_GONE


def test_a_controller_that_never_answered_is_starting_not_unresponsive():
    import time

    from elastic_jax.k8s_operator import tracker as tracker_module

    t, clients = _tracker()
    t.set_controller(_ctrl("u1"))
    clients[0].down = True
    assert t.poll_status() is None
    t.sync([_worker(0, "a"), _worker(1, "b")], lambda *e: None)
    assert t.unresponsive_message(time.monotonic() + tracker_module.UNRESPONSIVE_GRACE_S + 1) is None


class _TrainingClient(FakeClient):
    """A controller that answers as training (`phase`, on `active` of 2 slices, a step completed), or times out."""

    phase, active, answers = "Running", [0, 1], 0

    def status(self, after=None, wait_s=0.0):
        if self.down:
            raise ControlApiError("GET /v1/status: timed out")
        self.answers += 1  # (its clock ran on through a freeze: each answer's ledger booked 100 s more training)
        return ControllerStatus(phase=self.phase, step=3, total_steps=9, desired_slices=2, min_slices=1,
                                active_slices=self.active, inactive_slices=[], slices=[], pid=1, goodput=0.9,
                                goodput_seconds={"productive": 9.0 + 100 * self.answers, "starting": 1.0})


def test_a_freeze_past_the_grace_that_ends_in_an_answer_is_recorded_once_with_the_category_it_was_booked_in():
    """Issue 11: a frozen controller's ledger books its frozen seconds as training; the tracker records each freeze
    (its seconds, productive or reduced, when it ended) for `counters.carry` to re-book `recovering`."""
    from elastic_jax.k8s_operator import tracker as tracker_module
    from tests.support.fake_clock import FakeClock

    grace = tracker_module.UNRESPONSIVE_GRACE_S
    clock = FakeClock()  # (the spells last as long as the test says, without sleeping)
    clients = []
    t = JobTracker("ns", "job", 2, 1, client_factory=lambda u, tok: clients.append(_TrainingClient(u, tok)) or clients[-1],
                   clock=clock)
    t.token = "tok"
    t.set_controller(_ctrl("u1"))

    def freeze(seconds, **answer):
        clients[-1].down = True
        assert t.poll_status() is None
        clock.advance(seconds)
        clients[-1].down = False
        for k, v in answer.items():
            setattr(clients[-1], k, v)
        assert t.poll_status() is not None

    assert t.poll_status() is not None
    freeze(grace - 1)  # (a spell under the grace: a slow answer, no freeze)
    assert t.freezes == []
    freeze(grace + 10)
    assert [(f.booked_as, f.seconds) for f in t.freezes] == [("productive", grace + 10)]
    assert t.freezes[0].ended_at == clock.now().timestamp()  # (Unix seconds: its identity across passes)
    clients[-1].active = [0]  # training on 1 of 2 slices when it froze: its ledger booked `reduced`
    assert t.poll_status() is not None
    freeze(grace + 5)
    assert [(f.booked_as, f.seconds) for f in t.freezes] == [("productive", grace + 10), ("reduced", grace + 5)]
    assert t.freezes[0].ended_at < t.freezes[1].ended_at
    clients[-1].phase = "WaitingForSlices"  # paused: its ledger books the freeze `waiting`, no goodput
    assert t.poll_status() is not None
    freeze(grace + 10, phase="Running")
    assert len(t.freezes) == 2
    t.set_controller(_ctrl("u2"))  # another controller: its own freezes only
    assert t.freezes == []


def test_a_freeze_the_controllers_own_ledger_booked_as_a_stall_is_not_re_booked_again():
    """A CI run: the controller SIGSTOPped while its loop was outside the slices' step; once it ran again its
    stall notice booked the frozen seconds `stalled`, and the whole freeze was re-booked `recovering` from the
    training before and after it as well (productive read 0 for as long again). Only the training seconds its
    ledger booked meanwhile are re-booked."""
    import pytest

    from elastic_jax.supervision import controller_watch

    before = {"productive": 0.4, "starting": 3.0}
    assert controller_watch.freeze_training_s(before, {"productive": 0.4, "stalled": 29.0, "starting": 3.0},
                                              29.0) == 0.0
    assert controller_watch.freeze_training_s(before, {"productive": 29.9, "starting": 3.0}, 29.0) == 29.0
    assert controller_watch.freeze_training_s(before, {"productive": 10.4, "reduced": 5.0, "stalled": 14.0},
                                              29.0) == pytest.approx(15.0)
