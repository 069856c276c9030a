"""Observed children → plan: the operator's decisions."""

from __future__ import annotations

import dataclasses
import json

from elastic_jax.api.manifest import parse_manifest
from elastic_jax.k8s_operator.nodes import NodeLoss
from elastic_jax.k8s_operator.reconcile import SUSPEND_CONTROLLER_NOT_STOPPED, Observed, attempt_of, decide
from elastic_jax.k8s_operator.slices import JobSetView, jobset_view, pod_view
from tests.support.pod_views import controller_view


def _job(**spec):
    base = {"slices": {"count": 2}, "training": {"steps": 10, "globalBatchSize": 4}, "checkpoint": {"uri": "/tmp/ck"},
            "elasticity": {"maxRestarts": 3, "maxRestartsPerSlice": 2}}
    base.update(spec)
    return parse_manifest({"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob",
                           "metadata": {"name": "demo"}, "spec": base})


def _ctrl(attempt=0, phase="Running", exit_code=None, deleting=False, reason="", message=""):
    return controller_view(attempt, phase=phase, deleting=deleting, exit_code=exit_code, reason=reason,
                           termination_message=message)


def _both_jobsets(**kw):
    return {i: JobSetView(f"demo-slice-{i}", i, **kw) for i in range(2)}


def test_fresh_job_creates_controller_zero_and_every_jobset():
    plan = decide(_job(), Observed({}, [], {}))
    assert plan.create_controller == 0 and plan.create_jobsets == [0, 1]
    assert not plan.controller_restarted and plan.finish is None


def test_hot_spares_are_jobsets_like_the_others():
    plan = decide(_job(slices={"count": 2, "spares": 1}), Observed({}, [], {}))
    assert plan.create_jobsets == [0, 1, 2]


def test_steady_state_does_nothing():
    plan = decide(_job(), Observed({"controllerPod": "demo-controller-0"}, [_ctrl()], _both_jobsets(restarts=1)))
    assert plan.create_controller is None and not plan.create_jobsets and not plan.delete_pods


def test_worker_failures_never_touch_the_controller():
    # JobSet restarts (worker pods replaced) leave the controller pod alone.
    plan = decide(_job(), Observed({"controllerPod": "demo-controller-0"}, [_ctrl()], _both_jobsets(restarts=1)))
    assert plan.create_controller is None and plan.delete_pods == [] and plan.finish is None


def test_controller_killed_is_recreated_and_counted():
    dead = _ctrl(phase="Failed", exit_code=137, reason="exit code 137")
    plan = decide(_job(), Observed({"controllerPod": "demo-controller-0"}, [dead], _both_jobsets()))
    assert plan.create_controller == 1 and plan.controller_restarted
    assert plan.delete_pods == ["demo-controller-0"]
    assert plan.events[0][1] == "ControllerRestarted"


def test_controller_restart_event_says_what_the_new_pod_resumes_from():
    """A local checkpoint path is an emptyDir of the lost pod: the Event must not promise a resume
    (a new-user trial on kind lost 443 steps under "resumes from the latest checkpoint")."""
    dead = _ctrl(phase="Failed", exit_code=137, reason="exit code 137")
    observed = Observed({"controllerPod": "demo-controller-0"}, [dead], _both_jobsets())
    local = decide(_job(), observed).events[0][2]
    assert "starts again from step 0" in local and "spec.checkpoint.uri /tmp/ck is local" in local, local
    remote = decide(_job(checkpoint={"uri": "gs://test-bucket/ck"}), observed).events[0][2]
    assert remote.endswith("which resumes from the latest checkpoint"), remote


def test_vanished_controller_is_recreated():
    plan = decide(_job(), Observed({"controllerPod": "demo-controller-4"}, [], _both_jobsets()))
    assert plan.create_controller == 5 and plan.controller_restarted


def test_index_lag_does_not_create_twice():
    old = _ctrl(0, phase="Failed", exit_code=137)
    plan = decide(_job(), Observed({"controllerPod": "demo-controller-1"}, [old], _both_jobsets(),
                                   expected_pod_age_s=1.0))
    assert plan.create_controller is None


def test_a_created_pod_never_seen_is_a_loss_not_a_silent_wait():
    # issue 9 item 6: a dead pod in the index and the newer one gone before the index saw it
    old = _ctrl(0, phase="Failed", exit_code=137)
    for age in (None, 31.0):  # an operator restart (index complete), or long past any watch lag
        plan = decide(_job(), Observed({"controllerPod": "demo-controller-1", "controllerRestarts": 1}, [old],
                                       _both_jobsets(), expected_pod_age_s=age))
        assert plan.create_controller == 2 and plan.controller_restarted
        assert "demo-controller-1 lost (pod vanished)" in plan.events[0][2]


def test_controller_exit_codes_end_the_job():
    for code, phase, words in [(0, "Succeeded", "trained 10 steps"), (1, "Failed", "training failed: boom"),
                               (2, "Failed", "refused its input: spec.x: bad")]:
        pod = _ctrl(phase="Succeeded" if code == 0 else "Failed", exit_code=code, message="error: spec.x: bad")
        plan = decide(_job(), Observed({"controllerPod": "demo-controller-0"}, [pod], _both_jobsets(), "boom"))
        assert plan.finish[0] == phase and words in plan.finish[1]
        assert plan.create_controller is None
    # No reason anywhere (no termination message, nothing logged): the reason names the pod's log, not
    # "see the controller log".
    for code, words in [(1, "training failed: "), (2, "the controller refused its input: ")]:
        pod = _ctrl(phase="Failed", exit_code=code, message="")
        job = _job()
        job.metadata.namespace = "ml"
        plan = decide(job, Observed({"controllerPod": "demo-controller-0"}, [pod], _both_jobsets(), None))
        assert plan.finish == ("Failed", f"{words}no reason given; see kubectl logs demo-controller-0 -n ml "
                                         "-c controller"), plan.finish


def test_a_controller_whose_command_cannot_be_run_fails_the_job_at_once():
    """A new-user trial: `command: [/nonexistent/binary]` exited 127 and was replaced 21 times in 25 s until the
    restart budget was spent. A command that cannot be run (126/127, or the runtime's StartError) twice in a
    row (no step trained between) fails the job, naming the field; the first time is a loss like any other
    (CI under load: a stand-in's manifest mount not there yet, exit 126, had failed a healthy job at once);
    another exit code is still a loss to recover."""
    library = _job(controller={"command": ["/nonexistent/binary"]})
    for code, reason, message in ((127, "exit code 127", "exec /nonexistent/binary: No such file or directory"),
                                  (128, "exit code 128 (StartError)", "exec: \"/x\": stat /x: no such file"),
                                  (126, "exit code 126", "")):
        pod = _ctrl(phase="Failed", exit_code=code, message=message)
        pod = dataclasses.replace(pod, reason=reason)
        first = decide(library, Observed({"controllerPod": "demo-controller-0"}, [pod], _both_jobsets(), None))
        assert first.finish is None and first.create_controller == 1, (code, first)
        plan = decide(library, Observed({"controllerPod": "demo-controller-0", "controllerLossesInARow": 1}, [pod],
                                        _both_jobsets(), None))
        assert plan.finish is not None and plan.finish[0] == "Failed", (code, plan.finish)
        assert "cannot be run" in plan.finish[1] and "spec.controller.command" in plan.finish[1], plan.finish
        assert plan.create_controller is None
    pod = dataclasses.replace(_ctrl(phase="Failed", exit_code=3), reason="exit code 3")
    plan = decide(library, Observed({"controllerPod": "demo-controller-0"}, [pod], _both_jobsets(), None))
    assert plan.finish is None and plan.create_controller == 1, plan


def test_library_mode_exit_0_short_of_the_steps_is_the_librarys_failure_not_trained_n_steps():
    """Library mode: the program closed its runtime at step 0 of 10 without an exit code saying it succeeded
    (its final status: Failed, "the program ended at step 0 of 10"), then exited 0. The job read Succeeded,
    "trained 10 steps"; `elastic-jax run` said FAILED from the same books."""
    pod = _ctrl(phase="Succeeded", exit_code=0)
    ended = "the program ended at step 0 of 10"
    library = _job(controller={"command": ["python", "train.py"]})
    plan = decide(library, Observed({"controllerPod": "demo-controller-0"}, [pod], _both_jobsets(), ended,
                                    controller_phase="Failed"))
    assert plan.finish == ("Failed", f"the program exited 0 but {ended}"), plan.finish
    # Its own word that it succeeded (it reached the steps, or `close(exit_code=0)`: the MaxText wrapper,
    # which reports no steps), or no final status read after steps it reported (an operator restart while it
    # ended): exit 0 is success, as documented.
    for phase, status in (("Succeeded", {}), (None, {"step": 7})):
        plan = decide(library, Observed({"controllerPod": "demo-controller-0", **status}, [pod], _both_jobsets(),
                                        None, controller_phase=phase))
        assert plan.finish == ("Succeeded", "trained 10 steps"), (phase, plan.finish)


def test_library_mode_exit_0_without_ever_answering_is_failed_not_trained_n_steps():
    """A new-user trial: `command: [python, -c, "print(1)"]` (no `connect()`) exited 0 and the job read
    Succeeded, "trained 200 steps", step 200, where `elastic-jax run` refuses the same program ("controller
    exited with 0 before it was ready"). Never answered, no step known: Failed, naming what is missing."""
    pod = _ctrl(phase="Succeeded", exit_code=0)
    library = _job(controller={"command": ["python", "-c", "print(1)"]})
    plan = decide(library, Observed({"controllerPod": "demo-controller-0"}, [pod], _both_jobsets(), None))
    assert plan.finish[0] == "Failed", plan.finish
    assert "without ever answering the control API" in plan.finish[1] and "elastic_jax.connect()" in plan.finish[1]
    assert "kubectl logs demo-controller-0" in plan.finish[1]
    # the built-in trainer host always serves it: its exit 0 stays the documented success
    plan = decide(_job(), Observed({"controllerPod": "demo-controller-0"}, [pod], _both_jobsets(), None))
    assert plan.finish == ("Succeeded", "trained 10 steps"), plan.finish


def test_controller_asking_to_be_restarted_is_a_loss_recreated_and_counted():
    """Issue 9 item 1: a SIGTERM from the node (graceful shutdown, preemption) makes the controller
    checkpoint and exit RESTART; that is a controller loss, never the end of the job."""
    from elastic_jax.exit_codes import ControllerExit, ends_job

    for code in (ControllerExit.RESTART, ControllerExit.STOPPED, 143, 137, 99):
        pod = _ctrl(phase="Failed", exit_code=int(code), reason=f"exit code {int(code)}")
        plan = decide(_job(), Observed({"controllerPod": "demo-controller-0", "controllerRestarts": 1},
                                       [pod], _both_jobsets(), "controller interrupted by SIGTERM at step 7"))
        assert plan.finish is None, code
        assert plan.create_controller == 1 and plan.controller_restarted, code
        assert plan.events[0][1] == "ControllerRestarted" and f"exit code {int(code)}" in plan.events[0][2]
        assert not ends_job(int(code))
    assert all(ends_job(int(c)) for c in (ControllerExit.SUCCEEDED, ControllerExit.FAILED, ControllerExit.BAD_INPUT))
    assert not ends_job(None) and not ends_job(-15)


def test_controller_restart_budget():
    dead = _ctrl(3, phase="Failed", exit_code=137, reason="exit code 137")
    plan = decide(_job(), Observed({"controllerPod": "demo-controller-3", "controllerRestarts": 3}, [dead], _both_jobsets()))
    assert plan.finish[0] == "Failed" and "maxRestarts=3" in plan.finish[1]


def test_slice_budget_exhausted_fails_with_the_reason():
    js = _both_jobsets()
    js[1] = JobSetView("demo-slice-1", 1, restarts=2, failed=True, message="jobset failed: reached max restarts")
    plan = decide(_job(), Observed({"controllerPod": "demo-controller-0"}, [_ctrl()], js))
    assert plan.finish[0] == "Failed"
    assert "slice 1 exhausted its restart budget (elasticity.maxRestartsPerSlice=2)" in plan.finish[1]


def _resumed_status(restarts: list[int]) -> dict:
    """The status a job had before a suspend: its slices' restarts from the JobSets deleted then."""
    return {"controllerPod": "demo-controller-0", "slices": [{"index": i, "state": "Down", "restarts": r} for i, r in enumerate(restarts)],
            "counterBase": {"controllerUid": "uid0", "recoveries": 0,
                            "slices": [{"index": i, "jobsetUid": f"old-{i}", "restarts": 0} for i in range(2)]}}


def test_the_budgets_count_the_jobsets_deleted_before_a_resume():
    """Issue 11: suspend/resume created new JobSets (restarts 0) and with them a whole new budget."""
    status = _resumed_status([1, 1])
    fresh = {i: JobSetView(f"demo-slice-{i}", i, restarts=0, uid=f"new-{i}") for i in range(2)}
    assert decide(_job(), Observed(status, [_ctrl()], fresh)).finish is None
    again = {i: JobSetView(f"demo-slice-{i}", i, restarts=1, uid=f"new-{i}") for i in range(2)}  # 2 + 2 > 3
    plan = decide(_job(), Observed(status, [_ctrl()], again))
    assert plan.finish[0] == "Failed" and "4 slice replacements exceed elasticity.maxRestarts=3" in plan.finish[1]
    status = _resumed_status([2, 0])
    one_more = {**fresh, 0: JobSetView("demo-slice-0", 0, restarts=1, uid="new-0")}  # 2 + 1 > maxRestartsPerSlice=2
    plan = decide(_job(), Observed(status, [_ctrl()], one_more))
    assert plan.finish[0] == "Failed" and "slice 0 replaced 3 times" in plan.finish[1]
    assert "maxRestartsPerSlice=2" in plan.finish[1]


def test_job_wide_budget():
    plan = decide(_job(), Observed({"controllerPod": "demo-controller-0"}, [_ctrl()], _both_jobsets(restarts=2)))
    assert plan.finish[0] == "Failed" and "maxRestarts=3" in plan.finish[1]


def test_finished_job_tears_down_workers_keeps_finished_controller():
    done = _ctrl(phase="Succeeded", exit_code=0)
    plan = decide(_job(), Observed({"phase": "Succeeded", "completionTime": "2026-12-04T10:00:00Z"}, [done], _both_jobsets()))
    assert plan.delete_jobsets == ["demo-slice-0", "demo-slice-1"] and plan.delete_pods == []


def test_a_finished_jobs_controller_pod_is_kept_while_its_phase_still_lags_its_exited_container():
    """kind run: the job Succeeded on the container's exit code while the pod's phase still read Running
    (the kubelet reports the container first); teardown deleted the pod, and its logs with it."""
    exited = _ctrl(phase="Running", exit_code=0)
    plan = decide(_job(), Observed({"phase": "Succeeded", "completionTime": "2026-12-04T10:00:00Z"}, [exited], _both_jobsets()))
    assert plan.delete_pods == [] and plan.delete_jobsets == ["demo-slice-0", "demo-slice-1"]


def test_suspend_tears_everything_down_without_counting():
    # First the status lets go of the controller (the handler writes controllerPod ""), nothing deleted yet ...
    plan = decide(_job(suspend=True), Observed({"controllerPod": "demo-controller-0"}, [_ctrl()], _both_jobsets()))
    assert plan.delete_pods == [] and plan.delete_jobsets == []
    assert plan.create_controller is None and not plan.controller_restarted
    # ... then, once that status is back, the pod goes.
    plan = decide(_job(suspend=True), Observed({"controllerPod": ""}, [_ctrl()], _both_jobsets()))
    assert plan.delete_pods == ["demo-controller-0"]
    assert plan.create_controller is None and not plan.controller_restarted


def test_a_controller_released_by_suspend_is_never_a_loss_when_the_job_resumes():
    """Trial: suspend true -> false within a second counted a controller loss (restart, Warning)."""
    # Resumed while the released controller still checkpoints (deleting, SIGTERM): wait for it, no second one.
    stopping = _ctrl(deleting=True)
    plan = decide(_job(), Observed({"controllerPod": "", "controllerRestarts": 0}, [stopping], _both_jobsets()))
    assert plan.create_controller is None and not plan.controller_restarted and plan.events == []
    assert plan.delete_pods == [] and plan.finish is None
    # It stopped (exit 75: it checkpointed): the next incarnation starts, not counted, no Warning (its
    # checkpoints outlive it: gs://; a local one is `test_a_suspend_of_a_job_with_local_checkpoints_...`).
    kept = _job(checkpoint={"uri": "gs://test-bucket/ck"})
    for gone in (_ctrl(phase="Failed", exit_code=75, deleting=True), _ctrl(phase="Failed", exit_code=143)):
        plan = decide(kept, Observed({"controllerPod": "", "controllerRestarts": 0}, [gone], _both_jobsets()))
        assert plan.create_controller == 1 and not plan.controller_restarted and plan.events == []
    # Resumed before the pod was deleted at all: it is the job's controller again; nothing created.
    plan = decide(_job(), Observed({"controllerPod": "", "controllerRestarts": 0}, [_ctrl()], _both_jobsets()))
    assert plan.create_controller is None and plan.delete_pods == [] and plan.events == []
    # The same pod deleted by someone else while the status names it is still a loss (replaced once it
    # stopped: `test_a_gracefully_deleted_controller_is_replaced_only_once_it_has_stopped`).
    plan = decide(_job(), Observed({"controllerPod": "demo-controller-0", "controllerRestarts": 0}, [stopping],
                                   _both_jobsets()))
    assert plan.replace_after_stop == "demo-controller-0" and plan.create_controller is None


def test_a_gracefully_deleted_controller_is_replaced_only_once_it_has_stopped():
    """Issue 11: `kubectl delete pod` of the controller: on SIGTERM it checkpoints its last step; a replacement
    created at once restored before that commit (an older step of a gs:// checkpoint)."""
    status = {"controllerPod": "demo-controller-0", "controllerRestarts": 0}
    stopping = _ctrl(deleting=True)
    plan = decide(_job(), Observed(status, [stopping], _both_jobsets()))
    assert plan.create_controller is None and not plan.controller_restarted and plan.events == []
    assert plan.replace_after_stop == "demo-controller-0" and plan.delete_pods == []
    # its container stopped (exit 75: it checkpointed): now the replacement, counted and announced
    stopped = _ctrl(phase="Failed", exit_code=75, deleting=True)
    plan = decide(_job(), Observed(status, [stopped], _both_jobsets()))
    assert plan.create_controller == 1 and plan.controller_restarted and plan.replace_after_stop == ""
    assert [e[1] for e in plan.events] == ["ControllerRestarted"]
    # a force delete (grace 0) or a pod on a lost node never stops gracefully: no wait
    forced = dataclasses.replace(_ctrl(deleting=True), deletion_grace_s=0)
    plan = decide(_job(), Observed(status, [forced], _both_jobsets()))
    assert plan.create_controller == 1 and plan.replace_after_stop == ""


def test_suspend_keeps_workers_until_the_controller_checkpointed_and_exited():
    # The controller is still Ready (checkpointing after SIGTERM): its workers must stay.
    stopping = _ctrl(deleting=True)
    plan = decide(_job(suspend=True), Observed({"controllerPod": ""}, [stopping], _both_jobsets()))
    assert plan.delete_jobsets == [] and plan.delete_pods == []
    # Exited (or gone): now the workers go.
    exited = _ctrl(phase="Failed", exit_code=1, deleting=True)
    plan = decide(_job(suspend=True), Observed({"controllerPod": ""}, [exited], _both_jobsets()))
    assert plan.delete_jobsets == ["demo-slice-0", "demo-slice-1"]
    plan = decide(_job(suspend=True), Observed({"controllerPod": ""}, [], _both_jobsets()))
    assert plan.delete_jobsets == ["demo-slice-0", "demo-slice-1"]
    # A controller on a lost node cannot checkpoint and does not hold the workers (it is force-deleted).
    lost = dataclasses.replace(_ctrl(deleting=True), ready=False, node="n1")
    plan = decide(_job(suspend=True), Observed({"controllerPod": ""}, [lost], _both_jobsets(),
                                               lost_nodes={"n1": NodeLoss("n1", 60.0, "NotReady")}))
    assert len(plan.delete_jobsets) == 2
    # Nor does one that never ran (Pending: no step to end) or one force-deleted (grace 0: no time to act).
    for gone in (_ctrl(phase="Pending", deleting=True), dataclasses.replace(stopping, deletion_grace_s=0)):
        plan = decide(_job(suspend=True), Observed({"controllerPod": ""}, [gone], _both_jobsets()))
        assert len(plan.delete_jobsets) == 2, gone


def test_suspend_keeps_workers_while_the_stopping_controller_is_no_longer_ready_but_still_runs():
    """Kind race: the kubelet marks a terminating pod not Ready at once, while the controller still ends its
    last step; the JobSets went then and a slice_down was recorded at the step it committed."""
    stopping = dataclasses.replace(_ctrl(deleting=True), ready=False, deletion_grace_s=60,
                                   deletion_deadline="2026-12-02T01:01:00Z")
    for now in ("", "2026-12-02T01:00:30Z", "2026-12-02T01:00:59Z"):
        plan = decide(_job(suspend=True), Observed({"controllerPod": ""}, [stopping], _both_jobsets(), now=now))
        assert plan.delete_jobsets == [] and plan.events == [], now
    # Its container terminated (phase not yet updated): it stopped, the workers go, nothing to warn of.
    plan = decide(_job(suspend=True), Observed({"controllerPod": ""}, [dataclasses.replace(stopping, exit_code=75)],
                                               _both_jobsets(), now="2026-12-02T01:00:30Z"))
    assert plan.delete_jobsets == ["demo-slice-0", "demo-slice-1"] and plan.events == []
    # Past its grace period (the kubelet's SIGKILL time) the wait ends: the workers go, and an Event says why.
    plan = decide(_job(suspend=True), Observed({"controllerPod": ""}, [stopping], _both_jobsets(),
                                               now="2026-12-02T01:01:00Z"))
    assert plan.delete_jobsets == ["demo-slice-0", "demo-slice-1"]
    assert [(t, r) for t, r, _ in plan.events] == [("Warning", SUSPEND_CONTROLLER_NOT_STOPPED)], plan.events
    assert "demo-controller-0" in plan.events[0][2] and "grace period" in plan.events[0][2]
    # Said once: the JobSets being deleted are not deleted again.
    plan = decide(_job(suspend=True), Observed({"controllerPod": ""}, [stopping], _both_jobsets(deleting=True),
                                               now="2026-12-02T01:01:05Z"))
    assert plan.delete_jobsets == [] and plan.events == []


def test_a_suspend_waits_for_the_controller_pods_whose_container_still_runs():
    """Issue 11 (trial): the phase read Suspended ~2 s while the stopping controller still made steps. The plan
    names the controller pods a suspend still waits for (the job is Suspending), by the rule that keeps the
    workers for them: from the first suspend pass (the pod not yet deleted) until its container terminated."""
    running = _ctrl()
    assert decide(_job(suspend=True), Observed({"controllerPod": "demo-controller-0"}, [running],
                                               _both_jobsets())).suspend_waits_for == ["demo-controller-0"]
    stopping = dataclasses.replace(_ctrl(deleting=True), ready=False, deletion_grace_s=60,
                                   deletion_deadline="2026-12-02T01:01:00Z")
    # (also past its grace period, when its workers go anyway: it still runs until the kubelet's SIGKILL)
    for now in ("2026-12-02T01:00:30Z", "2026-12-02T01:01:05Z"):
        plan = decide(_job(suspend=True), Observed({"controllerPod": ""}, [stopping], _both_jobsets(), now=now))
        assert plan.suspend_waits_for == ["demo-controller-0"], now
    # stopped: its container terminated (the pod's phase may lag), it is terminal, or gone; never started
    for pods in ([dataclasses.replace(stopping, exit_code=75)], [_ctrl(phase="Failed", exit_code=75, deleting=True)],
                 [], [_ctrl(phase="Pending", deleting=True)]):
        assert decide(_job(suspend=True), Observed({"controllerPod": ""}, pods,
                                                   _both_jobsets())).suspend_waits_for == [], pods
    assert decide(_job(), Observed({"controllerPod": "demo-controller-0"}, [running],
                                   _both_jobsets())).suspend_waits_for == []


def test_pod_view_reads_the_deletion_deadline():
    body = {"metadata": {"name": "demo-controller-0", "deletionTimestamp": "2026-12-02T01:01:00Z",
                         "deletionGracePeriodSeconds": 60, "labels": {}}, "status": {"phase": "Running"}}
    view = pod_view(body)
    assert view.deleting and view.deletion_deadline == "2026-12-02T01:01:00Z" and view.deletion_grace_s == 60
    assert pod_view({"metadata": {"name": "p"}}).deletion_deadline == ""


def test_a_suspend_of_a_job_with_local_checkpoints_warns_at_suspend_and_at_resume():
    """Issue 9: a local spec.checkpoint.uri is the controller pod's emptyDir; a suspend/resume started again
    from step 0 with no word. The suspend says so (Event), and so does the resume (Event), never gs://."""
    # the release pass deletes nothing and says nothing (a toggle back now loses nothing) ...
    assert decide(_job(suspend=True), Observed({"controllerPod": "demo-controller-0", "step": 40}, [_ctrl()],
                                               _both_jobsets())).events == []
    # ... the pass that deletes the controller pod says what goes with it
    released = {"controllerPod": "", "step": 40}
    plan = decide(_job(suspend=True), Observed(released, [_ctrl()], _both_jobsets()))
    assert plan.delete_pods == ["demo-controller-0"]
    assert [(t, r) for t, r, _ in plan.events] == [("Warning", "SuspendDropsCheckpoints")]
    # (the step last reported: the controller trains on until it stops, so the job's final STEP may be later; a
    # new user's trial read "at step 40" beside a final STEP of 52 as a contradiction)
    assert "(step 40 when last reported; it checkpoints the step it stops at)" in plan.events[0][2], plan.events
    assert "/tmp/ck" in plan.events[0][2], plan.events
    assert decide(_job(suspend=True), Observed(released, [_ctrl(deleting=True)], _both_jobsets())).events == []
    assert decide(_job(suspend=True, checkpoint={"uri": "gs://test-bucket/ck"}),
                  Observed(released, [_ctrl()], _both_jobsets())).events == []
    # resumed while the released pod is gone (its exit seen) or long gone (no pod, status said Suspended)
    for pods, status in (([_ctrl(phase="Failed", exit_code=75, deleting=True)], {"controllerPod": "", "step": 40}),
                         ([], {"controllerPod": "", "step": 40, "phase": "Suspended"}),
                         ([], {"controllerPod": "", "step": 40,
                               "conditions": [{"type": "Suspended", "status": "True"}]}),
                         # a quick toggle on kind: the released pod was gone before the pass that saw the
                         # resume, whose status no longer said Suspended (phase Running, condition False)
                         ([], {"controllerPod": "", "step": 40, "phase": "Running",
                               "conditions": [{"type": "Suspended", "status": "False"}]})):
        plan = decide(_job(), Observed(status, pods, _both_jobsets()))
        assert plan.create_controller is not None and not plan.controller_restarted
        assert [(t, r) for t, r, _ in plan.events] == [("Warning", "ResumedFromStepZero")], plan.events
        assert "not step 40" in plan.events[0][2]
        assert decide(_job(checkpoint={"uri": "gs://test-bucket/ck"}), Observed(status, pods, _both_jobsets())).events == []
    # a first start is no resume
    assert decide(_job(), Observed({}, [], {})).events == []


def test_a_suspend_and_resume_at_step_0_warn_of_no_loss():
    """Session 12's trial: a suspend while Recovering from a restart at step 0 posted "resumed from step 0, not
    step 0" on resume. Starting again from step 0 loses nothing at step 0: neither the suspend's Warning
    (`deleting ... at step 0`) nor the resume's is posted; every phrasing names a step above 0 or is not said."""
    released = {"controllerPod": "", "step": 0, "phase": "Suspending"}
    assert decide(_job(suspend=True), Observed(released, [_ctrl(attempt=1)], _both_jobsets())).events == []
    for pods, status in (([_ctrl(attempt=1, phase="Failed", exit_code=75, deleting=True)], released),
                         ([], {"controllerPod": "", "step": 0, "phase": "Suspended"})):
        plan = decide(_job(), Observed(status, pods, _both_jobsets()))
        assert plan.create_controller is not None and plan.events == [], plan.events
    # (one step made is one step lost: said)
    plan = decide(_job(), Observed({"controllerPod": "", "step": 1, "phase": "Suspended"}, [], _both_jobsets()))
    assert [e[2].split(":")[0] for e in plan.events] == ["resumed from step 0, not step 1"]


def test_resume_after_suspend_starts_fresh_controller():
    plan = decide(_job(), Observed({"controllerPod": "", "controllerRestarts": 0}, [], {}))
    assert plan.create_controller == 0 and not plan.controller_restarted


def test_helpers():
    assert attempt_of("demo-controller-12") == 12 and attempt_of("demo") is None
    v = jobset_view({"metadata": {"name": "x"}, "status": {"restarts": 2, "conditions": [
        {"type": "Failed", "status": "True", "message": "m"}]}}, 0)
    assert v.failed and v.restarts == 2 and v.message == "m"


_BUDGET = "ElasticRuntimeError: restart budget exhausted: 2 slice failures > spec.elasticity.maxRestarts=1"


def _log_tail_of_a_failed_run() -> str:
    """What FallbackToLogsOnError gives for a controller that ran out of restarts: the log's last 2048 bytes."""
    import json

    recoveries = [{"cause": "slice_down", "slices": [i % 2], "at_step": 10 * i, "seconds": 5.99} for i in range(40)]
    failed = {"level": "ERROR", "msg": f"training failed: {_BUDGET}", "event": "training_failed", "reason": _BUDGET}
    summary = {"level": "INFO", "msg": "finished: failed after 70/100 steps", "event": "finished",
               "recoveries": recoveries, "steps_lost": 0, "failure_reason": _BUDGET, "wall_seconds": 80.1,
               "exit_code": 1}
    log = "\n".join(json.dumps(x) for x in ({"msg": "ready"}, failed, summary)) + "\n"
    return log.encode()[-2048:].decode()


def test_a_log_tail_ending_in_a_cut_json_summary_still_gives_the_clean_reason():
    from elastic_jax.k8s_operator.reconcile import termination_reason

    tail = _log_tail_of_a_failed_run()
    assert not tail.startswith("{")  # the summary line is cut: the old reason was this fragment
    assert termination_reason(tail) == _BUDGET
    pod = _ctrl(phase="Failed", exit_code=1, message=tail)
    plan = decide(_job(), Observed({"controllerPod": "demo-controller-0"}, [pod], _both_jobsets()))
    assert plan.finish == ("Failed", f"training failed: {_BUDGET}")
    # a cut fragment with no reason in it is never the reason
    assert termination_reason('[0], "at_step": 70, "seconds": 5.99}, {"cause": "slice_down"}]}') == ""


def test_a_sigkilled_controller_is_reported_as_killed_not_by_a_stale_log_line():
    """Exit 137 with no `error:` line: the kubelet's log tail ends in a slice loss recovered a minute
    before the kill; the Event named that line as the cause. It names the signal as the cause now, and the
    line only as the log's last one."""
    stale = json.dumps({"msg": "elastic event: DATA_LOSS: slice 1 (127.0.0.3:9000) unreachable", "level": "warning"})
    dead = _ctrl(phase="Failed", exit_code=137, reason="exit code 137", message=stale)
    plan = decide(_job(), Observed({"controllerPod": "demo-controller-0"}, [dead], _both_jobsets()))
    message = plan.events[0][2]
    assert "lost (exit code 137: SIGKILL: killed (e.g. out of memory, or by its node);" in message, message
    # the stale line is named as the log's last line, never as the cause
    assert message.index("SIGKILL") < message.index("its last log line, from before the signal: elastic event: DATA_LOSS")
    # the controller's own `error:` line still wins over the signal
    said = _ctrl(phase="Failed", exit_code=137, reason="exit code 137", message="error: no progress for 600 s")
    plan = decide(_job(), Observed({"controllerPod": "demo-controller-0"}, [said], _both_jobsets()))
    assert "lost (exit code 137: error: no progress for 600 s)" in plan.events[0][2]


def test_signal_exit_names_the_signal_of_a_128_plus_n_or_negative_code():
    from elastic_jax.exit_codes import signal_exit

    assert signal_exit(143) == "SIGTERM: terminated" and signal_exit(-9).startswith("SIGKILL: killed")
    assert signal_exit(None) == signal_exit(1) == signal_exit(75) == signal_exit(128) == signal_exit(255) == ""


def test_the_controllers_termination_line_is_the_reason_without_its_error_prefix():
    pod = _ctrl(phase="Failed", exit_code=1, message=f"error: {_BUDGET}")
    plan = decide(_job(), Observed({"controllerPod": "demo-controller-0"}, [pod], _both_jobsets()))
    assert plan.finish == ("Failed", f"training failed: {_BUDGET}")


# -- backend pathways: start order and head restarts (issue 10 items 2 and 5) --


def _pw_job():
    return _job(backend="pathways", slices={"count": 2, "accelerator": "tpu-v5-lite-podslice", "topology": "2x2"},
                checkpoint={"uri": "gs://test-bucket/ck"})


def _head(attempt=0, rm_started=True, rm_restarts=0, **kw):
    return dataclasses.replace(_ctrl(attempt, **kw), rm_started=rm_started, rm_restarts=rm_restarts)


def test_pathways_workers_wait_for_the_resource_manager_to_listen():
    job = _pw_job()
    first = decide(job, Observed({}, [], {}))
    assert first.create_controller == 0 and first.create_jobsets == []
    starting = decide(job, Observed({"controllerPod": "demo-controller-0"}, [_head(rm_started=False)], {}))
    assert starting.create_jobsets == []
    up = decide(job, Observed({"controllerPod": "demo-controller-0"}, [_head()], {}))
    assert up.create_jobsets == [0, 1] and up.pathways_head == "demo-controller-0.rm-0"


def test_pathways_workers_of_a_dead_head_are_restarted_with_the_new_one():
    job = _pw_job()
    dead = _head(phase="Failed", exit_code=137, reason="exit code 137")
    attached = _both_jobsets(head="demo-controller-0.rm-0")
    plan = decide(job, Observed({"controllerPod": "demo-controller-0"}, [dead], attached))
    assert plan.create_controller == 1
    assert plan.delete_jobsets == ["demo-slice-0", "demo-slice-1"] and plan.create_jobsets == []
    assert [e[1] for e in plan.events] == ["ControllerRestarted", "WorkersRestarted"]
    # next passes: the old JobSets go away; new ones only once the new head's resource manager listens
    deleting = _both_jobsets(head="demo-controller-0.rm-0", deleting=True)
    new = _head(1, rm_started=False)
    plan = decide(job, Observed({"controllerPod": "demo-controller-1"}, [dead, new], deleting))
    assert plan.delete_jobsets == [] and plan.create_jobsets == []
    plan = decide(job, Observed({"controllerPod": "demo-controller-1"}, [dead, _head(1)], {}))
    assert plan.create_jobsets == [0, 1] and plan.pathways_head == "demo-controller-1.rm-0"


def test_pathways_resource_manager_restart_in_place_restarts_the_workers():
    job = _pw_job()
    plan = decide(job, Observed({"controllerPod": "demo-controller-0"}, [_head(rm_restarts=1)],
                                _both_jobsets(head="demo-controller-0.rm-0")))
    assert plan.create_controller is None and plan.delete_jobsets == ["demo-slice-0", "demo-slice-1"]
    current = decide(job, Observed({"controllerPod": "demo-controller-0"}, [_head(rm_restarts=1)],
                                   _both_jobsets(head="demo-controller-0.rm-1")))
    assert current.delete_jobsets == [] and current.events == []


def test_cpu_jobsets_do_not_wait_for_a_head():
    plan = decide(_job(), Observed({"controllerPod": "demo-controller-0"}, [_ctrl()], {}))
    assert plan.create_jobsets == [0, 1] and plan.pathways_head == ""


def test_views_read_the_head_incarnation_and_the_resource_manager_state():
    from elastic_jax.api import labels
    from elastic_jax.k8s_operator.slices import pod_view

    js = jobset_view({"metadata": {"name": "demo-slice-0", "annotations": {labels.PATHWAYS_HEAD: "demo-controller-2.rm-1"}}}, 0)
    assert js.head == "demo-controller-2.rm-1"
    pod = {"metadata": {"name": "demo-controller-2", "labels": {labels.ROLE: "controller"}},
           "status": {"phase": "Pending", "initContainerStatuses": [
               {"name": "pathways-rm", "started": True, "restartCount": 1, "state": {"running": {}}},
               {"name": "pathways-proxy", "started": False, "restartCount": 4, "state": {"running": {}}}]}}
    view = pod_view(pod)
    assert view.rm_started and view.rm_restarts == 1
    pod["status"]["initContainerStatuses"][0].update(started=False)
    assert not pod_view(pod).rm_started


def test_a_controller_pod_gone_after_a_graceful_delete_is_named_deleted_not_vanished():
    """Session 16's trial: `kubectl delete pod` of the controller (it checkpointed on SIGTERM and exited) read
    "lost (pod vanished)" in the ControllerRestarted Event; the status had said it was being deleted."""
    stopping = {"type": "ControllerRestarted", "status": "True", "reason": "ControllerRestarting",
                "message": "controller pod lost; controller pod demo-controller-0 is being deleted: its replacement "
                           "is created once its container has stopped"}
    plan = decide(_job(), Observed({"controllerPod": "demo-controller-0", "conditions": [stopping]}, [],
                                   _both_jobsets(), None))
    [event] = [e for e in plan.events if e[1] == "ControllerRestarted"]
    assert "deleted by someone else" in event[2] and "vanished" not in event[2], event
    # without that word of the status, a pod gone is still said to have vanished
    plan = decide(_job(), Observed({"controllerPod": "demo-controller-0"}, [], _both_jobsets(), None))
    [event] = [e for e in plan.events if e[1] == "ControllerRestarted"]
    assert "pod vanished" in event[2], event


def test_the_next_controller_pod_is_above_every_one_the_job_had_also_after_a_suspend():
    """`status.controllerAttempt` counts with the pods seen; a status an older operator wrote (no field) counts
    only the pods, as before."""
    from elastic_jax.api.status import ElasticTrainingJobStatus
    from elastic_jax.k8s_operator.reconcile import next_attempt

    def status(**fields):
        return ElasticTrainingJobStatus.from_kube(fields)

    assert next_attempt(status()) == 0 and next_attempt(status(), None, None) == 0
    assert next_attempt(status(controllerAttempt=3)) == 4  # a resume: no pod left, the status remembers
    assert next_attempt(status(controllerAttempt=3), 5, None) == 6 and next_attempt(status(), 2, 4) == 5
    plan = decide(_job(), Observed({"controllerPod": "", "controllerAttempt": 1, "step": 40}, [], _both_jobsets()))
    assert plan.create_controller == 2 and not plan.controller_restarted
