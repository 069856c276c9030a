"""SIGTERM stops a test session the way Ctrl-C does: fixtures tear down.

A CI runner, ``timeout`` or a person ends a long run with SIGTERM. Python's
default action for it ends the interpreter at once, so no fixture finalizer
runs and every process the running tests started (launchers, controllers,
workers, API servers, Docker engines) is left behind. Raising
KeyboardInterrupt instead makes pytest stop the session and run each active
fixture's teardown, which stops those processes by PID.
"""

from __future__ import annotations

import signal


def _interrupt(signum, frame):  # noqa: ARG001 - signal handler signature
    # Once: a second SIGTERM during teardown ends the run at once, as before.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config):  # noqa: ARG001 - pytest hook signature
    """Install the handler in the main pytest process (not in test subprocesses)."""
    signal.signal(signal.SIGTERM, _interrupt)
