"""The goodput ledger's accounting (a fake clock: this is the ledger's own arithmetic)."""

import pytest

from elastic_jax.controller.goodput import CATEGORIES, GoodputLedger


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_categories_add_up_to_wall_and_a_failure_is_booked_from_its_step():
    clock = Clock()
    ledger = GoodputLedger(clock)
    clock.t = 110.0  # 10 s starting
    ledger.switch("productive")
    clock.t = 130.0
    # a step dispatched at 128 failed; noticed at 130: its 2 s are recovery, not progress
    ledger.switch("recovering", at=128.0)
    clock.t = 131.0
    ledger.switch("waiting")
    clock.t = 135.0
    ledger.switch("recovering")
    clock.t = 136.0
    ledger.switch("reduced", capacity=0.5)
    clock.t = 146.0
    s = ledger.seconds()
    assert s == {"starting": 10.0, "restoring": 0.0, "productive": 18.0, "reduced": 10.0, "recovering": 4.0,
                 "waiting": 4.0, "checkpointing": 0.0, "stalled": 0.0}
    assert sum(s.values()) == clock.t - 100.0
    assert ledger.goodput() == pytest.approx((18.0 + 5.0) / 46.0)  # reduced counts at active/desired


def test_move_rebooks_lost_steps_and_stop_freezes():
    clock = Clock()
    ledger = GoodputLedger(clock)
    ledger.switch("productive")
    clock.t = 120.0
    ledger.switch("restoring")
    assert ledger.move(5.0, "productive", "recovering") == 5.0
    assert ledger.move(99.0, "productive", "recovering") == 15.0  # never more than was booked
    clock.t = 121.0
    ledger.stop()
    clock.t = 500.0
    assert ledger.seconds()["restoring"] == 1.0 and ledger.current is None
    assert sum(ledger.seconds().values()) == 21.0


def test_carried_seconds_continue_the_jobs_ledger():
    clock = Clock()
    ledger = GoodputLedger(clock, carried={"productive": 30.0, "reduced": 10.0}, carried_equivalent=5.0)
    clock.t = 110.0
    assert ledger.seconds()["starting"] == 10.0 and ledger.seconds()["productive"] == 30.0
    assert ledger.goodput() == pytest.approx(35.0 / 50.0)


def test_bad_input():
    with pytest.raises(ValueError, match="unknown goodput category 'idle'"):
        GoodputLedger(Clock()).switch("idle")
    with pytest.raises(ValueError, match="capacity"):
        GoodputLedger(Clock()).switch("reduced", capacity=0)
    with pytest.raises(ValueError):
        GoodputLedger(Clock(), carried={"nope": 1.0})
    assert set(CATEGORIES) == set(GoodputLedger(Clock()).seconds())
