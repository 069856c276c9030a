"""Runs ``e2e/build.sh`` so binaries exist before a cluster starts."""

from __future__ import annotations

import subprocess
import time

from e2e.harness.paths import E2E_DIR, bin_dir

REQUIRED = ("localcluster", "etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler",
            "kubectl", "jobset-controller", "helm", "kind", "crictl")


def ensure_built(timeout_s: float = 3600) -> float:
    """Build (or verify up to date) every binary; return the seconds it took.

    Raises:
        RuntimeError: the build failed or a binary is missing afterwards;
            the message holds the end of the build output.
    """
    start = time.monotonic()
    proc = subprocess.run(["bash", str(E2E_DIR / "build.sh")], capture_output=True, text=True,
                          timeout=timeout_s)
    if proc.returncode != 0:
        raise RuntimeError(f"e2e/build.sh failed ({proc.returncode}):\n{(proc.stdout + proc.stderr)[-4000:]}")
    missing = [b for b in REQUIRED if not (bin_dir() / b).exists()]
    if missing:
        raise RuntimeError(f"e2e/build.sh left no {missing} in {bin_dir()}")
    return time.monotonic() - start
