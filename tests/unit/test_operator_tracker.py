"""The slice tracker: transitions become Events and controller reports, re-sent to a new controller."""

from __future__ import annotations

from elastic_jax.api.client import ControlApiError
from elastic_jax.api.control import ControllerStatus, SliceStatus
from elastic_jax.k8s_operator.slices import PodView
from elastic_jax.k8s_operator.tracker import JobTracker


class FakeClient:
    """Records reports; `down` makes it unreachable (a unit-test stand-in for ControlClient)."""

    def __init__(self, url, token):
        self.url, self.token, self.reports, self.down = url, token, [], False

    def report_slice(self, index, state, generation, addresses, reason, retries, backoff_s):
        if self.down:
            raise ControlApiError("unreachable")
        self.reports.append((index, state, generation, tuple(addresses)))

    def close(self):
        pass


def _worker(i, name, phase="Running", ready=True, exit_code=None, attempt=0):
    return PodView(name, name, "worker", i, attempt, 0, phase, ready, f"127.0.10.{i + 2}", False, exit_code,
                   "" if exit_code is None else f"exit code {exit_code}")


def _ctrl(uid):
    return PodView(f"c-{uid}", uid, "controller", -1, 0, 0, "Running", True, "127.0.11.2", False)


def _tracker():
    clients = []
    t = JobTracker("ns", "job", 2, 1, client_factory=lambda u, tok: clients.append(FakeClient(u, tok)) or clients[-1])
    t.token = "tok"
    return t, clients


def test_down_then_ready_reach_the_controller_with_increasing_generations():
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
    assert t.replacements == 1


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
