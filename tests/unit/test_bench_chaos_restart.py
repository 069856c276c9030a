"""The chaos benchmark's full-restart arms (`benchmarks/bench_chaos.py`, `e2e/chaos.py`): their pure parts.

What a restart costs is read from the controllers' logs (`_restart_costs`):
the steps re-done and the seconds from each kill to the next step. Checked
against logs written by the product's own JSON formatter, so a change of the
log schema breaks this test, not the benchmark's numbers.
"""

from __future__ import annotations

import logging
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from e2e.chaos import Plan, committed_steps, run_arm, tick_due
from e2e.harness import processes
from elastic_jax.logs import JsonFormatter

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_chaos import _restart_costs  # noqa: E402


def _log(path: Path, records: list[tuple[float, str, dict]]) -> Path:
    """A controller log: one JSON line per (ts, message, extra) record, as the controller writes it."""
    formatter = JsonFormatter()
    lines = []
    for ts, msg, extra in records:
        record = logging.makeLogRecord({"name": "elastic_jax.controller", "levelno": logging.INFO,
                                        "levelname": "INFO", "msg": msg, "args": (), **extra})
        record.created = ts
        lines.append(formatter.format(record))
    path.write_text("\n".join(lines) + "\n")
    return path


def _steps(first_ts: float, steps: range) -> list[tuple[float, str, dict]]:
    return [(first_ts + k, f"step {s}", {"event": "step", "step": s, "active_slices": [0, 1]})
            for k, s in enumerate(steps)]


def test_restart_costs_count_redone_steps_and_time_to_the_next_step(tmp_path):
    # run 0 trains 1..12 and is killed at t=112.5; run 1 restores step 10, trains 11..25, killed at t=130.5;
    # run 2 restores step 20 and trains 21..30. Re-done: 12-10 + 25-20 = 7.
    logs = [
        _log(tmp_path / "0.log", _steps(101, range(1, 13))),
        _log(tmp_path / "1.log", [(115, "restored checkpoint step 10 (data position: batch 10)", {}),
                                  *_steps(116, range(11, 26))]),
        _log(tmp_path / "2.log", [(140, "restored checkpoint step 20", {}), *_steps(141, range(21, 31))]),
    ]
    lost, recoveries, unrecovered = _restart_costs(logs, [112.5, 130.5])
    assert lost == 7
    assert recoveries == pytest.approx([116 - 112.5, 141 - 130.5])
    assert unrecovered == 0


def test_a_restart_killed_before_its_first_step_is_unrecovered_and_redoes_nothing_twice(tmp_path):
    # run 1 restores step 10 and is killed (t=120) before it trains; run 2 restores 10 again.
    logs = [
        _log(tmp_path / "0.log", _steps(101, range(1, 14))),
        _log(tmp_path / "1.log", [(118, "restored checkpoint step 10", {})]),
        tmp_path / "never-started.log",  # a controller pod that logged nothing before it was killed
        _log(tmp_path / "3.log", [(150, "restored checkpoint step 10", {}), *_steps(151, range(11, 21))]),
    ]
    lost, recoveries, unrecovered = _restart_costs(logs, [114, 120, 130])
    assert lost == 3  # 13 - 10 once; the runs that trained nothing re-did nothing
    assert recoveries == pytest.approx([151 - 130])
    assert unrecovered == 2


def test_no_checkpoint_restored_means_every_step_is_redone(tmp_path):
    logs = [_log(tmp_path / "0.log", _steps(101, range(1, 9))), _log(tmp_path / "1.log", _steps(120, range(1, 21)))]
    lost, recoveries, unrecovered = _restart_costs(logs, [109])
    assert (lost, unrecovered) == (8, 0)
    assert recoveries == pytest.approx([11])


def test_a_whole_job_arm_needs_checkpoints_that_outlive_the_controller_pod(tmp_path):
    # Refused before anything touches a cluster: with the pod's own emptyDir every restart would start at step 0.
    with pytest.raises(ValueError, match="outlive"):
        run_arm(None, tmp_path / "kubeconfig", tmp_path, 10, Plan(every=5, whole_job=True), random.Random(0))


def test_committed_steps_reads_the_checkpointers_own_commit_lines(tmp_path):
    # The real Checkpointer saving to a local folder, its log through the product's formatter: the line the
    # restart arm's plan waits for (Plan.after_commit) is the one the controller writes once a step is stored.
    import numpy as np

    from elastic_jax.controller import checkpointing

    log = tmp_path / "controller.log"
    handler = logging.FileHandler(log)
    handler.setFormatter(JsonFormatter())
    checkpointing.logger.addHandler(handler)
    # setLevel, not `.level =`: only setLevel clears the loggers' isEnabledFor cache, and in the whole suite an
    # earlier test had left INFO cached as off for this logger (its lines were lost; the file alone passed).
    # Nor may an earlier test's disabled flag, filters or global logging.disable drop them.
    previous = checkpointing.logger.level
    checkpointing.logger.setLevel(logging.INFO)
    was_disabled, checkpointing.logger.disabled = checkpointing.logger.disabled, False
    filters, checkpointing.logger.filters = checkpointing.logger.filters, []
    global_disable = logging.root.manager.disable
    logging.disable(logging.NOTSET)
    ckpt = checkpointing.Checkpointer(str(tmp_path / "ckpt"), 5, 2)
    try:
        assert committed_steps(log) == []
        for step in (5, 10):
            assert ckpt.maybe_save(step, {"w": np.arange(4, dtype=np.float32)}, {"next_batch_index": step})
            ckpt.wait_until_finished()
    finally:
        ckpt.close()
        checkpointing.logger.removeHandler(handler)
        checkpointing.logger.setLevel(previous)
        checkpointing.logger.disabled = was_disabled
        checkpointing.logger.filters = filters
        logging.disable(global_disable)
        handler.close()
    assert committed_steps(log) == [5, 10]
    assert committed_steps(tmp_path / "never-written.log") == [] and committed_steps(None) == []


def test_an_after_commit_tick_waits_for_a_commit_by_the_controller_started_since_the_last_one(tmp_path):
    plan = Plan(every=10, unit="step", whole_job=True, after_commit=True)
    first = _log(tmp_path / "0.log", _steps(100, range(1, 12)))
    # Step 11 reached, nothing committed yet: no tick (the next controller would start from step 0).
    assert not tick_due(plan, 0, 11, [first], 0)
    first = _log(tmp_path / "0.log", [*_steps(100, range(1, 12)), (112, "checkpoint step 5 committed in 0.40s", {})])
    assert tick_due(plan, 0, 11, [first], 0)
    assert not tick_due(plan, 0, 9, [first], 0)  # (the step still decides when)
    # Killed at tick 0: until its replacement's log appears, the old log's commit does not count, at any step.
    assert not tick_due(plan, 1, 25, [first], 1)
    second = _log(tmp_path / "1.log", [(120, "restored checkpoint step 5", {}), *_steps(121, range(6, 22))])
    assert not tick_due(plan, 1, 21, [first, second], 1)
    second = _log(tmp_path / "1.log", [(120, "restored checkpoint step 5", {}), *_steps(121, range(6, 22)),
                                       (140, "checkpoint step 10 committed in 0.40s", {})])
    assert tick_due(plan, 1, 21, [first, second], 1)
    # Without after_commit only the step decides (the seconds-unit bench arms keep their schedule).
    assert tick_due(Plan(every=10, unit="step", whole_job=True), 0, 11, [tmp_path / "none.log"], 0)
    assert not tick_due(Plan(every=10, unit="step", whole_job=True, max_ticks=1), 1, 30, [first], 0)
    with pytest.raises(ValueError, match="after_commit"):
        Plan(every=10, after_commit=True)


def test_belongs_tells_a_cluster_process_from_a_stranger(tmp_path):
    env = {**os.environ, processes.MARKER_ENV: str(tmp_path)}
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=env)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert processes.belongs(tmp_path, ours.pid)
        assert not processes.belongs(tmp_path, stranger.pid)
        assert not processes.belongs(tmp_path / "other", ours.pid)
    finally:
        for proc in (ours, stranger):
            proc.kill()
            proc.wait()
    assert not processes.belongs(tmp_path, ours.pid)  # gone
