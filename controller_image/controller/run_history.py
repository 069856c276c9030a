"""The run's history file: one JSON line per completed step and per elastic event, for the timeline picture.

The local launcher gives its controllers a run folder (`contract.ENV_RUN_DIR`); a controller with one appends
to `<run folder>/history.jsonl` (`HISTORY_FILE`), and `elastic_jax.timeline` draws it. Every controller of
the run appends to the same file (a restarted one after its predecessor), so a rewind after a controller loss
shows as a step lower than the line before it.

Lines (`t`: wall clock, `time.time()` seconds; `pid`: the writing controller):
  {"kind": "step", "t", "pid", "step", "loss" (float or null), "active" (slices in the step), "desired"}
  {"kind": "event", "t", "pid", "cause", "slices" (indices), "at_step"[, "joins": true]}
    ("joins": slices found down while the recovery before it waited for slices: that recovery's, not another)
  {"kind": "wait", "t", "pid", "blocked" (true: paused, waiting for slices; false: the wait ended), "up" (healthy
    slices: at the pause's start / the fewest while paused), "at_step", "desired"}

About 100 bytes a step: 100,000 steps are about 10 MB.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any

from elastic_jax.contract import RUN_HISTORY_FILE as HISTORY_FILE  # noqa: F401 - where the runtime writes

_logger = logging.getLogger(__name__)


class RunHistory:
    """Appends the history lines of one controller process to `path` (thread-safe).

    A write that fails (disk full, folder removed) is logged once and the history stops: the picture is
    a convenience, the training must not fail for it.

    Args:
      path: the history file (`<run folder>/history.jsonl`); None: nothing is written.
    """

    def __init__(self, path: str | Path | None):
        self.path = None if path is None else Path(path)
        self._lock = threading.Lock()

    def _append(self, line: dict[str, Any]) -> None:
        if self.path is None:
            return
        text = json.dumps(line, separators=(",", ":")) + "\n"
        with self._lock:
            try:
                with self.path.open("a") as f:
                    f.write(text)
            except OSError as e:
                _logger.warning("cannot append to the run history %s (%s); no more history lines", self.path, e)
                self.path = None

    def step(self, step: int, loss: float | None, active: int, desired: int) -> None:
        """A completed optimizer `step` with its `loss`, trained on `active` of `desired` slices."""
        self._append({"kind": "step", "t": round(time.time(), 3), "pid": os.getpid(), "step": step,
                      "loss": None if loss is None else float(loss), "active": active, "desired": desired})

    def event(self, cause: str, slices: list[int], at_step: int, joins: bool = False) -> None:
        """An elastic event (`RecoveryRecord.cause`: slice_down, hang, drain, scale_up, ...) at `at_step`;
        `joins`: more `slices` of the last event's recovery (found down while it waited for slices)."""
        line = {"kind": "event", "t": round(time.time(), 3), "pid": os.getpid(), "cause": cause,
                "slices": list(slices), "at_step": at_step}
        self._append({**line, "joins": True} if joins else line)

    def wait(self, blocked: bool, up: int, at_step: int, desired: int) -> None:
        """The run paused waiting for slices (`blocked`, `up` healthy of `desired`) at `at_step`, or that pause
        ended (`up`: the fewest healthy slices while it lasted)."""
        self._append({"kind": "wait", "t": round(time.time(), 3), "pid": os.getpid(), "blocked": blocked, "up": up,
                      "at_step": at_step, "desired": desired})

