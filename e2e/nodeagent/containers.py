"""One container's process: started in its own mount namespace, signalled by process group.

The process is ``unshare --mount`` running :mod:`e2e.nodeagent.mountexec`,
which bind-mounts the pod's volumes (and its ``/etc/hosts``) over their mount
paths, changes to the working directory and ``exec``s the container's argv,
so the program sees
``/var/run/secrets/kubernetes.io/serviceaccount/token`` and friends where
in-cluster clients expect them, and the host sees none of it.

Each container leads its own session (process group), so a signal reaches the
processes it started too; when its main process exits the agent kills the rest
of the group, and the main process dies with the agent (``PR_SET_PDEATHSIG``),
as containers die with their node.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

_PR_SET_PDEATHSIG = 1
_MOUNTEXEC = Path(__file__).with_name("mountexec.py")
_libc = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class Mount:
    """Bind ``source`` (host path) over ``target`` (path the container sees)."""

    source: Path
    target: str
    read_only: bool = False


def _child_setup() -> None:
    # Runs in the child between fork and exec: own session, and SIGKILL when
    # the agent thread that spawned it dies (a lost node takes its pods along).
    os.setsid()
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def ensure_mountpoint(mount: Mount, created_log: Path) -> None:
    """Create ``mount.target`` on the host if missing (a bind mount needs one).

    Created paths are appended to ``created_log`` so cluster teardown can remove
    them again (only when still empty).
    """
    target = Path(mount.target)
    if target.exists():
        return
    missing = []
    p = target
    while not p.exists():
        missing.append(p)
        p = p.parent
    if mount.source.is_dir():
        target.mkdir(parents=True, exist_ok=True)
    else:
        target.parent.mkdir(parents=True, exist_ok=True)
        target.touch()
    with open(created_log, "a") as f:
        for path in missing:
            f.write(f"{path}\n")


def start(argv: list[str], *, env: dict[str, str], mounts: list[Mount], workdir: str,
          log_path: Path, pid_path: Path) -> subprocess.Popen:
    """Start the container process; stdout and stderr are appended to ``log_path``.

    Raises:
        OSError: ``unshare`` could not be started.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    pid_path.parent.mkdir(parents=True, exist_ok=True)
    spec = {"mounts": [[str(m.source), m.target, m.read_only] for m in mounts], "workdir": workdir}
    # -I: the pod's PYTHON* variables must not affect the helper.
    wrapper = ["unshare", "--mount", "--propagation", "private", "--",
               sys.executable, "-I", str(_MOUNTEXEC), json.dumps(spec), *argv]
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(wrapper, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, preexec_fn=_child_setup, close_fds=True)
    pid_path.write_text(str(proc.pid))
    return proc


def signal_group(proc: subprocess.Popen, sig: int) -> None:
    """Send ``sig`` to the container's whole process group (ignore if already gone)."""
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def exit_code(returncode: int) -> int:
    """Container exit code as Kubernetes reports it: 128+N for death by signal N."""
    return 128 - returncode if returncode < 0 else returncode
