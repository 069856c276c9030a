"""Issue 31 item 11 (accelerate#2016): resuming with another global batch size or seed.

`validate`, `validate --trainer` and `run` exited 0 and "resumed from checkpoint
step 20" with the changed fields never named: the data order and what a step
means to the optimizer changed silently. The built-in loop records both with
each step; a resume must match them unless `spec.checkpoint.allowDataChange`
says the change is intended. Real runs (controller, workers, Orbax) on disk and
on the GCS emulator (where only the controller can read the step: its own
refusal, exit 2, is what `run` reports).
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import yaml

from tests.support.runs import ROOT, job_manifest, run_cli

CLI = str(Path(sys.executable).parent / "elastic-jax")
BATCH = "spec.training.globalBatchSize 16 (checkpoint step 20 was trained with 8)"
SEED = "spec.training.seed 1 (checkpoint step 20 was trained with 0)"


def _first(tmp_path: Path, uri: str, env: dict | None = None) -> dict:
    m = job_manifest("datachange", tmp_path, slices={"count": 1},
                     training={"steps": 20, "globalBatchSize": 8, "seed": 0, "logEverySteps": 5},
                     checkpoint={"uri": uri, "intervalSteps": 10})
    first = run_cli(m, tmp_path, "--no-failure", env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    assert first.summary["last_committed_checkpoint_step"] == 20
    return m


def _changed(m: dict) -> dict:
    m = copy.deepcopy(m)
    m["spec"]["training"].update({"steps": 40, "globalBatchSize": 16, "seed": 1})
    return m


def _validate(tmp_path: Path, manifest: dict, *flags: str) -> subprocess.CompletedProcess:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return subprocess.run([CLI, "validate", *flags, str(path)], capture_output=True, text=True, timeout=180,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)})


def _refused(code: int, stderr: str, *fragments: str) -> None:
    errors = [ln for ln in stderr.splitlines() if ln.startswith("error: ")]
    assert code == 2 and errors, (code, stderr[-3000:])
    assert "Traceback" not in stderr
    line = next((e for e in errors if all(f in e for f in fragments)), None)
    assert line is not None, (fragments, errors)
    assert "spec.checkpoint.allowDataChange" in line


def test_a_changed_batch_size_and_seed_are_refused_naming_both_unless_allowed(tmp_path):
    m = _first(tmp_path, str(tmp_path / "ckpt"))
    changed = _changed(m)
    for flags in ((), ("--trainer",)):
        proc = _validate(tmp_path, changed, *flags)
        _refused(proc.returncode, proc.stderr, BATCH, SEED)
    refused = run_cli(changed, tmp_path, "--no-failure")
    _refused(refused.returncode, refused.stderr, BATCH, SEED)
    assert "resumed from checkpoint" not in refused.stderr

    changed["spec"]["checkpoint"]["allowDataChange"] = True
    assert _validate(tmp_path, changed).returncode == 0
    allowed = run_cli(changed, tmp_path, "--no-failure")
    assert allowed.returncode == 0, allowed.stderr[-3000:]
    assert allowed.summary["restored_from_step"] == 20 and allowed.summary["steps"] == 40
    log = allowed.controller_log()
    assert "spec.checkpoint.allowDataChange" in log and BATCH in log and SEED in log, log[-3000:]
    # Trial finding C5: the run's own output says so too (it was in controller.log only), once, naming both.
    said = [ln for ln in allowed.stderr.splitlines() if ln.startswith("warning: spec.checkpoint.allowDataChange")]
    assert said == ["warning: spec.checkpoint.allowDataChange: true: resumed from checkpoint step 20 with a changed "
                    f"data order: {BATCH}, {SEED}"], allowed.stderr[-3000:]


def test_the_controller_refuses_a_changed_seed_on_gcs_with_exit_2(tmp_path, gcs_emulator):
    """gs:// steps are read by the controller only: its refusal before any worker starts is the job's reason."""
    bucket = gcs_emulator.make_bucket("ej-datachange")
    m = _first(tmp_path, f"{bucket}/job", env=gcs_emulator.env)
    changed = _changed(m)
    changed["spec"]["training"]["globalBatchSize"] = 8
    refused = run_cli(changed, tmp_path, "--no-failure", env=gcs_emulator.env)
    _refused(refused.returncode, refused.stderr, SEED)
    assert "globalBatchSize" not in [ln for ln in refused.stderr.splitlines() if ln.startswith("error: ")][-1]
