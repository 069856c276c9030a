"""Live progress of a local run: a rich progress bar on a terminal, plain lines otherwise."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from elastic_jax.api.control import ControllerStatus


class ProgressView:
    """Shows step, loss, throughput, active/desired slices and recoveries.

    Before the first step a note says what the start-up is doing (a new user read `step 0/N` of a resumed
    run as lost steps, and `slices 0/3` at start-up as a pause): resuming from the newest checkpoint step, or
    starting the workers.

    Args:
      total_steps: the run's length in steps.
      console: where to draw (stderr by default, so stdout keeps the SUMMARY line clean).
      resuming_from: the newest checkpoint step found before the run started (steps), None for none.
    """

    def __init__(self, total_steps: int, console: Console | None = None, resuming_from: int | None = None):
        self.console = console or Console(stderr=True)
        self.total_steps = total_steps
        self.resuming_from = resuming_from
        self.live = self.console.is_terminal
        self._next_line_step = 0
        self._last_line: tuple[str, str] | None = None  # (phase, note) of the last plain line
        self._progress = Progress(
            TextColumn("[bold]{task.fields[phase]:<16}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]}  {task.fields[tps]} tok/s  slices {task.fields[slices]}  recoveries {task.fields[rec]}"),
            TimeElapsedColumn(),
            TextColumn("{task.fields[note]}"),
            console=self.console,
            disable=not self.live,
        )
        self._said: set[str] = set()  # warnings printed (a stall, a setting), each once
        self._task = self._progress.add_task("train", total=total_steps, phase="Starting", loss="-", tps="-", slices="-", rec=0,
                                            note=self._note(None))

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
        note = self._note(status)
        self._progress.update(self._task, completed=status.step, phase=status.phase, loss=loss, tps=tps, slices=slices,
                              rec=rec, note=note)
        # What the controller found wrong while running (a stall in its own code, a setting too short): said at once.
        for warning in ([status.stalled] if status.stalled else []) + list(status.setting_warnings):
            key = warning.split(" for ")[0] if warning.startswith("stalled:") else warning
            if key not in self._said:
                self._said.add(key)
                # (one line, never wrapped: a `warning:` line is read, and grepped, whole)
                self.console.print(f"warning: {warning}", soft_wrap=True, markup=False, highlight=False)
        if not status.stalled:
            self._said = {w for w in self._said if not w.startswith("stalled:")}  # a later stall is said again
        # Plain lines (no terminal): every tenth of the run, and at each change of phase or note.
        if not self.live and (status.step >= self._next_line_step or (status.phase, note) != self._last_line):
            self._last_line = (status.phase, note)
            if status.step >= self._next_line_step:
                self._next_line_step = status.step + max(1, self.total_steps // 10)
            print(f"[{status.phase}] step {status.step}/{self.total_steps} loss {loss} {tps} tok/s "
                  f"slices {slices} recoveries {rec}" + (f" ({note})" if note else ""), file=sys.stderr, flush=True)

    def _note(self, status: ControllerStatus | None) -> str:
        """What the start-up is doing while no step has been trained or restored; "" after that.

        A controller restarted during the run starts again at step 0 too: the newest committed step any earlier
        status reported is where it resumes from (a trial saw `[Starting] step 0/300` after a controller's
        SIGKILL at step 236, and read it as training from scratch)."""
        if status is not None and status.last_committed_checkpoint_step:
            self.resuming_from = max(self.resuming_from or 0, status.last_committed_checkpoint_step)
        if status is not None and (status.step or status.resumed_from is not None or status.recovery_history):
            return ""
        if status is not None and status.phase == "Running":
            return "" if self.resuming_from else "compiling the first step"
        if status is not None and status.phase not in ("Starting", "WaitingForSlices"):
            return ""
        if self.resuming_from:
            return f"resuming from checkpoint step {self.resuming_from}"
        return "starting the workers" if status is not None and status.phase == "WaitingForSlices" else ""

    def message(self, text: str) -> None:
        """Prints a line above the bar: whole (never wrapped at the console's width, 80 columns when stderr is no
        terminal: a URL or a path is read and copied whole) and as written (no markup, no highlighting)."""
        self.console.print(text, soft_wrap=True, markup=False, highlight=False)
