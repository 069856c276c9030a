"""The controller's signal handling: SIGTERM, SIGINT and SIGHUP end the run as a controller loss, after a checkpoint.

One implementation for the built-in controller (`main.py`) and the library's
`Runtime.install_signal_handlers()`, and one rule for what a stop means
(`StopState`: a stop request or a signal, and which wins).
"""

from __future__ import annotations

import os
import signal
import threading
from collections.abc import Callable

from elastic_jax.exit_codes import ControllerExit

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


class StopState:
    """Why a run is stopping, for both loops (`TrainingRun.request_stop`, the library's `POST /v1/stop` and signals).

    A stop request (`POST /v1/stop`: Ctrl-C of `elastic-jax run`, a suspend) ends the run as
    `STOPPED` (exit 4); a bare signal (a node's graceful shutdown, preemption, a stray kill) as
    `RESTART` (exit 75), a controller loss its supervisor recovers by starting a new controller.
    A request overrides an earlier signal (the user's intent is known); a later signal never
    downgrades a request. Thread-safe.

    Attributes:
      kind: None, "requested" or "signal".
      reason: what stopped it, e.g. "SIGTERM" or "suspend" ("" before).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.kind: str | None = None
        self.reason = ""

    def note(self, reason: str, *, requested: bool) -> None:
        """Records a stop request (`requested`) or a signal, by the precedence above."""
        kind = "requested" if requested else "signal"
        with self._lock:
            if self.kind is None or (kind == "requested" and self.kind == "signal"):
                self.kind, self.reason = kind, reason

    @property
    def exit_code(self) -> int | None:
        """4 (`ControllerExit.STOPPED`) after a request, 75 (`ControllerExit.RESTART`) after a signal, else None."""
        return {"requested": int(ControllerExit.STOPPED), "signal": int(ControllerExit.RESTART)}.get(self.kind)
