"""Live progress of a local run: a rich progress bar on a terminal, plain lines otherwise."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from elastic_jax.api.control import ControllerStatus


class ProgressView:
    """Shows step, loss, throughput, active/desired slices and recoveries.

    Args:
      total_steps: the run's length in steps.
      console: where to draw (stderr by default, so stdout keeps the SUMMARY line clean).
    """

    def __init__(self, total_steps: int, console: Console | None = None):
        self.console = console or Console(stderr=True)
        self.total_steps = total_steps
        self.live = self.console.is_terminal
        self._next_line_step = 0
        self._progress = Progress(
            TextColumn("[bold]{task.fields[phase]:<16}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}  {task.fields[tps]} tok/s  slices {task.fields[slices]}  recoveries {task.fields[rec]}"),
            TimeElapsedColumn(),
            console=self.console,
            disable=not self.live,
        )
        self._said: set[str] = set()  # warnings printed (a stall, a setting), each once
        self._task = self._progress.add_task("train", total=total_steps, phase="Starting", loss="-", tps="-", slices="-", rec=0)

    def __enter__(self) -> "ProgressView":
        self._progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.__exit__(*exc)

    def update(self, status: ControllerStatus) -> None:
        """Renders one polled status."""
        loss = "-" if status.loss is None else f"{status.loss:.3f}"
        # Throughput is measured over training windows; while paused or recovering it would be stale.
        running = status.phase == "Running"
        tps = "-" if status.tokens_per_second is None or not running else f"{status.tokens_per_second:,.0f}"
        slices = f"{len(status.active_slices)}/{status.desired_slices}"
        rec = sum(v for k, v in status.recoveries.items() if k != "scale_up")
        self._progress.update(self._task, completed=status.step, phase=status.phase, loss=loss, tps=tps, slices=slices, rec=rec)
        # What the controller found wrong while running (a stall in its own code, a setting too short): said at once.
        for warning in ([status.stalled] if status.stalled else []) + list(status.setting_warnings):
            key = warning.split(" for ")[0] if warning.startswith("stalled:") else warning
            if key not in self._said:
                self._said.add(key)
                # (one line, never wrapped: a `warning:` line is read, and grepped, whole)
                self.console.print(f"warning: {warning}", soft_wrap=True, markup=False, highlight=False)
        if not status.stalled:
            self._said = {w for w in self._said if not w.startswith("stalled:")}  # a later stall is said again
        if not self.live and (status.step >= self._next_line_step or status.phase not in ("Running",)):
            if status.step >= self._next_line_step:
                self._next_line_step = status.step + max(1, self.total_steps // 10)
                print(f"[{status.phase}] step {status.step}/{self.total_steps} loss {loss} {tps} tok/s "
                      f"slices {slices} recoveries {rec}", file=sys.stderr, flush=True)

    def message(self, text: str) -> None:
        """Prints a line above the bar: whole (never wrapped at the console's width, 80 columns when stderr is no
        terminal: a URL or a path is read and copied whole) and as written (no markup, no highlighting)."""
        self.console.print(text, soft_wrap=True, markup=False, highlight=False)
