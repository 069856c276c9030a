"""Issue 12 item 3: `status.goodput`, the job's goodput ledger over every controller pod
(`k8s_operator.goodput`, carried in `status.counterBase.goodput` by `counters.carry`)."""

from __future__ import annotations

import pytest

from elastic_jax.api.control import ControllerStatus, SliceStatus
from elastic_jax.api.status import GOODPUT_CATEGORIES, ElasticTrainingJobStatus, Goodput
from elastic_jax.controller import goodput as controller_goodput
from elastic_jax.k8s_operator import counters
from elastic_jax.k8s_operator import goodput as gp
from tests.unit.test_operator_status import _ctrl, _inputs, build_status



def _carry(previous: dict, *args, **kw) -> counters.Counts:
    """`counters.carry` on the status as the operator reads it back from the API server (typed)."""
    return counters.carry(ElasticTrainingJobStatus.from_kube(previous), *args, **kw)

def _status(seconds: dict[str, float], goodput: float | None) -> ControllerStatus:
    return ControllerStatus(phase="Running", step=5, total_steps=10, desired_slices=2, min_slices=1,
                            active_slices=[0, 1], inactive_slices=[], slices=[], pid=1,
                            goodput_seconds=seconds, goodput=goodput)


def _written(previous: dict, c: counters.Counts) -> dict:
    """The status after the pass wrote `c` (what the next pass reads)."""
    out = {**previous, "recoveries": c.recoveries,
           "counterBase": c.base.model_dump(mode="json", by_alias=True, exclude_none=True)}
    if c.goodput is not None:
        out["goodput"] = c.goodput.model_dump(mode="json", by_alias=True, exclude_none=True)
    return out


def test_status_lists_the_controllers_categories():
    assert set(GOODPUT_CATEGORIES) == set(controller_goodput.CATEGORIES)


def test_live_ledger_recovers_the_weighted_reduced_seconds():
    # 60 productive, 20 reduced at 1/2 capacity, 20 recovering: goodput (60 + 10) / 100
    live = gp.live_ledger(_status({"productive": 60, "reduced": 20, "recovering": 20}, 0.7))
    assert live.seconds.productive == 60 and live.seconds.reduced == 20
    assert live.reduced_equivalent_seconds == pytest.approx(10)
    total = gp.total(gp.base_from_total(None), live)
    assert total.fraction == pytest.approx(0.7) and total.percent == "70.0%" and total.wall_seconds == 100


def test_no_fraction_before_a_step_but_the_seconds_are_booked():
    total = gp.total(gp.base_from_total(None), gp.live_ledger(_status({"starting": 12.5}, None)))
    assert total.fraction is None and total.percent == "" and total.seconds.starting == 12.5


def test_a_controller_that_completed_no_step_books_no_progress():
    """Issue 11 (status truth): a first step that failed while it compiled booked `productive` (then
    `recovering`) seconds before any step completed. The operator books what a controller that has no
    step yet (goodput None) put there as `starting`, so `status.goodput` shows no progress either."""
    live = gp.live_ledger(_status({"starting": 5, "productive": 3, "recovering": 2, "restoring": 1}, None))
    assert live.seconds.starting == 10 and live.seconds.productive == 0 and live.seconds.recovering == 0
    assert live.seconds.restoring == 1
    total = gp.total(gp.base_from_total(None), live)
    assert total.fraction is None and total.wall_seconds == 11


def test_a_new_controller_pods_ledger_adds_to_the_jobs_never_resets():
    s: dict = {}
    c = _carry(s, 2, "pod-a", 0, {}, gp.live_ledger(_status({"starting": 10, "productive": 90}, 0.9)))
    assert c.goodput.seconds.productive == 90 and c.goodput.fraction == pytest.approx(0.9)
    s = _written(s, c)
    # pod-a lost: nothing answers, status.goodput stays as written
    c = _carry(s, 2, "", None, {}, None)
    assert c.goodput is None and c.recoveries == 0
    s = _written(s, c)
    assert s["goodput"]["seconds"]["productive"] == 90
    # pod-b (a new controller after the loss, or a resume) books from 0 again: the job's ledger grows
    c = _carry(s, 2, "pod-b", 0, {}, gp.live_ledger(_status({"starting": 5, "restoring": 5}, None)))
    assert c.base.goodput.seconds.productive == 90 and c.base.goodput.seconds.starting == 10
    assert c.goodput.seconds.productive == 90 and c.goodput.seconds.starting == 15
    assert c.goodput.seconds.restoring == 5 and c.goodput.wall_seconds == 110
    assert c.goodput.fraction == pytest.approx(90 / 110, abs=1e-4)
    s = _written(s, c)
    c = _carry(s, 2, "pod-b", 0, {}, gp.live_ledger(
        _status({"starting": 5, "restoring": 5, "productive": 40, "reduced": 20}, 50 / 70)))
    assert c.goodput.seconds.productive == 130 and c.goodput.seconds.reduced == 20
    assert c.goodput.reduced_equivalent_seconds == pytest.approx(10)
    assert c.goodput.fraction == pytest.approx((130 + 10) / 170, abs=1e-4)
    assert c.goodput.wall_seconds == 170
    s = _written(s, c)
    # every later pass of pod-b: base unchanged, totals follow its ledger
    assert _carry(s, 2, "pod-b", 0, {}, gp.live_ledger(
        _status({"starting": 5, "restoring": 5, "productive": 41, "reduced": 20}, 51 / 71))
    ).goodput.seconds.productive == 131


def test_a_status_from_before_goodput_existed_starts_the_ledger_at_the_live_controller():
    # an operator upgrade: counterBase without goodput, no status.goodput
    s = {"recoveries": 1, "counterBase": {"controllerUid": "pod-a", "recoveries": 0, "slices": []}}
    c = _carry(s, 2, "pod-a", 1, {}, gp.live_ledger(_status({"productive": 30}, 1.0)))
    assert c.goodput.seconds.productive == 30 and c.goodput.fraction == 1.0


def test_build_status_writes_goodput_and_spare_slices_and_validates():
    ctrl = _ctrl()
    ctrl.slices = [SliceStatus(index=0, state="Active", generation=1), SliceStatus(index=1, state="Active", generation=1),
                   SliceStatus(index=2, state="Spare", generation=1)]
    total = gp.total(gp.base_from_total(None), gp.live_ledger(_status({"productive": 8, "recovering": 2}, 0.8)))
    out = build_status(_inputs(controller=ctrl, goodput=total))
    assert out["spareSlices"] == [2] and out["spareCount"] == 1
    assert out["goodput"]["fraction"] == 0.8 and out["goodput"]["percent"] == "80.0%"
    assert out["goodput"]["seconds"]["recovering"] == 2
    parsed = ElasticTrainingJobStatus.model_validate(out)
    assert parsed.goodput == Goodput.model_validate(out["goodput"])
    # no answer this pass: the last goodput stays; a suspended job names no spare
    kept = build_status(_inputs(previous=out, controller=None, goodput=None, job=_suspended()))
    assert kept["goodput"] == out["goodput"] and kept["spareSlices"] == [] and kept["spareCount"] == 0


def _suspended():
    from tests.unit.test_operator_status import _job
    return _job(suspend=True)


def test_the_operators_counter_gets_what_each_pass_added():
    first = gp.total(gp.base_from_total(None), gp.live_ledger(_status({"starting": 10, "productive": 5}, 0.33)))
    assert gp.increments(None, first) == {"starting": 10, "productive": 5}
    later = gp.total(gp.base_from_total(None), gp.live_ledger(_status({"starting": 10, "productive": 7}, 0.41)))
    assert gp.increments(first, later) == {"productive": 2}
    assert gp.increments(later, None) == {} and gp.increments(later, first) == {}  # never negative


# -- when status.goodput is written (issue 11 trial: a quiet Pending job rewritten every ~26 s) ------------------

def _observed(status: dict, ctrl: ControllerStatus | None, total: Goodput | None, **kw):
    """The status decision's input for a job whose controller answered `ctrl` (its ledger: `total`)."""
    from elastic_jax.k8s_operator.slices import JobSetView
    from elastic_jax.k8s_operator.status_decision import StatusObserved
    inputs = _inputs(previous=status, controller=ctrl, goodput=total, **kw)
    return StatusObserved(inputs=inputs, status=status, finished=False, refusal=None, controller_pods=[],
                          worker_pods=[], jobsets={i: JobSetView(f"demo-slice-{i}", i) for i in range(2)},
                          current=None, controller_created_now=False)


def _starting(seconds: float) -> ControllerStatus:
    """A controller still waiting for its slices at start (the job Pending), `seconds` booked to starting."""
    c = _status({"starting": seconds}, None)
    c.phase, c.step, c.active_slices = "WaitingForSlices", 0, []
    return c


def _pass(status: dict, ctrl: ControllerStatus, unwritten: Goodput | None = None, **kw):
    """One operator pass: counters carried, the status decided; (status after it, its patch, the decision)."""
    from elastic_jax.k8s_operator.effects import CountGoodput, PatchStatus
    from elastic_jax.k8s_operator.status_decision import decide_status
    c = _carry(status, 2, "pod-a", 0, {}, gp.live_ledger(ctrl), unwritten)
    d = decide_status(_observed(status, ctrl, c.goodput, counter_base=c.base, recoveries=c.recoveries, **kw))
    (patch,) = [e.fields for e in d.effects if isinstance(e, PatchStatus)]
    counted = sum(e.seconds for e in d.effects if isinstance(e, CountGoodput))
    return {**status, **patch}, patch, d, counted


def test_a_quiet_jobs_status_is_not_rewritten_for_its_goodput_clock_alone():
    """Only the ledger's seconds moved (nothing `kubectl get ejob` shows): no write until QUIET_WRITE_S of booked
    time passed since the last one; the metric counts what is written, never twice."""
    status, patch, d, counted = _pass({}, _starting(1.0))
    assert patch["phase"] == "Pending" and patch["goodput"]["seconds"]["starting"] == 1.0 and counted == 1.0
    status, patch, d, _ = _pass(status, _starting(2.0))
    assert patch == {} and d.unwritten_goodput.seconds.starting == 2.0  # a second more: held back
    writes, total_counted = [], 0.0
    for n in range(1, 15):  # a status long poll every 26 s
        status, patch, d, counted = _pass(status, _starting(2.0 + 26.0 * n))
        total_counted += counted
        if patch:
            writes.append((n, sorted(patch)))
        else:
            assert d.unwritten_goodput is not None and d.unwritten_goodput.seconds.starting == 2.0 + 26.0 * n
            assert d.written["goodput"] == status["goodput"]  # (what the object holds)
    # 14 x 26 s: one write, of the goodput alone, at the first answer 300 s past the one written (12 x 26 s)
    assert gp.QUIET_WRITE_S == 300.0 and writes == [(12, ["goodput"])], writes
    assert total_counted == status["goodput"]["seconds"]["starting"] - 1.0 == 2.0 + 26.0 * 12 - 1.0
    # anything else that changes writes the ledger with it: a first step (phase, STEP column)
    trained = _starting(2.0 + 26.0 * 15)
    trained.phase, trained.step, trained.active_slices = "Running", 1, [0, 1]
    status, patch, d, _ = _pass(status, trained)
    assert patch["phase"] == "Running" and patch["goodput"]["seconds"]["starting"] == 2.0 + 26.0 * 15, patch
    assert d.unwritten_goodput is None


def test_the_goodput_column_moving_or_a_stop_writes_the_ledger_at_once():
    from tests.unit.test_operator_status import _job
    ctrl = _status({"productive": 90, "waiting": 10}, 0.9)
    status, _, _, _ = _pass({}, ctrl)
    status, _, _, _ = _pass(status, ctrl)
    # paused: the GOODPUT column falls 90.0% -> 89.9%: shown, so written
    status, patch, _, _ = _pass(status, _status({"productive": 90, "waiting": 10.2}, 90 / 100.2))
    assert patch["goodput"]["percent"] == "89.8%", patch
    status, patch, _, _ = _pass(status, _status({"productive": 90, "waiting": 10.25}, 90 / 100.25))
    assert patch == {}, patch  # (89.8% still)
    # a suspend's (or a finishing job's) last seconds are always written
    held = held_before = _status({"productive": 90, "waiting": 10.3}, 90 / 100.3)
    assert not gp.held_back(Goodput.model_validate(status["goodput"]),
                            gp.total(gp.base_from_total(None), gp.live_ledger(held)), running=False)
    _, patch, _, _ = _pass(status, held_before, job=_job(suspend=True), suspend_waits_for=["demo-controller-0"])
    assert patch["goodput"]["seconds"]["waiting"] == 10.3, patch


def test_the_seconds_held_back_reach_the_next_controllers_base():
    """The ledger held back when its controller went (a loss between two writes): the next controller's base is
    the newest total the operator computed, not the older one written, so the job's seconds lose nothing."""
    status, _, _, _ = _pass({}, _starting(1.0))
    status, _, _, _ = _pass(status, _starting(2.0))
    status, patch, d, _ = _pass(status, _starting(100.0))
    assert patch == {} and d.unwritten_goodput.seconds.starting == 100.0
    unwritten = d.unwritten_goodput
    assert status["goodput"]["seconds"]["starting"] == 1.0  # what the object says
    # pod-a lost without another answer; pod-b answers
    c = _carry(status, 2, "pod-b", 0, {}, gp.live_ledger(_starting(5.0)), unwritten)
    assert c.base.goodput.seconds.starting == 100.0 and c.goodput.seconds.starting == 105.0
    # without the operator's memory (it restarted): the base is the total written
    c = _carry(status, 2, "pod-b", 0, {}, gp.live_ledger(_starting(5.0)), None)
    assert c.base.goodput.seconds.starting == 1.0
    # an older total kept in memory never lowers the base
    c = _carry({**status, "goodput": unwritten.model_dump(mode="json", by_alias=True, exclude_none=True)}, 2,
               "pod-b", 0, {}, gp.live_ledger(_starting(5.0)), gp.total(gp.base_from_total(None),
                                                                       gp.live_ledger(_starting(50.0))))
    assert c.base.goodput.seconds.starting == 100.0


# -- a frozen controller (issue 11: its ledger's clock ran on while it was SIGSTOPped) ---------------------------

def test_a_freeze_is_booked_recovering_once_in_status_and_in_the_operators_counter_across_operator_restarts():
    """A controller frozen 30 s while training answers again with those seconds in its `productive`: status and
    `elasticjax_operator_goodput_seconds_total` book them `recovering` (`elastic-jax run`'s rule), each freeze
    once (`counterBase.frozenUntil`), also after an operator restart (the tracker's memory gone), and the next
    controller's base keeps the re-booked ledger."""
    from elastic_jax.k8s_operator.tracker import Freeze

    s: dict = {}
    c = _carry(s, 2, "pod-a", 0, {}, gp.live_ledger(_status({"starting": 10, "productive": 60}, 60 / 70)))
    s = _written(s, c)
    before = c.goodput
    # frozen 30 s, then 5 s more of training: its ledger says productive 95
    freezes = [Freeze(ended_at=1000.0, seconds=30.0, booked_as="productive")]
    answer = gp.live_ledger(_status({"starting": 10, "productive": 95}, 95 / 105))
    c = _carry(s, 2, "pod-a", 0, {}, answer, None, freezes)
    assert c.goodput.seconds.productive == 65 and c.goodput.seconds.recovering == 30
    assert c.goodput.wall_seconds == 105 and c.goodput.fraction == pytest.approx(65 / 105, abs=1e-4)
    assert c.base.frozen_seconds == 30 and c.base.frozen_until == 1000.0
    assert gp.increments(before, c.goodput) == {"productive": 5, "recovering": 30}  # (the metric: each second once)
    s = _written(s, c)
    # the next passes (the tracker still holds the freeze): not re-booked twice
    c = _carry(s, 2, "pod-a", 0, {}, gp.live_ledger(_status({"starting": 10, "productive": 100}, 100 / 110)),
               None, freezes)
    assert c.goodput.seconds.productive == 70 and c.goodput.seconds.recovering == 30 and c.base.frozen_seconds == 30
    s = _written(s, c)
    # a restarted operator (no tracker memory): the freeze written stays re-booked
    c = _carry(s, 2, "pod-a", 0, {}, gp.live_ledger(_status({"starting": 10, "productive": 101}, 101 / 111)))
    assert c.goodput.seconds.productive == 71 and c.goodput.seconds.recovering == 30
    s = _written(s, c)
    # a second freeze, on 1 of 2 slices (its ledger booked it `reduced`): from reduced, the equivalent seconds too
    freezes = [Freeze(ended_at=1100.0, seconds=10.0, booked_as="reduced")]
    c = _carry(s, 2, "pod-a", 0, {}, gp.live_ledger(
        _status({"starting": 10, "productive": 101, "reduced": 20}, (101 + 10) / 131)), None, freezes)
    assert c.goodput.seconds.productive == 71 and c.goodput.seconds.reduced == 10
    assert c.goodput.seconds.recovering == 40 and c.goodput.reduced_equivalent_seconds == pytest.approx(5)
    assert c.base.frozen_seconds == 40 and c.base.frozen_reduced_seconds == 10 and c.base.frozen_until == 1100.0
    s = _written(s, c)
    # a new controller pod: its base is the re-booked total, its own freezes start at 0
    c = _carry(s, 2, "pod-b", 0, {}, gp.live_ledger(_status({"starting": 4}, None)))
    assert c.base.goodput.seconds.recovering == 40 and c.base.goodput.seconds.productive == 71
    assert c.base.frozen_seconds == 0 and c.base.frozen_until is None
    assert c.goodput.seconds.recovering == 40 and c.goodput.seconds.starting == 14


# -- issue 11: `kubectl get ejob -w` printed a line identical to the last for writes of unprinted fields alone ----

def test_a_running_jobs_unprinted_counters_alone_are_written_at_most_every_counter_write_s():
    """A status write is a watch event, so `kubectl get ejob -w` prints a line for it, identical to the last when no
    printed column moved (a checkpoint committed between two steps; a frozen controller's ControllerUnresponsive
    message counting its seconds; the goodput seconds). Those are written with the next change a column shows, or
    `COUNTER_WRITE_S` after the last write; a step or a phase is written at once."""
    import dataclasses

    from elastic_jax.k8s_operator.effects import PatchStatus
    from elastic_jax.k8s_operator.status_decision import COUNTER_WRITE_S, decide_status

    def decide(status: dict, ctrl, since_s, **kw):
        c = _carry(status, 2, "pod-a", 0, {}, gp.live_ledger(ctrl) if ctrl is not None else None)
        o = _observed(status, ctrl, c.goodput, counter_base=c.base, recoveries=c.recoveries)
        o = dataclasses.replace(o, since_write_s=since_s, **kw)
        d = decide_status(o)
        (patch,) = [e.fields for e in d.effects if isinstance(e, PatchStatus)]
        return {**status, **patch}, patch

    def answer(step: int, checkpoint: int, productive: float):
        c = _status({"starting": 10, "productive": productive}, 0.5)
        c.step, c.last_committed_checkpoint_step = step, checkpoint
        return c

    status, patch = decide({}, answer(5, 4, 10), None)
    assert patch["step"] == 5
    # the checkpoint of step 5 committed before step 6 (and the ledger's clock): nothing printed moved
    committed = answer(5, 5, 10.01)
    assert decide(status, committed, 1.0)[1] == {}
    status, patch = decide(status, committed, COUNTER_WRITE_S + 0.1)
    assert patch["lastCheckpointStep"] == 5 and "goodput" in patch and "step" not in patch
    # a step is written at once, whatever the time since the last write
    status, patch = decide(status, answer(6, 5, 11), 0.1)
    assert patch["step"] == 6
    # a frozen controller: Degraded at once, then its condition's message counting seconds waits
    status, patch = decide(status, None, 0.1, unresponsive="not answered for 21 s; last error: x")
    assert patch["phase"] == "Degraded" and patch["activeSlices"] == 0
    assert decide(status, None, 1.0, unresponsive="not answered for 40 s; last error: x")[1] == {}
    status, patch = decide(status, None, COUNTER_WRITE_S, unresponsive="not answered for 49 s; last error: x")
    assert list(patch) == ["conditions"] and "49 s" in str(patch["conditions"])
    # it answers again: the condition turns False and the phase moves, at once
    status, patch = decide(status, answer(6, 5, 11.5), 0.1)
    assert patch["phase"] == "Running"
