"""`elastic-jax run` draws its run (timeline.png from the controllers' history.jsonl); `elastic-jax report DIR`
draws it again. Real runs: a real CLI, controller and worker processes, one worker SIGKILLed mid-run, the run
stopped with SIGINT once the worker's slice has rejoined."""

from __future__ import annotations

import os
import subprocess

import yaml

from elastic_jax import timeline
from tests.support.runs import CLI, ROOT, CliRun, interrupt_when, job_manifest, leftover_processes

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# Long enough never to end by itself: the run is stopped (SIGINT) once the killed slice has rejoined.
STEPS = 100_000
STEPS_SHOWN_AFTER_REJOIN = 10  # steps on 3 slices again before the stop, so the picture shows the recovery


def _png_size(path) -> tuple[int, int]:
    """(width, height) in pixels from the PNG's IHDR chunk."""
    head = path.read_bytes()[:24]
    assert head[:8] == PNG_MAGIC, f"{path} is not a PNG"
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def _rejoined_and_trained_on(run_dir) -> bool:
    """Whether the run's history shows a dip below 3 active slices and then STEPS_SHOWN_AFTER_REJOIN steps on 3."""
    try:
        active = [r["active"] for r in timeline.read_history(run_dir) if r["kind"] == "step"]
    except timeline.TimelineError:  # (no history yet)
        return False
    dip = next((i for i, a in enumerate(active) if a < 3), None)
    return dip is not None and active[dip:].count(3) >= STEPS_SHOWN_AFTER_REJOIN


def test_a_run_with_a_killed_worker_draws_the_slice_dip_and_the_recovery(tmp_path):
    # 3 slices, 2 minimum: the killed slice's worker is replaced and rejoins (a scale-up) while training goes on
    # on 2. The run is held until the rejoin is in its history, whatever the load (the replaced worker's start,
    # a JAX process and its program, takes longer under load: 300 steps were too few at load 20, and a fixed
    # 1200 cost 36 s on a quiet machine), then stopped with SIGINT, as Ctrl-C: the picture is drawn then too.
    manifest = job_manifest("timeline", tmp_path, slices={"count": 3, "minSlices": 2},
                            training={"steps": STEPS, "globalBatchSize": 12, "logEverySteps": 10})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    workdir = tmp_path / "run"
    proc = subprocess.Popen([CLI, "run", str(path), "--workdir", str(workdir), "--kill-at-step", "40"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)
    out, err = interrupt_when(proc, lambda: _rejoined_and_trained_on(workdir), str(tmp_path))
    assert not leftover_processes(str(tmp_path)), "processes left running"
    run = CliRun(proc.returncode, out, err, workdir)
    assert run.returncode == 130, run.stderr[-3000:]  # (interrupted: every process stopped, a SUMMARY)
    s = run.summary
    killed = s["injected_failure"]
    assert killed is not None and s["recoveries"] >= 1 and s["interrupted"]

    # The picture: where the report says, a PNG of a sane size.
    png = run.workdir / "timeline.png"
    assert s["timeline"] == str(png) and f"timeline {png}" in run.stderr
    width, height = _png_size(png)
    assert 400 <= width <= 2000 and 300 <= height <= 2000
    assert 5_000 < png.stat().st_size < 1_000_000

    # What it plots: every step, the slices dipping to 2 after the kill and back to 3 after the rejoin,
    # the slice_down marked at the last step on 3 slices, at or after the step the launcher killed the worker at
    # (the controller may have completed a few steps between the launcher's poll and the kill).
    data = timeline.timeline_data(timeline.read_history(run.workdir))
    assert data.step[0] == 1 and sorted(set(data.step)) == list(range(1, data.step[-1] + 1))
    assert set(data.desired) == {3}
    first_dip = next(i for i, a in enumerate(data.active) if a < 3)
    assert data.active[first_dip] == 2 and data.active[:first_dip] == [3] * first_dip
    assert data.active[first_dip:].count(3) >= STEPS_SHOWN_AFTER_REJOIN, "the rejoin is not in the plotted series"
    downs = [r for r in data.recoveries if r.cause == "slice_down"]
    assert len(downs) == 1 and downs[0].slices == [killed["slice"]]
    assert killed["at_step"] <= downs[0].at_step == data.step[first_dip - 1]
    assert downs[0].seconds is not None and downs[0].seconds > 0
    assert data.step[first_dip] == downs[0].at_step + 1  # the first step on 2 slices is the next one
    assert data.t[first_dip - 1] <= downs[0].t <= data.t[first_dip]
    assert any(r.cause == "scale_up" for r in data.recoveries)
    assert all(v is None or v > 0 for v in data.steps_per_second) and data.loss[-1] < data.loss[0]

    # `report DIR` draws it again for the finished run.
    png.unlink()
    again = subprocess.run([CLI, "report", str(run.workdir)], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip() == f"timeline {png}" and _png_size(png) == (width, height)


def test_report_on_a_folder_with_nothing_to_draw_is_one_error_line_exit_2(tmp_path):
    cases = {
        "missing": (tmp_path / "nope", "not a directory"),
        "empty": (tmp_path / "empty", "no history.jsonl"),
        "no step": (tmp_path / "nostep", "no completed step recorded"),
    }
    (tmp_path / "empty").mkdir()
    (tmp_path / "nostep").mkdir()
    (tmp_path / "nostep" / "history.jsonl").write_text('{"kind": "event", "t": 1, "pid": 1, "cause": "slice_down", '
                                                      '"slices": [0], "at_step": 0}\n{"torn')
    for name, (folder, words) in cases.items():
        r = subprocess.run([CLI, "report", str(folder)], capture_output=True, text=True, timeout=120)
        assert r.returncode == 2, (name, r.stderr)
        assert r.stderr.count("\n") == 1 and r.stderr.startswith("error: ") and words in r.stderr, (name, r.stderr)
        assert "Traceback" not in r.stderr and not (folder / "timeline.png").exists()
