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
