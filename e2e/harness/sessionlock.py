"""One test session per cluster folder at a time.

A session that may start, wipe or stop the cluster in a folder holds an
exclusive ``flock`` on ``<folder>.lock`` (beside the folder, which a fresh
start wipes) until it ends; a second session on the same folder waits instead
of killing the first one's processes. Runs in other folders
(``E2E_CLUSTER_DIR``, ``E2E_PORT_BASE``) are not affected.
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path


def lock_path(state: Path) -> Path:
    """``e2e/.cluster`` -> ``e2e/.cluster.lock``."""
    return state.with_name(state.name + ".lock")


def acquire(state: Path, on_wait=None, timeout_s: float = 3600) -> int:
    """Take the folder's lock; returns the file descriptor that holds it (close it to release).

    Args:
        state: the cluster folder.
        on_wait: called once with a message when another session holds the lock.
        timeout_s: how long to wait for the other session.

    Raises:
        TimeoutError: the other session kept the lock for ``timeout_s``.
    """
    path = lock_path(state)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + timeout_s
    told = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if not told and on_wait:
                on_wait(f"e2e: another test session uses {state}; waiting for it to finish")
                told = True
            if time.monotonic() > deadline:
                os.close(fd)
                raise TimeoutError(f"{path} stayed locked for {timeout_s:.0f}s") from None
            time.sleep(1)
