"""The timeline's series (`elastic_jax.timeline.timeline_data`) from history lines, without a run."""

from __future__ import annotations

import json

import pytest

from elastic_jax import timeline


def _step(t, step, active=2, pid=1, loss=1.0):
    return {"kind": "step", "t": t, "pid": pid, "step": step, "loss": loss, "active": active, "desired": 2}


def test_a_lost_controllers_successor_rewinds_and_is_marked_and_rates_restart_per_controller(tmp_path):
    lines = [_step(100.0, 1), _step(100.5, 2), _step(101.0, 3),
             {"kind": "event", "t": 101.2, "pid": 1, "cause": "slice_down", "slices": [1], "at_step": 3},
             _step(103.2, 4, active=1),
             _step(110.0, 3, pid=2), _step(111.0, 4, pid=2)]  # a new controller resumed from step 2's checkpoint
    (tmp_path / "history.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"kind": "st')
    data = timeline.timeline_data(timeline.read_history(tmp_path))
    assert data.step == [1, 2, 3, 4, 3, 4] and data.active == [2, 2, 2, 1, 2, 2]
    assert data.t[0] == 0 and data.t[-1] == 11.0
    assert data.steps_per_second[:4] == [None, 2.0, 2.0, pytest.approx(3 / 3.2)]
    assert data.steps_per_second[4:] == [None, 1.0]  # (not across the controllers: the gap is no step rate)
    assert data.controller_starts == [(10.0, 3)]
    [r] = data.recoveries
    assert (r.t, r.at_step, r.cause, r.slices, r.seconds) == (pytest.approx(1.2), 3, "slice_down", [1], 2.0)


def test_a_recovery_the_run_ended_in_has_no_seconds(tmp_path):
    lines = [_step(1.0, 1), {"kind": "event", "t": 2.0, "pid": 1, "cause": "hang", "slices": [0], "at_step": 1}]
    (tmp_path / "history.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    [r] = timeline.timeline_data(timeline.read_history(tmp_path)).recoveries
    assert r.seconds is None


def test_draw_writes_a_png_where_it_says(tmp_path):
    (tmp_path / "history.jsonl").write_text("".join(json.dumps(_step(float(i), i)) + "\n" for i in range(1, 20)))
    path = timeline.draw(tmp_path, title="t")
    assert path == tmp_path / "timeline.png" and path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
