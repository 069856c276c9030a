"""The TPU tier: skipped, with the reason, where no TPU is attached.

Detection never opens the chip in the pytest process: one program at a time
holds a TPU (a second gets libtpu's lockfile error), and the tier's scenarios
run in child processes that need it. First the device files (free, no JAX):
a TPU VM exposes its chips as `/dev/accel*` (v2-v4) or `/dev/vfio/<n>` (v5e and
later); without either there is no TPU and the tier skips at once, as in CI.
With one, a child process asks JAX (`JAX_PLATFORMS=tpu`) for its devices and
exits cleanly, which releases the chip at once (a SIGKILLed holder keeps it
~12 s): a VFIO device file alone could be another accelerator.
"""

from __future__ import annotations

import functools
import glob
import subprocess
import sys

import pytest

# On the TPU machine the tier runs with --confcutdir=tests/tpu (benchmarks/tpu_session.sh): the root
# conftest, which registers this too, is not loaded there.
pytest.register_assert_rewrite("tests.support.pathways_scenarios")

from tests.support.pathways_scenarios import ROOT, child_env  # noqa: E402

_PROBE = "import jax; d = jax.devices()[0]; print('TPU', d.platform, d.device_kind, len(jax.devices()))"
PROBE_TIMEOUT_S = 180.0


@functools.cache
def tpu_absent_reason() -> str | None:
    """None when a TPU is attached, else why the tier skips (one line)."""
    files = glob.glob("/dev/accel*") + glob.glob("/dev/vfio/[0-9]*")
    if not files:
        return "no TPU attached (no /dev/accel* or /dev/vfio/<n> device file)"
    try:
        proc = subprocess.run([sys.executable, "-c", _PROBE], cwd=ROOT, env=child_env("tpu"), capture_output=True,
                              text=True, timeout=PROBE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        return f"device files {files[:3]} but JAX did not list its devices within {PROBE_TIMEOUT_S:.0f} s"
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("TPU ")]
    if proc.returncode != 0 or not lines or lines[-1].split()[1] != "tpu":
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:300]
        return f"device files {files[:3]} but JAX_PLATFORMS=tpu finds no TPU: {tail}"
    return None


@pytest.fixture(autouse=True)
def _needs_tpu(request):
    if request.node.get_closest_marker("tpu") is not None:
        reason = tpu_absent_reason()
        if reason:
            pytest.skip(reason)
