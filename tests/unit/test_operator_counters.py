"""Issue 11 (status truth): `status.recoveries`, `sliceReplacements` and the slices' `restarts` keep
counting across suspend/resume and a new controller pod (`k8s_operator.counters`), also through
the kopf shell."""

from __future__ import annotations

import functools

import kopf

from elastic_jax.api import labels as lbl
from elastic_jax.api.control import ControllerStatus
from elastic_jax.api.status import ElasticTrainingJobStatus
from elastic_jax.k8s_operator import counters, job_pass, operator_state
from elastic_jax.k8s_operator.slices import JobSetView, jobset_view
from elastic_jax.k8s_operator.slices import pod_view
from elastic_jax.k8s_operator.tracker import JobTracker
from tests.support.fake_kube import FakeKube



def _carry(previous: dict, *args, **kw) -> counters.Counts:
    """`counters.carry` on the status as the operator reads it back from the API server (typed)."""
    return counters.carry(ElasticTrainingJobStatus.from_kube(previous), *args, **kw)

def _js(i: int, uid: str, restarts: int) -> JobSetView:
    return JobSetView(name=f"j-slice-{i}", slice_index=i, restarts=restarts, uid=uid)


def _written(previous: dict, c: counters.Counts) -> dict:
    """The status after the pass wrote `c` (what the next pass reads)."""
    return {**previous, "recoveries": c.recoveries, "sliceReplacements": c.slice_replacements,
            "counterBase": c.base.model_dump(mode="json", by_alias=True, exclude_none=True),
            "slices": [{"index": i, "state": "Ready", "restarts": r} for i, r in enumerate(c.slice_restarts)]}


def test_a_new_controller_pods_recoveries_add_to_the_jobs():
    s: dict = {}
    c = _carry(s, 2, "pod-a", 2, {})
    assert c.recoveries == 2
    s = _written(s, c)
    # pod-a gone (controller lost): nothing answers, the total stays
    c = _carry(s, 2, "", None, {})
    assert c.recoveries == 2
    s = _written(s, c)
    # pod-b, a new process, counts from 0 again: the job's total keeps growing from 2
    c = _carry(s, 2, "pod-b", 0, {})
    assert c.recoveries == 2 and c.base.controller_uid == "pod-b" and c.base.recoveries == 2
    s = _written(s, c)
    c = _carry(s, 2, "pod-b", 3, {})
    assert c.recoveries == 5


def test_jobsets_created_again_after_a_resume_add_to_each_slices_restarts():
    s: dict = {}
    c = _carry(s, 2, "", None, {0: _js(0, "a0", 1), 1: _js(1, "a1", 2)})
    assert c.slice_restarts == [1, 2] and c.slice_replacements == 3
    s = _written(s, c)
    # suspended: JobSets deleted; every slice keeps its count
    c = _carry(s, 2, "", None, {})
    assert c.slice_restarts == [1, 2] and c.slice_replacements == 3
    s = _written(s, c)
    # resumed: new JobSets (new UIDs, restarts 0), then slice 0 loses a worker again
    c = _carry(s, 2, "", None, {0: _js(0, "b0", 0), 1: _js(1, "b1", 0)})
    assert c.slice_restarts == [1, 2]
    s = _written(s, c)
    c = _carry(s, 2, "", None, {0: _js(0, "b0", 1), 1: _js(1, "b1", 0)})
    assert c.slice_restarts == [2, 2] and c.slice_replacements == 4


def test_the_same_pass_twice_gives_the_same_counts():
    """A pass that reads a status without its last patch (stale watch) must not count twice."""
    s = _written({}, _carry({}, 1, "pod-a", 2, {0: _js(0, "a0", 1)}))
    once = _carry(s, 1, "pod-b", 1, {0: _js(0, "b0", 1)})
    twice = _carry(s, 1, "pod-b", 1, {0: _js(0, "b0", 1)})
    assert once == twice and once.recoveries == 3 and once.slice_restarts == [2]


def test_a_status_written_before_bases_existed_is_not_counted_twice():
    """An operator upgrade: the old status holds the live sources' own counts, no counterBase."""
    old = {"recoveries": 2, "sliceReplacements": 3, "slices": [{"index": 0, "state": "Ready", "restarts": 3}]}
    c = _carry(old, 1, "pod-a", 2, {0: _js(0, "a0", 3)})
    assert c.recoveries == 2 and c.slice_restarts == [3]
    c = _carry(_written(old, c), 1, "pod-a", 3, {0: _js(0, "a0", 4)})
    assert c.recoveries == 3 and c.slice_restarts == [4]


def test_the_base_is_valid_status():
    c = _carry({}, 2, "pod-a", 1, {0: _js(0, "a0", 1)})
    ElasticTrainingJobStatus.model_validate(_written({}, c))


def test_jobset_view_reads_the_uid():
    assert jobset_view({"metadata": {"name": "j-slice-0", "uid": "u-7"}, "status": {"restarts": 2}}, 0).uid == "u-7"


# -- through the kopf shell -------------------------------------------------------------------


class _Patch:
    def __init__(self):
        self.status: dict = {}


class _Controller:
    """The control API of one controller process: its recoveries so far (`recoveries[0]`)."""

    recoveries = [0]

    def __init__(self, url, token):
        pass

    def status(self, retries=0, backoff_s=0.1, after=None, wait_s=0.0):
        return ControllerStatus(phase="Running", step=7, total_steps=100, desired_slices=1, min_slices=1,
                                active_slices=[0], inactive_slices=[], slices=[], pid=1,
                                recoveries={"slice_down": self.recoveries[0], "scale_up": 5})

    def report_slice(self, *a, **k):
        pass

    def close(self):
        pass


def _controller_pod(attempt: int, uid: str):
    return pod_view({"metadata": {"name": f"j-controller-{attempt}", "uid": uid, "labels": {
        lbl.ROLE: lbl.ROLE_CONTROLLER, lbl.JOB_NAME: "j", lbl.JOB_UID: "u1", lbl.CONTROLLER_ATTEMPT: str(attempt)}},
        "status": {"phase": "Running", "podIP": "127.0.0.1",
                   "containerStatuses": [{"name": "controller", "ready": True, "state": {"running": {}}}]}})


def _jobset(uid: str, restarts: int) -> dict:
    return {"metadata": {"name": "j-slice-0", "uid": uid, "labels": {lbl.JOB_NAME: "j", lbl.JOB_UID: "u1",
                                                                      lbl.SLICE_INDEX: "0"}},
            "status": {"restarts": restarts}}


def test_counters_keep_growing_through_suspend_resume_and_a_new_controller_pod(monkeypatch):
    monkeypatch.setattr(kopf, "event", lambda *a, **k: None)
    monkeypatch.setattr(job_pass, "JobTracker", functools.partial(JobTracker, client_factory=_Controller))
    spec = {"slices": {"count": 1}, "training": {"steps": 100, "globalBatchSize": 2}, "checkpoint": {"uri": "/tmp/ck"}}
    meta = {"name": "j", "namespace": "ns", "uid": "u1", "generation": 1}
    state = operator_state.OperatorState(kube=FakeKube(), key=b"k" * 32)
    status = {"phase": "Running", "controllerPod": "j-controller-0", "tokenSecret": "j-token"}

    def run(pods, jobsets, suspend=False):
        nonlocal status
        s = {**spec, "suspend": suspend}
        body = {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": meta, "spec": s}
        patch = _Patch()
        job_pass.reconcile_pass(body=body, spec=s, status=status, meta=meta, namespace="ns", name="j", patch=patch,
                               memo={"elasticjax": state}, job_pods={("ns", "j", "u1"): pods},
                               job_jobsets={("ns", "j", "u1"): [jobset_view(js, 0) for js in jobsets]})
        status = {**status, **patch.status}
        return status

    _Controller.recoveries[0] = 2
    s = run([_controller_pod(0, "c0")], [_jobset("js-a", 2)])
    assert (s["recoveries"], s["sliceReplacements"], s["slices"][0]["restarts"]) == (2, 2, 2)
    s = run([], [], suspend=True)  # suspended: controller and JobSets gone
    assert (s["recoveries"], s["sliceReplacements"], s["slices"][0]["restarts"]) == (2, 2, 2)
    _Controller.recoveries[0] = 0  # resumed: a new controller pod and JobSet, each counting from 0
    s = run([_controller_pod(0, "c1")], [_jobset("js-b", 0)])
    assert (s["recoveries"], s["sliceReplacements"], s["slices"][0]["restarts"]) == (2, 2, 2)
    _Controller.recoveries[0] = 1
    s = run([_controller_pod(0, "c1")], [_jobset("js-b", 1)])
    assert (s["recoveries"], s["sliceReplacements"], s["slices"][0]["restarts"]) == (3, 3, 3)
    _Controller.recoveries[0] = 1  # the controller pod replaced (attempt 1): its own count restarts
    s = run([_controller_pod(1, "c2")], [_jobset("js-b", 1)])
    assert s["recoveries"] == 4  # (c2 says 1 as well: 3 before it + 1)
    ElasticTrainingJobStatus.model_validate(s)


def test_a_pass_that_sees_nothing_new_writes_nothing(monkeypatch):
    """Issue 11 (status truth): `kubectl get ejob -w` printed an identical line every second, i.e. a
    status patch with no change. Running (the controller answering the same), then suspended: the
    second pass of each patches nothing."""
    monkeypatch.setattr(kopf, "event", lambda *a, **k: None)
    monkeypatch.setattr(job_pass, "JobTracker", functools.partial(JobTracker, client_factory=_Controller))
    spec = {"slices": {"count": 1}, "training": {"steps": 100, "globalBatchSize": 2}, "checkpoint": {"uri": "/tmp/ck"}}
    meta = {"name": "j", "namespace": "ns", "uid": "u1", "generation": 1}
    state = operator_state.OperatorState(kube=FakeKube(), key=b"k" * 32)
    status = {"phase": "Running", "controllerPod": "j-controller-0", "tokenSecret": "j-token"}
    worker = pod_view({"metadata": {"name": "j-slice-0-w", "uid": "w0", "labels": {
        lbl.ROLE: lbl.ROLE_WORKER, lbl.JOB_NAME: "j", lbl.JOB_UID: "u1", lbl.SLICE_INDEX: "0"}},
        "status": {"phase": "Running", "podIP": "127.0.0.2",
                   "containerStatuses": [{"name": "worker", "ready": True, "state": {"running": {}}}]}})
    _Controller.recoveries[0] = 1
    patches = []
    for suspend, pods in ((False, [_controller_pod(0, "c0"), worker]),) * 3 + ((True, []),) * 3:
        s = {**spec, "suspend": suspend}
        body = {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": meta, "spec": s}
        patch = _Patch()
        job_pass.reconcile_pass(body=body, spec=s, status=status, meta=meta, namespace="ns", name="j", patch=patch,
                               memo={"elasticjax": state}, job_pods={("ns", "j", "u1"): pods},
                               job_jobsets={("ns", "j", "u1"): [] if suspend else [jobset_view(_jobset("js", 0), 0)]})
        patches.append(patch.status)
        status = {**status, **patch.status}
    assert patches[0] and patches[3], patches  # the first pass of each writes the news
    assert patches[1:3] == [{}, {}] and patches[4:] == [{}, {}], patches


def test_a_worker_lost_while_the_operator_was_down_gets_one_slice_down_event(monkeypatch):
    """Session 10's trial: a worker lost while the operator itself was down (its pod already replaced when
    the operator came back) was counted (`restarts`, `sliceReplacements`) but got no SliceDown Event. The
    new operator's first pass posts it, once: not again on the next passes."""
    events = []
    monkeypatch.setattr(kopf, "event", lambda ref, type, reason, message: events.append((type, reason, message)))
    monkeypatch.setattr(job_pass, "JobTracker", functools.partial(JobTracker, client_factory=_Controller))
    spec = {"slices": {"count": 1}, "training": {"steps": 100, "globalBatchSize": 2}, "checkpoint": {"uri": "/tmp/ck"}}
    meta = {"name": "j", "namespace": "ns", "uid": "u1", "generation": 1}
    body = {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": meta, "spec": spec}
    status = {"phase": "Running", "controllerPod": "j-controller-0", "tokenSecret": "j-token"}
    _Controller.recoveries[0] = 0

    def worker(uid):
        return pod_view({"metadata": {"name": f"j-slice-0-w-{uid}", "uid": uid, "labels": {
            lbl.ROLE: lbl.ROLE_WORKER, lbl.JOB_NAME: "j", lbl.JOB_UID: "u1", lbl.SLICE_INDEX: "0", lbl.JOB_COMPLETION_INDEX: "0"}},
            "status": {"phase": "Running", "podIP": "127.0.0.2", "conditions": [{"type": "Ready", "status": "True"}],
                       "containerStatuses": [{"name": "worker", "ready": True, "state": {"running": {}}}]}})

    def run(state, pod, restarts):
        nonlocal status
        patch = _Patch()
        job_pass.reconcile_pass(body=body, spec=spec, status=status, meta=meta, namespace="ns", name="j", patch=patch,
                               memo={"elasticjax": state}, job_pods={("ns", "j", "u1"): [_controller_pod(0, "c0"), pod]},
                               job_jobsets={("ns", "j", "u1"): [jobset_view(_jobset("js-a", restarts), 0)]})
        status = {**status, **patch.status}

    def slice_downs():
        return [e for e in events if e[1] == "SliceDown"]

    run(operator_state.OperatorState(kube=FakeKube(), key=b"k" * 32), worker("w0"), 0)
    assert status["slices"][0]["state"] == "Ready" and not slice_downs(), events
    # the operator is down; worker w0 is lost and the JobSet replaces it (restarts 1) before it comes back
    restarted = operator_state.OperatorState(kube=FakeKube(), key=b"k" * 32)
    for _ in range(3):
        run(restarted, worker("w1"), 1)
    assert status["sliceReplacements"] == 1 and status["slices"][0]["restarts"] == 1
    assert len(slice_downs()) == 1, events
    assert slice_downs()[0][0] == "Warning" and "slice 0 was replaced 1 time(s) while the operator was not running" \
        in slice_downs()[0][2]
    # an operator that was up for the loss posts its own SliceDown, and nothing more for the restart it counts
    events.clear()
    run(restarted, pod_view({**{"metadata": {"name": "j-slice-0-w-w1", "uid": "w1", "labels": {
        lbl.ROLE: lbl.ROLE_WORKER, lbl.JOB_NAME: "j", lbl.JOB_UID: "u1", lbl.SLICE_INDEX: "0", lbl.JOB_COMPLETION_INDEX: "0"}}},
        "status": {"phase": "Failed"}}), 1)
    run(restarted, worker("w2"), 2)
    assert len(slice_downs()) == 1 and "Ready -> Down" in slice_downs()[0][2], events


def test_missed_losses_leave_out_the_ones_an_operator_announced():
    from elastic_jax.api.status import SliceStatusEntry
    from elastic_jax.k8s_operator.missed_losses import missed_loss_events

    written = [SliceStatusEntry(index=0, state="Ready", restarts=1), SliceStatusEntry(index=1, state="Down", restarts=0),
               SliceStatusEntry(index=2, state="Ready", restarts=0)]
    events = missed_loss_events(written, [3, 1, 1], down_now={2})
    # slice 0: two losses unseen; slice 1: its one loss was posted by the previous operator (it wrote Down);
    # slice 2: this operator holds it Down, it posted its SliceDown itself
    assert [(t, r) for t, r, _ in events] == [("Warning", "SliceDown")] and "slice 0 was replaced 2 time(s)" in events[0][2]
    assert missed_loss_events([], [2]) == []  # nothing was written about the slice: no claim about it
