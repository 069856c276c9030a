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


def _starting(phase: str, step: int = 0, **fields) -> ControllerStatus:
    return ControllerStatus(phase=phase, step=step, total_steps=100, desired_slices=3, min_slices=1, active_slices=[],
                            inactive_slices=[0, 1, 2], slices=[], recoveries={}, pid=1, **fields)


def test_a_resumed_start_says_which_step_it_restores_until_it_has(capsys):
    # A new user read `[Starting] step 0/100` of a resumed run as its steps lost.
    view = ProgressView(100, console=Console(file=io.StringIO(), force_terminal=False), resuming_from=40)
    with view:
        view.update(_starting("Starting"))
        view.update(_starting("Running", 40, resumed_from={"step": 40}))
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "[Starting] step 0/100 loss - - tok/s slices 0/3 recoveries 0 (resuming from checkpoint step 40)"
    assert lines[1] == "[Running] step 40/100 loss - - tok/s slices 0/3 recoveries 0"


def test_a_new_start_waiting_for_its_workers_says_so_and_a_later_pause_does_not(capsys):
    # `[WaitingForSlices] slices 0/3` at start-up read as a pause; a real pause later keeps its plain line.
    view = ProgressView(100, console=Console(file=io.StringIO(), force_terminal=False))
    with view:
        view.update(_starting("Starting"))
        view.update(_starting("WaitingForSlices"))
        view.update(_starting("WaitingForSlices", 30))
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "[Starting] step 0/100 loss - - tok/s slices 0/3 recoveries 0"
    assert lines[1].endswith("slices 0/3 recoveries 0 (starting the workers)"), lines
    assert lines[2] == "[WaitingForSlices] step 30/100 loss - - tok/s slices 0/3 recoveries 0"


def test_a_restarted_controller_says_where_it_resumes_and_a_first_step_says_it_compiles(capsys):
    # A trial: after a controller SIGKILL at step 236 the line read `[Starting] step 0/300` with no hint; a new
    # run sat at `[Running] step 0/300 ... slices 3/3` while its first step compiled.
    view = ProgressView(100, console=Console(file=io.StringIO(), force_terminal=False))
    with view:
        view.update(_starting("Running"))
        view.update(_starting("Running", 60, last_committed_checkpoint_step=50))
        view.update(_starting("Starting"))  # the replacement controller, before it restored
        view.update(_starting("Running", 50, resumed_from={"step": 50}))
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].endswith("(compiling the first step)"), lines
    assert lines[1] == "[Running] step 60/100 loss - - tok/s slices 0/3 recoveries 0"
    assert lines[2].startswith("[Starting] step 0/100") and lines[2].endswith("(resuming from checkpoint step 50)")
    assert lines[3] == "[Running] step 50/100 loss - - tok/s slices 0/3 recoveries 0"
