"""Session 12's new-user trial: Events that were noise or said too little.

A restarted operator announced `Provisioning -> Ready` for slices Ready all along; one worker loss posted
three `controller told slice N Down`; a hung worker's Events did not say `step_deadline`. Through the
reconcile pass (`job_pass.reconcile_pass`) with the fake API, or the tracker where the fault is its own.
"""

from __future__ import annotations

import functools
import sys

import kopf

from elastic_jax.api import labels as lbl
from elastic_jax.api.control import ControllerStatus, RecoveryRecord, SliceStatus
from elastic_jax.k8s_operator import job_pass, operator_state
from elastic_jax.k8s_operator.slices import jobset_view
from elastic_jax.k8s_operator.slices import pod_view
from elastic_jax.k8s_operator.tracker import JobTracker
from tests.support.fake_kube import FakeKube
from tests.unit.test_operator_counters import _controller_pod, _Patch

SPEC = {"slices": {"count": 2}, "training": {"steps": 100, "globalBatchSize": 2}, "checkpoint": {"uri": "/tmp/ck"}}
META = {"name": "j", "namespace": "ns", "uid": "u1", "generation": 1}


def _worker(i: int, uid: str = "", phase: str = "Running", ready: bool = True):
    uid = uid or f"w{i}"
    status = {"phase": phase, "podIP": f"127.0.0.{i + 2}" if phase == "Running" else "",
              "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
              "containerStatuses": [{"name": "worker", "ready": ready, "state": {"running": {}}}]}
    if phase == "Failed":
        status["containerStatuses"] = [{"name": "worker", "state": {"terminated": {"exitCode": 137}}}]
    return pod_view({"metadata": {"name": f"j-slice-{i}-{uid}", "uid": uid, "labels": {
        lbl.ROLE: lbl.ROLE_WORKER, lbl.JOB_NAME: "j", lbl.JOB_UID: "u1", lbl.SLICE_INDEX: str(i),
        lbl.JOB_COMPLETION_INDEX: "0"}}, "status": status})


def _jobsets():
    return [jobset_view({"metadata": {"name": f"j-slice-{i}", "uid": f"js-{i}", "labels": {
        lbl.JOB_NAME: "j", lbl.JOB_UID: "u1", lbl.SLICE_INDEX: str(i)}}, "status": {"restarts": 0}}, i) for i in (0, 1)]


class _Controller:
    """A controller training on both slices; `answer` is what it says next (tests set it)."""

    answer = ControllerStatus(phase="Running", step=7, total_steps=100, desired_slices=2, min_slices=1,
                              active_slices=[0, 1], inactive_slices=[], slices=[], pid=1)
    reports: list = []

    def __init__(self, url, token):
        pass

    def status(self, retries=0, backoff_s=0.1, after=None, wait_s=0.0):
        return self.answer

    def report_slice(self, index, state, generation, addresses, reason, retries=1, backoff_s=0.05):
        _Controller.reports.append((index, state, generation))

    def close(self):
        pass


def _runner(monkeypatch, status: dict):
    """A `run(state, pods)` doing one reconcile pass with `status` carried between passes, and the Events posted."""
    events: list[tuple[str, str, str]] = []
    monkeypatch.setattr(kopf, "event", lambda ref, type, reason, message: events.append((type, reason, message)))
    monkeypatch.setattr(job_pass, "JobTracker", functools.partial(JobTracker, client_factory=_Controller))
    body = {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": META, "spec": SPEC}
    _Controller.reports = []

    def run(state, pods):
        patch = _Patch()
        job_pass.reconcile_pass(body={**body, "status": dict(status)}, spec=SPEC, status=dict(status), meta=META,
                                namespace="ns", name="j", patch=patch, memo={"elasticjax": state},
                                job_pods={("ns", "j", "u1"): pods}, job_jobsets={("ns", "j", "u1"): _jobsets()})
        status.update(patch.status)
        return patch.status

    return run, events


def test_a_restarted_operator_posts_no_transition_for_slices_ready_all_along(monkeypatch):
    status = {"phase": "Running", "controllerPod": "j-controller-0", "tokenSecret": "j-token"}
    run, events = _runner(monkeypatch, status)
    pods = [_controller_pod(0, "c0"), _worker(0), _worker(1)]
    run(operator_state.OperatorState(kube=FakeKube(), key=b"k" * 32), pods)
    assert [e[2] for e in events if e[1] == "SliceReady"] == [
        "slice 0 Provisioning -> Ready at 127.0.0.2:8471", "slice 1 Provisioning -> Ready at 127.0.0.3:8471"], events
    written = [dict(s) for s in status["slices"]]
    events.clear()
    # the operator restarts (a new process: no memory); the slices stayed Ready
    restarted = operator_state.OperatorState(kube=FakeKube(), key=b"k" * 32)
    run(restarted, pods)
    run(restarted, pods)
    assert not [e for e in events if e[1].startswith("Slice")], events
    assert status["slices"] == written  # (their lastTransitionTime is the previous operator's)
    # a real transition after the restart is still said, from the state the previous operator wrote
    run(restarted, [_controller_pod(0, "c0"), _worker(0), _worker(1, phase="Failed")])
    assert [e[2][:20] for e in events if e[1] == "SliceDown"] == ["slice 1 Ready -> Dow"], events


def test_one_worker_loss_tells_the_controller_down_once():
    """The Down was re-sent (and announced) each time the slice's pods changed while it stayed Down: the
    failed pod, then none, then its replacement Pending."""
    _Controller.reports = []
    events: list[tuple[str, str, str]] = []
    tracker = JobTracker("ns", "j", 1, 1, client_factory=_Controller)
    tracker.token = "t"
    tracker.set_controller(_controller_pod(0, "c0"))
    post = lambda *e: events.append(e)  # noqa: E731
    for pods in ([_worker(0)], [_worker(0, phase="Failed")], [], [_worker(0, uid="w9", phase="Pending", ready=False)],
                 [_worker(0, uid="w9", phase="Pending", ready=False)], [_worker(0, uid="w9")]):
        tracker.sync(pods, post)
    told = [e[2].split(" (")[0] for e in events if e[1] == "ControllerNotified"]
    assert told == ["controller told slice 0 Ready", "controller told slice 0 Down",
                    "controller told slice 0 Ready"], events
    assert [r[1] for r in _Controller.reports] == ["Ready", "Down", "Ready"]
    # a replacement at the same address is a new worker: the controller is told Ready again
    for pods in ([_worker(0, uid="w9", phase="Failed")], [_worker(0, uid="wa")]):
        tracker.sync(pods, post)
    assert [r[1] for r in _Controller.reports] == ["Ready", "Down", "Ready", "Down", "Ready"]


def test_a_hung_workers_events_name_the_controllers_reason(monkeypatch):
    status = {"phase": "Running", "controllerPod": "j-controller-0", "tokenSecret": "j-token"}
    run, events = _runner(monkeypatch, status)
    state = operator_state.OperatorState(kube=FakeKube(), key=b"k" * 32)
    pods = [_controller_pod(0, "c0"), _worker(0), _worker(1)]
    _Controller.answer = _Controller.answer.model_copy(update={"slices": []})
    run(state, pods)
    ready_generation = max(g for i, s, g in _Controller.reports if i == 1 and s == "Ready")
    # the controller's step deadline found slice 1 hung: it holds it Down, its pod still looks Ready
    _Controller.answer = _Controller.answer.model_copy(update={
        "active_slices": [0], "inactive_slices": [1],
        "slices": [SliceStatus(index=0, state="Active", generation=1),
                   SliceStatus(index=1, state="Down", generation=ready_generation)],
        "recovery_history": [RecoveryRecord(cause="slice_down", slices=[0], at_step=2),
                             RecoveryRecord(cause="step_deadline", slices=[1], at_step=7)]})
    events.clear()
    run(state, pods)
    replaced = [e for e in events if e[1] == "WorkerReplaced"]
    assert len(replaced) == 1 and "step_deadline" in replaced[0][2], events
    # the pod it deleted (grace 0) is gone: the slice's SliceDown says why the operator deleted it
    run(state, [_controller_pod(0, "c0"), _worker(0)])
    downs = [e for e in events if e[1] == "SliceDown"]
    assert len(downs) == 1 and "step_deadline" in downs[0][2], events
    assert "step_deadline" in next(s for s in status["slices"] if s["index"] == 1)["reason"]
    _Controller.answer = _Controller.answer.model_copy(update={"slices": [], "recovery_history": [],
                                                               "active_slices": [0, 1], "inactive_slices": []})


def test_a_down_slices_pods_changing_rewrites_no_status(monkeypatch):
    """`kubectl get ejob -w` printed identical lines while a paused job's slice was Down: each pod change
    (the failed pod, none, the replacement Pending) rewrote `status.slices[i].pods` alone, a field not
    printed. A Down slice keeps the pods it lost (its reason names them) until it is Ready again."""
    status = {"phase": "Running", "controllerPod": "j-controller-0", "tokenSecret": "j-token"}
    run, events = _runner(monkeypatch, status)
    state = operator_state.OperatorState(kube=FakeKube(), key=b"k" * 32)
    _Controller.answer = _Controller.answer.model_copy(update={"slices": [], "recovery_history": []})
    c = _controller_pod(0, "c0")
    run(state, [c, _worker(0), _worker(1)])
    assert run(state, [c, _worker(0), _worker(1)]) == {}
    run(state, [c, _worker(0), _worker(1, phase="Failed")])
    down = next(s for s in status["slices"] if s["index"] == 1)
    assert down["state"] == "Down" and down["pods"] == ["j-slice-1-w1"] and "exit code 137" in down["reason"]
    assert run(state, [c, _worker(0)]) == {}
    assert run(state, [c, _worker(0), _worker(1, uid="w9", phase="Pending", ready=False)]) == {}
    run(state, [c, _worker(0), _worker(1, uid="w9")])
    back = next(s for s in status["slices"] if s["index"] == 1)
    assert back["state"] == "Ready" and back["pods"] == ["j-slice-1-w9"]


def test_a_restarted_operator_adopts_the_ready_the_controller_holds_at_the_same_addresses(monkeypatch):
    """Session 12's trial: a new operator re-sent `Ready` with a new generation for slices the controller held
    Ready at the same addresses (`ControllerNotified` each restart; a new generation reads as a new worker).
    Adopted when the controller's view holds the slice up at those addresses; sent when it does not."""
    status = {"phase": "Running", "controllerPod": "j-controller-0", "tokenSecret": "j-token"}
    run, events = _runner(monkeypatch, status)
    pods = [_controller_pod(0, "c0"), _worker(0), _worker(1)]
    run(operator_state.OperatorState(kube=FakeKube(), key=b"k" * 32), pods)
    sent = {i: g for i, s, g in _Controller.reports if s == "Ready"}
    assert set(sent) == {0, 1}
    # the controller holds slice 0 in its mesh at the address it was told; slice 1 at another one
    monkeypatch.setattr(_Controller, "answer", _Controller.answer.model_copy(update={"slices": [
        SliceStatus(index=0, state="Active", generation=sent[0], addresses=["127.0.0.2:8471"]),
        SliceStatus(index=1, state="Active", generation=sent[1], addresses=["127.0.0.9:8471"])]}))
    events.clear()
    _Controller.reports = []
    restarted = operator_state.OperatorState(kube=FakeKube(), key=b"k" * 32)
    run(restarted, pods)
    run(restarted, pods)
    assert [r[0] for r in _Controller.reports] == [1], _Controller.reports
    assert [e[2].split(" (")[0] for e in events if e[1] == "ControllerNotified"] == ["controller told slice 1 Ready"]
    assert not [e for e in events if e[1].startswith("Slice")], events
    # the adopted Ready still counts as the controller's: a loss of slice 0 is sent
    run(restarted, [_controller_pod(0, "c0"), _worker(0, phase="Failed"), _worker(1)])
    assert (0, "Down") in [r[:2] for r in _Controller.reports]


def test_a_restarted_operator_sends_ready_for_a_slice_replaced_while_it_was_down(monkeypatch):
    """A slice whose JobSet restarted while no operator ran holds a new worker: its Ready is sent even when
    the controller's view shows the old one at the same address."""
    status = {"phase": "Running", "controllerPod": "j-controller-0", "tokenSecret": "j-token"}
    run, events = _runner(monkeypatch, status)
    pods = [_controller_pod(0, "c0"), _worker(0), _worker(1)]
    run(operator_state.OperatorState(kube=FakeKube(), key=b"k" * 32), pods)
    sent = {i: g for i, s, g in _Controller.reports if s == "Ready"}
    monkeypatch.setattr(_Controller, "answer", _Controller.answer.model_copy(update={"slices": [
        SliceStatus(index=i, state="Active", generation=sent[i], addresses=[f"127.0.0.{i + 2}:8471"]) for i in (0, 1)]}))
    monkeypatch.setattr(sys.modules[__name__], "_jobsets", lambda: [jobset_view({"metadata": {
        "name": f"j-slice-{i}", "uid": f"js-{i}", "labels": {lbl.JOB_NAME: "j", lbl.JOB_UID: "u1",
                                                             lbl.SLICE_INDEX: str(i)}},
        "status": {"restarts": 1 if i == 0 else 0}}, i) for i in (0, 1)])
    _Controller.reports = []
    restarted = operator_state.OperatorState(kube=FakeKube(), key=b"k" * 32)
    run(restarted, [_controller_pod(0, "c0"), _worker(0, uid="w0b"), _worker(1)])
    run(restarted, [_controller_pod(0, "c0"), _worker(0, uid="w0b"), _worker(1)])
    assert [r[:2] for r in _Controller.reports] == [(0, "Ready")], _Controller.reports
