"""The local run's progress lines (non-terminal output, as in CI logs)."""

import io

from rich.console import Console

from elastic_jax.api.control import ControllerStatus
from elastic_jax.local.progress import ProgressView


def _status(phase: str, step: int, tps: float | None) -> ControllerStatus:
    return ControllerStatus(phase=phase, step=step, total_steps=100, desired_slices=2, min_slices=1,
                            active_slices=[0] if phase != "Running" else [0, 1], inactive_slices=[], slices=[],
                            loss=2.5, tokens_per_second=tps, recoveries={"slice_down": 1}, pid=1)


def test_lines_show_throughput_only_while_running(capsys):
    view = ProgressView(100, console=Console(file=io.StringIO(), force_terminal=False))
    with view:
        view.update(_status("Running", 10, 1234.0))
        view.update(_status("Recovering", 20, 1234.0))  # the last window's rate would be stale here
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "[Running] step 10/100 loss 2.500 1,234 tok/s slices 2/2 recoveries 1"
    assert lines[1] == "[Recovering] step 20/100 loss 2.500 - tok/s slices 1/2 recoveries 1"
