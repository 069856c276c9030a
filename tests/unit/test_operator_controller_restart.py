"""Issue 11: the status while a lost controller pod is replaced (`k8s_operator.controller_restart`): phase
Recovering with reason ControllerRestarting until the replacement trained a step, no flap, the step it
resumed from, and a ControllerRestarted message that names a pod (or says none runs)."""

from __future__ import annotations

from elastic_jax.api.control import ResumeInfo
from tests.unit.test_operator_status import _ctrl, _inputs, _job, build_status, get_condition

_SLICES = [{"index": 0, "state": "Ready"}, {"index": 1, "state": "Ready"}]


def _running_at_step_50() -> dict:
    s = build_status(_inputs(controller=_ctrl(step=50)))
    assert s["phase"] == "Running" and s["step"] == 50 and s["activeSlices"] == 2
    return s


def _next(previous: dict, **kw) -> dict:
    base = dict(previous=previous, controller_pod="demo-controller-1", controller_restarts=1, slices=_SLICES)
    base.update(kw)
    return build_status(_inputs(**base))


def test_a_lost_controller_reads_recovering_until_its_replacement_trained_a_step():
    """Trial: after a controller SIGKILL `kubectl get ejob` kept Running with the old step and slice count
    until the new controller answered, then Pending while it restored (a flap)."""
    s = _running_at_step_50()
    phases = []
    # the pass that finds the pod dead and creates demo-controller-1 (nothing answers)
    s = _next(s, controller=None, controller_lost=True)
    phases.append(s["phase"])
    assert s["phase"] == "Recovering" and s["activeSlices"] == 0 and s["step"] == 50
    restarted = get_condition(s["conditions"], "ControllerRestarted")
    assert restarted["status"] == "True" and restarted["reason"] == "ControllerRestarting"
    assert "demo-controller-1" in restarted["message"]
    degraded = get_condition(s["conditions"], "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "ControllerRestarting"
    # the new pod is not up yet; then it answers while it restores (Starting, step 0): still Recovering, step kept
    s = _next(s, controller=None)
    phases.append(s["phase"])
    s = _next(s, controller=_ctrl(phase="Starting", step=0, active=()))
    phases.append(s["phase"])
    assert s["step"] == 50 and s["activeSlices"] == 0
    # it restored step 40 and runs, no step yet: the step is the one it resumed from
    resumed = _ctrl(step=40)
    resumed.resumed_from = ResumeInfo(step=40)
    s = _next(s, controller=resumed)
    phases.append(s["phase"])
    assert s["step"] == 40
    assert get_condition(s["conditions"], "ControllerRestarted")["reason"] == "ControllerRestarting"
    # its first step: the restart is over
    trained = _ctrl(step=41)
    trained.resumed_from = ResumeInfo(step=40)
    s = _next(s, controller=trained)
    phases.append(s["phase"])
    assert phases == ["Recovering"] * 4 + ["Running"], phases
    restarted = get_condition(s["conditions"], "ControllerRestarted")
    assert restarted["reason"] == "ControllerPodLost"
    assert restarted["message"] == "controller pod recreated 1 time(s); now demo-controller-1, resumed from step 40"
    assert get_condition(s["conditions"], "Degraded")["reason"] == "AllSlicesActive"


def test_the_lost_controllers_parting_word_does_not_end_the_restart():
    """The watch hands over the old pod's last answer once after it went: it says nothing of the new one."""
    s = _running_at_step_50()
    s = _next(s, controller=None, controller_lost=True)
    s = _next(s, controller=_ctrl(step=51), answered_by="demo-controller-0")
    assert s["phase"] == "Recovering" and s["activeSlices"] == 0
    assert get_condition(s["conditions"], "ControllerRestarted")["reason"] == "ControllerRestarting"


def test_a_job_still_pending_stays_pending_while_its_controller_is_replaced():
    s = build_status(_inputs(controller=_ctrl(phase="Starting", step=0, active=())))
    assert s["phase"] == "Pending"
    s = _next(s, controller=None, controller_lost=True)
    assert s["phase"] == "Pending"
    assert get_condition(s["conditions"], "ControllerRestarted")["reason"] == "ControllerRestarting"


def test_the_restarted_condition_names_a_pod_or_says_none_runs():
    """Trial: after a suspend/resume the condition read "controller pod recreated 1 time(s); now " (no pod)."""
    s = _running_at_step_50()
    s = _next(s, controller=_ctrl(step=55))
    assert get_condition(s["conditions"], "ControllerRestarted")["message"].endswith("now demo-controller-1")
    # suspended: no controller pod
    s = _next(s, job=_job(suspend=True), controller=None, controller_pod="")
    message = get_condition(s["conditions"], "ControllerRestarted")["message"]
    assert message == "controller pod recreated 1 time(s); no controller pod runs now (spec.suspend)"
    # resumed, the new pod not created yet
    s = _next(s, controller=None, controller_pod="")
    assert not get_condition(s["conditions"], "ControllerRestarted")["message"].endswith("now ")
    # finished
    s = _next(s, controller=None, finish=("Succeeded", ""))
    message = get_condition(s["conditions"], "ControllerRestarted")["message"]
    assert message == "controller pod recreated 1 time(s); the job Succeeded; its last controller pod was demo-controller-1"
    # a suspend ends a restart in progress (nothing is replaced while suspended)
    s = _next(_next(_running_at_step_50(), controller=None, controller_lost=True),
              job=_job(suspend=True), controller=None, controller_pod="")
    assert get_condition(s["conditions"], "ControllerRestarted")["reason"] == "ControllerPodLost"
    assert s["phase"] == "Suspended"


def test_the_kopf_shell_replaces_a_gracefully_deleted_controller_once_it_stopped_and_reads_it_until_then(
        monkeypatch):
    """Issue 11: `kubectl delete pod` of the controller. It checkpoints on SIGTERM; its replacement was created at
    once (restoring before that commit) and the stopping pod was no longer read (its final step unread)."""
    import kopf

    from elastic_jax.api import labels as lbl
    from elastic_jax.k8s_operator import job_pass, operator_state
    from elastic_jax.k8s_operator.slices import jobset_view
    from elastic_jax.k8s_operator.slices import pod_view
    from tests.support.fake_kube import FakeKube

    events = []
    monkeypatch.setattr(kopf, "event", lambda ref, type, reason, message: events.append((type, reason, message)))
    spec = {"slices": {"count": 1}, "training": {"steps": 10, "globalBatchSize": 1}, "checkpoint": {"uri": "gs://test-bucket/c"}}
    meta = {"name": "j", "namespace": "ns", "uid": "u1", "generation": 1}
    body = {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": meta, "spec": spec}
    state = operator_state.OperatorState(kube=FakeKube(), key=b"k" * 32)
    labels = {lbl.ROLE: lbl.ROLE_CONTROLLER, lbl.JOB_NAME: "j", lbl.JOB_UID: "u1", lbl.CONTROLLER_ATTEMPT: "0"}
    deleting = {"name": "j-controller-0", "uid": "c0", "labels": labels, "deletionTimestamp": "2099-01-01T00:00:30Z",
                "deletionGracePeriodSeconds": 30}
    stopping = pod_view({"metadata": deleting, "status": {"phase": "Running", "podIP": "127.0.0.9", "containerStatuses": [
        {"name": "controller", "ready": False, "state": {"running": {}}}]}})
    stopped = pod_view({"metadata": deleting, "status": {"phase": "Failed", "podIP": "127.0.0.9", "containerStatuses": [
        {"name": "controller", "state": {"terminated": {"exitCode": 75}}}]}})
    jobset = jobset_view({"metadata": {"name": "j-slice-0", "labels": {lbl.JOB_UID: "u1"}}}, 0)
    status = {"phase": "Running", "step": 7, "controllerPod": "j-controller-0", "tokenSecret": "j-token",
              "controllerRestarts": 0}

    def reconcile(pods):
        nonlocal status
        patch = type("Patch", (), {"status": {}})()
        job_pass.reconcile_pass(body=body, spec=spec, status=status, meta=meta, namespace="ns", name="j", patch=patch,
                                memo={"elasticjax": state}, job_pods={("ns", "j", "u1"): pods},
                                job_jobsets={("ns", "j", "u1"): [jobset]})
        status = {**status, **patch.status}

    reconcile([stopping])
    assert not any(n.startswith("j-controller-") for n in state.kube.created), state.kube.created
    assert status["controllerRestarts"] == 0 and not any(e[1] == "ControllerRestarted" for e in events)
    assert status["phase"] == "Recovering"
    restarted = get_condition(status["conditions"], "ControllerRestarted")
    assert restarted["reason"] == "ControllerRestarting"
    assert "controller pod j-controller-0 is being deleted: its replacement is created once" in restarted["message"]
    # (still read: the step its stop commits reaches status)
    assert state.jobs.get(("ns", "j")).tracker.controller_uid == "c0"
    reconcile([stopped])
    assert "j-controller-1" in state.kube.created and status["controllerRestarts"] == 1
    assert [e[1] for e in events].count("ControllerRestarted") == 1
    assert status["phase"] == "Recovering" and status["controllerPod"] == "j-controller-1"


def test_the_restarting_message_says_what_the_replacement_starts_from_per_checkpoint_storage():
    """Session 12's trial: with a local spec.checkpoint.uri (the pod's emptyDir) the condition promised "the
    latest committed checkpoint" (and after a graceful delete the SIGTERM's) while the replacement starts from
    step 0, as the ControllerRestarted Event said."""
    for uri, says, never in (("/tmp/ck", "started again from step 0", "latest committed checkpoint"),
                             ("gs://test-bucket/ck", "resumed from the latest committed checkpoint", "step 0")):
        job = _job(checkpoint={"uri": uri})
        s = build_status(_inputs(job=job, controller=_ctrl(step=50)))
        lost = _next(s, job=job, controller=None, controller_lost=True)
        message = get_condition(lost["conditions"], "ControllerRestarted")["message"]
        assert says in message and never not in message, message
        assert (uri in message) == uri.startswith("/"), message
        # a graceful delete: the replacement waits for the SIGTERM's checkpoint, which a local uri loses too
        stopping = _next(s, job=job, controller=_ctrl(step=51), controller_pod="demo-controller-0",
                         controller_restarts=0, replace_after_stop="demo-controller-0")
        message = get_condition(stopping["conditions"], "ControllerRestarted")["message"]
        assert "is being deleted" in message, message
        if uri.startswith("/"):
            assert "that checkpoint goes with the pod and the replacement starts again from step 0" in message
            assert "which the replacement resumes" not in message, message
        else:
            assert "which the replacement resumes" in message and "step 0" not in message, message


def test_last_checkpoint_step_is_cleared_when_a_local_checkpoint_went_with_its_pod():
    """Session 12's trial: `lastCheckpointStep` kept naming the lost pod's emptyDir checkpoint until the new
    controller committed one. Local uri: unset from the pass that finds the pod lost (also against the lost
    pod's parting word) until the replacement reports its own; gs://: kept (the replacement restores it)."""
    local = _job()
    s = _running_at_step_50()
    assert s["lastCheckpointStep"] == 4  # (`_ctrl` reports checkpoint 4)
    lost = _next(s, controller=None, controller_lost=True)
    assert "lastCheckpointStep" not in lost
    parting = _next(lost, controller=_ctrl(step=51), answered_by="demo-controller-0")
    assert "lastCheckpointStep" not in parting
    starting = _ctrl(phase="Starting", step=0, active=())
    starting.last_committed_checkpoint_step = None
    s = _next(parting, job=local, controller=starting)
    assert "lastCheckpointStep" not in s
    committed = _ctrl(step=3)
    committed.last_committed_checkpoint_step = 2
    assert _next(s, controller=committed)["lastCheckpointStep"] == 2
    # shared storage: the checkpoint outlives the pod
    gs = _job(checkpoint={"uri": "gs://test-bucket/ck"})
    s = build_status(_inputs(job=gs, controller=_ctrl(step=50)))
    assert _next(s, job=gs, controller=None, controller_lost=True)["lastCheckpointStep"] == 4


def test_the_status_patch_removes_a_last_checkpoint_step_that_went_with_the_lost_pod():
    """The written status leaves an unset field out: the patch must carry a null for the API server to drop it."""
    from elastic_jax.k8s_operator.status_decision import StatusObserved, decide_status

    before = _running_at_step_50()
    decision = decide_status(StatusObserved(
        inputs=_inputs(previous=before, controller=None, controller_pod="demo-controller-1", controller_restarts=1,
                       controller_lost=True),
        status=before, finished=False, refusal=None, controller_pods=[], worker_pods=[], jobsets={}, current=None,
        controller_created_now=True))
    patch = next(e for e in decision.effects if type(e).__name__ == "PatchStatus")
    assert patch.fields["lastCheckpointStep"] is None and patch.fields["phase"] == "Recovering"


def test_a_pod_event_of_the_terminated_controller_wakes_the_pass_that_writes_recovering(monkeypatch):
    """Session 9's trial: after a controller SIGKILL the status read Running with the old step for ~12 s under
    load. The path from the container's end to the status write: the pod event (`handlers.job_pod_event`)
    wakes the job's sleeping daemon at once (not its next timeout), and that very pass decides the loss,
    creates the replacement and writes Recovering, 0 active (the daemon, the pass and the decisions are the
    real ones; the API server is stood in for)."""
    import asyncio

    import kopf

    from elastic_jax.api import labels as lbl
    from elastic_jax.k8s_operator import handlers, operator_state, wake
    from elastic_jax.k8s_operator.slices import jobset_view
    from elastic_jax.k8s_operator.slices import pod_view
    from tests.support.fake_kube import FakeKube
    from tests.unit.test_operator_wake import _Stopped

    events = []
    monkeypatch.setattr(kopf, "event", lambda ref, type, reason, message: events.append((type, reason, message)))
    spec = {"slices": {"count": 1}, "training": {"steps": 10, "globalBatchSize": 1}, "checkpoint": {"uri": "gs://test-bucket/c"}}
    meta = {"name": "j", "namespace": "ns", "uid": "u1", "generation": 1, "resourceVersion": "1"}
    status = {"phase": "Running", "step": 7, "activeSlices": 1, "controllerPod": "j-controller-0",
              "tokenSecret": "j-token", "controllerRestarts": 0}
    body = {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": meta, "spec": spec,
            "status": status}
    state = operator_state.OperatorState(kube=FakeKube(), key=b"k" * 32)
    state.kopf_settings = kopf.OperatorSettings()
    memo = {"elasticjax": state}
    labels = {lbl.ROLE: lbl.ROLE_CONTROLLER, lbl.JOB_NAME: "j", lbl.JOB_UID: "u1", lbl.CONTROLLER_ATTEMPT: "0"}
    pod_meta = {"name": "j-controller-0", "uid": "c0", "labels": labels}
    running = pod_view({"metadata": pod_meta, "status": {"phase": "Running", "podIP": "127.0.0.9", "containerStatuses": [
        {"name": "controller", "ready": True, "state": {"running": {}}}]}})
    # SIGKILL: the kubelet reports the container terminated (137) before the pod's phase follows
    killed = pod_view({"metadata": {**pod_meta, "resourceVersion": "2"}, "status": {
        "phase": "Running", "podIP": "127.0.0.9", "containerStatuses": [
            {"name": "controller", "ready": False, "state": {"terminated": {"exitCode": 137, "reason": "Error"}}}]}})
    pods = [running]
    job_pods = {("ns", "j", "u1"): pods}
    job_jobsets = {("ns", "j", "u1"): [jobset_view({"metadata": {"name": "j-slice-0", "labels": {lbl.JOB_UID: "u1"}}},
                                                   0)]}
    written: list[dict] = []
    waits: list[tuple[float, bool]] = []
    stopped: list = []

    loop: list = []

    def patch_job_status(patch):
        # (the API server's write and the watch bringing it back: the daemon's live status and resourceVersion)
        written.append(dict(patch["status"]))
        status.update({k: v for k, v in patch["status"].items()})
        meta["resourceVersion"] = str(int(meta["resourceVersion"]) + 1)
        if len(written) == 2:
            loop[0].call_soon_threadsafe(stopped[0].event.set)  # (from the daemon's executor thread)
        return {"metadata": meta, "status": dict(status)}

    state.kube.on_status_patch = patch_job_status
    real_wait = wake.Waker.wait

    async def wait_then_kill(self, timeout_s, stop=None):
        if len(waits) == 0:  # the daemon sleeps after its first pass: the controller is SIGKILLed now
            # (the first pass's own news, its failed poll of the controller, is consumed first: only the pod
            # event may end the wait below)
            await real_wait(self, 0)

            def pod_event():
                pods[:] = [killed]  # (kopf updates the index before it calls the handler)
                asyncio.ensure_future(handlers.job_pod_event(namespace="ns", labels=labels, memo=memo))
            asyncio.get_running_loop().call_soon(pod_event)
        woken = await real_wait(self, timeout_s, stop)
        waits.append((timeout_s, woken))
        return woken

    monkeypatch.setattr(wake.Waker, "wait", wait_then_kill)
    # (the timeout must never be what runs the pass: far beyond the time the test takes)
    monkeypatch.setattr(wake, "PASS_INTERVAL_S", 600.0)

    async def run():
        stopped.append(_Stopped())
        loop.append(asyncio.get_running_loop())
        await asyncio.wait_for(handlers.reconcile_job(
            body=body, namespace="ns", name="j", memo=memo, stopped=stopped[0], resource=None, logger=handlers._logger,
            patch=kopf.Patch(), spec=spec, status=status, meta=meta, job_pods=job_pods, job_jobsets=job_jobsets), 60)

    asyncio.run(run())
    assert written[0].get("phase", "Running") == "Running"  # (before the kill: the controller only did not answer)
    assert len(waits) == 1 and waits[0][1] is True and waits[0][0] > 500, waits  # woken by the pod event
    after = written[1]
    assert after["phase"] == "Recovering" and after["activeSlices"] == 0 and after["controllerPod"] == "j-controller-1"
    restarted = get_condition(after["conditions"], "ControllerRestarted")
    assert (restarted["status"], restarted["reason"]) == ("True", "ControllerRestarting")
    assert "j-controller-1" in state.kube.created and [e[1] for e in events].count("ControllerRestarted") == 1


def test_a_suspended_job_with_a_local_checkpoint_uri_claims_no_checkpoint_step():
    """Session 12's trial: Suspended showed `lastCheckpointStep` 2744 while its own Suspended condition said
    that checkpoint went with the controller pod's emptyDir. Local uri: kept while the stopping pod still runs
    (its emptyDir holds it), unset once no pod is left to stop; gs://: the step the stop saved stays."""
    for uri, kept in (("/tmp/ck", False), ("gs://test-bucket/ck", True)):
        job = _job(checkpoint={"uri": uri})
        job.spec.suspend = True
        s = build_status(_inputs(job=_job(checkpoint={"uri": uri}), controller=_ctrl(step=50)))
        assert s["lastCheckpointStep"] == 4
        stopping = _ctrl(step=51)
        stopping.last_committed_checkpoint_step = 51  # (the stop's save)
        s = _next(s, job=job, controller=stopping, controller_pod="", controller_restarts=0,
                  answered_by="demo-controller-0", suspend_waits_for=["demo-controller-0"])
        assert s["lastCheckpointStep"] == 51 and s["step"] == 51, s
        # the stopping pod's last word, then nobody: Suspended
        for answer in (stopping, None):
            s = _next(s, job=job, controller=answer, controller_pod="", controller_restarts=0,
                      answered_by="demo-controller-0")
            assert s.get("lastCheckpointStep") == (51 if kept else None), (uri, s)
            assert s["step"] == 51
