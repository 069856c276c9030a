"""e2e/kind/run.sh: shellcheck-clean everywhere; run end to end where Docker and kind exist.

The script builds the images, so it needs a Docker engine; these machines have
none (and no kind), so the end-to-end test skips here and says why. It runs
as one subprocess in its own session, stopped by PID (its process group) if
it outlives the timeout.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "run.sh"
TIMEOUT_S = 45 * 60  # image builds (JAX wheels) plus a ~2-minute job on a small machine


def test_run_sh_is_shellcheck_clean():
    shellcheck = Path(sys.executable).parent / "shellcheck"
    proc = subprocess.run([str(shellcheck), "--severity=style", "--external-sources", str(SCRIPT)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _why_not_runnable() -> str | None:
    for tool in ("docker", "kind"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (e2e/kind/run.sh needs docker with an engine, and kind)"
    try:
        info = subprocess.run(["docker", "info"], capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        return "docker info timed out: no reachable Docker engine"
    if info.returncode != 0:
        return "docker cannot reach an engine (docker info failed): the kind test builds images"
    return None


def test_kind_end_to_end():
    reason = _why_not_runnable()
    if reason:
        pytest.skip(reason)
    proc = subprocess.Popen(["bash", str(SCRIPT)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)  # the script's trap deletes the cluster it created
        try:
            out, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        pytest.fail(f"e2e/kind/run.sh did not finish in {TIMEOUT_S}s:\n{out[-5000:]}")
    assert proc.returncode == 0, out[-5000:]
    assert "OK: job Succeeded" in out
