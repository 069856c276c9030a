"""``apt-get``, one at a time on this machine.

The suite installs Debian packages where they are missing (root, Debian): the
kind tier's Docker engine (:func:`e2e.kind.engine.ensure_packages`) and
Prometheus (:func:`tests.support.prometheus.ensure_prometheus`). Under the
suite's lanes (:mod:`tests.support.lanes`) two of these can run at once, and a
second ``apt-get`` fails at once on dpkg's lock ("Could not get lock
/var/lib/dpkg/lock-frontend"). Ours take :data:`LOCK` first; an ``apt-get``
of someone else's waits for dpkg's own lock (``DPkg::Lock::Timeout``).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from pathlib import Path

LOCK = Path("/var/lock/elastic-jax-apt.lock")
"""Held while one of the suite's apt-get commands runs (machine-wide: every checkout's runs share dpkg)."""
DPKG_LOCK_TIMEOUT_S = 600
"""How long apt-get waits for dpkg's lock held by another program (seconds)."""


def apt_get(*args: str, **run_kwargs) -> subprocess.CompletedProcess:
    """``apt-get ARGS`` (non-interactive) once no other of the suite's apt-get runs; ``subprocess.run``'s
    keyword arguments pass through (``check``, ``capture_output``...)."""
    env = dict(run_kwargs.pop("env", None) or os.environ, DEBIAN_FRONTEND="noninteractive")
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    with open(LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        return subprocess.run(["apt-get", "-o", f"DPkg::Lock::Timeout={DPKG_LOCK_TIMEOUT_S}", *args],
                              env=env, **run_kwargs)
