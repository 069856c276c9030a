"""SliceSet: generation ordering, down marking, waiting."""

import threading

import pytest

from elastic_jax.api.control import SliceReport
from elastic_jax.controller.elastic.slice_set import SliceSet


def ready(gen, addr="127.0.0.1:1"):
    return SliceReport(state="Ready", generation=gen, addresses=[addr])


def test_stale_generation_is_ignored():
    s = SliceSet(2)
    assert s.apply_report(0, ready(3)) == (True, 3)
    assert s.apply_report(0, SliceReport(state="Down", generation=2)) == (False, 3)
    assert s.apply_report(0, ready(3)) == (False, 3)  # idempotent retry
    assert s.ready() == {0}


def test_down_report_leaves_active_set_and_counts_failure():
    s = SliceSet(3)
    for i in range(3):
        s.apply_report(i, ready(1))
    s.set_active({0, 1, 2})
    s.apply_report(1, SliceReport(state="Down", generation=2, reason="OOMKilled"))
    assert s.active == {0, 2}
    assert s.record(1).failures == 1 and s.record(1).reason == "OOMKilled"


def test_mark_down_skips_slice_replaced_since_dispatch():
    s = SliceSet(2)
    s.apply_report(0, ready(1))
    s.set_active({0})
    s.apply_report(0, ready(2, "127.0.0.1:2"))  # replacement reported while a step was in flight
    s.mark_down([0], "rpc failed", generations={0: 1})
    assert s.record(0).state == "Ready"
    s.mark_down([0], "rpc failed", generations={0: 2})
    assert s.record(0).state == "Down" and 0 not in s.active


def test_bad_reports():
    s = SliceSet(2)
    with pytest.raises(IndexError):
        s.apply_report(2, ready(1))
    with pytest.raises(ValueError, match="addresses"):
        s.apply_report(0, SliceReport(state="Ready", generation=1))
    assert s.record(0).generation == -1


def test_available_inactive_and_draining():
    s = SliceSet(3)
    for i in range(3):
        s.apply_report(i, ready(1))
    s.set_active({0, 1})
    assert s.available_inactive() == {2}
    s.apply_report(1, SliceReport(state="Draining", generation=2))
    assert s.draining_active() == {1}


def test_wait_for_wakes_on_report_and_listener_fires():
    s = SliceSet(2)
    seen = []
    unsubscribe = s.add_listener(lambda i, state: seen.append((i, state)))
    threading.Timer(0.1, lambda: s.apply_report(1, ready(1))).start()
    assert s.wait_for(lambda: 1 in s.ready(), timeout_s=5)
    assert seen == [(1, "Ready")]
    unsubscribe()
    s.apply_report(1, SliceReport(state="Down", generation=2))
    assert seen == [(1, "Ready")]
    assert not s.wait_for(lambda: 0 in s.ready(), timeout_s=0.05)


def test_spares_are_not_a_scale_up_signal_while_the_mesh_is_full():
    s = SliceSet(2, spares=1)
    assert s.total == 3
    for i in range(3):
        s.apply_report(i, ready(1))
    s.set_active(s.choose_active(s.ready()))
    assert s.active == {0, 1}
    assert s.available_inactive() == frozenset() and s.spare_indices() == {2}
    assert [x.state for x in s.statuses()] == ["Active", "Active", "Spare"]
    # an active slice lost: the mesh is below count, the spare is now the scale-up candidate
    s.apply_report(1, SliceReport(state="Down", generation=2))
    assert s.available_inactive() == {2} and s.spare_indices() == frozenset()
    assert s.choose_active(s.ready()) == {0, 2}  # the survivor kept, the spare swapped in
    with pytest.raises(IndexError):
        s.apply_report(3, ready(1))


def test_choose_active_keeps_the_current_mesh():
    s = SliceSet(2, spares=2)
    s.set_active({1, 3})
    assert s.choose_active({0, 1, 2, 3}) == {1, 3}  # no reshuffle when a lower index comes back
    assert s.choose_active({0, 2, 3}) == {0, 3}
    with pytest.raises(ValueError):
        SliceSet(2, spares=-1)
