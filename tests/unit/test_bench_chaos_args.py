"""benchmarks/bench_chaos.py's command line: bad input is a usage error naming the flag, before anything runs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_chaos.py"


@pytest.mark.parametrize("args, flag", [
    (["--arms", "elastc"], "--arms"),  # a misspelt arm was dropped silently: the run measured only `none`
    (["--repeats", "0"], "--repeats"),  # ended in a StatisticsError traceback after the setup
    (["--period", "0"], "--period"),
    (["--period", "nan"], "--period"),
    (["--steps", "-5"], "--steps"),
    (["--node-loss-tick", "-1"], "--node-loss-tick"),  # (tick 0 is the first: e2e/chaos.py counts from 0)
])
def test_bad_arguments_are_a_usage_error_naming_the_flag(args, flag):
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert f"error: {flag}: " in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
