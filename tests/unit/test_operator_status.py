"""Status transitions, conditions and phase."""

from __future__ import annotations

import pytest

from elastic_jax.api.control import ControllerStatus, RecoveryRecord, ResumeInfo
from elastic_jax.api.identity import JobIdentity
from elastic_jax.api.manifest import parse_manifest
from elastic_jax.api.status import Condition, CounterBase, ElasticTrainingJobStatus, ResumedFrom, SliceStatusEntry
from elastic_jax.k8s_operator import status_builder
from elastic_jax.k8s_operator.conditions import get_condition, set_condition
from elastic_jax.k8s_operator.phases import phase as job_phase
from elastic_jax.k8s_operator.status_builder import Inputs, changed_fields


# The builder is typed end to end; these tests read what it writes to the API server (camelCase).
def build_status(i: Inputs) -> dict:
    out = status_builder.build_status(i)
    assert isinstance(out, ElasticTrainingJobStatus)
    return out.to_kube()


def get_condition(conditions: list[dict], type_: str) -> dict | None:
    return next((c for c in conditions if c["type"] == type_), None)


def resume_events(previous: dict | None, current: dict | None):
    typed = [None if r is None else ResumedFrom.model_validate(r) for r in (previous, current)]
    return status_builder.resume_events(*typed)


def _job(**spec):
    base = {"slices": {"count": 2, "minSlices": 1}, "training": {"steps": 10, "globalBatchSize": 4},
            "checkpoint": {"uri": "/tmp/ck"}}
    base.update(spec)
    return parse_manifest({"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob",
                           "metadata": {"name": "demo"}, "spec": base})


def _ctrl(phase="Running", active=(0, 1), step=5):
    return ControllerStatus(phase=phase, step=step, total_steps=10, desired_slices=2, min_slices=1,
                            active_slices=list(active), inactive_slices=[], slices=[], loss=2.0, initial_loss=5.0,
                            last_committed_checkpoint_step=4, recoveries={"slice_down": 1, "scale_up": 1},
                            recovery_history=[RecoveryRecord(cause="slice_down", slices=[1], at_step=3, seconds=0.5),
                                              RecoveryRecord(cause="scale_up", slices=[1], at_step=4, seconds=0.1)],
                            pid=1)


def _inputs(**kw):
    base = dict(job=_job(), generation=2, previous={}, slices=[{"index": 0, "state": "Ready"}, {"index": 1, "state": "Ready"}],
                controller=_ctrl(), controller_pod="demo-controller-0", controller_restarts=0, slice_replacements=0,
                recoveries=1, counter_base=None,
                finish=None, rejected_fields=[], now="2025-01-01T00:00:00Z")
    base.update(kw)
    # as the operator reads them back from the API server
    base["previous"] = ElasticTrainingJobStatus.from_kube(base["previous"])
    base["slices"] = [SliceStatusEntry.model_validate(s) for s in base["slices"]]
    if isinstance(base["counter_base"], dict):
        base["counter_base"] = CounterBase.model_validate(base["counter_base"])
    return Inputs(**base)


def test_set_condition_keeps_transition_time_while_status_holds():
    c = set_condition([], "Running", "True", "R", "m", 1, "t1")
    c = set_condition(c, "Running", "True", "R", "m2", 2, "t2")
    assert c == [Condition(type="Running", status="True", reason="R", message="m2", last_transition_time="t1",
                           observed_generation=2)]
    assert [x.model_dump(by_alias=True) for x in c] == [{"type": "Running", "status": "True", "reason": "R",
                                                         "message": "m2", "lastTransitionTime": "t1",
                                                         "observedGeneration": 2}]
    c = set_condition(c, "Running", "False", "X", "", 2, "t3")
    assert c[0].last_transition_time == "t3"


R2, ONE_DOWN = ["Ready"] * 2, ["Ready", "Down"]


@pytest.mark.parametrize("case, expected", [
    # (the controller's answer and the slices)
    (dict(controller_phase=None, slice_states=R2), "Pending"),
    (dict(controller_phase="WaitingForSlices", slice_states=["Provisioning"] * 2), "Pending"),
    (dict(controller_phase="Running", slice_states=R2), "Running"),
    (dict(controller_phase="Recovering", slice_states=ONE_DOWN), "Recovering"),
    (dict(controller_phase="Running", slice_states=ONE_DOWN, active_slices=1), "Degraded"),
    (dict(controller_phase="Running", slice_states=R2, previous="Pending", trained=False), "Pending"),
    # (the job ended or was suspended: whatever else holds)
    (dict(controller_phase="Running", slice_states=[], suspended=True), "Suspended"),
    (dict(controller_phase=None, slice_states=[], suspended=True, stopping=True), "Suspending"),
    (dict(controller_phase="Running", slice_states=[], finished="Failed"), "Failed"),
    (dict(controller_phase=None, slice_states=[], finished="Failed", suspended=True, stopping=True), "Failed"),
    (dict(controller_phase=None, slice_states=R2, finished="Succeeded", restarting=True), "Succeeded"),
    # (the controller replaced: Recovering for a job that was training, Pending stays Pending)
    (dict(controller_phase=None, slice_states=R2, previous="Running", restarting=True), "Recovering"),
    (dict(controller_phase="Running", slice_states=R2, previous="Degraded", restarting=True), "Recovering"),
    (dict(controller_phase=None, slice_states=R2, previous="Pending", restarting=True), "Pending"),
    # (unreachable, or ended and not exited yet: the phase it had)
    (dict(controller_phase=None, slice_states=R2, previous="Degraded"), "Degraded"),
    (dict(controller_phase="Succeeded", slice_states=R2, previous="Running", active_slices=0), "Running"),
    (dict(controller_phase=None, slice_states=R2, previous="Suspended"), "Pending"),
    # (unresponsive: no step seen to move)
    (dict(controller_phase="Running", slice_states=R2, previous="Running", unresponsive=True), "Degraded"),
    (dict(controller_phase="Recovering", slice_states=ONE_DOWN, previous="Running", unresponsive=True), "Recovering"),
    (dict(controller_phase="Starting", slice_states=R2, previous="Pending", unresponsive=True), "Pending"),
    (dict(controller_phase=None, slice_states=R2, previous="Running", unresponsive=True, restarting=True), "Recovering"),
])
def test_phases(case, expected):
    args = dict(finished=None, suspended=False, active_slices=2, desired_slices=2)
    assert job_phase(**{**args, **case}) == expected


def test_waiting_at_start_for_a_slice_still_coming_up_is_pending_not_degraded():
    # Seen on the pathways path: one slice's pool missing at start, the other slice Ready; the
    # controller waits for all of them and has trained nothing. "Degraded" would say it trains.
    p = dict(finished=None, suspended=False, active_slices=0, desired_slices=2)
    assert job_phase(controller_phase="WaitingForSlices", slice_states=["Ready", "Provisioning"],
                        trained=False, **p) == "Pending"
    # The same wait after it trained (a replaced slice's pod is coming up again): a recovery.
    assert job_phase(controller_phase="WaitingForSlices", slice_states=["Ready", "Provisioning"],
                        trained=True, **p) == "Recovering"
    assert job_phase(controller_phase="WaitingForSlices", slice_states=["Ready", "Down"],
                        trained=False, **p) == "Recovering"


def test_a_controller_that_has_not_trained_past_its_resume_step_is_not_degraded():
    prev = build_status(_inputs(controller=None))
    waiting = _ctrl(phase="WaitingForSlices", active=(), step=40)
    waiting.resumed_from = ResumeInfo(step=40)
    slices = [{"index": 0, "state": "Ready"}, {"index": 1, "state": "Provisioning"}]
    out = build_status(_inputs(previous=prev, controller=waiting, slices=slices))
    assert out["phase"] == "Pending", out
    waiting.step = 41
    assert build_status(_inputs(previous=prev, controller=waiting, slices=slices))["phase"] == "Recovering"


def test_running_status_reflects_the_controller_and_validates():
    s = build_status(_inputs())
    assert s["phase"] == "Running" and s["step"] == 5 and s["activeSlices"] == 2
    assert s["recoveries"] == 1 and s["lastRecoverySeconds"] == 0.5 and s["lastCheckpointStep"] == 4
    assert s["loss"] == 2.0 and s["initialLoss"] == 5.0
    assert all(c["observedGeneration"] == 2 for c in s["conditions"])
    assert get_condition(s["conditions"], "Running")["status"] == "True"
    ElasticTrainingJobStatus.model_validate(s)  # matches the CRD's status schema


def test_a_new_controller_still_restoring_does_not_reset_the_step():
    """Issue 11 (status truth): around a suspend or a controller loss the STEP column read
    10361 -> 0 -> 10411: a new controller says step 0 until its restore ends."""
    s = build_status(_inputs(previous={"step": 10361}, controller=_ctrl(phase="Starting", active=(), step=0)))
    assert s["step"] == 10361
    s = build_status(_inputs(previous={"step": 10361}, controller=_ctrl(step=10411)))
    assert s["step"] == 10411
    # a restore to an older checkpoint is the truth once the controller runs
    assert build_status(_inputs(previous={"step": 10361}, controller=_ctrl(step=10300)))["step"] == 10300
    # a first start has no step to keep
    assert build_status(_inputs(controller=_ctrl(phase="Starting", active=(), step=0)))["step"] == 0


def test_degraded_then_recovered_keeps_history_in_conditions():
    s1 = build_status(_inputs(controller=_ctrl(active=(0,)), slices=[{"index": 0, "state": "Ready"}, {"index": 1, "state": "Down"}]))
    assert s1["phase"] == "Degraded"
    assert get_condition(s1["conditions"], "Degraded")["status"] == "True"
    s2 = build_status(_inputs(previous=s1, now="2025-01-01T00:01:00Z"))
    assert s2["phase"] == "Running"
    assert get_condition(s2["conditions"], "Degraded") == {**get_condition(s2["conditions"], "Degraded"),
                                                           "status": "False", "lastTransitionTime": "2025-01-01T00:01:00Z"}


def test_finish_sets_reason_time_and_condition_once():
    s = build_status(_inputs(controller=None, finish=("Failed", "slice 1 exhausted its restart budget")))
    assert s["phase"] == "Failed" and s["failureReason"] == "slice 1 exhausted its restart budget"
    assert get_condition(s["conditions"], "Failed")["message"] == "slice 1 exhausted its restart budget"
    again = build_status(_inputs(previous=s, controller=None, finish=("Succeeded", "x"), now="later"))
    assert again["phase"] == "Failed" and again["completionTime"] == s["completionTime"]


def test_a_succeeded_job_shows_its_final_checkpoint_step():
    """Issue 11 (status truth): the last poll saw step 4 committed; exit 0 means step 10's save committed."""
    running = build_status(_inputs())
    assert running["lastCheckpointStep"] == 4
    done = build_status(_inputs(previous=running, controller=None, finish=("Succeeded", "trained 10 steps")))
    assert done["step"] == done["lastCheckpointStep"] == 10
    failed = build_status(_inputs(previous=running, controller=None, finish=("Failed", "x")))
    assert failed["lastCheckpointStep"] == 4


def test_degraded_condition_after_the_end_does_not_contradict_itself():
    """A finished job is not degraded, and does not claim 'AllSlicesActive' with 0 slices active."""
    s = build_status(_inputs(controller=None, finish=("Succeeded", "trained 10 steps")))
    degraded = get_condition(s["conditions"], "Degraded")
    assert (degraded["status"], degraded["reason"], degraded["message"]) == ("False", "NotTraining", "phase Succeeded")


def test_controller_restart_has_its_own_condition():
    s = build_status(_inputs(controller_restarts=1, controller_pod="demo-controller-1"))
    cond = get_condition(s["conditions"], "ControllerRestarted")
    assert cond["status"] == "True" and "demo-controller-1" in cond["message"]


def test_rejected_spec_change_condition_names_the_field():
    s = build_status(_inputs(rejected_fields=["spec.slices.count"]))
    cond = get_condition(s["conditions"], "SpecChangeRejected")
    assert cond["status"] == "True" and cond["message"].startswith("spec.slices.count cannot change")
    s2 = build_status(_inputs(previous=s))
    assert get_condition(s2["conditions"], "SpecChangeRejected")["status"] == "False"


def test_changed_fields_ignores_suspend_and_ttl():
    a = _job().spec.to_manifest()
    b = _job(suspend=True, ttlSecondsAfterFinished=3, slices={"count": 4}).spec.to_manifest()
    assert changed_fields(a, b) == ["spec.slices.count", "spec.slices.minSlices"]


# -- issue 9 item 13: every resume is visible -------------------------------------------------------

_WRITER = JobIdentity(namespace="ml", name="demo", uid="1111-aaaa")


def _resumed(step=20, fallback=None, writer=_WRITER):
    c = _ctrl()
    c.resumed_from = ResumeInfo(step=step, fallback_reason=fallback, writer=writer)
    return c


def test_the_controllers_resume_is_copied_into_status_with_its_writer():
    out = build_status(_inputs(controller=_resumed()))
    assert out["resumedFrom"] == {"step": 20, "writerNamespace": "ml", "writerName": "demo", "writerUid": "1111-aaaa",
                                  "fallbackReason": "", "controllerPod": "demo-controller-0"}
    ElasticTrainingJobStatus.model_validate(out)  # the typed status (and so the CRD) holds it
    # A controller that has not resumed (yet) leaves the last resume in place.
    assert build_status(_inputs(previous=out, controller=_ctrl()))["resumedFrom"] == out["resumedFrom"]
    assert "resumedFrom" not in build_status(_inputs())


def test_a_resume_posts_one_resumed_event_naming_step_and_writer():
    new = build_status(_inputs(controller=_resumed()))["resumedFrom"]
    assert resume_events(None, new) == [
        ("Normal", "Resumed", "resumed from checkpoint step 20 written by ml/demo (uid 1111-aaaa)")]
    assert resume_events(new, dict(new)) == []  # reported again by the same controller: no second Event
    again = build_status(_inputs(controller=_resumed(), controller_pod="demo-controller-1"))["resumedFrom"]
    assert [e[1] for e in resume_events(new, again)] == ["Resumed"]  # a new controller resumed: a new Event
    assert resume_events(new, None) == []


def test_a_fallback_to_an_older_step_is_a_warning_event():
    new = build_status(_inputs(controller=_resumed(step=30, fallback="newer committed steps unreadable: step 40: x")))
    events = resume_events(None, new["resumedFrom"])
    assert events[0][:2] == ("Normal", "Resumed")
    assert events[1] == ("Warning", "CheckpointFallback",
                         "resumed from older checkpoint step 30: newer committed steps unreadable: step 40: x")


def test_a_step_without_writer_identity_is_named_as_unknown():
    new = build_status(_inputs(controller=_resumed(writer=None)))["resumedFrom"]
    assert new["writerUid"] == ""
    assert resume_events(None, new)[0][2] == (
        "resumed from checkpoint step 20 written by an unknown job (no writer identity saved)")


def test_resumed_from_crosses_the_wire_with_its_writer():
    """The controller builds `resumedFrom` from its run's dict; the operator reads the JSON of /v1/status."""
    run_dict = {"step": 20, "fallbackReason": None, "writer": {"namespace": "ml", "name": "demo", "uid": "u1"}}
    served = ControllerStatus.model_validate({**_ctrl().model_dump(by_alias=True), "resumedFrom": run_dict})
    wire = ControllerStatus.model_validate_json(served.model_dump_json(by_alias=True))
    assert wire.resumed_from.writer == JobIdentity(namespace="ml", name="demo", uid="u1")
    assert build_status(_inputs(controller=wire))["resumedFrom"]["writerUid"] == "u1"


def test_a_suspended_jobs_status_takes_the_step_its_stopping_controller_saved():
    # Issue 11: the suspend's controller is read until it exits; its final status (phase Interrupted,
    # the step it stopped at, that step committed) is what a suspended job shows, not the last poll before
    prev = build_status(_inputs(controller=_ctrl(step=5)))
    final = _ctrl(phase="Interrupted", active=(), step=9)
    final.last_committed_checkpoint_step = 9
    gs = {"uri": "gs://test-bucket/ck"}
    out = build_status(_inputs(previous=prev, controller=final, job=_job(suspend=True, checkpoint=gs)))
    assert out["phase"] == "Suspended"
    assert out["step"] == 9 and out["lastCheckpointStep"] == 9
    # a local uri: that checkpoint went with the pod's emptyDir; the step reached stays (what the resume loses)
    local = build_status(_inputs(previous=prev, controller=final, job=_job(suspend=True)))
    assert local["step"] == 9 and "lastCheckpointStep" not in local
    assert out["activeSlices"] == 0 and out["spareSlices"] == []
    # still stopping (saving), mesh not yet released: it trains no more either way
    saving = _ctrl(phase="Running", active=(0, 1), step=9)
    out = build_status(_inputs(previous=prev, controller=saving, job=_job(suspend=True),
                               suspend_waits_for=["demo-controller-0"]))
    assert out["phase"] == "Suspending" and out["activeSlices"] == 0 and out["step"] == 9
    ElasticTrainingJobStatus.model_validate(out)


def test_a_suspended_job_is_suspending_until_its_controller_container_has_stopped():
    """Issue 11 (trial): after `suspend: true` the phase read Suspended ~2 s while the stopping controller still
    made steps. While a controller pod still runs (`reconcile.Plan.suspend_waits_for`) the phase is Suspending
    and the Suspended condition False, reason Suspending, naming the pod; Suspended once it has stopped."""
    prev = build_status(_inputs(controller=_ctrl(step=5)))
    job = _job(suspend=True, checkpoint={"uri": "gs://test-bucket/ck"})
    stopping = build_status(_inputs(previous=prev, controller=_ctrl(step=7), job=job, controller_pod="",
                                    suspend_waits_for=["demo-controller-0"]))
    assert stopping["phase"] == "Suspending" and stopping["step"] == 7, stopping
    cond = get_condition(stopping["conditions"], "Suspended")
    assert (cond["status"], cond["reason"]) == ("False", "Suspending"), cond
    assert "demo-controller-0" in cond["message"] and "checkpoints" in cond["message"], cond
    running = get_condition(stopping["conditions"], "Running")
    assert (running["status"], running["reason"]) == ("False", "Suspending"), running
    done = build_status(_inputs(previous=stopping, controller=None, job=job, controller_pod=""))
    assert done["phase"] == "Suspended", done
    cond = get_condition(done["conditions"], "Suspended")
    assert (cond["status"], cond["reason"]) == ("True", "Suspended"), cond
    # a finished job is never Suspending, whatever still runs
    assert job_phase(finished="Failed", suspended=True, stopping=True, controller_phase=None, slice_states=[],
                        active_slices=0, desired_slices=2) == "Failed"


def test_a_suspended_job_whose_checkpoints_go_with_its_controller_pod_says_so():
    s = build_status(_inputs(job=_job(suspend=True), controller=None, controller_pod=""))
    cond = get_condition(s["conditions"], "Suspended")
    assert cond["status"] == "True" and cond["reason"] == "SuspendedWithoutCheckpoint", cond
    assert "/tmp/ck" in cond["message"] and "step 0" in cond["message"], cond
    kept = build_status(_inputs(job=_job(suspend=True, checkpoint={"uri": "gs://test-bucket/ck"}), controller=None,
                                controller_pod=""))
    assert get_condition(kept["conditions"], "Suspended")["reason"] == "Suspended"


def test_a_job_that_never_trained_stays_pending_through_a_failed_first_step():
    """Issue 11 (status truth, session 10's trial): a failure during the first step (while its program
    compiles) flapped the phase Pending/Recovering. Until a first step completes the job is Pending,
    whatever the controller says meanwhile; the completed step makes it Running."""
    status: dict = {}
    phases = []
    for phase, active, slices in (("Running", (0, 1), ("Ready", "Ready")),
                                  ("Recovering", (0,), ("Ready", "Down")),  # slice 1 lost in step 1
                                  ("WaitingForSlices", (), ("Ready", "Down")),
                                  ("Recovering", (0, 1), ("Ready", "Ready"))):
        c = _ctrl(phase=phase, active=active, step=0)
        status = build_status(_inputs(previous=status, controller=c,
                                      slices=[{"index": i, "state": s} for i, s in enumerate(slices)]))
        phases.append(status["phase"])
    assert phases == ["Pending"] * 4, phases
    assert get_condition(status["conditions"], "Running")["status"] == "False"
    status = build_status(_inputs(previous=status, controller=_ctrl(step=1)))
    assert status["phase"] == "Running"
    # A job that trained before keeps the recovery phases (a later failure is a recovery).
    assert build_status(_inputs(previous=status, controller=_ctrl(phase="Recovering", step=2)))["phase"] == "Recovering"


def test_a_frozen_controllers_job_reads_degraded_with_no_slice_active_until_it_answers():
    """Session 10/12 trials: while the controller was frozen (condition ControllerUnresponsive True) `kubectl get
    ejob` kept Running with the old step and 2/2 active. Now PHASE Degraded, ACTIVE 0 and the Degraded condition
    says why (reason ControllerUnresponsive); STEP stays the last step it reported; Running once it answers."""
    from elastic_jax.k8s_operator.status_decision import StatusObserved, decide_status

    running = build_status(_inputs(controller=_ctrl(step=7)))
    assert (running["phase"], running["activeSlices"]) == ("Running", 2)

    def decided(previous, controller, unresponsive):
        return decide_status(StatusObserved(
            inputs=_inputs(previous=previous, controller=controller), status=previous, finished=False, refusal=None,
            controller_pods=[], worker_pods=[], jobsets={}, current=None, controller_created_now=False,
            unresponsive=unresponsive)).written

    frozen = decided(running, None, "the controller pod runs but its control API has not answered for 21 s")
    assert (frozen["phase"], frozen["step"], frozen["activeSlices"]) == ("Degraded", 7, 0)
    degraded = get_condition(frozen["conditions"], "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "ControllerUnresponsive")
    assert "0/2 slices" in degraded["message"] and "step 7" in degraded["message"]
    assert get_condition(frozen["conditions"], "ControllerUnresponsive")["status"] == "True"
    again = decided(frozen, _ctrl(step=8), None)
    assert (again["phase"], again["step"], again["activeSlices"]) == ("Running", 8, 2)
    assert get_condition(again["conditions"], "Degraded")["reason"] == "AllSlicesActive"
    # a job whose controller is being replaced stays Recovering (the restart's own reason), and one not running
    # yet is not said to be degraded
    pending = build_status(_inputs(controller=_ctrl(phase="Starting", step=0, active=())))
    assert decided(pending, None, "not answered for 21 s")["phase"] == "Pending"


def test_a_resumed_jobs_pending_status_says_which_stage_of_its_new_controller_step_and_active_stand_on():
    """Session 12's trial: after a resume STEP and ACTIVE "lagged the new controller" by 8-10 s. Measured on the
    local control plane (`e2e/measure_resume_lag.py`): the operator writes each answer of the new controller within a
    second; the seconds are the controller's own start (~12 s `Starting`: trainer build, restore or init) and its
    first step's compile (~27 s `Running` at its resume step, 0 steps done). Pending said only "phase Pending"
    meanwhile, with the step the job had reached before (88) and then ACTIVE 2 at step 0: now the Running
    condition's message says which stage each of those versions stands on."""
    def running_message(status: dict) -> str:
        return get_condition(status["conditions"], "Running")["message"]

    status = {"phase": "Suspended", "step": 88, "activeSlices": 0}
    status = build_status(_inputs(previous=status, controller=None, controller_pod="demo-controller-1"))
    # (issue 11: STEP read 88, the step reached before the suspend, until the new controller said where it
    # starts; with a local checkpoint.uri it starts from 0, and 88 is kept for the steps lost)
    assert (status["phase"], status["step"], running_message(status)) == ("Pending", 0, "phase Pending")
    assert status["counterBase"]["stepAtResume"] == 88
    starting = _ctrl(phase="Starting", active=(), step=0)
    status = build_status(_inputs(previous=status, controller=starting, controller_pod="demo-controller-1"))
    assert (status["phase"], status["step"], status["activeSlices"]) == ("Pending", 0, 0), status
    assert running_message(status) == (
        "phase Pending: controller pod demo-controller-1 is starting: building its trainer, then restoring its "
        "latest committed checkpoint or initializing its state; it starts from step 0: spec.checkpoint.uri is "
        "local to the earlier controller pod; the job had reached step 88 before it")
    # a failed poll (None) while it starts is no news of its stage: the message stays
    unanswered = build_status(_inputs(previous=status, controller=None, controller_pod="demo-controller-1"))
    assert running_message(unanswered) == running_message(status)
    compiling = _ctrl(phase="Running", step=0)
    compiling.resumed_from = ResumeInfo(step=0)
    status = build_status(_inputs(previous=status, controller=compiling, controller_pod="demo-controller-1"))
    assert (status["phase"], status["step"], status["activeSlices"]) == ("Pending", 0, 2), status
    assert running_message(status) == ("phase Pending: controller pod demo-controller-1 compiles and runs its first "
                                       "step from step 0 on 2 slice(s)")
    trained = _ctrl(phase="Running", step=1)
    trained.resumed_from = ResumeInfo(step=0)
    status = build_status(_inputs(previous=status, controller=trained, controller_pod="demo-controller-1"))
    assert (status["phase"], running_message(status)) == ("Running", "phase Running")


def _full_pass(previous: dict, job, ctrl, uid: str) -> dict:
    """One operator pass as the operator runs it: the counters, the steps lost, then the status."""
    from elastic_jax.k8s_operator import counters, steps_lost

    prev = ElasticTrainingJobStatus.from_kube(previous)
    c = counters.carry(prev, 2, uid if ctrl else "", counters.controller_recoveries(ctrl), {})
    c = steps_lost.carry_steps_lost(prev, c, ctrl, uid if ctrl else "")
    return build_status(_inputs(job=job, previous=previous, controller=ctrl, controller_pod="demo-controller-1",
                                counter_base=c.base, steps_lost=c.steps_lost))


def test_a_resumed_job_reads_the_step_its_new_controller_starts_from_and_counts_the_steps_lost_from_the_step_reached():
    """Issue 11 (session 14's trial): after suspend -> resume STEP read the pre-suspend step until the new controller
    reported. From the resume's pass STEP is the step the new pod starts from (the suspend's committed checkpoint
    with gs://, 0 with a local uri); `stepsLost` still counts from the step reached (`counterBase.stepAtResume`)."""
    from elastic_jax.api.control import ResumeInfo

    a_pass = _full_pass
    for job, committed, start in ((_job(), None, 0), (_job(checkpoint={"uri": "gs://test-bucket/ck"}), 80, 80)):
        suspended = {"phase": "Suspended", "step": 88, "activeSlices": 0, "stepsLost": 0,
                     "counterBase": {"controllerUid": "pod-a", "stepReached": 0}}
        if committed is not None:
            suspended["lastCheckpointStep"] = committed
        resumed = a_pass(suspended, job, None, "")
        assert (resumed["phase"], resumed["step"]) == ("Pending", start), resumed
        starting = _ctrl(phase="Starting", active=(), step=0)
        resumed = a_pass(resumed, job, starting, "pod-b")
        assert resumed["step"] == start and resumed["counterBase"]["stepReached"] == 88
        assert "stepAtResume" not in resumed["counterBase"]
        compiling = _ctrl(phase="Running", step=start)
        compiling.resumed_from = ResumeInfo(step=start) if start else None
        resumed = a_pass(resumed, job, compiling, "pod-b")
        assert (resumed["step"], resumed["stepsLost"]) == (start, 88 - start), resumed


def _trained_from_0(step: int) -> ControllerStatus:
    from elastic_jax.api.control import ResumeInfo

    c = _ctrl(phase="Running", step=step)
    c.resumed_from = ResumeInfo(step=0)
    return c


def test_a_resume_toggled_off_before_its_pod_took_over_keeps_the_step_reached_for_the_next_resume():
    """Session 16's trial (F1): suspend at 1319, resume, suspend again a second later (its pod never answered),
    resume: the second resume took STEP (0, where the first resume's pod would have started) as the step
    reached, and the 1319 steps a local checkpoint.uri loses were never in `stepsLost`."""
    job = _job()
    s = {"phase": "Suspended", "step": 1319, "activeSlices": 0, "stepsLost": 0,
         "counterBase": {"controllerUid": "pod-a", "stepReached": 0, "resumeCounted": True}}
    s = _full_pass(s, job, None, "")  # the resume: no pod answered yet
    assert s["step"] == 0 and s["counterBase"]["stepAtResume"] == 1319
    s = {**s, "phase": "Suspended"}  # suspended again before its pod answered
    s = _full_pass(s, job, None, "")  # the next resume
    assert s["counterBase"]["stepAtResume"] == 1319, s["counterBase"]
    s = _full_pass(s, job, _ctrl(phase="Starting", active=(), step=0), "pod-c")
    s = _full_pass(s, job, _trained_from_0(0), "pod-c")
    assert s["stepsLost"] == 1319, s


def test_a_resume_whose_pod_answers_in_the_resumes_own_pass_leaves_no_stale_step_for_the_next_loss():
    """Session 16's trial (F2): LOST 4162 after a resume from 0 at step 3203; the resumed pod reached 2387 and
    was lost: LOST went to 7365 (+3203), not 6549. Its pod answered in the resume's own pass, so the takeover
    took 3203 as the step reached and the resume kept `stepAtResume` 3203 too, which the next takeover read
    as the step reached instead of 2387."""
    job = _job()
    s = {"phase": "Suspended", "step": 3203, "activeSlices": 0, "stepsLost": 959,
         "counterBase": {"controllerUid": "pod-a", "stepReached": 0, "resumeCounted": True}}
    s = _full_pass(s, job, _ctrl(phase="Starting", active=(), step=0), "pod-b")  # the resume, pod-b answering
    s = _full_pass(s, job, _trained_from_0(0), "pod-b")
    assert s["stepsLost"] == 959 + 3203, s
    s = _full_pass(s, job, _trained_from_0(2387), "pod-b")
    assert "stepAtResume" not in s["counterBase"], s["counterBase"]
    s = _full_pass(s, job, _ctrl(phase="Starting", active=(), step=0), "pod-c")  # pod-b lost; pod-c from step 0
    s = _full_pass(s, job, _trained_from_0(0), "pod-c")
    assert s["stepsLost"] == 959 + 3203 + 2387, s


def test_a_controller_that_ended_but_has_not_exited_keeps_the_jobs_phase():
    """Session 16's trial: a job that succeeded read Running -> Degraded (0 active) -> Succeeded, with a
    PhaseChanged Event: the controller's last answers say Succeeded with its mesh released before its exit
    code is seen. The job keeps its phase until then."""
    running = build_status(_inputs(controller=_ctrl(step=9)))
    assert running["phase"] == "Running"
    for ended in ("Succeeded", "Failed", "Stopped", "Interrupted"):
        done = _ctrl(phase=ended, active=(), step=10)
        status = build_status(_inputs(previous=running, controller=done))
        assert status["phase"] == "Running", (ended, status["phase"])


def test_a_nested_status_key_the_new_status_drops_is_null_in_the_merge_patch():
    """CI and session 16's trial: `counterBase.stepAtResume` dropped at a takeover stayed in the object (the
    status is written by JSON merge patch, which keeps what it does not name), and the next controller loss
    counted its steps lost from that stale step."""
    from elastic_jax.k8s_operator.status_decision import merge_patch_value

    old = {"controllerUid": "pod-a", "stepAtResume": 836, "stepReached": 836, "slices": [{"index": 0}]}
    new = {"controllerUid": "pod-b", "stepReached": 836, "slices": []}
    patch = merge_patch_value(new, old)
    assert patch == {"controllerUid": "pod-b", "stepReached": 836, "slices": [], "stepAtResume": None}
    merged = {k: v for k, v in {**old, **patch}.items() if v is not None}  # (RFC 7386, one level here)
    assert merged == new
    assert merge_patch_value(5, {"a": 1}) == 5 and merge_patch_value({"a": 1}, None) == {"a": 1}


def test_every_condition_type_and_reason_is_spelled_once_in_the_status_module():
    """Issue 11 item 3: the condition types and reasons are named constants of `elastic_jax.api.status`. Three
    controller-answer conditions and their reasons lived in `k8s_operator/conditions.py`, and `nodes.py` spelled
    NodeLost/NodeLossRecovered a second time."""
    import ast
    from pathlib import Path

    from elastic_jax.api import status as st

    repo = Path(__file__).resolve().parents[2]
    values = {getattr(st, n): n for n in dir(st) if n.startswith(("COND_", "REASON_")) and isinstance(getattr(st, n), str)}
    found = []
    for folder in ("operator", "elastic_jax", "controller_image"):
        for path in (repo / folder).rglob("*.py"):
            if path.resolve() == Path(st.__file__).resolve():
                continue
            for node in ast.parse(path.read_text()).body:
                if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                        and isinstance(node.value.value, str)):
                    continue
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                if any(n.startswith("COND_") for n in names) or (
                        node.value.value in values and any(n.startswith("REASON_") for n in names)):
                    found.append(f"{path.relative_to(repo)}:{node.lineno}: {names[0]} = {node.value.value!r}"
                                 f" (st.{values.get(node.value.value, '?')})")
    assert not found, "condition types and reasons belong in elastic_jax/api/status.py:\n" + "\n".join(found)


def test_a_controllers_setting_warning_is_copied_into_status_and_posted_once():
    """Issue 31 item 13: the controller's `settingWarnings` (a stepDeadlineSeconds shorter than every slice's
    step) reaches `status.settingWarnings` and one Warning Event, not one per pass."""
    line = ("spec.elasticity.stepDeadlineSeconds (1 s) is shorter than a step: every active slice [0, 1] ran past "
            "it in the same step, which took 3.1 s; ...")
    c = _ctrl().model_copy(update={"setting_warnings": [line]})
    out = build_status(_inputs(controller=c))
    assert out["settingWarnings"] == [line]
    ElasticTrainingJobStatus.model_validate(out)
    assert status_builder.setting_warning_events([], [line]) == [("Warning", "SettingWarning", line)]
    assert status_builder.setting_warning_events([line], [line]) == []
