"""Issue 29 item 1, the CPU twin of tests/tpu/: the same scenarios on 4 CPU host devices as 2 slices of 2.

The real `PathwaysBackend` and `TrainingRun` on the built-in LM, real Orbax on
local disk, one child process per scenario (tests/support/pathways_scenarios.py);
only the device → slice mapping is given (`device.id // 2`: CPU devices have no
`slice_index`). The slice loss takes slice 1 of the two: slice 0 survives with a
full replica of the state.

Orbax's Pathways array handler (`CloudPathwaysArrayHandler`) is registered as
pathwaysutils 0.1.13 registers it only to judge the restore target: pathwaysutils
itself registers it only under `JAX_PLATFORMS=proxy`, and off Pathways it cannot
read (after checking that every target is a `NamedSharding` it compiles an IFRT
plugin program only the Pathways proxy runs: `INVALID_ARGUMENT: PjRtCompiler
requires an HloProgram` here). The checkpoints themselves use Orbax's standard
handler.
"""

from tests.support import pathways_scenarios as sc


def test_trains_the_builtin_lm_on_cpu_slices(tmp_path):
    sc.check_train(sc.run_scenario("train", tmp_path, "cpu"))


def test_committed_step_restores_into_named_sharding_arrays_on_cpu_slices(tmp_path):
    sc.check_restore(sc.run_scenario("restore", tmp_path, "cpu"))


def test_injected_slice_loss_loses_no_step_on_cpu_slices(tmp_path):
    sc.check_slice_loss(sc.run_scenario("slice_loss", tmp_path, "cpu"))


def test_lone_slice_loss_restores_the_host_snapshot_without_compiling(tmp_path):
    # Every device one slice, as on a single TPU chip: no replica survives, the snapshot of every step does.
    result = sc.run_scenario("lone_slice_loss", tmp_path, "cpu")
    assert result["slices"] == 1 and result["host_snapshot_every"] == 1, result
    sc.check_slice_loss(result)


def test_second_process_resumes_from_the_committed_step_on_cpu_slices(tmp_path):
    first = sc.run_scenario("resume_first", tmp_path, "cpu")
    sc.check_resume(first, sc.run_scenario("resume_second", tmp_path, "cpu"))
