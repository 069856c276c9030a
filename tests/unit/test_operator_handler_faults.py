"""The kopf shell applies the pod-fault decisions: an unpullable controller image makes one
condition and one Event over many passes, no new pod, nothing counted (issue 9 item 7)."""

from __future__ import annotations

import datetime as dt
import itertools

import kopf

from elastic_jax.api import labels as lbl
from elastic_jax.k8s_operator import job_pass, operator_state
from elastic_jax.k8s_operator.clock import SystemClock
from elastic_jax.k8s_operator.slices import pod_view
from elastic_jax.k8s_operator.slices import jobset_view
from tests.support.fake_kube import FakeKube


_Kube = FakeKube


class _Patch:
    def __init__(self):
        self.status: dict = {}


def test_unpullable_controller_image_one_condition_one_event_no_new_pod(monkeypatch):
    events = []
    monkeypatch.setattr(kopf, "event", lambda ref, type, reason, message: events.append((type, reason, message)))
    spec = {"slices": {"count": 1}, "training": {"steps": 10, "globalBatchSize": 1}, "checkpoint": {"uri": "/tmp/ck"}}
    meta = {"name": "j", "namespace": "ns", "uid": "u1", "generation": 1}
    body = {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": meta, "spec": spec}
    state = operator_state.OperatorState(kube=_Kube(), key=b"k" * 32)
    ctrl = pod_view({"metadata": {"name": "j-controller-0", "uid": "c0", "labels": {
        lbl.ROLE: lbl.ROLE_CONTROLLER, lbl.JOB_NAME: "j", lbl.CONTROLLER_ATTEMPT: "0"}},
        "status": {"phase": "Pending", "containerStatuses": [{"name": "controller", "image": "bad:1", "state": {
            "waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "bad:1"'}}}]}})
    jobset = jobset_view({"metadata": {"name": "j-slice-0"}}, 0)
    status = {"phase": "Pending", "controllerPod": "j-controller-0", "tokenSecret": "j-token"}
    for _ in range(5):
        patch = _Patch()
        job_pass.reconcile_pass(body=body, spec=spec, status=status, meta=meta, namespace="ns", name="j", patch=patch,
                               memo={"elasticjax": state}, job_pods={("ns", "j", "u1"): [ctrl]},
                               job_jobsets={("ns", "j", "u1"): [jobset]})
        status = {**status, **patch.status}
    assert not any(n.startswith("j-controller-") for n in state.kube.created)
    assert state.kube.deleted == []
    assert status["controllerRestarts"] == 0
    (cond,) = [c for c in status["conditions"] if c["type"] == "ImagePullFailed"]
    assert cond["status"] == "True" and "image bad:1 cannot be pulled" in cond["message"]
    assert [e[1] for e in events if e[0] == "Warning"] == ["ImagePullBackOff"]


def test_a_refused_replacement_is_neither_counted_nor_announced_until_it_exists(monkeypatch):
    from elastic_jax.k8s_operator.kube import ChildRefused

    events = []
    monkeypatch.setattr(kopf, "event", lambda ref, type, reason, message: events.append((type, reason, message)))
    spec = {"slices": {"count": 1}, "training": {"steps": 10, "globalBatchSize": 1}, "checkpoint": {"uri": "/tmp/ck"}}
    meta = {"name": "j", "namespace": "ns", "uid": "u1", "generation": 1}
    body = {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": meta, "spec": spec}

    class Refusing(_Kube):
        refuse = True

        def create(self, namespace, body):
            if self.refuse and body["metadata"]["name"].startswith("j-controller-"):
                raise ChildRefused("Pod", body["metadata"]["name"], 403, "forbidden by PodSecurity")
            return super().create(namespace, body)

    state = operator_state.OperatorState(kube=Refusing(), key=b"k" * 32)
    dead = pod_view({"metadata": {"name": "j-controller-0", "uid": "c0", "labels": {
        lbl.ROLE: lbl.ROLE_CONTROLLER, lbl.JOB_NAME: "j", lbl.CONTROLLER_ATTEMPT: "0"}},
        "status": {"phase": "Failed", "containerStatuses": [{"name": "controller", "state": {
            "terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}})
    jobset = jobset_view({"metadata": {"name": "j-slice-0"}}, 0)
    status = {"phase": "Running", "controllerPod": "j-controller-0", "tokenSecret": "j-token"}

    def reconcile(pods):
        nonlocal status
        patch = _Patch()
        job_pass.reconcile_pass(body=body, spec=spec, status=status, meta=meta, namespace="ns", name="j", patch=patch,
                               memo={"elasticjax": state}, job_pods={("ns", "j", "u1"): pods},
                               job_jobsets={("ns", "j", "u1"): [jobset]})
        status = {**status, **patch.status}

    for pods in ([dead], [], []):  # the dead pod is deleted after the first pass
        reconcile(pods)
    assert status["controllerRestarts"] == 0 and status["controllerPod"] == "j-controller-0"
    assert not any(e[1] == "ControllerRestarted" for e in events)
    assert any(c["type"] == "CreateFailed" and c["status"] == "True" for c in status["conditions"])
    state.kube.refuse = False
    reconcile([])
    assert status["controllerRestarts"] == 1 and status["controllerPod"] == "j-controller-1"
    assert [e[1] for e in events].count("ControllerRestarted") == 1
    # the next pass, before the watch delivered j-controller-1: wait for it, do not create another
    reconcile([dead])
    assert status["controllerRestarts"] == 1 and "j-controller-2" not in state.kube.created


def test_a_configmap_or_service_planted_under_the_jobs_names_is_a_condition_not_used(monkeypatch):
    """Someone who may create ConfigMaps pre-creates `<job>-manifest` (or the Service): the operator
    must not run the planted manifest (it chooses the code and image run with the job's token)."""
    events = []
    monkeypatch.setattr(kopf, "event", lambda ref, type, reason, message: events.append((type, reason, message)))
    spec = {"slices": {"count": 1}, "training": {"steps": 10, "globalBatchSize": 1}, "checkpoint": {"uri": "/tmp/ck"}}
    meta = {"name": "j", "namespace": "ns", "uid": "u1", "generation": 1}
    body = {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": meta, "spec": spec}
    planted_manifest = "apiVersion: elasticjax.dev/v1alpha1\nkind: ElasticTrainingJob\nmetadata: {name: j}\nspec: {}\n"

    for planted_kind in ("ConfigMap", "Service"):
        class Planted(_Kube):
            read = []

            def create(self, namespace, body):
                if body["kind"] == planted_kind:
                    return False  # 409: the name exists
                return super().create(namespace, body)

            def read_manifest(self, namespace, name, owner_uid):
                self.read.append(owner_uid)
                return planted_manifest if owner_uid == "someone-else" else None

            def owners(self, namespace, kind, name):
                return []

            def owned_by(self, namespace, kind, name, owner_uid):
                return False

        state = operator_state.OperatorState(kube=Planted(), key=b"k" * 32)
        status = {"phase": "Pending", "tokenSecret": "j-token"}
        for _ in range(3):
            patch = _Patch()
            job_pass.reconcile_pass(body=body, spec=spec, status=status, meta=meta, namespace="ns", name="j",
                                   patch=patch, memo={"elasticjax": state}, job_pods={}, job_jobsets={})
            status = {**status, **patch.status}
        assert state.kube.read == ["u1"], "the manifest is read only as this job's"
        assert not any(n.startswith(("j-controller-", "j-slice-")) for n in state.kube.created), state.kube.created
        (cond,) = [c for c in status["conditions"] if c["type"] == "CreateFailed"]
        assert cond["status"] == "True" and cond["reason"] == "ChildNameConflict", cond
        assert f"{planted_kind} j-" in cond["message"] and "not owned by this job" in cond["message"], cond


_BUDGET = "ElasticRuntimeError: restart budget exhausted: 2 slice failures > spec.elasticity.maxRestarts=1"


class _TickingClock(SystemClock):
    """Every wall-clock read is a second later, as the 1 s timer's passes are (from 2030-01-01T00:00:00Z); the
    monotonic clock is the system's."""

    def __init__(self) -> None:
        self._ticks = itertools.count()

    def now(self) -> dt.datetime:
        return dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=next(self._ticks))


def _finished_job_passes(monkeypatch, status, pods, passes=3):
    events = []
    monkeypatch.setattr(kopf, "event", lambda ref, type, reason, message: events.append((type, reason, message)))
    spec = {"slices": {"count": 2}, "training": {"steps": 100, "globalBatchSize": 2}, "checkpoint": {"uri": "/tmp/ck"}}
    meta = {"name": "j", "namespace": "ns", "uid": "u1", "generation": 1}
    body = {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": meta, "spec": spec}
    state = operator_state.OperatorState(kube=_Kube(), key=b"k" * 32, clock=_TickingClock())
    patches = []
    for _ in range(passes):
        patch = _Patch()
        job_pass.reconcile_pass(body=body, spec=spec, status=status, meta=meta, namespace="ns", name="j", patch=patch,
                               memo={"elasticjax": state}, job_pods={("ns", "j", "u1"): pods},
                               job_jobsets={("ns", "j", "u1"): []})
        patches.append(patch.status)
        status = {**status, **patch.status}
    return status, patches, events


def _failed_controller(message):
    return pod_view({"metadata": {"name": "j-controller-0", "uid": "c0", "labels": {
        lbl.ROLE: lbl.ROLE_CONTROLLER, lbl.JOB_NAME: "j", lbl.CONTROLLER_ATTEMPT: "0"}},
        "status": {"phase": "Failed", "containerStatuses": [{"name": "controller", "state": {
            "terminated": {"exitCode": 1, "reason": "Error", "message": message}}}]}})


def test_the_controllers_termination_line_is_the_failure_reason_and_the_event(monkeypatch):
    status = {"phase": "Running", "controllerPod": "j-controller-0", "tokenSecret": "j-token"}
    status, _, events = _finished_job_passes(monkeypatch, status, [_failed_controller(f"error: {_BUDGET}\n")], 1)
    assert status["phase"] == "Failed"
    assert status["failureReason"] == f"training failed: {_BUDGET}"
    assert ("Warning", "JobFailed", f"training failed: {_BUDGET}") in events


def test_a_finished_jobs_status_is_not_rewritten_every_pass(monkeypatch):
    # the job ends in the first pass (its slices never Ready); every later pass writes nothing
    status = {"phase": "Running", "controllerPod": "j-controller-0", "tokenSecret": "j-token"}
    status, patches, _ = _finished_job_passes(monkeypatch, status, [_failed_controller(f"error: {_BUDGET}")])
    assert status["phase"] == "Failed"
    assert patches[1:] == [{}, {}]


def test_a_finished_job_keeps_its_last_slice_states_after_an_operator_restart(monkeypatch):
    slices = [{"index": i, "state": "Down", "restarts": 2, "pods": [f"j-slice-{i}-0"], "addresses": [],
               "reason": "pod j-slice-0-0: exit code 137", "lastTransitionTime": "2029-12-31T23:00:00Z"}
              for i in range(2)]
    done = {"phase": "Failed", "failureReason": f"training failed: {_BUDGET}", "completionTime": "2029-12-31T23:00:05Z",
            "controllerPod": "j-controller-0", "tokenSecret": "j-token", "slices": slices, "sliceReplacements": 4,
            "controllerRestarts": 0, "startTime": "2029-12-31T22:00:00Z"}
    # a new operator process (fresh tracker: every slice "Provisioning"), the JobSets already gone
    status, patches, events = _finished_job_passes(monkeypatch, done, [_failed_controller("")])
    assert status["slices"] == slices and status["sliceReplacements"] == 4
    assert patches[1:] == [{}, {}]
    assert "slices" not in patches[0] and not any(e[1].startswith("Slice") for e in events)


def test_pathways_shell_creates_the_head_service_and_annotates_jobsets_with_the_head(monkeypatch):
    """Issue 10 items 1, 2, 5 through the kopf shell: the headless head Service is created with the other
    static children; JobSets only once the resource manager started, each carrying the head incarnation."""
    monkeypatch.setattr(kopf, "event", lambda *a, **k: None)
    bodies = []

    class Recording(_Kube):
        def create(self, namespace, body):
            bodies.append(body)
            return super().create(namespace, body)

    spec = {"backend": "pathways", "slices": {"count": 2, "accelerator": "tpu-v5-lite-podslice", "topology": "2x2"},
            "training": {"steps": 10, "globalBatchSize": 8}, "checkpoint": {"uri": "gs://test-bucket/j"}}
    meta = {"name": "j", "namespace": "ns", "uid": "u1", "generation": 1}
    body = {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": meta, "spec": spec}
    state = operator_state.OperatorState(kube=Recording(), key=b"k" * 32)

    def head(started: bool):
        rm = {"name": "pathways-rm", "started": started, "restartCount": 0, "state": {"running": {}}}
        return pod_view({"metadata": {"name": "j-controller-0", "uid": "c0", "labels": {
            lbl.ROLE: lbl.ROLE_CONTROLLER, lbl.JOB_NAME: "j", lbl.JOB_UID: "u1", lbl.CONTROLLER_ATTEMPT: "0"}},
            "status": {"phase": "Pending", "podIP": "10.0.0.9", "initContainerStatuses": [rm]}})

    status = {"phase": "Pending", "controllerPod": "j-controller-0", "tokenSecret": "j-token"}
    for started in (False, True):
        patch = _Patch()
        job_pass.reconcile_pass(body=body, spec=spec, status=status, meta=meta, namespace="ns", name="j", patch=patch,
                               memo={"elasticjax": state}, job_pods={("ns", "j", "u1"): [head(started)]},
                               job_jobsets={("ns", "j", "u1"): []})
        jobsets = [b for b in bodies if b["kind"] == "JobSet"]
        if not started:
            assert jobsets == [], "no worker before its head's resource manager listens"
            services = [b for b in bodies if b["kind"] == "Service"]
            assert [s["metadata"]["name"] for s in services] == ["j-controller", "j-pathways-head"]
        status = {**status, **patch.status}
    assert [js["metadata"]["name"] for js in jobsets] == ["j-slice-0", "j-slice-1"]
    assert {js["metadata"]["annotations"][lbl.PATHWAYS_HEAD] for js in jobsets} == {"j-controller-0.rm-0"}


def test_pathways_shell_says_the_job_waits_for_its_resource_manager(monkeypatch):
    """Issue 10: while the head's resource manager has not passed its startupProbe the job has the
    WaitingForResourceManager condition and one Event (not a silent Pending); it clears when it listens."""
    events = []
    monkeypatch.setattr(kopf, "event", lambda ref, type, reason, message: events.append((type, reason, message)))
    spec = {"backend": "pathways", "slices": {"count": 1, "accelerator": "tpu-v5-lite-podslice", "topology": "2x2"},
            "training": {"steps": 10, "globalBatchSize": 8}, "checkpoint": {"uri": "gs://test-bucket/j"}}
    meta = {"name": "j", "namespace": "ns", "uid": "u1", "generation": 1}
    body = {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": meta, "spec": spec}
    state = operator_state.OperatorState(kube=_Kube(), key=b"k" * 32)

    def head(started: bool):
        rm = {"name": "pathways-rm", "started": started, "restartCount": 0, "state": {"running": {}}}
        return pod_view({"metadata": {"name": "j-controller-0", "uid": "c0", "labels": {
            lbl.ROLE: lbl.ROLE_CONTROLLER, lbl.JOB_NAME: "j", lbl.JOB_UID: "u1", lbl.CONTROLLER_ATTEMPT: "0"}},
            "spec": {"nodeName": "cpu-0"},
            "status": {"phase": "Pending", "podIP": "10.0.0.9", "initContainerStatuses": [rm]}})

    status = {"phase": "Pending", "controllerPod": "j-controller-0", "tokenSecret": "j-token"}
    seen = []
    for started in (False, False, True):
        patch = _Patch()
        job_pass.reconcile_pass(body=body, spec=spec, status=status, meta=meta, namespace="ns", name="j", patch=patch,
                               memo={"elasticjax": state}, job_pods={("ns", "j", "u1"): [head(started)]},
                               job_jobsets={("ns", "j", "u1"): []})
        status = {**status, **patch.status}
        (cond,) = [c for c in status["conditions"] if c["type"] == "WaitingForResourceManager"]
        seen.append((cond["status"], cond["reason"]))
    assert seen == [("True", "ResourceManagerStarting")] * 2 + [("False", "ResourceManagerListening")]
    assert [e[1] for e in events if e[1].startswith("ResourceManager")] == ["ResourceManagerStarting",
                                                                          "ResourceManagerListening"]


def test_cpu_jobs_have_no_resource_manager_condition(monkeypatch):
    monkeypatch.setattr(kopf, "event", lambda *a, **k: None)
    spec = {"slices": {"count": 1}, "training": {"steps": 10, "globalBatchSize": 1}, "checkpoint": {"uri": "/tmp/ck"}}
    meta = {"name": "j", "namespace": "ns", "uid": "u1", "generation": 1}
    body = {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": meta, "spec": spec}
    state = operator_state.OperatorState(kube=_Kube(), key=b"k" * 32)
    ctrl = pod_view({"metadata": {"name": "j-controller-0", "uid": "c0", "labels": {
        lbl.ROLE: lbl.ROLE_CONTROLLER, lbl.JOB_NAME: "j", lbl.JOB_UID: "u1", lbl.CONTROLLER_ATTEMPT: "0"}},
        "status": {"phase": "Pending"}})
    patch = _Patch()
    job_pass.reconcile_pass(body=body, spec=spec, status={"controllerPod": "j-controller-0", "tokenSecret": "j-token"},
                           meta=meta, namespace="ns", name="j", patch=patch, memo={"elasticjax": state},
                           job_pods={("ns", "j", "u1"): [ctrl]}, job_jobsets={("ns", "j", "u1"): []})
    assert not any(c["type"] == "WaitingForResourceManager" for c in patch.status["conditions"])
