"""Issue 11 (status truth, session 10's trial): a replaced slice still compiling its step programs read
`Ready` with no reason until it joined. The controller says `Warming` (`SliceSet.set_warming`); the
operator writes it as the slice's reason and counts a warming spare as a spare (`slice_warming`)."""

from __future__ import annotations

import functools

import kopf

from elastic_jax.api import labels as lbl
from elastic_jax.api.control import ControllerStatus, SliceStatus
from elastic_jax.api.status import ElasticTrainingJobStatus, SliceStatusEntry
from elastic_jax.k8s_operator import job_pass, operator_state, slice_warming
from elastic_jax.k8s_operator.slices import jobset_view
from elastic_jax.k8s_operator.slices import pod_view
from elastic_jax.k8s_operator.tracker import JobTracker
from tests.support.fake_kube import FakeKube
from tests.unit.test_operator_counters import _controller_pod, _Patch
from tests.unit.test_operator_status import _inputs, build_status


def _with(states: dict[int, str], active: list[int], desired: int = 2) -> ControllerStatus:
    slices = [SliceStatus(index=i, state=s, generation=1) for i, s in states.items()]
    return ControllerStatus(phase="Running", step=3, total_steps=10, desired_slices=desired, min_slices=1,
                            active_slices=active, inactive_slices=[i for i in states if i not in active],
                            slices=slices, pid=1)


def test_a_warming_slice_gets_its_reason_and_a_warming_spare_is_a_spare():
    entries = [SliceStatusEntry(index=i, state="Ready") for i in range(3)]
    rejoining = slice_warming.with_warming(entries, _with({0: "Active", 1: "Warming", 2: "Warming"}, [0]))
    assert [e.reason for e in rejoining] == ["", slice_warming.WARMING_TO_JOIN, slice_warming.WARMING_TO_JOIN]
    full = _with({0: "Active", 1: "Active", 2: "Warming"}, [0, 1])
    assert [e.reason for e in slice_warming.with_warming(entries, full)] == ["", "", slice_warming.WARMING_SPARE]
    assert slice_warming.spare_indices(full) == [2]
    assert slice_warming.spare_indices(_with({0: "Active", 1: "Warming"}, [0])) == []  # it will join, no spare
    # a slice the operator holds Down keeps its own reason; no controller: nothing said
    down = [SliceStatusEntry(index=2, state="Down", reason="exit code 137")]
    assert slice_warming.with_warming(down, full)[0].reason == "exit code 137"
    assert slice_warming.with_warming(entries, None) == entries
    # build_status: SPARES counts the warming spare
    s = build_status(_inputs(controller=full.model_copy(update={"step": 5})))
    assert s["spareSlices"] == [2] and s["spareCount"] == 1


class _Warming:
    """A controller whose slice 1 (back Ready after a loss) still compiles."""

    def __init__(self, url, token):
        pass

    def status(self, retries=0, backoff_s=0.1, after=None, wait_s=0.0):
        return _with({0: "Active", 1: "Warming"}, [0])

    def report_slice(self, *a, **k):
        pass

    def close(self):
        pass


def _worker(i: int):
    return pod_view({"metadata": {"name": f"j-slice-{i}-w", "uid": f"w{i}", "labels": {
        lbl.ROLE: lbl.ROLE_WORKER, lbl.JOB_NAME: "j", lbl.JOB_UID: "u1", lbl.SLICE_INDEX: str(i),
        lbl.JOB_COMPLETION_INDEX: "0"}},
        "status": {"phase": "Running", "podIP": f"127.0.0.{i + 2}", "conditions": [{"type": "Ready", "status": "True"}],
                   "containerStatuses": [{"name": "worker", "ready": True, "state": {"running": {}}}]}})


def test_the_operator_writes_the_warming_reason_of_a_ready_slice(monkeypatch):
    monkeypatch.setattr(kopf, "event", lambda *a, **k: None)
    monkeypatch.setattr(job_pass, "JobTracker", functools.partial(JobTracker, client_factory=_Warming))
    spec = {"slices": {"count": 2}, "training": {"steps": 10, "globalBatchSize": 2}, "checkpoint": {"uri": "/tmp/ck"}}
    meta = {"name": "j", "namespace": "ns", "uid": "u1", "generation": 1}
    body = {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": meta, "spec": spec}
    state = operator_state.OperatorState(kube=FakeKube(), key=b"k" * 32)
    status = {"phase": "Running", "controllerPod": "j-controller-0", "tokenSecret": "j-token"}
    jobsets = [jobset_view({"metadata": {"name": f"j-slice-{i}", "uid": f"js-{i}", "labels": {
        lbl.JOB_NAME: "j", lbl.JOB_UID: "u1", lbl.SLICE_INDEX: str(i)}}, "status": {"restarts": i}}, i) for i in (0, 1)]
    for _ in range(2):
        patch = _Patch()
        job_pass.reconcile_pass(body=body, spec=spec, status=status, meta=meta, namespace="ns", name="j", patch=patch,
                               memo={"elasticjax": state},
                               job_pods={("ns", "j", "u1"): [_controller_pod(0, "c0"), _worker(0), _worker(1)]},
                               job_jobsets={("ns", "j", "u1"): jobsets})
        status = {**status, **patch.status}
    slices = {s["index"]: s for s in status["slices"]}
    assert slices[1]["state"] == "Ready" and slices[1]["reason"] == slice_warming.WARMING_TO_JOIN, slices
    assert slices[0]["reason"] == ""
    assert status["phase"] == "Degraded"  # (1 of 2 slices trains meanwhile)
    ElasticTrainingJobStatus.model_validate(status)
