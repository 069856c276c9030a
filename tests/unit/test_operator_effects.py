"""The reconcile pass's effects: pure decisions (plan -> effects) and the one applier, without a cluster."""

from __future__ import annotations

import types

from elastic_jax.api import labels as lbl
from elastic_jax.api.manifest import parse_manifest
from elastic_jax.api.status import COND_PODS_NOT_STARTING, REASON_PREVIOUS_JOB_TERMINATING, ElasticTrainingJobStatus
from elastic_jax.k8s_operator import effects
from elastic_jax.k8s_operator.effects import (Applied, Applier, CountGoodput, CreateChild, DeleteJob, DeleteJobSet,
                                              DeletePod, EventLog, NodeLostPodSeen, PatchStatus, PostEvent)
from elastic_jax.k8s_operator.pod_faults import PodFault
from elastic_jax.k8s_operator.job_state import JobState
from elastic_jax.k8s_operator.kube import ChildRefused
from elastic_jax.api.status import REASON_NODE_LOST
from elastic_jax.k8s_operator.nodes import NodeLoss, NodeLostPod
from elastic_jax.k8s_operator.reconcile import RESUMED_FROM_STEP_ZERO, Plan
from elastic_jax.k8s_operator.slices import JobSetView
from elastic_jax.k8s_operator.slices import PodView
from elastic_jax.k8s_operator.status_builder import REASON_INVALID_SPEC, Inputs, child_conflict
from elastic_jax.k8s_operator.status_decision import StatusObserved, decide_status, expiry
from elastic_jax.k8s_operator.tracker import JobTracker
from tests.support.fake_kube import FakeKube
from tests.support.pod_views import controller_view

UID = "uid-1"


def _pod(name: str) -> dict:
    return {"kind": "Pod", "metadata": {"name": name, "ownerReferences": [{"uid": UID}]}}


def _jobset(i: int) -> dict:
    return {"kind": "JobSet", "metadata": {"name": f"j-w{i}", "ownerReferences": [{"uid": UID}]}}


def _stranded(pod: str, uid: str, slice_index: int) -> NodeLostPod:
    return NodeLostPod(pod, uid, slice_index, NodeLoss("n1", 90.0, "Ready=Unknown"))


def _job_state():
    return JobState("ns", "j", UID, "", JobTracker("ns", "j", 1, 1))


def test_child_effects_are_ordered_deletes_then_creates_and_a_lost_node_pod_is_said_once():
    plan = Plan(create_controller=2, delete_pods=["j-controller-1"], create_jobsets=[0, 1],
                delete_jobsets=["j-w3"], force_delete=[_stranded("j-w2-0", "said", 2), _stranded("j-c", "new", -1)],
                pathways_head="j-controller-2/0")
    out = effects.child_effects(plan, {"said"}, 60.0, False, lambda n: _pod(f"j-controller-{n}"), _jobset)
    kinds = [type(e).__name__ for e in out]
    assert kinds == ["DeletePod", "PostEvent", "NodeLostPodSeen", "DeletePod", "DeleteJobSet", "DeletePod",
                     "CreateChild", "CreateChild", "CreateChild"]
    assert out[0] == DeletePod("j-w2-0", grace_s=0) and out[3] == DeletePod("j-c", grace_s=0)
    assert out[1].reason == REASON_NODE_LOST and out[2].role == "controller"
    assert out[5] == DeletePod("j-controller-1")  # graceful: SIGTERM first
    assert out[6].controller and out[6].body["metadata"]["name"] == "j-controller-2"
    assert [e.body["metadata"]["annotations"][lbl.PATHWAYS_HEAD] for e in out[7:]] == ["j-controller-2/0"] * 2


def test_child_effects_blocked_creates_nothing_but_still_deletes():
    plan = Plan(create_controller=0, create_jobsets=[0], delete_jobsets=["j-w1"])
    out = effects.child_effects(plan, set(), 60.0, True, lambda n: _pod("c"), _jobset)
    assert out == [DeleteJobSet("j-w1")]


def test_after_creates_holds_a_replacement_and_a_resume_warning_until_the_pod_exists():
    plan = Plan(create_controller=1, controller_restarted=True,
                events=[("Warning", "ControllerRestarted", "lost"), ("Warning", RESUMED_FROM_STEP_ZERO, "step 0"),
                        ("Warning", "WorkersRestarted", "head")])
    held, replaced = effects.after_creates(plan, controller_created=False)
    assert not replaced and held == [PostEvent("Warning", "WorkersRestarted", "head")]
    done, replaced = effects.after_creates(plan, controller_created=True)
    assert replaced and [type(e).__name__ for e in done] == ["PostEvent"] * 3 + ["CountControllerRestart"]


def test_after_creates_announces_the_finish():
    out, _ = effects.after_creates(Plan(finish=("Failed", "budget")), controller_created=False)
    assert out == [PostEvent("Warning", "JobFailed", "budget"), effects.MarkFinished()]  # the teardown is no news
    out, _ = effects.after_creates(Plan(finish=("Succeeded", "trained")), controller_created=False)
    assert out == [PostEvent("Normal", "JobSucceeded", "trained"), effects.MarkFinished()]


def test_refusal_event_of_an_earlier_jobs_child_is_normal():
    assert effects.refusal_event((REASON_PREVIOUS_JOB_TERMINATING, "m")).type == "Normal"
    assert effects.refusal_event(("ChildConflict", "m")).type == "Warning"


def _controller(name: str, deleting: bool = False, terminal: bool = False) -> PodView:
    return controller_view(name=name, uid="u-" + name, phase="Failed" if terminal else "Running", ready=False, ip="",
                           deleting=deleting)


def test_invalid_child_effects_fail_the_job_and_stop_what_runs():
    pods = [_controller("c-0"), _controller("c-1", deleting=True), _controller("c-2", terminal=True)]
    jobsets = [JobSetView("j-w0", 0), JobSetView("j-w1", 1, deleting=True)]
    out = effects.invalid_child_effects("bad", {"phase": "Failed"}, "Running", pods, jobsets)
    assert out == [PostEvent("Warning", REASON_INVALID_SPEC, "bad"), PatchStatus({"phase": "Failed"}),
                   DeleteJobSet("j-w0"), DeletePod("c-0"), PostEvent("Normal", "PhaseChanged", "Running -> Failed"),
                   effects.MarkFinished()]


def test_worker_replacements_say_then_delete_at_once():
    assert effects.worker_replacements({1: ["p"]}) == [
        PostEvent("Warning", "WorkerReplaced", "controller saw slice 1 fail while pod p runs; deleting it"),
        DeletePod("p", grace_s=0)]


class _Recording(FakeKube):
    def __init__(self, refuse: dict[str, ChildRefused] | None = None, **kw):
        super().__init__(**kw)
        self.refuse = refuse or {}
        self.calls: list[tuple] = []

    def create(self, namespace, body):
        self.calls.append(("create", body["metadata"]["name"]))
        if body["metadata"]["name"] in self.refuse:
            raise self.refuse[body["metadata"]["name"]]
        return super().create(namespace, body)

    def delete_pod(self, namespace, name, grace_s=None):
        self.calls.append(("delete_pod", name, grace_s))

    def delete_jobset(self, namespace, name):
        self.calls.append(("delete_jobset", name))


def _applier(kube, events=None, job=None):
    patch = types.SimpleNamespace(status={})
    return Applier(kube, job or _job_state(), events or EventLog(lambda *e: None), patch)


def test_the_applier_runs_effects_in_order_and_records_the_controller_it_created():
    kube, job = _Recording(), _job_state()
    applier = _applier(kube, job=job)
    out = applier.apply([DeletePod("a", grace_s=0), DeleteJobSet("b"), DeletePod("c"),
                         CreateChild(_pod("j-controller-0"), controller=True), CreateChild(_jobset(0)),
                         PatchStatus({"phase": "Running"}),
                         NodeLostPodSeen("u", "a", "n1", "worker", "lost")])
    assert kube.calls == [("delete_pod", "a", 0), ("delete_jobset", "b"), ("delete_pod", "c", None),
                          ("create", "j-controller-0"), ("create", "j-w0")]
    assert out.controller_pod == "j-controller-0" and out.created == ["j-controller-0", "j-w0"]
    assert job.created_controller[0] == "j-controller-0" and job.node_lost_pods == {"u"}
    assert applier.patch.status == {"phase": "Running"}


def test_a_refused_create_is_an_observation_not_an_exception():
    refused = ChildRefused("JobSet", "j-w0", 422, "spec.replicatedJobs: Invalid value")
    kube = _Recording(refuse={"j-w0": refused}, taken={"j-controller-0": [{"uid": "someone-else"}]})
    out = _applier(kube).apply([CreateChild(_pod("j-controller-0"), controller=True), CreateChild(_jobset(0)),
                                CreateChild(_jobset(1))])
    assert out.refusal == child_conflict("Pod", "j-controller-0")  # the first refusal is kept
    assert out.invalid is not None and "j-w0" in out.invalid  # 422: the job fails
    assert not out.controller_created and out.created == ["j-w1"]  # the others still go


def test_a_refusal_seen_earlier_in_the_pass_is_kept():
    kube = _Recording(refuse={"j-w0": ChildRefused("JobSet", "j-w0", 403, "quota")})
    out = _applier(kube).apply([CreateChild(_jobset(0))], Applied(refusal=("TokenSecretConflict", "first")))
    assert out.refusal == ("TokenSecretConflict", "first") and out.invalid is None


def test_events_of_a_pass_are_posted_in_order_when_it_ends_and_later_ones_at_once():
    posted = []
    log = EventLog(lambda *e: posted.append(e))
    _applier(_Recording(), events=log).apply([PostEvent("Normal", "A", "1")])
    log("Warning", "B", "2")
    assert posted == [] and log.pending == [("Normal", "A", "1"), ("Warning", "B", "2")]
    log.flush()
    assert posted == [("Normal", "A", "1"), ("Warning", "B", "2")]
    log("Normal", "C", "3")  # (the controller link's report, after the pass)
    assert posted[-1] == ("Normal", "C", "3")


# -- the status half ------------------------------------------------------------------------

NOW = "2030-01-01T00:00:00Z"


def _status_observed(status: dict, finish=None, refusal=None, creation_refusal=None, rejected=(), **kw):
    job = parse_manifest({"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob",
                          "metadata": {"name": "j"},
                          "spec": {"slices": {"count": 1}, "training": {"steps": 10, "globalBatchSize": 2},
                                   "checkpoint": {"uri": "/tmp/ck"}}})
    inputs = Inputs(job=job, generation=1, previous=ElasticTrainingJobStatus.from_kube(status), slices=[],
                    controller=None, controller_pod="j-controller-0", controller_restarts=0, slice_replacements=0,
                    recoveries=0, counter_base=None, finish=finish, rejected_fields=list(rejected), now=NOW)
    return StatusObserved(inputs=inputs, status=status, finished=False, refusal=refusal, controller_pods=[],
                          worker_pods=[], jobsets={0: JobSetView("j-w0", 0)}, current=None,
                          controller_created_now=False, creation_refusal=creation_refusal, **kw)


def test_the_status_decision_ends_in_one_patch_of_the_fields_that_changed():
    d = decide_status(_status_observed({"phase": "Pending"}))
    assert isinstance(d.effects[-1], PatchStatus) and d.written is not None
    assert d.effects[-1].fields == {k: v for k, v in d.written.items() if {"phase": "Pending"}.get(k) != v}
    again = decide_status(_status_observed(dict(d.written)))  # the same world: nothing to write, nothing to say
    assert again.effects == [PatchStatus({})]
    assert not any(isinstance(e, (PostEvent, CountGoodput)) for e in again.effects)


def test_the_status_decision_says_a_refused_create_and_a_rejected_edit_once():
    d = decide_status(_status_observed({"phase": "Pending"}, refusal=child_conflict("Pod", "j-controller-0"),
                                       rejected=["spec.slices.count"]))
    reasons = [e.reason for e in d.effects if isinstance(e, PostEvent)]
    assert reasons[0] == child_conflict("Pod", "j-controller-0")[0] and "SpecChangeRejected" in reasons
    again = decide_status(_status_observed(dict(d.written), refusal=child_conflict("Pod", "j-controller-0"),
                                           rejected=["spec.slices.count"]))
    assert again.effects == [PatchStatus({})]


def test_an_invalid_worker_pod_template_fails_the_job_instead_of_writing_status():
    fault = PodFault(COND_PODS_NOT_STARTING, "FailedCreate", 'Pod "j-w0-0" is invalid: spec.containers[0]: bad')
    d = decide_status(_status_observed({"phase": "Running"}, creation_refusal=fault))
    assert d.written is None
    patch = next(e for e in d.effects if isinstance(e, PatchStatus)).fields
    assert patch["phase"] == "Failed" and patch["completionTime"] == NOW and "is invalid" in patch["failureReason"]
    assert DeleteJobSet("j-w0") in d.effects
    assert [e.reason for e in d.effects if isinstance(e, PostEvent)] == [REASON_INVALID_SPEC, "PhaseChanged"]


def test_a_finishing_job_reads_no_pod_fault():
    fault = PodFault(COND_PODS_NOT_STARTING, "FailedCreate", 'Pod "j-w0-0" is invalid: bad')
    d = decide_status(_status_observed({"phase": "Running"}, finish=("Failed", "budget"), creation_refusal=fault))
    assert d.written is not None and d.written["phase"] == "Failed"


def test_a_finished_job_expires_once_its_ttl_passed():
    import datetime as dt

    done = {"phase": "Succeeded", "completionTime": "2030-01-01T00:00:00Z"}
    at = lambda s: dt.datetime(2030, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=s)  # noqa: E731
    assert expiry(60, done, at(59)) == [] and expiry(None, done, at(10 ** 6)) == []
    assert expiry(60, {**done, "phase": "Running"}, at(61)) == []
    assert expiry(60, done, at(60)) == [DeleteJob(60)]
    deleted, job = [], _job_state()
    kube = types.SimpleNamespace(delete_job=lambda ns, name: deleted.append((ns, name)))
    _applier(kube, job=job).apply(expiry(60, done, at(61)))
    assert deleted == [("ns", "j")] and job.tracker.deleting  # its children's end is no news


def test_an_unresponsive_controller_is_a_condition_with_one_warning_then_a_normal_when_it_answers():
    """The trial: a frozen controller's job said nothing for ~150 s; the phase may stay, the condition says it."""
    from elastic_jax.api.status import (COND_CONTROLLER_UNRESPONSIVE, REASON_CONTROLLER_ANSWERING,
                                                      REASON_CONTROLLER_NOT_ANSWERING)

    def cond(written):
        return next(c for c in written["conditions"] if c["type"] == COND_CONTROLLER_UNRESPONSIVE)

    def events(d):
        return [(e.type, e.reason) for e in d.effects if isinstance(e, PostEvent)
                if e.reason in (REASON_CONTROLLER_NOT_ANSWERING, REASON_CONTROLLER_ANSWERING)]

    d = decide_status(_status_observed({"phase": "Running"}, unresponsive="not answered for 21 s; last error: x"))
    assert cond(d.written)["status"] == "True" and "21 s" in cond(d.written)["message"]
    assert events(d) == [("Warning", REASON_CONTROLLER_NOT_ANSWERING)]
    d = decide_status(_status_observed(dict(d.written), unresponsive="not answered for 40 s; last error: x"))
    assert "40 s" in cond(d.written)["message"] and events(d) == [], "one Warning while it lasts"
    d = decide_status(_status_observed(dict(d.written)))
    assert cond(d.written)["status"] == "False" and events(d) == [("Normal", REASON_CONTROLLER_ANSWERING)]


def test_an_unresponsive_controller_that_was_replaced_is_not_said_to_answer_again():
    from elastic_jax.api.status import COND_CONTROLLER_UNRESPONSIVE, REASON_CONTROLLER_GONE

    d = decide_status(_status_observed({"phase": "Running"}, unresponsive="not answered for 21 s; last error: x"))
    gone = (REASON_CONTROLLER_GONE, "the controller that did not answer is gone (controller pod c-1 is the current one)")
    d = decide_status(_status_observed(dict(d.written), unresponsive_ended=gone))
    [c] = [c for c in d.written["conditions"] if c["type"] == COND_CONTROLLER_UNRESPONSIVE]
    assert (c["status"], c["reason"]) == ("False", REASON_CONTROLLER_GONE)
    [e] = [e for e in d.effects if isinstance(e, PostEvent) and e.reason == REASON_CONTROLLER_GONE]
    assert e.type == "Normal" and e.message.startswith(gone[1]) and "answers again" not in e.message


def test_a_suspended_or_finished_job_does_not_keep_saying_its_controller_does_not_answer():
    """Both controller-answer conditions were only updated while the job runs: a job suspended (or finished)
    while its controller was frozen kept `ControllerUnresponsive` True, "the controller pod runs but ...",
    for as long as it stayed suspended."""
    from elastic_jax.api.status import (COND_CONTROLLER_ANSWERS_REFUSED, COND_CONTROLLER_UNRESPONSIVE,
                                                      REASON_CONTROLLER_GONE)

    d = decide_status(_status_observed({"phase": "Running"}, unresponsive="not answered for 21 s; last error: x",
                                       answer_fault="answers refused: malformed answer"))
    assert {c["type"]: c["status"] for c in d.written["conditions"]}[COND_CONTROLLER_UNRESPONSIVE] == "True"
    d = decide_status(_status_observed(dict(d.written), finish=("Succeeded", "trained 10 steps")))
    conds = {c["type"]: c for c in d.written["conditions"]}
    for type_ in (COND_CONTROLLER_UNRESPONSIVE, COND_CONTROLLER_ANSWERS_REFUSED):
        assert (conds[type_]["status"], conds[type_]["reason"]) == ("False", REASON_CONTROLLER_GONE), conds[type_]
    gone = [e for e in d.effects if isinstance(e, PostEvent) and e.reason == REASON_CONTROLLER_GONE]
    assert [e.type for e in gone] == ["Normal", "Normal"] and all("suspended or finished" in e.message for e in gone)
    again = decide_status(_status_observed(dict(d.written), finish=("Succeeded", "trained 10 steps")))
    assert not [e for e in again.effects if isinstance(e, PostEvent) and e.reason == REASON_CONTROLLER_GONE]
