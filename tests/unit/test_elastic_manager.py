"""Manager.elastic_retry semantics (pathways-utils' Manager), on our own slice set."""

import threading

import pytest

from elastic_jax.api.control import SliceReport
from elastic_jax.controller.elastic.errors import (
    ElasticRuntimeError,
    ScaleUpSignalError,
    SliceDownError,
    is_slice_down,
)
from elastic_jax.controller.elastic.manager import Manager
from elastic_jax.controller.elastic.policy import RestartBudget
from elastic_jax.controller.elastic.slice_set import SliceSet


def make(count, ready=None, **manager_args):
    s = SliceSet(count)
    for i in ready if ready is not None else range(count):
        s.apply_report(i, SliceReport(state="Ready", generation=1, addresses=[f"h:{i}"]))
    return s, Manager(s, poll_interval_s=0.05, **manager_args)


def test_replica_resize_continues_on_survivors():
    s, m = make(3)
    seen = []

    @m.elastic_retry(minimum_slice_count=2, timeout_s=1)
    def train():
        seen.append(sorted(s.active))
        if len(seen) == 1:
            s.mark_down([2], "killed")
            raise SliceDownError("slice 2 lost", [2])
        return "done"

    assert train() == "done"
    assert seen == [[0, 1, 2], [0, 1]]
    assert m.attempts == 2


def test_pause_and_resume_waits_for_the_slice():
    s, m = make(2)
    seen = []

    @m.elastic_retry(minimum_slice_count=None, timeout_s=5)
    def train():
        seen.append(sorted(s.active))
        if len(seen) == 1:
            s.mark_down([1], "killed")
            threading.Timer(0.3, lambda: s.apply_report(1, SliceReport(state="Ready", generation=2, addresses=["h:9"]))).start()
            raise SliceDownError("slice 1 lost", [1])
        return "done"

    assert train() == "done"
    assert seen == [[0, 1], [0, 1]]


def test_timeout_waiting_for_slices_is_elastic_runtime_error():
    s, m = make(2, ready=[0])

    @m.elastic_retry(minimum_slice_count=2, timeout_s=0.2)
    def train():
        raise AssertionError("must not run")

    with pytest.raises(ElasticRuntimeError, match="only 1 of the 2 slices"):
        train()


def test_other_errors_propagate_unretried():
    s, m = make(2)
    calls = []

    @m.elastic_retry(minimum_slice_count=1)
    def train():
        calls.append(1)
        raise ValueError("user bug")

    with pytest.raises(ValueError, match="user bug"):
        train()
    assert calls == [1]


def test_budget_ends_retries_with_reason():
    s, m = make(2)
    budget = RestartBudget(max_restarts=2, max_restarts_per_slice=10)

    @m.elastic_retry(minimum_slice_count=1, retry_policy=budget)
    def train():
        raise SliceDownError("flaky", [0])

    with pytest.raises(ElasticRuntimeError, match="maxRestarts=2"):
        train()
    assert budget.restarts == 3


def test_per_slice_budget():
    budget = RestartBudget(max_restarts=100, max_restarts_per_slice=1)
    assert budget(1, SliceDownError("x", [1]))
    assert not budget(2, SliceDownError("x", [1]))
    assert "slice 1" in budget.reason


def test_scale_up_and_draining_do_not_count():
    budget = RestartBudget(max_restarts=0, max_restarts_per_slice=0)
    assert budget(1, ScaleUpSignalError())
    assert budget(2, SliceDownError("drain", [0], cause="draining"))
    assert not budget(3, SliceDownError("lost", [0]))


def test_scale_up_signal_retries_with_more_slices_and_reports_nothing_lost():
    lost = []  # (nothing is lost on a first attempt or a scale-up)
    s, m = make(3, ready=[0, 1], on_slices_lost=lost.append)
    seen = []

    @m.elastic_retry(minimum_slice_count=2, timeout_s=1)
    def train():
        seen.append(sorted(s.active))
        if len(seen) == 1:
            s.apply_report(2, SliceReport(state="Ready", generation=1, addresses=["h:2"]))
            assert m.available_inactive_slices() == {2}
            raise ScaleUpSignalError()
        return "done"

    assert train() == "done"
    assert seen == [[0, 1], [0, 1, 2]]
    assert lost == []


def test_unhealthy_ready_slice_is_marked_down():
    s = SliceSet(2)
    for i in range(2):
        s.apply_report(i, SliceReport(state="Ready", generation=1, addresses=[f"h:{i}"]))
    m = Manager(s, health_check=lambda idx: frozenset(i for i in idx if i != 1), poll_interval_s=0.05)
    assert m.wait_for_slices(1, timeout_s=1) == {0}
    assert s.record(1).state == "Down"


def test_error_classification():
    import jax

    assert is_slice_down(SliceDownError("x", [0]))
    assert str(SliceDownError("x", [0])).startswith("DATA_LOSS")
    assert is_slice_down(jax.errors.JaxRuntimeError("DATA_LOSS: slice gone"))
    assert not is_slice_down(jax.errors.JaxRuntimeError("INVALID_ARGUMENT: shapes"))
    assert not is_slice_down(ValueError("DATA_LOSS"))
    assert is_slice_down(jax.errors.JaxRuntimeError("UNAVAILABLE: connection to slice 1 lost"))
    assert is_slice_down(jax.errors.JaxRuntimeError("DEADLINE_EXCEEDED: slice 0 did not answer"))


def test_host_callback_errors_are_the_users_not_a_slice_loss():
    """Issue 9 item 2: XLA reports a raising host callback as INTERNAL; no slice caused it."""
    import jax

    from elastic_jax.controller.elastic.errors import one_line_reason

    text = ("INTERNAL: CpuCallback error calling callback: Traceback (most recent call last):\n"
            "  File \"opt.py\", line 3, in scale_for\nKeyError: 30")
    for error in (jax.errors.JaxRuntimeError(text), ValueError(text)):
        assert not is_slice_down(error)
        assert one_line_reason(error).startswith("host callback raised KeyError: 30 (")
    assert not is_slice_down(jax.errors.JaxRuntimeError("INTERNAL: something else"))
    assert one_line_reason(RuntimeError("a\n  b")) == "RuntimeError: a b"


def test_stop_request_ends_a_wait_for_slices():
    from elastic_jax.controller.elastic.errors import StopRequested

    s, m = make(2, ready=[0])
    threading.Timer(0.2, m.stop_event.set).start()
    with pytest.raises(StopRequested):
        m.wait_for_slices(2, timeout_s=30)


def test_hot_spare_replaces_a_lost_slice_on_the_next_attempt():
    s = SliceSet(2, spares=1)
    for i in range(3):
        s.apply_report(i, SliceReport(state="Ready", generation=1, addresses=[f"h:{i}"]))
    m = Manager(s, poll_interval_s=0.05)
    seen = []

    @m.elastic_retry(minimum_slice_count=None, timeout_s=1)  # pause and resume: no wait with a spare
    def train():
        seen.append(sorted(s.active))
        if len(seen) == 1:
            s.mark_down([0], "killed")
            raise SliceDownError("slice 0 lost", [0])
        # the lost slice comes back: a spare now, not a scale-up signal
        s.apply_report(0, SliceReport(state="Ready", generation=2, addresses=["h:9"]))
        assert m.available_inactive_slices() == frozenset()
        return "done"

    assert train() == "done"
    assert seen == [[0, 1], [1, 2]]
    assert s.spare_indices() == {0}


class Preparer:
    """A backend's `prepare` for the tests: the slices in `warm` are ready to join; every call is recorded."""

    def __init__(self, warm=()):
        self.warm = set(warm)
        self.asked: list[frozenset[int]] = []

    def __call__(self, indices):
        self.asked.append(frozenset(indices))
        return frozenset(indices) & self.warm


def test_scale_up_waits_until_the_rejoining_slice_is_prepared():
    """A slice back Ready is no scale-up signal until the backend has warmed it (the mesh never waits on its compile)."""
    s, _ = make(2, ready=[0])
    prepare = Preparer()
    m = Manager(s, poll_interval_s=0.05, prepare=prepare)
    s.set_active([0])
    s.apply_report(1, SliceReport(state="Ready", generation=1, addresses=["h:1"]))
    assert m.available_inactive_slices() == frozenset()  # not warm: keep training on slice 0
    assert prepare.asked[-1] == {1}  # ...while the backend warms slice 1
    prepare.warm.add(1)
    assert m.available_inactive_slices() == {1}


def test_spares_are_prepared_while_the_mesh_trains_and_a_warm_one_is_swapped_in():
    s = SliceSet(2, spares=2)
    for i in range(4):
        s.apply_report(i, SliceReport(state="Ready", generation=1, addresses=[f"h:{i}"]))
    prepare = Preparer()
    m = Manager(s, poll_interval_s=0.05, prepare=prepare)
    seen = []

    @m.elastic_retry(minimum_slice_count=1, timeout_s=1)
    def train():
        seen.append(sorted(s.active))
        if len(seen) == 1:
            assert m.available_inactive_slices() == frozenset()  # a full mesh: no scale-up...
            assert prepare.asked[-1] == {2, 3}  # ...but both spares are being prepared
            prepare.warm.add(3)  # spare 3 is warm first, spare 2 (the lower index) is not yet
            s.mark_down([0], "killed")
            raise SliceDownError("slice 0 lost", [0])
        return "done"

    assert train() == "done"
    assert seen == [[0, 1], [1, 3]]  # the warm spare, not the lowest index


def _states(s):
    return {v.index: v.state for v in s.statuses()}


def test_a_slice_still_compiling_reads_warming_until_it_joins_or_is_a_warm_spare():
    """Issue 11 (status truth, session 10's trial): a replaced slice compiling its step programs read `Ready`
    with no word until it joined. It reads `Warming` (the rejoining slice, and a spare) until prepared."""
    s = SliceSet(2, spares=1)
    for i in range(3):
        s.apply_report(i, SliceReport(state="Ready", generation=1, addresses=[f"h:{i}"]))
    prepare = Preparer()
    m = Manager(s, poll_interval_s=0.05, prepare=prepare)
    s.set_active([0])  # a mesh below count: slices 1 and 2 (both back Ready) may join once prepared
    assert m.available_inactive_slices() == frozenset()
    assert _states(s) == {0: "Active", 1: "Warming", 2: "Warming"}
    prepare.warm.add(1)
    assert m.available_inactive_slices() == {1}
    assert _states(s)[1] == "Ready" and _states(s)[2] == "Warming"
    s.set_active([0, 1])  # slice 1 joined: slice 2 is a spare that still compiles
    m.available_inactive_slices()
    assert _states(s) == {0: "Active", 1: "Active", 2: "Warming"}
    prepare.warm.add(2)
    m.available_inactive_slices()
    assert _states(s)[2] == "Spare"
    # a new worker on slice 2 (reported again) compiles again, and is Warming only once prepare says so
    prepare.warm.discard(2)
    s.apply_report(2, SliceReport(state="Ready", generation=2, addresses=["h:22"]))
    assert _states(s)[2] == "Spare"
    m.available_inactive_slices()
    assert _states(s)[2] == "Warming"


def test_choose_active_prefers_given_slices_after_the_active_ones():
    s = SliceSet(2, spares=2)
    s.set_active([1])
    assert s.choose_active({0, 1, 2, 3}, prefer={3}) == {1, 3}
    assert s.choose_active({0, 1, 2, 3}) == {0, 1}


def test_a_slice_found_down_while_waiting_after_a_loss_is_reported_and_the_pause_too():
    """Two slices lost at once: the step's error names slice 2; slice 1 fails the health check in the wait that
    follows (reported to `on_slices_lost`, with slice 2, once), and with 1 of the 2 needed up the wait blocks (`on_wait`) until
    slice 2's replacement is Ready."""
    s = SliceSet(3)
    for i in range(3):
        s.apply_report(i, SliceReport(state="Ready", generation=1, addresses=[f"h:{i}"]))
    lost, waits = [], []
    seen = []
    # (slice 1's worker died with slice 2's: it fails every health check after the first attempt began)
    m = Manager(s, health_check=lambda idx: frozenset(i for i in idx if i != 1 or not seen),
                poll_interval_s=0.05, on_slices_lost=lost.append, on_wait=lambda *a: waits.append(a))

    @m.elastic_retry(minimum_slice_count=2, timeout_s=30)
    def train():
        seen.append(sorted(s.active))
        if len(seen) == 1:
            s.mark_down([2], "killed")
            threading.Timer(0.2, lambda: s.apply_report(
                2, SliceReport(state="Ready", generation=2, addresses=["h:2"]))).start()
            raise SliceDownError("slice 2 lost", [2])
        return "done"

    assert train() == "done"
    assert seen == [[0, 1, 2], [0, 2]]
    assert lost == [frozenset({1, 2})]  # (once: every slice of the last attempt down; the recovery record dedups)
    assert waits == [(True, 1), (False, 1)]


