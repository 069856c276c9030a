"""Operator races a new-user trial found (issue 9 follow-up): stale snapshots, teardown read as loss, taken names.

The kopf shell (`handlers.reconcile_once`, `handlers.worker_pod_event`) runs with real pod and
JobSet objects (as the API returns them, read through `pod_view`/`jobset_view`), the real
`JobTracker`, and a stand-in only for the API server and the controller's HTTP API.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools

import kopf
from kubernetes import client as k8s

from elastic_jax.api import labels as lbl
from elastic_jax.api.control import ControllerStatus
from elastic_jax.k8s_operator import handlers, incarnation, job_pass, metrics, operator_state
from elastic_jax.k8s_operator.kube import Kube
from elastic_jax.k8s_operator.slices import jobset_view
from elastic_jax.k8s_operator.slices import pod_view
from elastic_jax.k8s_operator.tracker import JobTracker
from tests.support.fake_kube import FakeKube


def _replaced() -> float:
    """`elasticjax_operator_slice_replacements_total` now (tests compare it before and after)."""
    return metrics.SLICE_REPLACEMENTS._value.get()


UID = "u-new"
SPEC = {"slices": {"count": 1}, "training": {"steps": 10, "globalBatchSize": 1}, "checkpoint": {"uri": "/tmp/ck"}}


def _worker(rv: int, ready: bool, name="j-slice-0-worker-0-0-a", uid="w0", job_uid=UID):
    return pod_view({
        "metadata": {"name": name, "uid": uid, "resourceVersion": str(rv), "labels": {
            lbl.ROLE: lbl.ROLE_WORKER, lbl.JOB_NAME: "j", lbl.JOB_UID: job_uid, lbl.SLICE_INDEX: "0",
            lbl.JOB_COMPLETION_INDEX: "0", lbl.JOBSET_RESTART_ATTEMPT: "0"}},
        "status": {"phase": "Running", "podIP": "127.0.10.2" if ready else "",
                   "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}})


def _controller(attempt=0, deleting=False, exit_code=None, job_uid=UID):
    meta = {"name": f"j-controller-{attempt}", "uid": f"c{attempt}", "labels": {
        lbl.ROLE: lbl.ROLE_CONTROLLER, lbl.JOB_NAME: "j", lbl.JOB_UID: job_uid, lbl.CONTROLLER_ATTEMPT: str(attempt)}}
    if deleting:
        meta.update(deletionTimestamp="2026-01-01T00:01:00Z", deletionGracePeriodSeconds=30)
    status = {"phase": "Running", "podIP": "127.0.11.2", "conditions": [{"type": "Ready", "status": "True"}]}
    if exit_code is not None:
        status = {"phase": "Failed", "containerStatuses": [{"name": "controller", "state": {
            "terminated": {"exitCode": exit_code}}}]}
    return pod_view({"metadata": meta, "status": status})


class _Controller:
    """The controller's control API as the operator's client sees it; `during_status` runs inside the HTTP call."""

    def __init__(self, url, token):
        self.reports: list[tuple[int, str]] = []
        self.during_status = None

    def status(self, after=None, wait_s=0.0):
        if self.during_status is not None:
            hook, self.during_status = self.during_status, None
            hook()
        return ControllerStatus(phase="Running", step=3, total_steps=10, desired_slices=1, min_slices=1,
                                active_slices=[0], inactive_slices=[], slices=[], pid=1)

    def report_slice(self, index, state, generation, addresses, reason, retries, backoff_s):
        self.reports.append((index, state))

    def close(self):
        pass


def _Kube(taken=None):
    """The API server: creates succeed unless the name is `taken` (name -> ownerReferences)."""
    return FakeKube(taken=taken, owns_unknown=False)


class _Patch:
    def __init__(self):
        self.status: dict = {}


class _Job:
    """One ElasticTrainingJob as kopf hands it to the timer: status and resourceVersion move on only when
    the watch brings the object back (`land`)."""

    def __init__(self, monkeypatch, kube=None, status=None, suspend=False):
        self.events: list[tuple[str, str, str]] = []
        self.on_event: dict = {}  # Event reason -> run once while the pass posts it (another thread's moment)

        def event(ref, type, reason, message):
            self.events.append((type, reason, message))
            hook = self.on_event.pop(reason, None)
            if hook is not None:
                hook()

        monkeypatch.setattr(kopf, "event", event)
        self.controllers: list[_Controller] = []

        def factory(url, token):
            self.controllers.append(_Controller(url, token))
            return self.controllers[-1]

        monkeypatch.setattr(job_pass, "JobTracker", functools.partial(JobTracker, client_factory=factory))
        self.state = operator_state.OperatorState(kube=kube or _Kube(), key=b"k" * 32)
        self.rv = 100
        self.spec = dict(SPEC, suspend=suspend)
        self.status = dict({"phase": "Running", "controllerPod": "j-controller-0", "tokenSecret": "j-token"}
                           if status is None else status)
        self.deletion = ""
        self.pods: dict = {}
        # slice 0's JobSet lives (its pods' losses are news) unless a test says otherwise
        self.jobsets: dict = {("ns", "j", UID): [jobset_view({"metadata": {"name": "j-slice-0"}}, 0)]}
        self.pending: dict = {}
        self.unready_nodes: dict = {}

    def meta(self):
        meta = {"name": "j", "namespace": "ns", "uid": UID, "generation": 1, "resourceVersion": str(self.rv),
                "creationTimestamp": "2026-01-01T00:00:00Z"}
        if self.deletion:
            meta["deletionTimestamp"] = self.deletion
        return meta

    def reconcile(self, land=True):
        """One timer pass; `land`: the watch brings the patched object back before the next pass."""
        meta = self.meta()
        body = {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": meta,
                "spec": self.spec}
        patch = _Patch()
        job_pass.reconcile_pass(body=body, spec=self.spec, status=dict(self.status), meta=meta, namespace="ns",
                               name="j", patch=patch, memo={"elasticjax": self.state}, job_pods=self.pods,
                               job_jobsets=self.jobsets, unready_nodes=self.unready_nodes)
        self.pending.update(patch.status)
        if land:
            self.land()
        return patch.status

    def land(self):
        if self.pending:
            self.status.update(self.pending)
            self.pending = {}
            self.rv += 1

    def pod_event(self):
        asyncio.run(handlers.worker_pod_event(namespace="ns", labels={lbl.JOB_NAME: "j", lbl.JOB_UID: UID},
                                              job_pods=self.pods, memo={"elasticjax": self.state},
                                              job_jobsets=self.jobsets))

    @property
    def tracker(self) -> JobTracker:
        return self.state.jobs.tracker(("ns", "j"))


def _pods(*views):
    return {("ns", "j", UID): list(views)}


# -- 1. a stale pod snapshot never wins ------------------------------------------------------


def test_tracker_never_applies_a_snapshot_read_before_one_it_applied():
    replaced = _replaced()
    t = JobTracker("ns", "j", 1, 1, client_factory=_Controller)
    t.token = "tok"
    t.set_controller(_controller())
    events = []
    older = t.observation()
    stale = [_worker(10, ready=False)]  # read first ...
    newer = t.observation()
    t.sync([_worker(11, ready=True)], lambda *e: events.append(e), observed_at=newer)  # ... applied second
    t.sync(stale, lambda *e: events.append(e), observed_at=older)
    assert t.slices[0].state == "Ready"
    assert t.client.reports == [(0, "Ready")]
    assert not any(r == "SliceDown" for _, r, _ in events) and _replaced() == replaced


def test_tracker_never_applies_an_older_resource_version_of_a_pod():
    t = JobTracker("ns", "j", 1, 1, client_factory=_Controller)
    t.token = "tok"
    t.set_controller(_controller())
    t.sync([_worker(11, ready=True)], lambda *e: None)
    t.sync([_worker(10, ready=False)], lambda *e: None)  # no mark: the pod's own version tells
    assert t.slices[0].state == "Ready" and t.client.reports == [(0, "Ready")]
    t.sync([_worker(12, ready=False)], lambda *e: None)  # a newer observation does count
    assert t.slices[0].state == "Down" and t.client.reports == [(0, "Ready"), (0, "Down")]


def test_the_timer_does_not_apply_the_pods_it_read_before_polling_the_controller(monkeypatch):
    """Trial: slice Ready, then "Down (0/1 hosts ready)" 0.5 s later: the timer read the pods, polled the
    controller (HTTP), meanwhile the pod event applied Ready, then the timer applied its older read."""
    replaced = _replaced()
    job = _Job(monkeypatch)
    job.pods = _pods(_controller(), _worker(10, ready=False))
    job.reconcile()  # the controller client exists now
    assert job.tracker.slices[0].state == "Provisioning"

    def worker_turns_ready():  # during the timer's HTTP call: the watch delivers the Ready pod
        job.pods[("ns", "j", UID)] = [_controller(), _worker(11, ready=True)]
        job.pod_event()

    job.pods[("ns", "j", UID)] = [_controller(), _worker(10, ready=False)]
    job.controllers[-1].during_status = worker_turns_ready
    job.reconcile()
    assert job.tracker.slices[0].state == "Ready"
    assert job.controllers[-1].reports == [(0, "Ready")]
    assert not any(r in ("SliceDown", "ControllerNotified") and "Down" in m for _, r, m in job.events)
    assert _replaced() == replaced


def test_a_pass_on_the_job_object_its_last_pass_patched_waits_for_the_watch(monkeypatch):
    """The timer's object comes from the watch, not from its own PATCH: a pass that still sees the
    status before its last write would replace the same lost controller twice."""
    job = _Job(monkeypatch)
    job.pods = _pods(_controller(exit_code=137))
    written = job.reconcile(land=False)
    assert written["controllerPod"] == "j-controller-1" and written["controllerRestarts"] == 1
    # The index already shows the new pod? Not yet: the watch is behind on both.
    assert job.reconcile(land=False) == {}  # the same object again: nothing decided on it
    assert [n for n in job.state.kube.created if "controller-" in n] == ["j-controller-1"]
    job.land()
    job.pods = _pods(_controller(exit_code=137), _controller(attempt=1))
    job.reconcile()
    assert [n for n in job.state.kube.created if "controller-" in n] == ["j-controller-1"]
    assert job.status["controllerRestarts"] == 1


def test_a_node_ready_again_during_the_controller_poll_has_no_pod_force_deleted(monkeypatch):
    """The lost-node view is read after the poll too: a node back before the pass acts keeps its pods."""
    import datetime as dt

    from elastic_jax.k8s_operator.nodes import node_view

    job = _Job(monkeypatch)
    job.state.node_lost_s = 30
    worker = dataclasses.replace(_worker(10, ready=False), node="n1")
    job.pods = _pods(_controller(), worker)
    job.reconcile()
    since = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=45)).strftime("%Y-%m-%dT%H:%M:%SZ")
    job.unready_nodes = {"n1": [node_view({"metadata": {"name": "n1"}, "status": {"conditions": [
        {"type": "Ready", "status": "Unknown", "lastTransitionTime": since, "reason": "NodeStatusUnknown"}]}})]}

    def node_back():  # the kubelet posts Ready again: kopf drops the node from the index
        job.unready_nodes.clear()
        job.pods[("ns", "j", UID)] = [_controller(), dataclasses.replace(_worker(11, ready=True), node="n1")]

    job.controllers[-1].during_status = node_back
    job.reconcile()
    assert job.state.kube.deleted == [] and not [e for e in job.events if e[1] == "NodeLost"], job.events


# -- 2. a teardown the operator started is never a loss -------------------------------------


def _restarts(job):
    return int(job.status.get("controllerRestarts") or 0)


def test_suspend_toggled_off_within_a_second_counts_no_controller_loss(monkeypatch):
    job = _Job(monkeypatch)
    job.pods = _pods(_controller(), _worker(10, ready=True))
    job.reconcile()
    job.spec["suspend"] = True
    job.reconcile()  # lets go of the controller in status first
    job.reconcile()  # then deletes it (graceful: it checkpoints)
    assert "j-controller-0" in job.state.kube.deleted and job.status["controllerPod"] == ""
    job.pods = _pods(_controller(deleting=True), _worker(10, ready=True))
    job.spec["suspend"] = False  # a second later
    job.reconcile()
    job.reconcile()
    assert not [n for n in job.state.kube.created if "controller-" in n]  # the old one still checkpoints
    job.pods = _pods(_controller(deleting=True, exit_code=75), _worker(10, ready=True))
    job.reconcile()
    assert [n for n in job.state.kube.created if "controller-" in n] == ["j-controller-1"]
    assert _restarts(job) == 0
    # no loss; the only Warnings say that the local (emptyDir) checkpoints went with the pod, once each
    warnings = [e[1] for e in job.events if e[0] == "Warning"]
    assert warnings == ["SuspendDropsCheckpoints", "ResumedFromStepZero"], job.events


def test_a_resumed_jobs_controller_pod_gets_a_name_no_earlier_pod_of_the_job_had(monkeypatch):
    """Session 16's open item: controller pods -0, -1, then after a suspend and resume -0 again (the status named
    no pod while suspended, so the next incarnation started over). `status.controllerAttempt` keeps the newest."""
    job = _Job(monkeypatch, status={"phase": "Running", "controllerPod": "j-controller-1", "controllerRestarts": 1,
                                    "tokenSecret": "j-token"})
    job.pods = _pods(_controller(attempt=1), _worker(10, ready=True))
    job.reconcile()
    assert job.status["controllerAttempt"] == 1
    job.spec["suspend"] = True
    job.reconcile()  # lets go of the controller in status first
    job.reconcile()  # then deletes it
    job.pods = _pods()  # its pod and the JobSet's are gone
    job.reconcile()
    assert job.status["controllerPod"] == "" and job.status["controllerAttempt"] == 1
    job.spec["suspend"] = False
    job.reconcile()
    assert [n for n in job.state.kube.created if "controller-" in n] == ["j-controller-2"]
    assert job.status["controllerPod"] == "j-controller-2" and job.status["controllerAttempt"] == 2
    assert _restarts(job) == 1  # (a resume is no restart)


def test_suspend_toggled_off_before_the_pod_was_deleted_deletes_and_counts_nothing(monkeypatch):
    job = _Job(monkeypatch)
    job.pods = _pods(_controller(), _worker(10, ready=True))
    job.reconcile()
    job.spec["suspend"] = True
    job.reconcile(land=False)
    job.spec["suspend"] = False  # the user's edit, right after our status write
    job.land()
    job.reconcile()
    job.reconcile()
    assert job.state.kube.deleted == [] and not [n for n in job.state.kube.created if "controller-" in n]
    assert job.status["controllerPod"] == "j-controller-0" and _restarts(job) == 0
    assert not [e for e in job.events if e[0] == "Warning"], job.events


def test_a_job_being_deleted_neither_replaces_nor_reports_its_children(monkeypatch):
    """Foreground deletion (or another's finalizer): the job stays while the garbage collector removes its
    pods; their end is not a controller loss, not a slice replacement, not a Warning."""
    replaced = _replaced()
    job = _Job(monkeypatch)
    job.pods = _pods(_controller(), _worker(10, ready=True))
    job.reconcile()
    job.deletion = "2026-01-01T00:02:00Z"
    job.pods = _pods(_controller(deleting=True), _worker(11, ready=False))
    job.reconcile()
    job.pod_event()
    job.pods = _pods(_worker(12, ready=False))
    job.reconcile()
    job.pod_event()
    assert not [n for n in job.state.kube.created if "controller-" in n] and job.state.kube.deleted == []
    assert _replaced() == replaced and _restarts(job) == 0
    assert not [e for e in job.events if e[0] == "Warning"], job.events
    assert (0, "Down") not in job.controllers[-1].reports
    # the delete event: the tracker is dropped; a late pod event finds nothing to report
    handlers.job_deleted(namespace="ns", name="j", uid=UID, memo={"elasticjax": job.state})
    job.pod_event()


def test_workers_whose_jobset_is_gone_or_going_are_torn_down_not_lost(monkeypatch):
    """Background deletion: the job is gone at once and the garbage collector deletes its JobSets, then
    their pods (grace period: they would read as drains), possibly before the job's delete event is
    handled. A slice whose JobSet is gone loses its pods on purpose: no Warning, nothing counted."""
    replaced = _replaced()
    job = _Job(monkeypatch)
    jobset = jobset_view({"metadata": {"name": "j-slice-0", "labels": {}}}, 0)
    job.jobsets = {("ns", "j", UID): [jobset]}
    job.pods = _pods(_controller(), _worker(10, ready=True))
    job.reconcile()
    assert job.tracker.slices[0].state == "Ready"
    going = dataclasses.replace(_worker(11, ready=True), deleting=True, deletion_grace_s=5)
    job.jobsets = {}  # the garbage collector deleted the JobSet first
    job.pods = _pods(_controller(), going)
    job.pod_event()
    assert job.tracker.slices[0].state == "Draining"  # the controller is still told
    job.pods = _pods(_controller())
    job.pod_event()
    assert _replaced() == replaced
    assert not [e for e in job.events if e[0] == "Warning"], job.events
    # while its JobSet lives, the same drain and loss are news and count
    job2 = _Job(monkeypatch)
    replaced = _replaced()
    job2.jobsets = {("ns", "j", UID): [jobset]}
    job2.pods = _pods(_controller(), _worker(10, ready=True))
    job2.reconcile()
    job2.pods = _pods(_controller(), going)
    job2.pod_event()
    job2.pods = _pods(_controller())
    job2.pod_event()
    assert _replaced() == replaced + 1
    assert [e[1] for e in job2.events if e[0] == "Warning"] == ["SliceDraining", "SliceDown"]


def test_a_finished_job_stays_finished_on_a_pass_over_an_older_object(monkeypatch):
    replaced = _replaced()
    job = _Job(monkeypatch)
    job.pods = _pods(_controller(exit_code=0), _worker(10, ready=True))
    job.reconcile(land=False)
    assert job.pending["phase"] == "Succeeded" and job.tracker.finished
    job.rv += 1  # some other change of the job arrives first; our status write is not in it

    def workers_go():  # a pod event on another thread while this pass runs
        job.pods = _pods(_controller(exit_code=0), _worker(11, ready=False))
        job.pod_event()

    job.on_event["JobSucceeded"] = workers_go
    job.reconcile(land=False)
    assert job.tracker.finished and "JobSucceeded" not in job.on_event
    assert _replaced() == replaced
    assert not [e for e in job.events if e[1] in ("SliceDown", "ControllerRestarted")], job.events


# -- 3. every child name taken by someone else is said; an earlier job's is waited for ------


def _foreign_jobset_kube():
    return _Kube(taken={"j-slice-0": []})


def test_a_foreign_jobset_holding_a_slice_name_is_a_child_name_conflict(monkeypatch):
    job = _Job(monkeypatch, kube=_foreign_jobset_kube())
    job.jobsets = {}
    job.pods = _pods(_controller())
    job.reconcile()
    job.reconcile()
    cond = next(c for c in job.status["conditions"] if c["type"] == "CreateFailed")
    assert cond["status"] == "True" and cond["reason"] == "ChildNameConflict"
    assert "JobSet j-slice-0 exists and is not owned by this job" in cond["message"]
    assert [e for e in job.events if e[1] == "ChildNameConflict"] == [("Warning", "ChildNameConflict", cond["message"])]
    assert "j-slice-0" not in job.state.kube.deleted
    # the foreign JobSet is removed: the slice's own is created and the condition clears
    job.state.kube.taken.clear()
    job.reconcile()
    assert "j-slice-0" in job.state.kube.created
    assert next(c for c in job.status["conditions"] if c["type"] == "CreateFailed")["status"] == "False"


def test_a_jobset_of_this_job_or_of_an_earlier_job_of_this_name_is_no_conflict(monkeypatch):
    earlier = [{"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "name": "j", "uid": "u-old"}]
    job = _Job(monkeypatch, kube=_Kube(taken={"j-slice-0": earlier}))
    job.jobsets = {}
    job.pods = _pods(_controller())
    job.reconcile()
    cond = next(c for c in job.status["conditions"] if c["type"] == "CreateFailed")
    assert cond["reason"] == "PreviousJobTerminating" and "JobSet j-slice-0" in cond["message"]
    assert not [e for e in job.events if e[0] == "Warning"], job.events
    # ours (the index is only behind): nothing to say
    job2 = _Job(monkeypatch, kube=_Kube(taken={"j-slice-0": [{"uid": UID}]}))
    job2.jobsets = {}
    job2.pods = _pods(_controller())
    job2.reconcile()
    assert not any(c["type"] == "CreateFailed" and c["status"] == "True" for c in job2.status.get("conditions", []))


def test_holder_reads_owner_references():
    etj = {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob"}
    assert incarnation.holder([{**etj, "name": "j", "uid": UID}], "j", UID) == "ours"
    assert incarnation.holder([{**etj, "name": "j", "uid": "old"}], "j", UID) == "earlier"
    assert incarnation.holder(None, "j", UID) == "earlier"  # gone since the 409
    assert incarnation.holder([], "j", UID) == "foreign"
    assert incarnation.holder([{**etj, "name": "other", "uid": "x"}], "j", UID) == "foreign"
    assert incarnation.holder([{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "j", "uid": "x"}], "j", UID) == "foreign"


def test_kube_owners_reads_jobsets_and_core_objects():
    class _Custom:
        def get_namespaced_custom_object(self, group, version, namespace, plural, name, _request_timeout):
            return {"metadata": {"name": name, "ownerReferences": [
                {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "name": "j", "uid": "u1"}]}}

    class _Core:
        def read_namespaced_config_map(self, name, namespace, _request_timeout):
            return k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=name, owner_references=[k8s.V1OwnerReference(
                api_version="elasticjax.dev/v1alpha1", kind="ElasticTrainingJob", name="j", uid="u2")]))

        def read_namespaced_service(self, name, namespace, _request_timeout):
            from kubernetes.client.rest import ApiException
            raise ApiException(status=404)

    kube = Kube.__new__(Kube)
    kube.custom, kube.core = _Custom(), _Core()
    assert kube.owners("ns", "JobSet", "j-slice-0")[0]["uid"] == "u1" and kube.owned_by("ns", "JobSet", "j-slice-0", "u1")
    assert kube.owners("ns", "ConfigMap", "j-manifest") == [
        {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "name": "j", "uid": "u2"}]
    assert kube.owners("ns", "Service", "j-controller") is None


def test_a_configmap_of_an_earlier_job_of_this_name_is_waited_for_not_a_conflict(monkeypatch):
    earlier = [{"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "name": "j", "uid": "u-old"}]
    job = _Job(monkeypatch, kube=_Kube(taken={"j-manifest": earlier}), status={})
    job.reconcile()
    cond = next(c for c in job.status["conditions"] if c["type"] == "CreateFailed")
    assert cond["reason"] == "PreviousJobTerminating" and "ConfigMap j-manifest" in cond["message"]
    assert not [e for e in job.events if e[0] == "Warning"], job.events
    assert not [n for n in job.state.kube.created if "controller-" in n]  # nothing starts meanwhile


# -- 4. the earlier job's token Secret, still being garbage-collected ------------------------


def test_a_token_secret_of_a_job_just_deleted_under_this_name_is_waited_for(monkeypatch):
    """Trial: delete + apply again at once gave a transient TokenSecretConflict Warning."""
    job = _Job(monkeypatch, kube=_Kube(taken={"j-token": None}), status={})
    handlers.job_deleted(namespace="ns", name="j", uid="u-old", memo={"elasticjax": job.state})  # the earlier job
    job.reconcile()
    cond = next(c for c in job.status["conditions"] if c["type"] == "CreateFailed")
    assert cond["reason"] == "PreviousJobTerminating"
    assert cond["message"].startswith("waiting for the earlier job's Secret j-token to go")
    assert not [e for e in job.events if e[0] == "Warning"], job.events
    assert job.state.kube.created == []  # nothing starts without our own token
    del job.state.kube.taken["j-token"]  # the garbage collector removed it
    job.reconcile()
    assert "j-token" in job.state.kube.created and job.status["tokenSecret"] == "j-token"
    assert next(c for c in job.status["conditions"] if c["type"] == "CreateFailed")["status"] == "False"


def test_the_earlier_jobs_children_in_the_indexes_or_its_configmap_show_its_secret_is_going(monkeypatch):
    job = _Job(monkeypatch, kube=_Kube(taken={"j-token": None}), status={})
    job.pods = {("ns", "j", "u-old"): [_controller(deleting=True, job_uid="u-old")]}  # e.g. after an operator restart
    job.reconcile()
    assert next(c for c in job.status["conditions"] if c["type"] == "CreateFailed")["reason"] == "PreviousJobTerminating"
    earlier = [{"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "name": "j", "uid": "u-old"}]
    job2 = _Job(monkeypatch, kube=_Kube(taken={"j-token": None, "j-manifest": earlier}), status={})
    job2.reconcile()
    assert next(c for c in job2.status["conditions"] if c["type"] == "CreateFailed")["reason"] == "PreviousJobTerminating"


def test_a_token_secret_with_no_earlier_job_in_sight_is_still_a_conflict(monkeypatch):
    job = _Job(monkeypatch, kube=_Kube(taken={"j-token": None}), status={})
    job.reconcile()
    cond = next(c for c in job.status["conditions"] if c["type"] == "CreateFailed")
    assert cond["reason"] == "TokenSecretConflict"
    assert [e[:2] for e in job.events if e[0] == "Warning"] == [("Warning", "TokenSecretConflict")]


def _slice_pod(name, uid, created, ready, deleting=False):
    meta = {"name": name, "uid": uid, "resourceVersion": "1", "creationTimestamp": created, "labels": {
        lbl.ROLE: lbl.ROLE_WORKER, lbl.JOB_NAME: "j", lbl.JOB_UID: UID, lbl.SLICE_INDEX: "0",
        lbl.JOB_COMPLETION_INDEX: "0", lbl.JOBSET_RESTART_ATTEMPT: "0"}}
    if deleting:
        meta.update(deletionTimestamp="2026-01-01T00:05:00Z", deletionGracePeriodSeconds=5)
    return pod_view({"metadata": meta, "status": {"phase": "Running", "podIP": "127.0.10.2" if ready else "",
                                                  "conditions": [{"type": "Ready", "status": str(ready)}]}})


def test_a_resumed_slices_new_jobset_never_counts_the_old_jobsets_terminating_pods(monkeypatch):
    """Kind (issue 9 item 4): a quick suspend toggle posted SliceDraining/SliceDown and counted replacements:
    the JobSet the resume created again under the slice's name got the deleted one's terminating pods
    (same slice index, same restart attempt) as its own, and their end as the slice's loss."""
    replaced = _replaced()
    job = _Job(monkeypatch)
    old_js = jobset_view({"metadata": {"name": "j-slice-0", "uid": "js1", "creationTimestamp": "2026-01-01T00:00:01Z"}}, 0)
    job.jobsets = {("ns", "j", UID): [old_js]}
    old = _slice_pod("j-slice-0-worker-0-0-a", "w-old", "2026-01-01T00:00:02Z", ready=True)
    job.pods = _pods(_controller(), old)
    job.reconcile()
    job.pod_event()
    assert job.tracker.slices[0].state == "Ready"
    # suspended: the controller checkpoints and exits, the JobSet and its pod are being deleted
    job.spec["suspend"] = True
    job.reconcile()
    job.reconcile()
    terminating = _slice_pod("j-slice-0-worker-0-0-a", "w-old", "2026-01-01T00:00:02Z", ready=False, deleting=True)
    job.jobsets = {("ns", "j", UID): [dataclasses.replace(old_js, deleting=True)]}
    job.pods = _pods(_controller(deleting=True, exit_code=75), terminating)
    job.pod_event()
    job.reconcile()
    # resumed: the old JobSet is gone, the new one (same name) exists, the old pod still terminates
    job.spec["suspend"] = False
    new_js = jobset_view({"metadata": {"name": "j-slice-0", "uid": "js2", "creationTimestamp": "2026-01-01T00:05:01Z"}}, 0)
    job.jobsets = {("ns", "j", UID): [new_js]}
    fresh = _slice_pod("j-slice-0-worker-0-0-b", "w-new", "2026-01-01T00:05:02Z", ready=False)
    for pods in ((terminating,), (terminating, fresh), (fresh,)):
        job.pods = _pods(_controller(attempt=1), *pods)
        job.pod_event()
        job.reconcile()
    job.pods = _pods(_controller(attempt=1),
                     _slice_pod("j-slice-0-worker-0-0-b", "w-new", "2026-01-01T00:05:02Z", ready=True))
    job.pod_event()
    job.reconcile()
    assert job.tracker.slices[0].state == "Ready"
    bad = [e for e in job.events if e[1] in ("SliceDown", "SliceDraining")]
    assert bad == [] and _replaced() == replaced, job.events


# -- 3. a healthy job with no news costs no pass ---------------------------------------------


def test_the_timer_skips_a_whole_jobs_pass_until_something_it_reads_moves(monkeypatch):
    """Issue 12 item 4: each job's 1 s pass (render, decide, build status) ran whether or not anything
    changed. Once a pass found the job whole and changed nothing, the timer skips passes whose inputs
    (`pass_inputs`) are the same; a pod change, a new controller answer or a new job object runs one."""
    from elastic_jax.k8s_operator import tracker as tracker_mod

    job = _Job(monkeypatch)
    job.pods = _pods(_controller(), _worker(10, ready=True))
    ran = []
    real_pass = job_pass.reconcile_pass

    def counted(**kwargs):
        ran.append(kwargs["inputs"])
        return real_pass(**kwargs)

    monkeypatch.setattr(job_pass, "reconcile_pass", counted)

    def tick():
        meta = job.meta()
        body = {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": meta,
                "spec": job.spec}
        patch = _Patch()
        asyncio.run(handlers.reconcile_once(body=body, spec=job.spec, status=dict(job.status), meta=meta,
                                            namespace="ns", name="j", patch=patch, memo={"elasticjax": job.state},
                                            job_pods=job.pods, job_jobsets=job.jobsets, unready_nodes={}))
        job.pending.update(patch.status)
        job.land()

    tick()  # the first pass makes the tracker (and polls the controller once, in the pass: no link here)
    answer = job.tracker.poll_result
    assert answer is not None
    job.tracker.refresh_status = lambda: answer  # the watch's last answer, unchanged from here on
    for _ in range(5):  # passes until the status they write has landed and one writes nothing
        tick()
        if job.tracker.last_pass_quiet:
            break
    assert job.tracker.last_pass_quiet, job.status
    passes = len(ran)
    for _ in range(3):
        tick()
    assert len(ran) == passes  # nothing moved: no pass

    job.tracker.answers += 1  # the watch brought an answer (a change, or a long poll's end)
    tick()
    assert len(ran) == passes + 1
    tick()
    assert len(ran) == passes + 1  # ... and that pass was quiet again

    job.pods = _pods(_controller(), _worker(11, ready=False))  # a worker pod changed
    tick()
    assert len(ran) == passes + 2 and job.tracker.slices[0].state == "Down"

    # a quiet job still gets a full pass every QUIET_RESYNC_S (a net for inputs a pass reads and these miss)
    job.pods = _pods(_controller(), _worker(12, ready=True))
    for _ in range(5):
        tick()
    settled = len(ran)
    monkeypatch.setattr(tracker_mod, "QUIET_RESYNC_S", 0.0)
    tick()
    assert len(ran) == settled + 1
