"""The stand-in's container setup (`e2e/nodeagent/mountexec.py`) in a real mount namespace."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

MOUNTEXEC = Path(__file__).resolve().parents[2] / "e2e" / "nodeagent" / "mountexec.py"


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root and unshare")
def test_a_mount_point_removed_before_the_start_is_created_again(tmp_path):
    """CI beside other local clusters: another cluster's teardown removed the empty mount point file
    /etc/elastic-jax/manifest that this one's agent had created, and the controller's start failed with
    exit 126 ("mount ... No such file or directory"), which failed the job."""
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "manifest").write_text("kind: ElasticTrainingJob\n")
    spec = {"mounts": [[str(tmp_path / "src" / "manifest"), str(tmp_path / "gone" / "manifest"), True],
                       [str(tmp_path / "src"), str(tmp_path / "gone" / "dir"), False]], "workdir": str(tmp_path)}
    run = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", sys.executable, "-I",
                          str(MOUNTEXEC), json.dumps(spec), "cat", str(tmp_path / "gone" / "manifest"),
                          str(tmp_path / "gone" / "dir" / "manifest")], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "kind: ElasticTrainingJob\n" * 2
