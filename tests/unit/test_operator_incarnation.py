"""A job deleted and applied again under the same name: the new job never counts, reports or deletes the
old one's pods and JobSets (issue 9, new-user trial: RESTARTS 1 and a SliceDown "exit 143" from the old pods)."""

from __future__ import annotations

import asyncio

import kopf
import pytest

from elastic_jax.api import labels as lbl
from elastic_jax.k8s_operator import backends, children, handlers, incarnation, job_pass, operator_state
from elastic_jax.k8s_operator.backends import renderer_for
from elastic_jax.k8s_operator.slices import jobset_view
from elastic_jax.k8s_operator.slices import pod_view
from elastic_jax.api.manifest import parse_manifest
from tests.unit.test_operator_handler_faults import _Kube, _Patch

SPEC = {"slices": {"count": 1}, "training": {"steps": 10, "globalBatchSize": 1}, "checkpoint": {"uri": "/data/ck"}}


def _pod(name, uid, role, job_uid, *, phase="Running", created="2026-01-01T00:00:10Z", exit_code=None, deleting=False):
    labels = {lbl.JOB_NAME: "j", lbl.ROLE: role}
    if job_uid is not None:
        labels[lbl.JOB_UID] = job_uid
    if role == lbl.ROLE_CONTROLLER:
        labels[lbl.CONTROLLER_ATTEMPT] = name.rsplit("-", 1)[1]
    else:
        labels.update({lbl.SLICE_INDEX: "0", lbl.JOB_COMPLETION_INDEX: "0"})
    meta = {"name": name, "uid": uid, "labels": labels, "creationTimestamp": created}
    if deleting:
        meta.update(deletionTimestamp="2026-01-01T00:01:00Z", deletionGracePeriodSeconds=60)
    container = {"name": role, "state": {"terminated": {"exitCode": exit_code}} if exit_code is not None else
                 {"running": {}}, "ready": exit_code is None}
    return {"metadata": meta, "status": {"phase": phase, "podIP": "10.0.0.9", "containerStatuses": [container],
                                         "conditions": [{"type": "Ready", "status": str(exit_code is None)}]}}


def _index(*bodies):
    out: dict = {}
    for body in bodies:
        out.setdefault(incarnation.index_key("ns", body["metadata"]["labels"]), []).append(pod_view(body))
    return out


PATHWAYS_SPEC = {"backend": "pathways",
                 "slices": {"count": 1, "accelerator": "tpu-v5-lite-podslice", "topology": "2x2"},
                 "training": {"steps": 10, "globalBatchSize": 4}, "checkpoint": {"uri": "gs://test-bucket/ck"}}


@pytest.mark.parametrize("spec", [SPEC, PATHWAYS_SPEC], ids=["cpu", "pathways"])
def test_every_child_and_every_pod_template_carries_the_job_uid(spec):
    job = backends.resolve(parse_manifest({"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob",
                                           "metadata": {"name": "j", "namespace": "ns", "uid": "new-uid"},
                                           "spec": spec}))
    objs = children.render_children(job, token="t" * 32, job_uid="new-uid")
    for obj in objs:
        assert obj["metadata"]["labels"][lbl.JOB_UID] == "new-uid", obj["kind"]
    services = [o for o in objs if o["kind"] == "Service"]
    assert len(services) == (2 if spec is PATHWAYS_SPEC else 1)
    for service in services:  # never routes to an old job's controller (the head lists terminating pods too)
        assert service["spec"]["selector"][lbl.JOB_UID] == "new-uid", service["metadata"]["name"]
    jobset = renderer_for(spec.get("backend", "cpu")).worker_jobset(job, 0)
    job_template = jobset["spec"]["replicatedJobs"][0]["template"]
    assert job_template["metadata"]["labels"][lbl.JOB_UID] == "new-uid"
    assert job_template["spec"]["template"]["metadata"]["labels"][lbl.JOB_UID] == "new-uid"


def test_own_reads_only_this_incarnation_and_older_operators_children_created_after_the_job():
    old = _pod("j-controller-0", "p-old", lbl.ROLE_CONTROLLER, "old-uid")
    new = _pod("j-slice-0-worker-0-0-abc", "p-new", lbl.ROLE_WORKER, "new-uid")
    legacy_before = _pod("j-slice-0-worker-0-0-xyz", "p-l1", lbl.ROLE_WORKER, None, created="2026-01-01T00:00:01Z")
    legacy_after = _pod("j-controller-1", "p-l2", lbl.ROLE_CONTROLLER, None, created="2026-01-01T00:00:20Z")
    index = _index(old, new, legacy_before, legacy_after)
    got = {v.uid for v in incarnation.own(index, "ns", "j", "new-uid", "2026-01-01T00:00:05Z")}
    assert got == {"p-new", "p-l2"}
    assert {v.uid for v in incarnation.own(index, "ns", "j", "old-uid", "")} == {"p-old"}
    assert incarnation.belongs({lbl.JOB_UID: "new-uid"}, "new-uid")
    assert not incarnation.belongs({lbl.JOB_UID: "old-uid"}, "new-uid")
    # jobsets too
    js = {"metadata": {"name": "j-slice-0", "labels": {lbl.JOB_NAME: "j", lbl.JOB_UID: "old-uid"}}}
    jobsets = {incarnation.index_key("ns", js["metadata"]["labels"]): [jobset_view(js, 0)]}
    assert incarnation.own(jobsets, "ns", "j", "new-uid", "2026-01-01T00:00:05Z") == []


def _reconcile(state, meta, status, pods, jobsets=None):
    patch = _Patch()
    body = {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": meta, "spec": SPEC}
    job_pass.reconcile_pass(body=body, spec=SPEC, status=status, meta=meta, namespace="ns", name="j", patch=patch,
                           memo={"elasticjax": state}, job_pods=pods, job_jobsets=jobsets or {})
    return {**status, **patch.status}


class _KubeWithOldPod(_Kube):
    """The API server still holds the old job's controller pod `j-controller-0` (terminating)."""

    def __init__(self):
        super().__init__()
        self.old_pod_gone = False

    def create(self, namespace, body):
        if body["metadata"]["name"] == "j-controller-0" and not self.old_pod_gone:
            return False  # 409
        return super().create(namespace, body)

    def owners(self, namespace, kind, name):
        return []

    def owned_by(self, namespace, kind, name, owner_uid):
        return not (kind == "Pod" and name == "j-controller-0" and not self.old_pod_gone)


def test_reapplied_job_ignores_the_old_jobs_terminating_pods_and_waits_for_their_names(monkeypatch):
    events = []
    monkeypatch.setattr(kopf, "event", lambda ref, type, reason, message: events.append((type, reason, message)))
    state = operator_state.OperatorState(kube=_KubeWithOldPod(), key=b"k" * 32)
    meta = {"name": "j", "namespace": "ns", "uid": "new-uid", "generation": 1, "creationTimestamp": "2026-01-01T00:00:30Z"}
    # The old job's pods: a controller terminating (SIGTERM: exit 143 soon) and a worker that already failed.
    old_ctrl = _pod("j-controller-0", "c-old", lbl.ROLE_CONTROLLER, "old-uid", deleting=True)
    old_worker = _pod("j-slice-0-worker-0-0-old", "w-old", lbl.ROLE_WORKER, "old-uid", phase="Failed", exit_code=143)
    old_js = {"metadata": {"name": "j-slice-0", "labels": {lbl.JOB_NAME: "j", lbl.JOB_UID: "old-uid",
                                                          lbl.SLICE_INDEX: "0"}, "deletionTimestamp": "x"}}
    pods = _index(old_ctrl, old_worker)
    jobsets = {incarnation.index_key("ns", old_js["metadata"]["labels"]): [jobset_view(old_js, 0)]}
    status: dict = {}
    for _ in range(3):
        status = _reconcile(state, meta, status, pods, jobsets)
    kube = state.kube
    # nothing of the old job is deleted or counted; the controller name is awaited, not counted as a restart
    assert "j-controller-0" not in kube.deleted and "j-slice-0" not in kube.deleted
    assert int(status.get("controllerRestarts") or 0) == 0
    assert not any(r in ("SliceDown", "ControllerRestarted", "WorkerReplaced") for _, r, _ in events), events
    cond = next(c for c in status["conditions"] if c["type"] == "CreateFailed")
    assert cond["status"] == "True" and cond["reason"] == "PreviousJobTerminating" and "j-controller-0" in cond["message"]
    assert "j-slice-0" in kube.created  # its own JobSet (the old one's name is free by the time it lands)
    # the old pod is gone: the new job's controller is created, nothing counted
    kube.old_pod_gone = True
    status = _reconcile(state, meta, status, {})
    assert "j-controller-0" in kube.created and int(status.get("controllerRestarts") or 0) == 0
    assert next(c for c in status["conditions"] if c["type"] == "CreateFailed")["status"] == "False"


def test_a_foreign_pod_holding_the_controller_name_is_a_name_conflict_not_an_earlier_job(monkeypatch):
    """Trial (kind): an unrelated pod named <job>-controller-0 was reported as "an earlier job of this name
    (deleted, still terminating)"; no earlier job existed."""
    monkeypatch.setattr(kopf, "event", lambda *a, **k: None)
    state = operator_state.OperatorState(kube=_KubeWithOldPod(), key=b"k" * 32)
    meta = {"name": "j", "namespace": "ns", "uid": "new-uid", "generation": 1, "creationTimestamp": "2026-01-01T00:00:30Z"}
    status = _reconcile(state, meta, {}, {})  # the pod is in no index of this operator's jobs
    cond = next(c for c in status["conditions"] if c["type"] == "CreateFailed")
    assert cond["status"] == "True" and cond["reason"] == "ChildNameConflict", cond
    assert "Pod j-controller-0 exists and is not owned by this job" in cond["message"]
    assert "j-controller-0" not in state.kube.deleted


def test_the_worker_pod_event_of_an_old_incarnation_is_not_this_jobs_news(monkeypatch):
    calls = []
    state = operator_state.OperatorState(kube=_Kube(), key=b"k" * 32)
    tracker = job_pass.JobTracker("ns", "j", 1, 1)
    tracker.observe = lambda *a, **k: calls.append(a)  # type: ignore[method-assign]
    state.jobs.add(job_pass.JobState("ns", "j", "new-uid", "", tracker, ref={"metadata": {"name": "j"}}))
    asyncio.run(handlers.worker_pod_event(namespace="ns", labels={lbl.JOB_NAME: "j", lbl.JOB_UID: "old-uid"},
                                          job_pods={}, memo={"elasticjax": state}))
    assert calls == []
    asyncio.run(handlers.worker_pod_event(namespace="ns", labels={lbl.JOB_NAME: "j", lbl.JOB_UID: "new-uid"},
                                          job_pods={}, memo={"elasticjax": state}))
    assert len(calls) == 1


def test_deleting_the_old_job_late_never_drops_the_new_jobs_tracker():
    state = operator_state.OperatorState(kube=_Kube(), key=b"k" * 32)
    tracker = job_pass.JobTracker("ns", "j", 1, 1)
    state.jobs.add(job_pass.JobState("ns", "j", "new-uid", "", tracker))
    handlers.job_deleted(namespace="ns", name="j", uid="old-uid", memo={"elasticjax": state})
    assert state.jobs.tracker(("ns", "j")) is tracker and not tracker.deleting
    handlers.job_deleted(namespace="ns", name="j", uid="new-uid", memo={"elasticjax": state})
    assert ("ns", "j") not in state.jobs and tracker.deleting
