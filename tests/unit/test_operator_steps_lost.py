"""Issue 11: `status.stepsLost` and the goodput of the steps a new controller pod does not resume
(`k8s_operator.steps_lost`, on top of `counters.carry`)."""

from __future__ import annotations

import pytest

from elastic_jax.api.control import ControllerStatus, ResumeInfo
from elastic_jax.api.status import ElasticTrainingJobStatus
from elastic_jax.k8s_operator import counters, steps_lost
from elastic_jax.k8s_operator import goodput as gp


def _ctrl(step: int, seconds: dict[str, float], phase: str = "Running", resumed: int | None = None,
          lost: int = 0) -> ControllerStatus:
    wall = sum(seconds.values())
    return ControllerStatus(phase=phase, step=step, total_steps=1000, desired_slices=2, min_slices=1,
                            active_slices=[0, 1], inactive_slices=[], slices=[], pid=1, steps_lost=lost,
                            goodput_seconds=seconds, goodput=seconds.get("productive", 0) / wall if wall else None,
                            resumed_from=None if resumed is None else ResumeInfo(step=resumed))


def _pass(status: dict, uid: str, ctrl: ControllerStatus | None) -> tuple[counters.Counts, dict]:
    """One operator pass's counters, and the status it writes (what the next pass reads)."""
    previous = ElasticTrainingJobStatus.from_kube(status)
    counts = counters.carry(previous, 2, uid if ctrl else "", counters.controller_recoveries(ctrl), {},
                            None if ctrl is None else gp.live_ledger(ctrl))
    counts = steps_lost.carry_steps_lost(previous, counts, ctrl, uid if ctrl else "")
    written = {**status, "stepsLost": counts.steps_lost,
               "counterBase": counts.base.model_dump(mode="json", by_alias=True, exclude_none=True)}
    if ctrl is not None and not (ctrl.phase == "Starting" and ctrl.step == 0):
        written["step"] = ctrl.step
    if counts.goodput is not None:
        written["goodput"] = counts.goodput.model_dump(mode="json", by_alias=True, exclude_none=True)
    return counts, written


def _trained_to_100(uid: str = "pod-a") -> dict:
    """A job whose first controller trained steps 0..100 in 100 productive seconds (10 starting)."""
    s: dict = {}
    _, s = _pass(s, uid, _ctrl(0, {"starting": 5}, phase="Starting"))
    _, s = _pass(s, uid, _ctrl(100, {"starting": 10, "productive": 100}))
    assert s["stepsLost"] == 0 and s["step"] == 100
    return s


def test_a_new_controller_that_starts_again_from_step_0_loses_the_steps_and_their_productive_seconds():
    """Trial: a local checkpoint.uri on a cluster: the new controller pod restores nothing; status kept the
    thrown-away 100 s as productive and no field counted the 100 steps."""
    s = _trained_to_100()
    # pod-b restores: nothing known yet (it may still find a checkpoint)
    c, s = _pass(s, "pod-b", _ctrl(0, {"starting": 3}, phase="Starting"))
    assert c.steps_lost == 0 and c.goodput.seconds.productive == 100 and s["step"] == 100
    # it resumed nothing: it starts from 0, the 100 steps are lost, their seconds were no progress
    c, s = _pass(s, "pod-b", _ctrl(0, {"starting": 8}))
    assert c.steps_lost == 100 and s["stepsLost"] == 100
    assert c.goodput.seconds.productive == 0 and c.goodput.seconds.recovering == 100
    assert c.goodput.wall_seconds == pytest.approx(118)  # (re-booked, not dropped)
    # GOODPUT reads 0 % until pod-b trains (session 15's trial: blank while the new controller started)
    assert c.goodput.fraction == 0 and c.goodput.percent == "0.0%"
    # it trains: its own productive seconds count; the loss is not booked again pass after pass
    c, s = _pass(s, "pod-b", _ctrl(30, {"starting": 8, "productive": 30}))
    assert c.steps_lost == 100 and c.goodput.seconds.productive == 30 and c.goodput.seconds.recovering == 100
    c, s = _pass(s, "pod-b", _ctrl(30, {"starting": 8, "productive": 31}))
    assert c.goodput.seconds.recovering == 100
    # and a third pod, from step 0 again, loses pod-b's 30 as well: 130 in all, and pod-b's seconds
    c, s = _pass(s, "pod-c", _ctrl(0, {"starting": 2}))
    assert c.steps_lost == 130 and c.goodput.seconds.productive == 0 and c.goodput.seconds.recovering == 131


def test_a_resume_from_an_older_checkpoint_loses_the_steps_since_it_at_the_mean_step_seconds():
    """gs://: the controller lost at step 100 had committed step 80; 20 of its 100 steps are redone."""
    before = _trained_to_100()
    c, s = _pass(before, "pod-b", _ctrl(80, {"starting": 4, "restoring": 2}, resumed=80))
    assert c.steps_lost == 20 and s["step"] == 80
    assert c.goodput.seconds.productive == pytest.approx(80) and c.goodput.seconds.recovering == pytest.approx(20)
    # the same pass twice (a pass on a status read before the last write) gives the same counts
    assert _pass(before, "pod-b", _ctrl(80, {"starting": 4, "restoring": 2}, resumed=80))[0] == c
    # and the next passes keep it, not re-booked again
    c, s = _pass(s, "pod-b", _ctrl(90, {"starting": 4, "restoring": 2, "productive": 10}, resumed=80))
    assert c.steps_lost == 20 and c.goodput.seconds.productive == pytest.approx(90)
    assert c.goodput.seconds.recovering == pytest.approx(20)


def test_a_resume_from_the_step_reached_loses_nothing():
    """A suspend (or a graceful delete) whose stop checkpointed the step status shows: nothing is lost."""
    s = _trained_to_100()
    c, s = _pass(s, "pod-b", _ctrl(100, {"starting": 4}, resumed=100))
    assert c.steps_lost == 0 and c.goodput.seconds.productive == 100 and c.goodput.seconds.recovering == 0


def test_a_job_that_resumed_another_jobs_step_books_its_seconds_over_the_steps_it_trained():
    """The first controller resumed step 500 (written by an earlier job of the name) and trained to 600 in
    100 s: a loss back to 550 re-books 50 of those 100 steps' seconds, not 50/600 of them."""
    s: dict = {}
    _, s = _pass(s, "pod-a", _ctrl(500, {"starting": 5}, resumed=500))
    _, s = _pass(s, "pod-a", _ctrl(600, {"starting": 5, "productive": 100}, resumed=500))
    c, s = _pass(s, "pod-b", _ctrl(550, {"starting": 5}, resumed=550))
    assert c.steps_lost == 50 and c.goodput.seconds.recovering == pytest.approx(50)


def test_the_steps_a_live_controller_redid_itself_add_to_the_jobs():
    """Pathways: a controller that restored lost state from an older snapshot reports its own stepsLost."""
    s = _trained_to_100()
    c, s = _pass(s, "pod-a", _ctrl(100, {"starting": 10, "productive": 100}, lost=7))
    assert c.steps_lost == 7
    c, s = _pass(s, "pod-b", _ctrl(0, {"starting": 1}))
    assert c.steps_lost == 107
    # nobody answers: the total written stays
    c, s = _pass(s, "", None)
    assert c.steps_lost == 107


def _resume(status: dict) -> dict:
    """What the resume's pass writes (`status_builder`): STEP shows where the new pod starts (0: a local
    checkpoint.uri), and the step the job had reached is kept in `counterBase.stepAtResume`."""
    base = {**status.get("counterBase", {}), "stepAtResume": status["step"]}
    return {**status, "step": 0, "counterBase": base}


@pytest.mark.parametrize("how", ["suspend", "loss"])
def test_a_controller_replaced_before_it_said_where_it_resumed_passes_the_step_reached_on(how):
    """Trial (session 15): suspend/resume toggled four times a second apart resumed from step 0 with
    `stepsLost` 0: each resume's pod was stopped while `Starting`, the next resume kept STEP (0, where that
    pod would start) as the step reached, and the 100 steps the first pod trained were never counted. The
    same for a pod lost while `Starting` after a resume."""
    s = _resume(_trained_to_100())
    c, s = _pass(s, "pod-b", _ctrl(0, {"starting": 2}, phase="Starting"))
    assert c.steps_lost == 0 and c.base.step_reached == 100
    if how == "suspend":
        _, s = _pass(s, "", None)  # suspended: no controller
        s = _resume(s)
    # pod-c (the next resume's, or pod-b's replacement) resumes nothing: pod-a's 100 steps are lost, once
    c, s = _pass(s, "pod-c", _ctrl(0, {"starting": 1}, phase="Starting"))
    assert c.base.step_reached == 100, c.base
    c, s = _pass(s, "pod-c", _ctrl(0, {"starting": 3}))
    assert c.steps_lost == 100 and c.goodput.seconds.productive == 0 and c.goodput.seconds.recovering == 100
    # once counted, it is not passed on again: pod-c trains 20 steps, then pod-d resumes nothing
    c, s = _pass(s, "pod-c", _ctrl(20, {"starting": 3, "productive": 20}))
    c, s = _pass(s, "pod-d", _ctrl(0, {"starting": 1}))
    assert c.steps_lost == 120, c


def test_a_status_written_by_an_older_operator_counts_no_loss_it_cannot_know():
    """No `counterBase` (an operator upgrade): the live controller's start is not compared with anything."""
    s = {"step": 100, "goodput": None}
    s.pop("goodput")
    c, s = _pass(s, "pod-a", _ctrl(100, {"productive": 50}, resumed=60))
    assert c.steps_lost == 0 and c.goodput.seconds.recovering == 0


def test_the_operators_steps_lost_counter_counts_each_loss_once_across_operator_restarts(monkeypatch):
    """Session 12's trial: a restart's steps lost were in `status.stepsLost` but in no Prometheus series.
    `elasticjax_operator_steps_lost_total` grows by what status.stepsLost grew over the status written before:
    once per loss, not again on the next pass nor from a restarted operator."""
    from prometheus_client import REGISTRY

    from elastic_jax.api.status import CounterBase
    from elastic_jax.k8s_operator import operator_state
    from tests.support.fake_kube import FakeKube
    from tests.unit.test_operator_counters import _controller_pod
    from tests.unit.test_operator_events import _Controller, _runner, _worker

    def counted() -> float:
        return REGISTRY.get_sample_value("elasticjax_operator_steps_lost_total") or 0.0

    # the previous controller pod (c0) had reached step 50; its replacement c1 resumed from step 40
    status = {"phase": "Recovering", "controllerPod": "j-controller-1", "tokenSecret": "j-token", "step": 50,
              "controllerRestarts": 1,
              "counterBase": CounterBase(controller_uid="c0").model_dump(mode="json", by_alias=True, exclude_none=True)}
    run, _ = _runner(monkeypatch, status)
    monkeypatch.setattr(_Controller, "answer", _Controller.answer.model_copy(update={
        "step": 41, "resumed_from": ResumeInfo(step=40)}))
    pods = [_controller_pod(1, "c1"), _worker(0), _worker(1)]
    state = operator_state.OperatorState(kube=FakeKube(), key=b"k" * 32)
    before = counted()
    run(state, pods)
    assert status["stepsLost"] == 10 and counted() - before == 10
    run(state, pods)
    run(operator_state.OperatorState(kube=FakeKube(), key=b"k" * 32), pods)  # a restarted operator
    assert status["stepsLost"] == 10 and counted() - before == 10
    # the live controller redid 5 steps itself (pathways: lost state restored): counted once more
    monkeypatch.setattr(_Controller, "answer", _Controller.answer.model_copy(update={"steps_lost": 5}))
    run(state, pods)
    run(state, pods)
    assert status["stepsLost"] == 15 and counted() - before == 15


def test_the_operators_goodput_counter_books_each_second_once_through_a_rebooking():
    """Session 12's trial: after a controller restart with a local checkpoint uri status re-booked the lost
    steps' productive seconds as recovering, and `elasticjax_operator_goodput_seconds_total` counted them
    productive and recovering too (its categories summed to 498 s over 327 s booked). Each second is counted
    once, in the category it was first booked in: the counter's categories add up to `wallSeconds`."""
    from elastic_jax.api.status import Goodput

    s = _trained_to_100()
    counted: dict[str, float] = {}
    written = [Goodput.model_validate(s["goodput"])]
    for uid, ctrl in (("pod-b", _ctrl(0, {"starting": 3}, phase="Starting")), ("pod-b", _ctrl(0, {"starting": 8})),
                      ("pod-b", _ctrl(30, {"starting": 8, "productive": 30})),
                      ("pod-b", _ctrl(31, {"starting": 8, "productive": 31, "recovering": 2}))):
        c, s = _pass(s, uid, ctrl)
        written.append(c.goodput)
    for before, after in zip([None] + written, written):
        for category, seconds in gp.increments(before, after).items():
            counted[category] = counted.get(category, 0.0) + seconds
    assert sum(counted.values()) == pytest.approx(written[-1].wall_seconds)
    # the 100 s booked productive before the loss stay productive here (status: recovering), pod-b's own add
    assert counted["productive"] == pytest.approx(131) and counted.get("recovering", 0) == pytest.approx(2)
    assert written[-1].seconds.productive == pytest.approx(31) and written[-1].seconds.recovering == pytest.approx(102)
    # and the move is its own counter (session 15's trial: the metric disagreed with status.goodput), so the
    # metrics give status's ledger: productive 131 - 100, recovering 2 + 100
    moved: dict[str, float] = {}
    for before, after in zip([None] + written, written):
        for category, seconds in gp.rebooked(before, after).items():
            moved[category] = moved.get(category, 0.0) + seconds
    assert moved == {"productive": pytest.approx(100)}
    assert counted["productive"] - moved["productive"] == pytest.approx(written[-1].seconds.productive)
    assert counted["recovering"] + sum(moved.values()) == pytest.approx(written[-1].seconds.recovering)
    # a category edited down by hand, nothing moved into recovering, is no re-booking
    edited = written[-1].model_copy(update={"seconds": written[-1].seconds.model_copy(update={"productive": 1.0})})
    assert gp.rebooked(written[-1], edited) == {}


def test_an_operator_restart_alone_loses_no_steps_and_rebooks_nothing(monkeypatch):
    """Session 12's trial: restarting the operator alone (the controller pod untouched, same UID) made
    `stepsLost` jump by the step reached, `counterBase.stepReached` the step, the `starting` seconds doubled at
    each restart and `wallSeconds` outgrew the job. A new operator (a fresh tracker, the same status, the same
    controller answers) must change none of the counters or the ledger, nor grow the metrics."""
    from prometheus_client import REGISTRY

    from elastic_jax.k8s_operator import operator_state
    from tests.support.fake_kube import FakeKube
    from tests.unit.test_operator_counters import _controller_pod
    from tests.unit.test_operator_events import _Controller, _runner, _worker

    def metric(name: str, **labels) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    status = {"phase": "Running", "controllerPod": "j-controller-0", "tokenSecret": "j-token"}
    run, _ = _runner(monkeypatch, status)
    pods = [_controller_pod(0, "c0"), _worker(0), _worker(1)]

    def passes(state, n):
        for _ in range(n):
            run(state, pods)

    first = operator_state.OperatorState(kube=FakeKube(), key=b"k" * 32, controller_threads=False)
    monkeypatch.setattr(_Controller, "answer", _Controller.answer.model_copy(update={
        "phase": "Starting", "step": 0, "goodput_seconds": {"starting": 20.0}, "goodput": None}))
    passes(first, 3)
    monkeypatch.setattr(_Controller, "answer", _Controller.answer.model_copy(update={
        "phase": "Running", "step": 4121, "goodput_seconds": {"starting": 46.289, "productive": 120.0},
        "goodput": 120.0 / 166.289}))
    passes(first, 3)
    kept = {k: status.get(k) for k in ("stepsLost", "counterBase", "goodput", "step", "controllerRestarts")}
    assert kept["step"] == 4121 and kept["stepsLost"] == 0 and kept["goodput"]["wallSeconds"] == pytest.approx(166.289)
    lost_before = metric("elasticjax_operator_steps_lost_total")
    booked_before = {c: metric("elasticjax_operator_goodput_seconds_total", category=c)
                     for c in ("starting", "productive", "recovering")}
    for _ in range(2):  # two operator restarts, as in the trial
        passes(operator_state.OperatorState(kube=FakeKube(), key=b"k" * 32, controller_threads=False), 4)
        assert {k: status.get(k) for k in kept} == kept
    assert metric("elasticjax_operator_steps_lost_total") == lost_before
    assert {c: metric("elasticjax_operator_goodput_seconds_total", category=c) for c in booked_before} == booked_before


def test_a_status_an_older_operator_wrote_counts_the_next_loss_from_the_step_reached_not_a_stale_base():
    """Session 16's open item: `counterBase.resumeCounted` read False for a status written by an operator older
    than the field (it has no such key), so right after an upgrade the next controller loss counted its steps
    lost from that pod's stale `stepReached` (1000, where pod-a took over) instead of the step reached (800)."""
    older = {"step": 800, "stepsLost": 500,  # pod-a took over at 1000, resumed from 500, trained to 800
             "counterBase": {"controllerUid": "pod-a", "stepsLost": 0, "stepReached": 1000, "trainedFromStep": 0}}
    _, s = _pass(older, "pod-b", _ctrl(0, {"starting": 3}, phase="Starting"))
    c, s = _pass(s, "pod-b", _ctrl(700, {"starting": 8}, resumed=700))
    assert c.steps_lost == 600 and c.base.step_reached == 800, (c.steps_lost, c.base)
    # this operator's own status says False when it means it: that pod's start is carried on (F1 stays fixed)
    uncounted = {**older, "counterBase": {**older["counterBase"], "resumeCounted": False}}
    _, s = _pass(uncounted, "pod-b", _ctrl(0, {"starting": 3}, phase="Starting"))
    assert s["counterBase"]["stepReached"] == 1000
