"""The local run's SUMMARY says what this run did (issue 11, session 15's trial): a job whose checkpoints
already held its last step "trained" nothing, and the wall clock and the booked seconds goodput divides by are
both there, with the difference named. `LocalLauncher.summary` over a controller's `summary.json` as the
controller writes it; no process is started."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from elastic_jax.api.manifest import parse_manifest
from elastic_jax.cli import _print_report
from elastic_jax.local.launcher import LaunchOptions, LocalLauncher

STEPS = 300


def _launcher(tmp_path: Path) -> LocalLauncher:
    job = parse_manifest({"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob",
                          "metadata": {"name": "s"},
                          "spec": {"slices": {"count": 1}, "training": {"steps": STEPS, "globalBatchSize": 1},
                                   "checkpoint": {"uri": "gs://test-bucket/s"}}})
    launcher = LocalLauncher(job, tmp_path / "job.yaml", LaunchOptions(workdir=tmp_path / "run"))
    launcher.slices = []
    return launcher


def _summary(tmp_path: Path, run: dict, wall_seconds: float) -> dict:
    launcher = _launcher(tmp_path)
    (tmp_path / "run").mkdir(exist_ok=True)
    (tmp_path / "run" / "summary.json").write_text(json.dumps(run))
    return launcher.summary(wall_seconds, 0)


def test_a_run_that_restored_the_last_step_trained_0_steps_and_was_already_finished(tmp_path, capsys):
    """The gs:// case (a local folder is caught before any process starts): the controller restores step 300
    of 300 and trains nothing; `steps` 300 read as if it had trained them."""
    s = _summary(tmp_path, {"succeeded": True, "steps": STEPS, "restored_from_step": STEPS,
                            "last_committed_checkpoint_step": STEPS, "goodput_seconds": {"restoring": 4.0}}, 9.0)
    assert (s["steps"], s["steps_this_run"], s["already_finished"], s["nothing_started"]) == (STEPS, 0, True, False)
    _print_report(s, earlier_steps={})
    err = capsys.readouterr().err
    assert f"already finished at checkpoint step {STEPS}/{STEPS}; trained 0 steps this run" in err, err
    assert "succeeded after" not in err


def test_a_resumed_run_says_how_many_steps_it_trained_itself(tmp_path, capsys):
    s = _summary(tmp_path, {"succeeded": True, "steps": STEPS, "restored_from_step": 200,
                            "goodput_seconds": {"productive": 10.0}, "goodput": 1.0}, 12.0)
    assert (s["steps_this_run"], s["already_finished"]) == (100, False)
    _print_report(s, earlier_steps={})
    assert f"succeeded after {STEPS}/{STEPS} steps (100 this run) in 12 s" in capsys.readouterr().err


def test_a_fresh_run_trained_every_step(tmp_path):
    s = _summary(tmp_path, {"succeeded": True, "steps": STEPS, "goodput_seconds": {"productive": 10.0}}, 12.0)
    assert (s["steps_this_run"], s["already_finished"]) == (STEPS, False)


def test_the_first_controllers_restore_is_where_the_run_started(tmp_path):
    """A restarted controller resumes from a checkpoint this run saved: the run still started at step 0."""
    launcher = _launcher(tmp_path)
    launcher._resumed_at(0)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "summary.json").write_text(json.dumps(
        {"succeeded": True, "steps": STEPS, "restored_from_step": 250, "goodput_seconds": {"productive": 1.0}}))
    assert launcher.summary(5.0, 1)["steps_this_run"] == STEPS


def test_the_finished_summary_started_nothing_and_trained_nothing(tmp_path, capsys):
    s = _launcher(tmp_path).finished_summary(STEPS, None)
    assert (s["steps_this_run"], s["already_finished"], s["nothing_started"]) == (0, True, True)
    assert s["wall_seconds"] == s["booked_seconds"] == s["unbooked_seconds"] == 0
    _print_report(s, earlier_steps={})
    assert "trained 0 steps this run, nothing was started" in capsys.readouterr().err


def test_wall_and_booked_seconds_add_up_and_the_report_names_the_difference(tmp_path, capsys):
    """`wall_seconds` is the launcher's clock; goodput divides the controllers' booked seconds (as on a
    cluster); `unbooked_seconds` is the launcher's own start-up and shutdown between them."""
    booked = {"starting": 3.0, "productive": 40.0, "recovering": 1.5}
    s = _summary(tmp_path, {"succeeded": True, "steps": STEPS, "goodput_seconds": booked, "goodput": 40 / 44.5},
                 51.0)
    assert s["booked_seconds"] == pytest.approx(sum(booked.values()))
    assert s["booked_seconds"] + s["unbooked_seconds"] == pytest.approx(s["wall_seconds"])
    assert s["goodput"] == pytest.approx(40 / s["booked_seconds"], abs=1e-4)
    _print_report(s, earlier_steps={})
    assert ("goodput 89.9% of 44.5 s booked by the controllers; the launcher's own 6.5 s of the 51.0 s wall "
            "(start-up, shutdown) are not") in capsys.readouterr().err


def test_the_report_names_a_lost_controllers_gap_among_the_unbooked_seconds(tmp_path, capsys):
    """A new-user trial: the back-off before a lost controller's successor (no controller runs, nothing books
    it) was printed as "(start-up, shutdown)"."""
    booked = {"starting": 3.0, "productive": 40.0}
    launcher = _launcher(tmp_path)
    (tmp_path / "run").mkdir(exist_ok=True)
    (tmp_path / "run" / "summary.json").write_text(json.dumps({"succeeded": True, "steps": STEPS,
                                                               "goodput_seconds": booked, "goodput": 40 / 43}))
    s = launcher.summary(73.0, 1)
    _print_report(s, earlier_steps={})
    assert ("the launcher's own 30.0 s of the 73.0 s wall (start-up, waits for a lost controller's successor, "
            "shutdown) are not") in capsys.readouterr().err


@pytest.mark.parametrize("started, expected", [(161, "resumed from checkpoint step 161"), (0, None)])
def test_the_report_says_where_the_run_started_not_where_a_successor_resumed(tmp_path, capsys, started, expected):
    """A new-user trial: a run resumed from 161, its controller was killed and the successor resumed from 200;
    the report said "resumed from checkpoint step 200" (the last controller's). A run from scratch whose
    successor resumed said it had resumed at all."""
    launcher = _launcher(tmp_path)
    launcher._resumed_at(started)
    launcher.controller_losses.append({"cause": "lost", "exit_code": -9, "at_step": 230, "resumed_from_step": None,
                                       "steps_lost": None})
    launcher._resumed_at(200)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "summary.json").write_text(json.dumps(
        {"succeeded": True, "steps": STEPS, "restored_from_step": 200, "goodput_seconds": {"productive": 1.0},
         "resumed_from": {"step": 200, "fallbackReason": None, "writer": None}}))
    s = launcher.summary(5.0, 1)
    assert s["started_from_step"] == started and s["restored_from_step"] == 200
    _print_report(s, earlier_steps={})
    err = capsys.readouterr().err
    assert "its successor resumed from step 200" in err, err
    if expected is None:
        assert "resumed from checkpoint step" not in err, err
    else:
        assert expected in err and "resumed from checkpoint step 200" not in err, err


def test_a_run_stopped_before_any_summary_reports_what_the_controllers_last_answered(tmp_path, capsys):
    """A new-user trial: a Ctrl-C while a successor controller started (or within a second of the start) left no
    controller summary, and the report read `interrupted after None/300 steps`, `last committed step none`
    with committed steps on disk."""
    from elastic_jax.api.control import ControllerStatus

    launcher = _launcher(tmp_path)
    launcher._last_status = ControllerStatus.model_construct(phase="Running", step=98,
                                                             last_committed_checkpoint_step=50)
    (tmp_path / "run").mkdir()
    s = launcher.summary(5.0, 1)
    assert (s["steps"], s["last_committed_checkpoint_step"]) == (98, 50), s


def test_a_run_stopped_before_any_controller_answered_says_so(tmp_path, capsys):
    job = parse_manifest({"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob",
                          "metadata": {"name": "s"},
                          "spec": {"slices": {"count": 1}, "training": {"steps": STEPS, "globalBatchSize": 1},
                                   "checkpoint": {"uri": str(tmp_path / "ckpt")}}})
    (tmp_path / "ckpt" / "62").mkdir(parents=True)  # a committed step of an earlier run
    launcher = LocalLauncher(job, tmp_path / "job.yaml", LaunchOptions(workdir=tmp_path / "run"))
    launcher.slices = []
    (tmp_path / "run").mkdir()
    s = launcher.summary(1.0, 0)
    assert (s["steps"], s["last_committed_checkpoint_step"]) == (None, 62), s
    s["interrupted"], s["succeeded"] = True, False
    _print_report(s, earlier_steps={})
    err = capsys.readouterr().err
    assert "interrupted before its controller answered" in err and "None" not in err, err
    assert "last committed step 62" in err, err
