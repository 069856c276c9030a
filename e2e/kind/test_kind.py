"""e2e/kind/run.sh: shellcheck-clean, and ``run.sh --air-gapped`` green on this machine.

The end-to-end test runs the script as a user would, in its own session,
stopped by PID (its process group) if it outlives the timeout. It reuses this
session's engine and kind cluster (``DOCKER_HOST``, ``KIND_CLUSTER_NAME``), so
what it adds is the script's own path: images (cached), chart, the example in a
PodSecurity ``restricted`` namespace, a worker process SIGKILLed in its
container, and the checks.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

# The first test of a session also pays for what its fixtures build (images, node
# image, cluster, chart: up to ~30 min on a fresh machine under load).
pytestmark = pytest.mark.timeout(3600)

SCRIPT = Path(__file__).resolve().parent / "run.sh"
TIMEOUT_S = 30 * 60


def test_run_sh_is_shellcheck_clean():
    shellcheck = Path(sys.executable).parent / "shellcheck"
    proc = subprocess.run([str(shellcheck), "--severity=style", "--external-sources", str(SCRIPT)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_run_sh_air_gapped_end_to_end(docker_engine, elastic_jax):
    env = dict(docker_engine.env(), KIND_CLUSTER_NAME=elastic_jax.name, PYTHON=sys.executable)
    # 2000 of the example's 6000 steps: enough for the kill and the replacement to land mid-run.
    proc = subprocess.Popen(["bash", str(SCRIPT), "--air-gapped", "--steps", "2000"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, env=env)
    try:
        out, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            out, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        raise AssertionError(f"e2e/kind/run.sh --air-gapped did not finish in {TIMEOUT_S}s:\n{out[-5000:]}")
    finally:
        if proc.poll() is None:  # interrupted (Ctrl-C, pytest-timeout): stop the script's whole group
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, out[-8000:]
    assert "reusing kind cluster" in out, out[-3000:]
    assert "OK: job Succeeded" in out, out[-3000:]
