"""Where the local cluster keeps its binaries, state and logs.

Everything lives under ``e2e/`` in folders ignored by git: ``e2e/.build/bin``
for binaries and ``e2e/.cluster`` for certificates, etcd data, logs, PID files
and the files each pod's containers write. ``E2E_BUILD_DIR`` and
``E2E_CLUSTER_DIR`` move them elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path

E2E_DIR = Path(__file__).resolve().parent.parent
REPO_ROOT = E2E_DIR.parent


def build_dir() -> Path:
    """Folder that ``build.sh`` fills (``bin/`` inside)."""
    return Path(os.environ.get("E2E_BUILD_DIR", E2E_DIR / ".build")).resolve()


def bin_dir() -> Path:
    """Folder holding localcluster, its part symlinks, jobset-controller and helm."""
    return build_dir() / "bin"


def cluster_dir() -> Path:
    """Folder holding one cluster's state; one cluster per folder."""
    return Path(os.environ.get("E2E_CLUSTER_DIR", E2E_DIR / ".cluster")).resolve()
