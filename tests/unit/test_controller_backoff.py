"""A crash-looping controller: the restart back-off (kubelet CrashLoopBackOff rule), as pure functions.

A new-user trial: a controller that exits 3 at once every time was recreated on every pass, 21 pods in
25 s. Now `decide` waits 10 s doubling to 300 s from the dead pod's `finishedAt` between replacements of
a controller that trained no step since the last loss, says so (condition reason and one Warning
Event) and tells the daemon when to pass again.
"""

from __future__ import annotations


import pytest

from elastic_jax.api import status as st
from elastic_jax.api.manifest import parse_manifest
from elastic_jax.api.control import ControllerStatus, ResumeInfo
from elastic_jax.k8s_operator import tracker as tracker_mod
from elastic_jax.k8s_operator.reconcile import Observed, decide
from elastic_jax.k8s_operator.slices import JobSetView
from elastic_jax.k8s_operator.slices import pod_view
from elastic_jax.k8s_operator.status_builder import Inputs, build_status
from elastic_jax.supervision import backoff
from tests.support.pod_views import controller_view


def _job(max_restarts=10):
    return parse_manifest({"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob",
                           "metadata": {"name": "demo"},
                           "spec": {"slices": {"count": 2}, "training": {"steps": 10, "globalBatchSize": 4},
                                    "checkpoint": {"uri": "gs://bucket/ck"},
                                    "elasticity": {"maxRestarts": max_restarts, "maxRestartsPerSlice": 2}}})


def _dead(attempt=1, code=3, created="2026-12-04T10:00:00Z", finished="2026-12-04T10:00:02Z"):
    return controller_view(attempt, phase="Failed", exit_code=code, created=created, finished_at=finished)


def _jobsets():
    return {i: JobSetView(f"demo-slice-{i}", i) for i in range(2)}


def _observed(losses, now, pod=None, restarts=1, conditions=()):
    pod = pod or _dead()
    status = {"controllerPod": pod.name, "controllerRestarts": restarts, "controllerLossesInARow": losses,
              "conditions": list(conditions)}
    return Observed(status, [pod], _jobsets(), None, now=now)


def test_the_rule_is_the_kubelets_first_at_once_then_10s_doubling_to_300s():
    assert [backoff.restart_delay_s(n) for n in range(0, 9)] == [0, 0, 10, 20, 40, 80, 160, 300, 300]
    assert backoff.restart_delay_s(10_000) == 300
    assert backoff.losses_after(0, None) == 1 and backoff.losses_after(4, 30.0) == 5
    assert backoff.losses_after(4, backoff.RESET_AFTER_S) == 1  # ran 10 min: the loop is over


def test_the_first_loss_is_replaced_at_once():
    """A preemption after hours of training (no loss before it) costs no pause."""
    plan = decide(_job(), _observed(0, "2026-12-04T10:00:03Z", restarts=0))
    assert plan.create_controller == 2 and plan.controller_restarted and plan.backoff is None
    assert plan.losses_in_a_row == 1 and plan.wake_in_s is None


def test_a_second_loss_with_no_step_between_waits_10s_from_the_pods_finish_and_says_so():
    plan = decide(_job(), _observed(1, "2026-12-04T10:00:05Z"))
    assert plan.create_controller is None and not plan.controller_restarted and plan.finish is None
    assert plan.delete_pods == []  # (the dead pod keeps its logs while its replacement waits)
    wait = plan.backoff
    assert wait is not None and wait.delay_s == 10 and wait.losses_in_a_row == 2
    assert wait.since == "2026-12-04T10:00:02Z" and wait.until == "2026-12-04T10:00:12Z"
    assert plan.wake_in_s == pytest.approx(7.0)  # the daemon's next pass: when the wait ends
    [(kind, reason, message)] = plan.events
    assert (kind, reason) == ("Warning", st.REASON_CONTROLLER_BACK_OFF)
    assert "exit code 3" in message and "back-off 10 s" in message and "demo-controller-2" in message, message
    # the wait over: created, counted, the loss count carried
    plan = decide(_job(), _observed(1, "2026-12-04T10:00:12Z"))
    assert plan.create_controller == 2 and plan.controller_restarted and plan.losses_in_a_row == 2
    assert plan.backoff is None and plan.wake_in_s is None


def test_the_wait_doubles_per_loss_up_to_300s():
    for losses, delay in ((2, 20), (3, 40), (6, 300), (20, 300)):
        plan = decide(_job(max_restarts=100), _observed(losses, "2026-12-04T10:00:03Z"))
        assert plan.backoff is not None and plan.backoff.delay_s == delay, (losses, plan.backoff)
        assert plan.wake_in_s == pytest.approx(delay - 1)


def test_a_controller_that_ran_10_minutes_starts_the_loop_afresh():
    pod = _dead(created="2026-12-04T10:00:00Z", finished="2026-12-04T10:10:00Z")
    plan = decide(_job(), _observed(5, "2026-12-04T10:10:01Z", pod=pod))
    assert plan.create_controller == 2 and plan.backoff is None and plan.losses_in_a_row == 1


def test_the_event_is_posted_once_per_wait():
    first = decide(_job(), _observed(1, "2026-12-04T10:00:05Z"))
    status = _status(first, _observed(1, "2026-12-04T10:00:05Z").status)
    cond = next(c for c in status["conditions"] if c["type"] == st.COND_CONTROLLER_RESTARTED)
    # the field counts the loss waited on, as the message does (session 16's trial: 3 beside "4 losses")
    assert status["controllerLossesInARow"] == 2 and "2 losses in a row" in cond["message"], (status, cond)
    again = decide(_job(), _observed(status["controllerLossesInARow"], "2026-12-04T10:00:08Z", conditions=[cond]))
    assert again.backoff is not None and again.events == [], again.events
    assert again.losses_in_a_row == 2 and again.backoff.delay_s == 10  # (counted once, not again each pass)
    # the wait over: the replacement is created with the same count
    done = decide(_job(), _observed(status["controllerLossesInARow"], "2026-12-04T10:00:12Z", conditions=[cond]))
    assert done.create_controller == 2 and done.losses_in_a_row == 2


def test_the_restart_budget_still_ends_the_job_without_a_wait():
    plan = decide(_job(max_restarts=3), _observed(3, "2026-12-04T10:00:03Z", restarts=3))
    assert plan.finish is not None and plan.finish[0] == "Failed" and "maxRestarts=3" in plan.finish[1]
    assert plan.backoff is None and plan.wake_in_s is None


def test_a_vanished_or_deleted_controller_is_replaced_at_once():
    gone = Observed({"controllerPod": "demo-controller-1", "controllerRestarts": 1, "controllerLossesInARow": 3},
                    [], _jobsets(), None, now="2026-12-04T10:00:03Z")
    plan = decide(_job(), gone)
    assert plan.create_controller == 2 and plan.backoff is None and plan.losses_in_a_row == 4


def test_pod_view_reads_the_containers_finish_time():
    body = {"metadata": {"name": "demo-controller-1", "labels": {"elasticjax.dev/role": "controller"}},
            "status": {"phase": "Failed", "containerStatuses": [
                {"name": "controller", "state": {"terminated": {"exitCode": 3, "finishedAt": "2026-12-04T10:00:02Z"}}}]}}
    assert pod_view(body).finished_at == "2026-12-04T10:00:02Z"


def _status(plan, status, controller=None, replaced=False, pod="demo-controller-1", prev_phase="Recovering"):
    prev = st.ElasticTrainingJobStatus.from_kube({**status, "phase": prev_phase})
    out = build_status(Inputs(
        job=_job(), generation=1, previous=prev, slices=[], controller=controller, controller_pod=pod,
        controller_restarts=prev.controller_restarts + (1 if replaced else 0), slice_replacements=0, recoveries=0,
        counter_base=None, finish=plan.finish, rejected_fields=[], now="2026-12-04T10:00:05Z",
        controller_lost=plan.controller_restarted, backoff=plan.backoff,
        losses_in_a_row=plan.losses_in_a_row_written(replaced)))
    return out.to_kube()


def test_status_during_the_wait_reads_recovering_with_the_back_off_reason():
    observed = _observed(1, "2026-12-04T10:00:05Z")
    status = _status(decide(_job(), observed), observed.status)
    assert status["phase"] == "Recovering" and status.get("activeSlices", 0) == 0
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds[st.COND_CONTROLLER_RESTARTED]["reason"] == st.REASON_CONTROLLER_BACK_OFF
    assert conds[st.COND_DEGRADED]["reason"] == st.REASON_CONTROLLER_BACK_OFF
    assert "2026-12-04T10:00:12Z" in conds[st.COND_CONTROLLER_RESTARTED]["message"]
    assert "back-off" in conds[st.COND_RUNNING]["message"]
    # counted from the first pass of the wait, as its message says (session 16's trial: the field read 3
    # beside "4 losses in a row"); the next passes do not count it again (`test_the_event_is_posted_once_per_wait`)
    assert status["controllerLossesInARow"] == 2 and "2 losses in a row" in conds[st.COND_CONTROLLER_RESTARTED]["message"]


def _answer(phase, step, resumed=40):
    return ControllerStatus(phase=phase, step=step, total_steps=100, desired_slices=2, min_slices=1,
                            active_slices=[0, 1], inactive_slices=[], slices=[], pid=1,
                            resumed_from=ResumeInfo(step=resumed))


def test_losses_in_a_row_count_at_each_replacement_and_reset_once_a_controller_trains_a_step():
    observed = _observed(1, "2026-12-04T10:00:12Z")
    plan = decide(_job(), observed)
    status = _status(plan, observed.status, replaced=True, pod="demo-controller-2")
    assert status["controllerLossesInARow"] == 2
    cond = next(c for c in status["conditions"] if c["type"] == st.COND_CONTROLLER_RESTARTED)
    assert cond["reason"] == st.REASON_CONTROLLER_RESTARTING
    # the replacement restored step 40 and is starting: no step trained yet, the count stays
    starting = _answer("Starting", 40)
    later = _status(decide(_job(), Observed(status, [], _jobsets())), status, controller=starting,
                    pod="demo-controller-2")
    assert later["controllerLossesInARow"] == 2
    trained = _answer("Running", 41)
    later = _status(decide(_job(), Observed(status, [], _jobsets())), status, controller=trained,
                    pod="demo-controller-2")
    assert later["controllerLossesInARow"] == 0


def test_a_back_off_ends_a_quiet_window_at_its_end():
    """The daemon sleeps until the quiet window ends (`wake.next_pass_delay`): a wait's end shortens it."""
    t = tracker_mod.JobTracker.__new__(tracker_mod.JobTracker)
    t._quiet = (("inputs",), 100.0, 0)
    t.wake_at = None
    assert t.quiet_until() == 100.0 + tracker_mod.QUIET_RESYNC_S and t.quiet(("inputs",), 105.0)
    t.wake_at = 107.0
    assert t.quiet_until() == 107.0
    assert t.quiet(("inputs",), 106.9) and not t.quiet(("inputs",), 107.0)
