"""The controller's signal handling: SIGTERM, SIGINT and SIGHUP end the run as a controller loss, after a checkpoint.

One implementation for the built-in controller (`main.py`) and the library's
`Runtime.install_signal_handlers()`.
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

# Signals that end the run as a controller loss (exit RESTART), after a checkpoint.
LOSS_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def forward_signals_to(on_signal: Callable[[int], object]) -> None:
    """Calls `on_signal(signum)` on a helper thread for each of `LOSS_SIGNALS` (call from the main thread).

    The handler itself only writes the signal number to a pipe. Stopping takes
    locks (the backend's, a queue's) that the interrupted main thread may be
    holding at that very bytecode; taking them inside the handler deadlocked
    the controller (seen under load: SIGTERM, then nothing, until SIGKILL).

    Raises:
      ValueError: not called from the main thread (Python's `signal.signal`).
    """
    if threading.current_thread() is not threading.main_thread():
        raise ValueError("signal handlers can only be installed from the main thread")
    read_fd, write_fd = os.pipe()

    def watch() -> None:
        while True:
            data = os.read(read_fd, 1)
            if not data:
                return
            on_signal(data[0])

    threading.Thread(target=watch, name="signal-forwarder", daemon=True).start()
    for sig in LOSS_SIGNALS:
        signal.signal(sig, lambda signum, _frame: os.write(write_fd, bytes([signum])))
