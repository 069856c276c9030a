"""Issue 29 items 3 and 4, fault 3: recovery on the pathways backend without compiling or restoring on the
critical path, state sharded within a slice, the default device on an active slice.

Runs the real `TrainingRun` and `PathwaysBackend` in a child process with 8 CPU host devices (4 slices
of 2 chips; only `device.slice_index` is substituted). Shown on CPU host devices only: Pathways needs TPUs.
"""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.support import compilation_cache

HERE = Path(__file__).parent
ROOT = HERE.parents[1]


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pwrecover")
    proc = subprocess.run([sys.executable, str(HERE / "pathways_recovery_child.py"), str(tmp)], capture_output=True,
                          text=True, timeout=1500, cwd=ROOT,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", **compilation_cache.child_env()})
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


def test_a_slice_loss_and_its_rejoin_lose_no_step_and_keep_the_loss_curve(result):
    run, ref = result["run"], result["reference"]
    assert run["succeeded"], run["failure"]
    assert run["causes"] == ["slice_down", "scale_up"]
    assert run["steps_lost"] == 0
    # every step computed once (no rewind to a snapshot), and its loss is the no-failure run's
    assert sorted(run["losses"], key=int) == sorted(ref, key=int) and all(len(v) == 1 for v in run["losses"].values())
    got = [run["losses"][s][0] for s in sorted(ref, key=int)]
    want = [ref[s] for s in sorted(ref, key=int)]
    np.testing.assert_allclose(got, want, rtol=1e-4)
    # 6 steps on 4 slices, the lost step retried on slices 1-3, then all 4 again after the rejoin
    actives = run["actives"]
    assert actives[0] == [0, 1, 2, 3] and actives[6] == [0, 1, 2, 3] and actives[7] == [1, 2, 3], actives
    assert actives[-1] == [0, 1, 2, 3], actives


def test_no_compile_on_the_training_thread_during_a_recovery(result):
    compiles = result["compiles"]
    on_main = [c for c in compiles if c["main"] and c["window"] is not None]
    assert on_main == [], on_main
    # the two windows happened (the step after each event completed) and each mesh compiled once on the
    # training thread at most: the first mesh only (its first step), the others ahead
    assert result["run"]["compiled_here"] == [[0, 1, 2, 3]], result["run"]["compiled_here"]


def test_state_is_sharded_within_a_slice_and_each_surviving_slice_holds_a_copy(result):
    run = result["run"]
    for key in ("bytes_before", "bytes_after"):
        per_device = run[key]
        # 8 devices before, the 6 of slices 1-3 after the loss
        assert len(per_device) == (8 if key == "bytes_before" else 6), per_device
        assert len(set(per_device.values())) == 1, per_device
    # The built-in LM's float leaves all have an axis divisible by 2: each device holds half of them, plus
    # what cannot be split (Adam's int32 step counters, replicated: 8 bytes).
    assert run["unsplit_bytes"] == 8
    per_device = next(iter(run["bytes_before"].values()))
    assert per_device == (run["total_bytes"] - 8) // 2 + 8, (per_device, run["total_bytes"])
    assert run["bytes_after"] == {k: v for k, v in run["bytes_before"].items() if int(k) >= 2}


def test_the_default_device_is_on_an_active_slice_in_every_attempt(result):
    run = result["run"]
    for active, default in zip(run["actives"], run["default_slices"]):
        assert default in active, (active, default)


def test_with_no_surviving_replica_the_checkpoint_is_restored_onto_an_active_slice(result):
    single = result["single"]
    assert single["succeeded"], single["failure"]
    assert single["steps_lost"] == 2  # lost after 7 steps, the newest checkpoint is step 5's
    # the state is initialised on an active slice's device: first slice 0, after its loss slice 1
    assert single["init_slices"][0] == [0] and single["init_slices"][-1] == [1], single["init_slices"]
