"""The shared rule for steps a restarted controller redid (`elastic_jax.supervision.steps_lost`)."""

from elastic_jax.supervision import steps_lost as rule


def test_lost_steps_and_their_share_of_the_earlier_ledger():
    assert rule.lost_at_resume(80, 50) == 30 and rule.lost_at_resume(50, 80) == 0
    assert rule.lost_share(30, 80, 20) == 0.5  # 30 of the 60 steps the earlier ledger trained
    assert rule.lost_share(30, 80, 80) == 0.0 and rule.lost_share(0, 80, 0) == 0.0  # (nothing trained, lost)
    assert rule.lost_share(100, 80, 0) == 1.0


def test_rebooking_moves_the_lost_share_of_training_seconds_to_recovering():
    earlier = {"starting": 5.0, "productive": 8.0, "reduced": 2.0, "recovering": 1.0}
    total = {k: v + 1.0 for k, v in earlier.items()}  # (earlier + a live controller's second per category)
    seconds, equivalent = rule.rebook_lost(total, earlier, 0.5, equivalent=1.5, earlier_equivalent=1.0)
    assert seconds == {"starting": 6.0, "productive": 5.0, "reduced": 2.0, "recovering": 7.0}
    assert equivalent == 1.0 and sum(seconds.values()) == sum(total.values())  # (wall unchanged)
    assert rule.rebook_lost(total, earlier, 0.0, 1.5, 1.0) == (total, 1.5)
    assert rule.goodput_fraction(seconds, equivalent) == (5.0 + 1.0) / 20.0
    assert rule.goodput_fraction({}, 0.0) is None
