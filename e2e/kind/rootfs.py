"""A Debian root file system as a tar, made with ``mmdebstrap`` (the base of every image built here).

``mmdebstrap`` (root mode) mounts ``/proc`` and ``/sys`` inside a chroot under
``$TMPDIR`` and unmounts them at the end. In a loaded CI run that unmount once
failed with ``umount: .../proc: target is busy`` (the chroot lived in the
shared ``/tmp``, where any process walking ``/tmp`` can hold it for a moment),
and the whole kind tier errored. So the chroot lives in a private folder beside
the output, and one such failure is tried again.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path

ATTEMPTS = 2
"""mmdebstrap runs at most this many times (a busy unmount at its cleanup is transient)."""


def debian_tar(suite: str, tar: Path, variant: str, packages: list[str] | tuple[str, ...],
               extra_args: list[str] | tuple[str, ...] = (), log=print) -> None:
    """Writes ``tar``: ``mmdebstrap --variant=VARIANT --include=PACKAGES SUITE TAR``.

    Args:
      suite: the Debian suite (``bookworm``).
      tar: where the root file system's tar goes (its folder holds the chroot).
      variant: mmdebstrap's ``--variant``.
      packages: ``--include`` packages.
      extra_args: more mmdebstrap options (``--dpkgopt=...``).
      log: progress printer.

    Raises:
      subprocess.CalledProcessError: mmdebstrap failed ``ATTEMPTS`` times (the last one's stderr tail).
    """
    argv = ["mmdebstrap", "--quiet", f"--variant={variant}", f"--include={','.join(packages)}", *extra_args,
            suite, str(tar)]
    for attempt in range(1, ATTEMPTS + 1):
        with tempfile.TemporaryDirectory(prefix="chroot-", dir=tar.parent) as private_tmp:
            proc = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "TMPDIR": private_tmp})
        if proc.returncode == 0:
            return
        if attempt < ATTEMPTS:
            log(f"mmdebstrap failed (exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:]}); trying again")
            tar.unlink(missing_ok=True)
            time.sleep(5)
    raise subprocess.CalledProcessError(proc.returncode, argv, proc.stdout, proc.stderr[-4000:])
