"""Issue 29 item 1 on the chip: the real `PathwaysBackend` and the loop's `TrainingRun` on a TPU.

Run as one pytest process (`pytest tests/tpu -m tpu`; benchmarks/tpu_session.sh
does it on the TPU machine). Each scenario is a child process that opens the
chip, runs, and exits cleanly before the next starts, since one program at a
time holds the chip; the pytest process itself never opens it. Skipped with the
reason where no TPU is attached (conftest.py). The same scenarios run on CPU
host devices in CI: tests/integration/test_pathways_scenarios.py.

On the chip the device → slice mapping is the backend's own default
(`device.slice_index`), as a user's TPU VM gets it; the chip is one slice.
Orbax's Pathways array handler reads only through the Pathways proxy (an IFRT
plugin program), which a TPU VM does not run: checkpoints are written and read
with Orbax's standard handler, and the Pathways handler is registered (as
pathwaysutils 0.1.13 registers it) only to check the restore target it would be
given (`pathways_handler_verdict`).
"""

import pytest

from tests.support import pathways_scenarios as sc

pytestmark = pytest.mark.tpu

# One scenario on the chip: open it (6-11 s), compile the small model, train; a stuck one must leave time
# for the rest within the session's limit (benchmarks/tpu_session.sh). A killed child holds the chip ~12 s.
TIMEOUT_S = 100.0


def test_trains_the_builtin_lm_on_the_chip(tmp_path):
    sc.check_train(sc.run_scenario("train", tmp_path, "tpu", TIMEOUT_S))


def test_committed_step_restores_into_named_sharding_arrays_on_the_chip(tmp_path):
    sc.check_restore(sc.run_scenario("restore", tmp_path, "tpu", TIMEOUT_S))


def test_injected_slice_loss_loses_no_step_on_the_chip(tmp_path):
    sc.check_slice_loss(sc.run_scenario("slice_loss", tmp_path, "tpu", TIMEOUT_S))


def test_second_process_resumes_from_the_committed_step_on_the_chip(tmp_path):
    first = sc.run_scenario("resume_first", tmp_path, "tpu", TIMEOUT_S)
    sc.check_resume(first, sc.run_scenario("resume_second", tmp_path, "tpu", TIMEOUT_S))
