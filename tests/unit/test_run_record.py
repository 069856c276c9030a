"""`RunRecord`'s recovery records from the manager's calls (no run): a slice found down while another's loss
waits for slices joins that recovery; the pause below the minimum is booked on it and in the history."""

from __future__ import annotations

import json

import pytest

from elastic_jax.controller.metrics import ControllerMetrics
from elastic_jax.controller.run_history import RunHistory
from elastic_jax.controller.run_record import RunRecord


def _record(tmp_path) -> RunRecord:
    record = RunRecord(ControllerMetrics(), run_history=RunHistory(tmp_path / "history.jsonl"))
    record.step_completed()  # (past start-up: a recovery is booked as one)
    return record


def _lines(tmp_path) -> list[dict]:
    return [json.loads(x) for x in (tmp_path / "history.jsonl").read_text().splitlines()]


def test_a_slice_lost_while_a_loss_waits_joins_its_record_with_the_pause(tmp_path):
    record = _record(tmp_path)
    record.elastic_event("slice_down", [2], at_step=41)
    record.slices_lost(frozenset({1, 2}), at_step=41)  # (2: already the record's; as the manager looks: first)
    record.on_wait(True, 1, at_step=41, desired=3)
    record.slices_lost(frozenset({1}), at_step=41)  # (a later look: nothing new)
    record.on_wait(False, 1, at_step=41, desired=3)
    assert record.recovering
    record.step_completed()
    [r] = record.history()
    assert (r.cause, r.slices, r.at_step, r.fewest_slices) == ("slice_down", [1, 2], 41, 1)
    assert r.paused_seconds is not None and r.seconds is not None and r.seconds >= r.paused_seconds >= 0
    assert record.counts() == {"slice_down": 1} and not record.recovering
    events = [(x["kind"], x.get("slices"), x.get("joins"), x.get("blocked"), x.get("up")) for x in _lines(tmp_path)
              if x["kind"] != "step"]
    assert events == [("event", [2], None, None, None), ("event", [1], True, None, None),
                      ("wait", None, None, True, 1), ("wait", None, None, False, 1)]


def test_a_slice_lost_during_a_scale_up_or_hang_recovery_is_its_own_slice_down_and_both_end_at_the_next_step(tmp_path):
    record = _record(tmp_path)
    record.elastic_event("scale_up", [2], at_step=10)
    record.slices_lost([0], at_step=10)
    record.step_completed()
    up, down = record.history()
    assert (up.cause, up.slices, down.cause, down.slices, down.at_step) == ("scale_up", [2], "slice_down", [0], 10)
    assert up.seconds is not None and down.seconds is not None  # (a second open recovery was never measured)
    assert up.paused_seconds is None and up.fewest_slices is None  # (no wait blocked)


def test_a_pause_before_the_first_step_is_start_up_not_a_recovery(tmp_path):
    record = RunRecord(ControllerMetrics(), run_history=RunHistory(tmp_path / "history.jsonl"))
    record.on_wait(True, 1, at_step=0, desired=3)
    record.on_wait(False, 3, at_step=0, desired=3)
    assert record.history() == [] and not (tmp_path / "history.jsonl").exists()


@pytest.mark.parametrize("blocks", [1, 2])
def test_pauses_add_up_and_keep_the_fewest(tmp_path, blocks):
    record = _record(tmp_path)
    record.elastic_event("slice_down", [1], at_step=5)
    for up in range(blocks, 0, -1):
        record.on_wait(True, up, at_step=5, desired=3)
        record.on_wait(False, up, at_step=5, desired=3)
    [r] = record.history()
    assert r.fewest_slices == 1 and r.paused_seconds is not None


def test_the_supervisors_name_the_joined_slices_loss_from_the_status(tmp_path):
    """The operator and the launcher read `status.recoveryHistory` to say why they replace a slice's worker:
    the slice found down while another's loss waited is named there too (it was "", no cause)."""
    from types import SimpleNamespace

    from elastic_jax.supervision.slice_state import down_cause

    record = _record(tmp_path)
    record.elastic_event("slice_down", [2], at_step=41)
    record.slices_lost({1}, at_step=41)
    status = SimpleNamespace(recovery_history=record.history())
    assert [down_cause(status, i) for i in range(3)] == ["", "slice_down", "slice_down"]
