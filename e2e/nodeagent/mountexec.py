"""Runs first inside a container's new mount namespace: mount the pod's volumes, then exec the container.

Usage (by :mod:`e2e.nodeagent.containers`, as a script, stdlib only)::

    python -I mountexec.py SPEC_JSON ARGV...

``SPEC_JSON`` is ``{"mounts": [[source, target, read_only], ...], "workdir": path}``.
Every source is opened (``O_PATH``) before the first mount and bound from its
``/proc/self/fd`` link with ``mount(2)``, so a mount path that hides the
agent's state folder (a pod mounting something at ``/work``) cannot hide the
sources of the mounts after it. Exits 126 with a message when a mount fails,
127 when the command is not found (as a shell would).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys

MS_RDONLY = 1
MS_REMOUNT = 32
MS_BIND = 4096

_libc = ctypes.CDLL(None, use_errno=True)


def _mount(source: str | None, target: str, flags: int) -> None:
    src = source.encode() if source is not None else None
    if _libc.mount(src, target.encode(), None, flags, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source or ''} on {target}: {os.strerror(err)}")


def _ensure_target(source: str, target: str) -> None:
    """Create a missing mount point (a folder for a folder, else an empty file).

    The agent created it before the start, but mount points are host paths shared by every cluster on
    the host, and another cluster's teardown removes the empty ones it created: CI beside other local
    clusters saw `mount ... on /etc/elastic-jax/manifest: No such file or directory` (exit 126).
    """
    if os.path.lexists(target):
        return
    if os.path.isdir(source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target) or "/", exist_ok=True)
        with open(target, "a"):
            pass


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print("usage: mountexec.py SPEC_JSON ARGV...", file=sys.stderr)
        return 2
    spec = json.loads(argv[0])
    command = argv[1:]
    try:
        fds = [os.open(src, os.O_PATH) for src, _, _ in spec["mounts"]]
        for fd, (src, target, read_only) in zip(fds, spec["mounts"]):
            _ensure_target(src, target)
            _mount(f"/proc/self/fd/{fd}", target, MS_BIND)
            if read_only:
                _mount(None, target, MS_REMOUNT | MS_BIND | MS_RDONLY)
        for fd in fds:
            os.close(fd)
        os.makedirs(spec["workdir"], exist_ok=True)
        os.chdir(spec["workdir"])
    except OSError as e:
        print(f"container setup failed: {e}", file=sys.stderr)
        return 126
    sys.stdout.flush()
    try:
        os.execvp(command[0], command)
    except OSError as e:
        print(f"exec {command[0]}: {e.strerror}", file=sys.stderr)
        return 127 if isinstance(e, FileNotFoundError) else 126


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
