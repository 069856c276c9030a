"""A finished phase the operator did not write is not believed (pure: `decide` and `build_status`).

A new-user trial: `status.phase: Succeeded` written by someone else (a cluster admin; tenants cannot
write status) stopped the job, wrote step = spec.training.steps and no completionTime, so
ttlSecondsAfterFinished never deleted it.
"""

from __future__ import annotations

from elastic_jax.api import status as st
from elastic_jax.api.control import ControllerStatus
from elastic_jax.api.manifest import parse_manifest
from elastic_jax.k8s_operator.finished import REASON_FOREIGN_PHASE_IGNORED, finished_phase
from elastic_jax.k8s_operator.reconcile import Observed, decide
from elastic_jax.k8s_operator.slices import JobSetView
from elastic_jax.k8s_operator.status_builder import Inputs, build_status
from tests.support.pod_views import controller_view


def _job():
    return parse_manifest({"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob",
                           "metadata": {"name": "demo"},
                           "spec": {"slices": {"count": 2}, "training": {"steps": 300, "globalBatchSize": 4},
                                    "checkpoint": {"uri": "/tmp/ck"}, "ttlSecondsAfterFinished": 60}})


def _running_pod():
    return controller_view()


def _jobsets():
    return {i: JobSetView(f"demo-slice-{i}", i) for i in range(2)}


ADMIN_WROTE = {"phase": "Succeeded", "controllerPod": "demo-controller-0", "step": 40,
               "conditions": [{"type": "Running", "status": "True", "reason": "Running", "message": "phase Running"}]}


def test_a_succeeded_phase_without_the_operators_evidence_is_not_believed():
    plan = decide(_job(), Observed(dict(ADMIN_WROTE), [_running_pod()], _jobsets()))
    assert plan.delete_pods == [] and plan.delete_jobsets == [], plan  # the job is not stopped
    assert plan.finish is None
    [(kind, reason, message)] = plan.events
    assert (kind, reason) == ("Warning", REASON_FOREIGN_PHASE_IGNORED)
    assert "not written by the operator" in message and "spec.suspend" in message


def test_its_status_is_recomputed_from_the_controllers_answer_with_no_completion_time():
    answer = ControllerStatus(phase="Running", step=41, total_steps=300, desired_slices=2, min_slices=1,
                              active_slices=[0, 1], inactive_slices=[], slices=[], pid=1)
    out = build_status(Inputs(
        job=_job(), generation=1, previous=st.ElasticTrainingJobStatus.from_kube(ADMIN_WROTE), slices=[],
        controller=answer, controller_pod="demo-controller-0", controller_restarts=0, slice_replacements=0,
        recoveries=0, counter_base=None, finish=None, rejected_fields=[], now="2026-12-04T10:00:00Z")).to_kube()
    assert out["phase"] == "Running" and out["step"] == 41 and not out.get("completionTime"), out
    assert not any(c["type"] == "Succeeded" for c in out["conditions"])


def test_the_operators_own_finishes_are_believed():
    done = {"phase": "Succeeded", "completionTime": "2026-12-04T10:00:00Z",
            "conditions": [{"type": "Succeeded", "status": "True", "reason": "JobSucceeded"}]}
    # an unparseable spec's Failed carries its condition but (written by `_fail_spec`) no completionTime
    invalid = {"phase": "Failed", "conditions": [{"type": "Failed", "status": "True", "reason": "InvalidSpec"}]}
    for status in (done, invalid, {"phase": "Failed", "completionTime": "2026-12-04T10:00:00Z"}):
        assert finished_phase(st.ElasticTrainingJobStatus.from_kube(status)) == status["phase"], status
        plan = decide(_job(), Observed(dict(status, controllerPod="demo-controller-0"), [_running_pod()], _jobsets()))
        assert plan.delete_pods == ["demo-controller-0"] and plan.events == [], (status, plan)
    for status in (ADMIN_WROTE, {"phase": "Failed"}, {"phase": "Running"}):
        assert finished_phase(st.ElasticTrainingJobStatus.from_kube(status)) is None, status
