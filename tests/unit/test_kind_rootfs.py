"""e2e/kind/rootfs.py: mmdebstrap's chroot lives beside the output, and one failed cleanup is tried again.

A stand-in ``mmdebstrap`` on PATH (a shell script) plays the program: this
tests our own retry logic, not Debian's tool (the kind tier runs the real one).
"""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from e2e.kind import rootfs

_STANDIN = """#!/bin/sh
echo "$TMPDIR" >> "{log}"
n=$(wc -l < "{log}")
if [ "$n" -le "{fail_times}" ]; then
  echo "umount: $TMPDIR/mmdebstrap.x/proc: target is busy." >&2
  exit 25
fi
for last; do :; done
echo rootfs > "$last"
"""


def _standin(tmp_path: Path, monkeypatch, fail_times: int) -> Path:
    bin_dir, log = tmp_path / "bin", tmp_path / "calls.log"
    bin_dir.mkdir()
    script = bin_dir / "mmdebstrap"
    script.write_text(_STANDIN.format(log=log, fail_times=fail_times))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(rootfs.time, "sleep", lambda s: None)
    return log


def test_a_busy_unmount_is_tried_again_in_a_private_tmpdir(tmp_path, monkeypatch):
    log = _standin(tmp_path, monkeypatch, fail_times=1)
    out = tmp_path / "out"
    out.mkdir()
    said: list[str] = []
    rootfs.debian_tar("bookworm", out / "rootfs.tar", "minbase", ["python3"], log=said.append)
    assert (out / "rootfs.tar").read_text() == "rootfs\n"
    tmpdirs = log.read_text().split()
    assert len(tmpdirs) == 2 and all(Path(t).parent == out for t in tmpdirs)  # never the shared /tmp
    assert "target is busy" in said[0]


def test_a_failure_that_persists_is_raised_with_its_stderr(tmp_path, monkeypatch):
    _standin(tmp_path, monkeypatch, fail_times=rootfs.ATTEMPTS)
    with pytest.raises(subprocess.CalledProcessError) as info:
        rootfs.debian_tar("bookworm", tmp_path / "rootfs.tar", "minbase", ["python3"], log=lambda m: None)
    assert info.value.returncode == 25 and "target is busy" in info.value.stderr
