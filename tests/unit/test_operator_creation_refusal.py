"""A worker pod that another controller could not create (the Job controller, refused by a ResourceQuota,
LimitRange, PodSecurity or a webhook) is a PodsNotStarting condition and an Event on the job naming the
reason, read from the Warning Events of the job's own JobSet and Job (issue 9: the job was Degraded with
no reason, the refusal only on the batch Job)."""

from __future__ import annotations

import kopf

from elastic_jax.api import labels as lbl
from elastic_jax.k8s_operator import incarnation, job_pass, operator_state
from tests.support.fake_clock import FakeClock
from elastic_jax.k8s_operator.pod_faults import RefusalEvent, creation_fault, slices_missing_pods
from elastic_jax.k8s_operator.slices import jobset_view
from elastic_jax.k8s_operator.slices import pod_view
from tests.unit.test_operator_handler_faults import _Kube, _Patch

QUOTA = ('pods "j-slice-1-worker-0-0-abcde" is forbidden: exceeded quota: workers, requested: pods=1, '
         'used: pods=2, limited: pods=2')


def test_creation_fault_names_the_slice_the_job_and_the_api_servers_message():
    events = [RefusalEvent("Job", "j-slice-1-worker-0", "FailedCreate", "Error creating: " + QUOTA,
                           "2026-01-01T00:00:20Z"),
              RefusalEvent("Job", "j-slice-1-worker-0", "SuccessfulCreate", "ok", "2026-01-01T00:00:21Z")]
    fault = creation_fault(1, events, since="2026-01-01T00:00:10Z")
    assert fault.condition == "PodsNotStarting" and fault.reason == "FailedCreate"
    assert fault.message.startswith("slice 1 worker pods cannot be created: Job j-slice-1-worker-0: FailedCreate")
    assert "exceeded quota: workers" in fault.message


def test_an_earlier_incarnations_events_are_not_this_jobsets_news():
    events = [RefusalEvent("Job", "j-slice-1-worker-0", "FailedCreate", QUOTA, "2026-01-01T00:00:01Z")]
    assert creation_fault(1, events, since="2026-01-01T00:00:10Z") is None


def test_slices_missing_pods_counts_only_live_pods_of_existing_jobsets():
    def worker(i, phase="Running"):
        return pod_view({"metadata": {"name": f"w{i}", "uid": f"u{i}", "labels": {
            lbl.JOB_NAME: "j", lbl.ROLE: lbl.ROLE_WORKER, lbl.SLICE_INDEX: str(i), lbl.JOB_COMPLETION_INDEX: "0"}},
            "status": {"phase": phase}})
    pods = [worker(0), worker(1, "Failed")]
    assert slices_missing_pods(pods, {0: "t", 1: "t", 2: "t"}, 1) == [1, 2]
    assert slices_missing_pods(pods, {0: "t"}, 1) == []  # no JobSet yet: the operator's own create says why


class _QuotaKube(_Kube):
    def __init__(self):
        super().__init__()
        self.reads = []
        self.refusing = True

    def job_uid_if_owned(self, namespace, name, jobset_uid):
        return f"job-of-{jobset_uid}"

    def warning_events(self, namespace, kind, name, uid=""):
        self.reads.append((kind, name))
        assert uid == {"JobSet": "js-1", "Job": "job-of-js-1"}[kind], (kind, uid)
        if kind == "Job" and name == "j-slice-1-worker-0" and self.refusing:
            return [{"reason": "FailedCreate", "message": "Error creating: " + QUOTA, "last": "2026-01-01T00:00:40Z"}]
        return []


def test_reconcile_makes_a_condition_and_one_event_from_the_jobs_failedcreate(monkeypatch):
    events = []
    monkeypatch.setattr(kopf, "event", lambda ref, type, reason, message: events.append((type, reason, message)))
    clock = FakeClock()  # (a pass a second, without sleeping: the Events are read at most every REFUSAL_CHECK_S)
    spec = {"slices": {"count": 2}, "training": {"steps": 10, "globalBatchSize": 2}, "checkpoint": {"uri": "/data/ck"}}
    meta = {"name": "j", "namespace": "ns", "uid": "u1", "generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z"}
    body = {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": meta, "spec": spec}
    state = operator_state.OperatorState(kube=_QuotaKube(), key=b"k" * 32, clock=clock)
    labels = {lbl.JOB_NAME: "j", lbl.JOB_UID: "u1"}
    worker0 = pod_view({"metadata": {"name": "j-slice-0-worker-0-0-x", "uid": "w0", "labels": {
        **labels, lbl.ROLE: lbl.ROLE_WORKER, lbl.SLICE_INDEX: "0", lbl.JOB_COMPLETION_INDEX: "0"}},
        "status": {"phase": "Running"}})
    jobsets = [jobset_view({"metadata": {"name": f"j-slice-{i}", "creationTimestamp": "2026-01-01T00:00:30Z",
                                         "uid": f"js-{i}", "labels": labels}}, i) for i in (0, 1)]
    key = incarnation.index_key("ns", labels)
    status = {"phase": "Pending", "tokenSecret": "j-token"}

    def reconcile():
        nonlocal status
        patch = _Patch()
        job_pass.reconcile_pass(body=body, spec=spec, status=status, meta=meta, namespace="ns", name="j", patch=patch,
                               memo={"elasticjax": state}, job_pods={key: [worker0]}, job_jobsets={key: jobsets})
        status = {**status, **patch.status}
        clock.advance(1.0)

    for _ in range(7):
        reconcile()
    cond = next(c for c in status["conditions"] if c["type"] == "PodsNotStarting")
    assert cond["status"] == "True" and cond["reason"] == "FailedCreate"
    assert "slice 1 worker pods cannot be created" in cond["message"] and "exceeded quota: workers" in cond["message"]
    posted = [e for e in events if e[1] == "FailedCreate"]
    assert len(posted) == 1 and "exceeded quota" in posted[0][2], events
    # bounded reads: at most one round per REFUSAL_CHECK_S, and only for the slice without its pod
    assert set(state.kube.reads) == {("JobSet", "j-slice-1"), ("Job", "j-slice-1-worker-0")}
    assert len(state.kube.reads) <= 2 * (7 // int(job_pass.REFUSAL_CHECK_S) + 1)
    # the quota is raised and the pod exists: the condition clears
    worker1 = pod_view({"metadata": {"name": "j-slice-1-worker-0-0-y", "uid": "w1", "labels": {
        **labels, lbl.ROLE: lbl.ROLE_WORKER, lbl.SLICE_INDEX: "1", lbl.JOB_COMPLETION_INDEX: "0"}},
        "status": {"phase": "Running"}})
    patch = _Patch()
    job_pass.reconcile_pass(body=body, spec=spec, status=status, meta=meta, namespace="ns", name="j", patch=patch,
                           memo={"elasticjax": state}, job_pods={key: [worker0, worker1]}, job_jobsets={key: jobsets})
    status = {**status, **patch.status}
    assert next(c for c in status["conditions"] if c["type"] == "PodsNotStarting")["status"] == "False"


def test_without_rbac_to_read_events_the_job_still_reconciles(monkeypatch):
    from kubernetes.client.rest import ApiException

    class NoEvents(_Kube):
        def job_uid_if_owned(self, namespace, name, jobset_uid):
            raise ApiException(status=403, reason="Forbidden")

        def warning_events(self, namespace, kind, name, uid=""):
            raise ApiException(status=403, reason="Forbidden")

    monkeypatch.setattr(kopf, "event", lambda *a, **k: None)
    spec = {"slices": {"count": 1}, "training": {"steps": 10, "globalBatchSize": 1}, "checkpoint": {"uri": "/data/ck"}}
    meta = {"name": "j", "namespace": "ns", "uid": "u1", "generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z"}
    body = {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": meta, "spec": spec}
    state = operator_state.OperatorState(kube=NoEvents(), key=b"k" * 32)
    labels = {lbl.JOB_NAME: "j", lbl.JOB_UID: "u1"}
    js = jobset_view({"metadata": {"name": "j-slice-0", "uid": "js-0", "labels": labels}}, 0)
    patch = _Patch()
    job_pass.reconcile_pass(body=body, spec=spec, status={"tokenSecret": "j-token"}, meta=meta, namespace="ns",
                           name="j", patch=patch, memo={"elasticjax": state}, job_pods={},
                           job_jobsets={incarnation.index_key("ns", labels): [js]})
    assert patch.status.get("phase") == "Pending"


def test_a_foreign_job_holding_the_slices_job_name_is_not_read_about(monkeypatch):
    """Issue 9 (tenancy): a tenant names their job so that `<job>-slice-0-worker-0` is someone else's
    batch Job; that Job's Warning Events (about its own pods) must not become the tenant's condition."""
    events = []
    monkeypatch.setattr(kopf, "event", lambda ref, type, reason, message: events.append((type, reason, message)))
    foreign = "Error creating: pods \"j-slice-0-worker-0-0-z\" is forbidden: error looking up service account ops/deployer"

    class Planted(_Kube):
        reads: list = []

        def job_uid_if_owned(self, namespace, name, jobset_uid):
            return None  # the Job of that name is not owned by the job's JobSet

        def warning_events(self, namespace, kind, name, uid=""):
            self.reads.append((kind, name, uid))
            # The API server applies the UID selector; a read by name alone would return the foreign Event.
            if kind == "Job" and not uid:
                return [{"reason": "FailedCreate", "message": foreign, "last": "2026-01-01T00:00:40Z"}]
            return []

    spec = {"slices": {"count": 1}, "training": {"steps": 10, "globalBatchSize": 1}, "checkpoint": {"uri": "/data/ck"}}
    meta = {"name": "j", "namespace": "ns", "uid": "u1", "generation": 1, "creationTimestamp": "2026-01-01T00:00:00Z"}
    body = {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": meta, "spec": spec}
    state = operator_state.OperatorState(kube=Planted(), key=b"k" * 32)
    labels = {lbl.JOB_NAME: "j", lbl.JOB_UID: "u1"}
    js = jobset_view({"metadata": {"name": "j-slice-0", "uid": "js-0", "creationTimestamp": "2026-01-01T00:00:30Z",
                                   "labels": labels}}, 0)
    patch = _Patch()
    job_pass.reconcile_pass(body=body, spec=spec, status={"tokenSecret": "j-token"}, meta=meta, namespace="ns",
                           name="j", patch=patch, memo={"elasticjax": state}, job_pods={},
                           job_jobsets={incarnation.index_key("ns", labels): [js]})
    assert state.kube.reads == [("JobSet", "j-slice-0", "js-0")], state.kube.reads
    assert not any("ops/deployer" in (c.get("message") or "") for c in patch.status.get("conditions") or [])
    assert not any("ops/deployer" in e[2] for e in events)


def test_the_kube_client_reads_a_jobs_events_only_by_the_uid_of_a_job_the_jobset_owns():
    from types import SimpleNamespace as NS

    from kubernetes.client.rest import ApiException

    from elastic_jax.k8s_operator.kube import Kube

    kube = Kube.__new__(Kube)  # no API connection: the two calls below are the only ones made
    jobs = {"ours": NS(metadata=NS(uid="job-1", owner_references=[NS(uid="js-1")])),
            "foreign": NS(metadata=NS(uid="job-2", owner_references=[NS(uid="someone-else")]))}

    def read_job(name, namespace, _request_timeout):
        if name not in jobs:
            raise ApiException(status=404)
        return jobs[name]
    kube.batch = NS(read_namespaced_job=read_job)
    assert kube.job_uid_if_owned("ns", "ours", "js-1") == "job-1"
    assert kube.job_uid_if_owned("ns", "foreign", "js-1") is None
    assert kube.job_uid_if_owned("ns", "absent", "js-1") is None
    selectors = []
    kube.core = NS(list_namespaced_event=lambda ns, field_selector, limit, _request_timeout: selectors.append(field_selector) or NS(items=[]))
    kube.warning_events("ns", "Job", "ours", "job-1")
    assert selectors == ["involvedObject.kind=Job,involvedObject.name=ours,type=Warning,involvedObject.uid=job-1"]
