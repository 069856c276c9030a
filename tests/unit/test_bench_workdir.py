"""The TPU benchmarks refuse a scratch folder that holds an earlier run (it would resume, not measure)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.pathways_scenarios import require_empty

REPO = Path(__file__).resolve().parents[2]


def test_an_empty_or_missing_workdir_is_accepted(tmp_path):
    require_empty(tmp_path)
    require_empty(tmp_path / "new")


def test_a_workdir_holding_an_earlier_run_is_refused_naming_it(tmp_path):
    (tmp_path / "main-10" / "ckpt").mkdir(parents=True)
    with pytest.raises(SystemExit, match=r"--workdir: .*main-10 is not empty"):
        require_empty(tmp_path / "main-10")


def test_the_ratio_child_refuses_before_training(tmp_path):
    # The second `tpu_session.sh ratio` of one device call reused the first's folder: a traceback after a
    # resumed run with no step to time. Now one line and exit 1 before JAX trains anything.
    (tmp_path / "main-10" / "leftover").mkdir(parents=True)
    proc = subprocess.run([sys.executable, "benchmarks/bench_tpu.py", "--child", "main", "--platform", "cpu",
                           "--workdir", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert "is not empty" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
