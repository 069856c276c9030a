"""Issue 9 items 6 and 7: a controller pod that is dead or cannot start is never silent; an image
that cannot be pulled is one condition naming it, not a replacement loop."""

from __future__ import annotations

import dataclasses

from elastic_jax.api import labels
from elastic_jax.api import status as st
from elastic_jax.k8s_operator.pod_faults import pod_faults
from elastic_jax.k8s_operator.reconcile import Observed, decide
from elastic_jax.k8s_operator.slices import JobSetView
from elastic_jax.k8s_operator.slices import PodView, pod_view
from elastic_jax.k8s_operator.status_builder import with_pod_faults
from tests.unit.test_operator_reconcile import _ctrl, _job
from tests.support.pod_views import worker_view

BAD = "registry.invalid/elastic-jax/controller:nope"
KUBELET = f'Back-off pulling image "{BAD}": ErrImagePull: rpc error: code = NotFound'


def _jobsets():
    return {i: JobSetView(f"demo-slice-{i}", i) for i in range(2)}


def _pulling(pod: PodView, reason="ImagePullBackOff", image=BAD) -> PodView:
    return dataclasses.replace(pod, phase="Pending", ready=False, pod_ip="", waiting_reason=reason,
                               waiting_message=KUBELET, waiting_image=image)


def _worker(i, **kw):
    kw.setdefault("reason", "")
    return worker_view(f"demo-slice-{i}-w-0", i, uid=f"w{i}", **kw)


def _pod_body(status, name="demo-controller-0", role=labels.ROLE_CONTROLLER):
    return {"metadata": {"name": name, "uid": "u", "labels": {labels.ROLE: role}}, "status": status}


# -- pod_view reads what the kubelet and the scheduler say ------------------------------------


def test_pod_view_reads_an_image_pull_back_off():
    v = pod_view(_pod_body({"phase": "Pending", "containerStatuses": [
        {"name": "controller", "image": BAD, "state": {"waiting": {"reason": "ImagePullBackOff", "message": KUBELET}}}]}))
    assert (v.waiting_reason, v.waiting_image, v.waiting_message) == ("ImagePullBackOff", BAD, KUBELET)
    assert not v.terminal and v.exit_code is None


def test_pod_view_ignores_a_container_that_is_merely_starting():
    v = pod_view(_pod_body({"phase": "Pending", "containerStatuses": [
        {"name": "controller", "image": "x", "state": {"waiting": {"reason": "ContainerCreating"}}}]}))
    assert v.waiting_reason == ""


def test_pod_view_reads_unschedulable():
    v = pod_view(_pod_body({"phase": "Pending", "conditions": [
        {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
         "message": "0/3 nodes are available: 3 Insufficient cpu."}]}))
    assert v.unschedulable == "Unschedulable: 0/3 nodes are available: 3 Insufficient cpu."


def test_pod_view_prefers_the_controller_containers_exit():
    v = pod_view(_pod_body({"phase": "Running", "containerStatuses": [
        {"name": "sidecar", "state": {"terminated": {"exitCode": 0}}},
        {"name": "controller", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}]}))
    assert (v.exit_code, v.reason) == (137, "exit code 137 (OOMKilled)")


# -- item 6: any dead controller pod is replaced (counted) or fails the job with the reason -----


def test_controller_container_terminated_while_the_phase_still_says_running_is_a_loss():
    dead = _ctrl(exit_code=137, reason="exit code 137 (OOMKilled)")
    plan = decide(_job(), Observed({"controllerPod": dead.name}, [dead], _jobsets()))
    assert plan.create_controller == 1 and plan.controller_restarted
    assert plan.delete_pods == [dead.name]
    (event,) = plan.events
    assert event[1] == "ControllerRestarted" and "OOMKilled" in event[2]


def test_controller_failed_at_start_is_replaced_with_its_log_line_in_the_event():
    dead = _ctrl(phase="Failed", exit_code=137, reason="exit code 137",
                 message="Traceback ...\nImportError: libtpu.so: cannot open shared object file")
    plan = decide(_job(), Observed({"controllerPod": dead.name}, [dead], _jobsets()))
    assert plan.create_controller == 1 and plan.controller_restarted
    assert "ImportError: libtpu.so" in plan.events[0][2]


def test_controller_dying_after_the_budget_fails_the_job_naming_why():
    dead = _ctrl(attempt=3, phase="Failed", exit_code=139, reason="exit code 139", message="Segmentation fault")
    plan = decide(_job(), Observed({"controllerPod": dead.name, "controllerRestarts": 3}, [dead], _jobsets()))
    assert plan.finish[0] == "Failed"
    assert "exit code 139: SIGSEGV" in plan.finish[1] and "Segmentation fault" in plan.finish[1]
    assert "maxRestarts=3" in plan.finish[1]


def test_pending_controller_is_left_to_the_scheduler_and_said_in_a_condition():
    pending = dataclasses.replace(_ctrl(phase="Pending"), pod_ip="",
                                  unschedulable="Unschedulable: 0/3 nodes are available: 3 Insufficient memory.")
    plan = decide(_job(), Observed({"controllerPod": pending.name}, [pending], _jobsets()))
    assert plan.create_controller is None and not plan.delete_pods and plan.finish is None
    fault = pod_faults([pending])[st.COND_PODS_NOT_STARTING]
    assert fault.reason == "Unschedulable"
    assert fault.message == (f"controller pod {pending.name} cannot be scheduled: 0/3 nodes are available: "
                             "3 Insufficient memory. (the slices' workers keep their nodes meanwhile; "
                             "spec.suspend: true releases them)")
    # Workers are neither held back nor deleted while the controller waits for a node (the slices exist here).
    assert not plan.create_jobsets and not plan.delete_jobsets


# -- item 7: an image that cannot be pulled ---------------------------------------------------


def test_unpullable_controller_image_is_not_replaced_deleted_or_counted():
    pulling = _pulling(_ctrl(phase="Pending"))
    status = {"controllerPod": pulling.name}
    for _ in range(30):  # thirty passes (seconds): the same pod, no new one, nothing counted
        plan = decide(_job(), Observed(status, [pulling], _jobsets(), now="2026-01-01T00:00:30Z"))
        assert plan.create_controller is None and not plan.delete_pods and not plan.controller_restarted
        assert plan.finish is None and not plan.events
    fault = pod_faults([pulling])[st.COND_IMAGE_PULL_FAILED]
    assert fault.reason == "ImagePullBackOff"
    assert BAD in fault.message and KUBELET in fault.message and pulling.name in fault.message


def test_unpullable_worker_image_is_one_condition_and_no_replacement():
    workers = [_pulling(_worker(0), "ErrImagePull", "busybox:nope"), _pulling(_worker(1), "ImagePullBackOff", "busybox:nope")]
    plan = decide(_job(), Observed({"controllerPod": "demo-controller-0"}, [_ctrl()], _jobsets(), None, workers,
                                   now="2026-01-01T00:00:30Z"))
    assert plan == type(plan)()  # nothing to do: the kubelet retries
    faults = pod_faults([_ctrl()] + workers)
    assert list(faults) == [st.COND_IMAGE_PULL_FAILED]
    assert faults[st.COND_IMAGE_PULL_FAILED].message.startswith("slice 0 worker pod demo-slice-0-w-0: image busybox:nope")


def _since(t):
    return {"conditions": [{"type": st.COND_IMAGE_PULL_FAILED, "status": "True", "reason": "ImagePullBackOff",
                            "lastTransitionTime": t}], "controllerPod": "demo-controller-0"}


def test_unpullable_image_fails_the_job_after_image_pull_timeout_seconds():
    pulling = _pulling(_ctrl(phase="Pending"))
    job = _job(elasticity={"imagePullTimeoutSeconds": 600})
    early = decide(job, Observed(_since("2026-01-01T00:00:00Z"), [pulling], _jobsets(), now="2026-01-01T00:09:59Z"))
    assert early.finish is None
    late = decide(job, Observed(_since("2026-01-01T00:00:00Z"), [pulling], _jobsets(), now="2026-01-01T00:10:00Z"))
    assert late.finish[0] == "Failed"
    assert BAD in late.finish[1] and "elasticity.imagePullTimeoutSeconds=600" in late.finish[1]
    assert late.create_controller is None and not late.controller_restarted


def test_image_pull_timeout_zero_waits_forever():
    pulling = _pulling(_ctrl(phase="Pending"))
    job = _job(elasticity={"imagePullTimeoutSeconds": 0})
    plan = decide(job, Observed(_since("2020-01-01T00:00:00Z"), [pulling], _jobsets(), now="2026-01-01T00:00:00Z"))
    assert plan.finish is None


def test_default_image_pull_timeout_outlasts_the_kubelets_back_off():
    assert _job().spec.elasticity.image_pull_timeout_seconds >= 600  # two pulls at the kubelet's 300 s cap


def test_controller_pod_that_ended_unpulled_fails_once_instead_of_a_pod_per_second():
    ended = dataclasses.replace(_pulling(_ctrl()), phase="Failed", reason="Evicted")
    plan = decide(_job(), Observed({"controllerPod": ended.name}, [ended], _jobsets()))
    assert plan.create_controller is None and not plan.controller_restarted
    assert plan.finish[0] == "Failed" and BAD in plan.finish[1] and KUBELET in plan.finish[1]


# -- the conditions and Events ----------------------------------------------------------------


def test_fault_condition_is_set_once_with_one_event_and_cleared():
    pulling = _pulling(_ctrl(phase="Pending"))
    conds, events = with_pod_faults([], pod_faults([pulling]), 1, "2026-01-01T00:00:00Z")
    (cond,) = conds
    assert (cond.type, cond.status, cond.reason) == (st.COND_IMAGE_PULL_FAILED, "True", "ImagePullBackOff")
    assert [e[:2] for e in events] == [("Warning", "ImagePullBackOff")]
    # the kubelet's next retry flips the reason to ErrImagePull: same condition, same transition time, no Event
    again = _pulling(_ctrl(phase="Pending"), "ErrImagePull")
    conds, events = with_pod_faults(conds, pod_faults([again]), 1, "2026-01-01T00:05:00Z")
    assert events == [] and conds[0].last_transition_time == "2026-01-01T00:00:00Z"
    assert conds[0].reason == "ErrImagePull"
    conds, events = with_pod_faults(conds, pod_faults([_ctrl()]), 1, "2026-01-01T00:06:00Z")
    assert (conds[0].status, conds[0].reason) == ("False", "ImagesPulled")
    assert [e[:2] for e in events] == [("Normal", "ImagesPulled")]


def test_no_fault_no_condition():
    assert with_pod_faults([], pod_faults([_ctrl(), _worker(0)]), 1, "t") == ([], [])


def test_a_slice_waiting_for_its_image_is_not_ready_naming_it_never_failed():
    from elastic_jax.k8s_operator.slices import next_slice_state, observe_slice

    obs = observe_slice([_pulling(_worker(0), "ErrImagePull", "busybox:nope")], 1)
    assert obs.kind == "NotReady" and "ErrImagePull (busybox:nope)" in obs.reason
    assert next_slice_state("Provisioning", obs) == "Provisioning"


# -- item 3, operator side: a controller killed by its livenessProbe is replaced, counted, with why --


def test_controller_killed_by_its_liveness_probe_is_replaced_and_the_event_says_why():
    import json

    stalled = json.dumps({"level": "ERROR", "event": "stalled", "step": 10,
                          "msg": "error: no training step completed for 1801 s in phase Running after step 10 "
                                 "(spec.elasticity.progressTimeoutSeconds=1800): the controller is stuck"})
    after = json.dumps({"level": "WARNING", "msg": "SIGTERM: stopping at the next step boundary"})
    killed = _ctrl(phase="Failed", exit_code=137, reason="exit code 137", message=f"{stalled}\n{after}")
    plan = decide(_job(), Observed({"controllerPod": killed.name, "controllerRestarts": 1}, [killed], _jobsets()))
    assert plan.create_controller == 1 and plan.controller_restarted
    (event,) = plan.events
    assert "exit code 137: error: no training step completed for 1801 s" in event[2]
    # out of budget: the job fails with the same reason
    plan = decide(_job(), Observed({"controllerPod": killed.name, "controllerRestarts": 3}, [killed], _jobsets()))
    assert plan.finish[0] == "Failed" and "progressTimeoutSeconds=1800" in plan.finish[1]


def test_worker_pod_that_failed_unpulled_fails_the_job_naming_the_image_not_the_budget():
    # a runtime that fails the pod (the local e2e node agent does) instead of backing off
    failed = dataclasses.replace(_pulling(_worker(1), "ErrImagePull", "busybox:nope"), phase="Failed", reason="ErrImagePull")
    plan = decide(_job(), Observed({"controllerPod": "demo-controller-0"}, [_ctrl()],
                                   {i: JobSetView(f"demo-slice-{i}", i, restarts=1) for i in range(2)}, None, [failed]))
    assert plan.finish[0] == "Failed"
    assert plan.finish[1].startswith("slice 1 worker pod demo-slice-1-w-0: image busybox:nope cannot be pulled (ErrImagePull)")
    assert KUBELET in plan.finish[1]


def test_pod_view_of_a_pod_failed_with_err_image_pull():
    # what the local control plane's node agent reports (e2e/standin/test_pod_runtime.py)
    v = pod_view(_pod_body({"phase": "Failed", "reason": "ErrImagePull", "containerStatuses": [
        {"name": "controller", "image": BAD, "state": {"waiting": {"reason": "ErrImagePull", "message": KUBELET}}}]}))
    assert v.terminal and v.exit_code is None and v.waiting_reason == "ErrImagePull"
    plan = decide(_job(), Observed({"controllerPod": v.name}, [v], _jobsets()))
    assert plan.create_controller is None and plan.finish[0] == "Failed" and BAD in plan.finish[1]
