"""benchmarks/bench_tpu.py keeps working without a TPU: its CPU smoke run, and its refusal to call CPU a TPU.

The smoke run (`--platform cpu`: a tiny model on 2 CPU host devices as one
slice) runs every part the chip runs (start cold and warm, fused step, runtime
step, slice loss, steps lost) and must say it is CPU. No timing is asserted.
"""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "bench_tpu.py"


def test_cpu_smoke_run_is_labelled_cpu_and_writes_every_figure(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--platform", "cpu", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["platform"] == "cpu" and result["device_kind"] == "cpu", result
    assert "NOT a TPU result" in result["label"] and result["met"] is None, result
    assert "CPU smoke run: NOT a TPU result" in proc.stdout
    for key in ("fused_step_s", "runtime_step_s", "ratio", "recovery_s", "start_to_first_step_cold_s",
                "start_to_first_step_warm_s"):
        assert result[key] > 0, (key, result)
    assert result["recovery_slices"] == [0] and isinstance(result["steps_lost"], int), result
    assert result["cache_entries_after_cold"] > 0, result  # the warm start had a cache to read
    assert result["command"] == f"python benchmarks/bench_tpu.py --platform cpu --out {out}"


def test_tpu_run_without_a_tpu_is_refused_not_reported(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr[-4000:]
    assert "is a TPU attached?" in proc.stderr
    assert not out.exists()


def test_largest_ladder_cpu_smoke_trains_every_rung_with_the_state_split_over_the_slice(tmp_path):
    # benchmarks/bench_tpu_largest.py (issue 29 item 4) on 2 CPU host devices as one slice: every rung of
    # the tiny ladder trains, and FSDP puts half of each rung's state on each device.
    out = tmp_path / "largest.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_tpu_largest.py"), "--platform", "cpu",
                           "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert "NOT a TPU result" in result["label"] and result["stopped_by"] is None, result
    assert [r["rung"] for r in result["rungs"]] == [0, 1], result["rungs"]
    for rung in result["rungs"]:
        assert rung["finite"] and rung["devices_holding_state"] == 2, rung
        # Odd-sized leaves (Adam's count) stay whole on both devices: a little over half.
        assert rung["state_bytes"] / 2 <= rung["max_device_state_bytes"] < 0.51 * rung["state_bytes"], rung
