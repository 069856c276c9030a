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


@pytest.mark.parametrize("bad", [
    {"kind": "step"}, {"kind": "step", "t": "x", "pid": 1, "step": 9, "active": 2, "desired": 2},
    {"kind": "step", "t": 5.0, "step": "a", "active": 2, "desired": 2},
    {"kind": "event", "t": 5.0, "cause": "slice_down"}, {"kind": "step", "t": True, "pid": 1, "step": 9,
                                                          "active": 2, "desired": 2},
], ids=["no-fields", "t-string", "no-pid", "event-no-step", "t-bool"])
def test_a_line_of_the_wrong_shape_is_skipped_as_a_torn_one_is(tmp_path, bad):
    """A new user's trial: such a line made `report` print a KeyError/TypeError traceback."""
    lines = [_step(1.0, 1), _step(2.0, 2), bad, _step(3.0, 3)]
    (tmp_path / "history.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    data = timeline.timeline_data(timeline.read_history(tmp_path))
    assert data.step == [1, 2, 3] and data.recoveries == []


def test_draw_replaces_a_planted_link_instead_of_writing_through_it(tmp_path):
    """A new user's trial: `report` on a folder whose timeline.png was a link overwrote the link's target."""
    (tmp_path / "history.jsonl").write_text("".join(json.dumps(_step(float(i), i)) + "\n" for i in range(1, 5)))
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me")
    (tmp_path / "timeline.png").symlink_to(precious)
    path = timeline.draw(tmp_path)
    assert precious.read_text() == "keep me"
    assert not path.is_symlink() and path.read_bytes()[:4] == b"\x89PNG"
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".timeline")] == []  # no temp file left


def test_a_folder_at_the_pictures_place_is_one_error(tmp_path):
    (tmp_path / "history.jsonl").write_text(json.dumps(_step(1.0, 1)) + "\n")
    (tmp_path / "timeline.png").mkdir()
    with pytest.raises(timeline.TimelineError, match="cannot be written"):
        timeline.draw(tmp_path)
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".timeline")] == []


def test_report_on_a_run_folder_that_never_reached_step_1_says_what_it_is(tmp_path):
    from typer.testing import CliRunner

    from elastic_jax.cli import app
    from elastic_jax.local import run_folder

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    run_folder.mark(run_dir)  # (what `elastic-jax run` writes first)
    (run_dir / "summary.json").write_text(json.dumps({"failure_reason": "interrupted at step 0"}))
    result = CliRunner().invoke(app, ["report", str(run_dir)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.output.strip() == (f"error: {run_dir}: an `elastic-jax run` folder whose run completed no step "
                                     f"(it ended: interrupted at step 0): nothing to draw; its logs: "
                                     f"{run_dir / 'controller.log'}, {run_dir}/worker-*.log")
    # a history without a step (a controller stopped while compiling its first one) is the same folder
    (run_dir / timeline.HISTORY_FILE).write_text(json.dumps({"kind": "start", "t": 1.0}) + "\n")
    assert "completed no step" in CliRunner().invoke(app, ["report", str(run_dir)]).output
    # a folder that is no run's still says so
    other = tmp_path / "other"
    other.mkdir()
    assert "not an `elastic-jax run` folder" in CliRunner().invoke(app, ["report", str(other)]).output


def test_report_reads_a_damaged_history_and_never_through_a_link(tmp_path):
    """A new user's trial (session 24): bytes that are not UTF-8 appended to history.jsonl made `report` print a
    UnicodeDecodeError traceback (exit 1), and a history.jsonl linked to /etc/shadow was read through the link."""
    from typer.testing import CliRunner

    from elastic_jax.cli import app

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    history = run_dir / timeline.HISTORY_FILE
    history.write_bytes(b"".join(json.dumps(_step(float(i), i)).encode() + b"\n" for i in range(1, 5)) + b"\xff\xfe\n")
    result = CliRunner().invoke(app, ["report", str(run_dir)])
    assert result.exit_code == 0 and "Traceback" not in result.output, result.output
    assert timeline.timeline_data(timeline.read_history(run_dir)).step == [1, 2, 3, 4]  # (the damaged line skipped)
    # a link planted at the history's name: refused, its target not read
    secret = tmp_path / "secret.jsonl"
    secret.write_bytes(history.read_bytes())
    history.unlink()
    history.symlink_to(secret)
    result = CliRunner().invoke(app, ["report", str(run_dir)])
    assert result.exit_code == 2 and result.output.strip() == (
        f"error: {history}: a symbolic link, not the run's own file: not read")
    # something other than a regular file at the name: one line too
    history.unlink()
    history.mkdir()
    result = CliRunner().invoke(app, ["report", str(run_dir)])
    assert result.exit_code == 2 and result.output.strip() == f"error: {history}: cannot be read (Is a directory)"


def test_a_lost_controllers_gap_is_drawn_as_one_not_as_training(tmp_path):
    """A new user's trial (session 24): after a controller SIGKILL the picture drew 3 active slices and the loss
    line straight across the 27 s without a controller, with no mark of the loss, titled "0 elastic event(s)"."""
    lines = [_step(100.0, 1), _step(101.0, 2), _step(102.0, 3), _step(129.0, 2, pid=2), _step(130.0, 3, pid=2)]
    (tmp_path / "history.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    data = timeline.timeline_data(timeline.read_history(tmp_path))
    assert data.controller_gaps == [(2.0, 29.0, 3)]
    t, loss, _, active, _ = timeline._broken_at_controller_gaps(data)
    assert t == [0.0, 1.0, 2.0, 29.0, 29.0, 30.0]
    assert active == [2, 2, 0, 0, 2, 2]  # (nothing trained from the lost controller's last step to the next)
    assert loss[3] != loss[3] and loss[2] == 1.0 == loss[4]  # (a NaN: the line breaks across the gap)
    assert timeline.draw(tmp_path).read_bytes()[:4] == b"\x89PNG"


def test_a_slice_that_joins_a_recovery_is_in_its_slices_and_a_pause_dips_the_active_slices(tmp_path):
    """Two slices lost at once: the history's second event `joins` the first's recovery (one recovery, both
    slices); its wait lines are a pause, drawn as the slices up (1) from the pause until the next step."""
    lines = [_step(1.0, 1, active=3), _step(2.0, 2, active=3),
             {"kind": "event", "t": 2.1, "pid": 1, "cause": "slice_down", "slices": [2], "at_step": 2},
             {"kind": "event", "t": 2.2, "pid": 1, "cause": "slice_down", "slices": [1], "at_step": 2, "joins": True},
             {"kind": "wait", "t": 2.2, "pid": 1, "blocked": True, "up": 1, "at_step": 2, "desired": 3},
             {"kind": "wait", "t": 5.0, "pid": 1, "blocked": False, "up": 1, "at_step": 2, "desired": 3},
             _step(6.0, 3, active=2)]
    (tmp_path / "history.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    data = timeline.timeline_data(timeline.read_history(tmp_path))
    [r] = data.recoveries
    assert (r.cause, r.slices, r.at_step, r.seconds) == ("slice_down", [1, 2], 2, pytest.approx(3.9))
    [p] = data.pauses
    assert (p.t, p.t_end, p.at_step, p.up, p.desired) == (pytest.approx(1.2), pytest.approx(4.0), 2, 1, 3)
    t, loss, _, active, _ = timeline.drawn_series(data)
    assert active == [3, 3, 1, 2] and t[2] == pytest.approx(1.2) and loss[2] != loss[2]  # (NaN: no step there)
    assert data.active == [3, 3, 2]  # (the steps' own series is unchanged)
    assert timeline.draw(tmp_path).is_file()
