"""The library's `Runtime.restore` / `save`: real Orbax on disk, through the built-in trainer's own checkpoint
code (`controller/run_checkpoints.py`), its status over real HTTP, and its summary."""

from __future__ import annotations

import json
import time

import jax.numpy as jnp
import numpy as np
import pytest

from elastic_jax import contract
from elastic_jax.api.checkpoints import CheckpointForeignError, CheckpointMismatchError, CheckpointUnreadableError
from elastic_jax.api.client import ControlClient
from elastic_jax.api.manifest import parse_manifest
from elastic_jax.controller.runtime import Runtime
from tests.support.bad_manifests import pathways_job
from tests.support.runs import close_while_polled

TOKEN = "t0ken"
ME = {contract.ENV_JOB_NAMESPACE: "ml", contract.ENV_JOB_NAME: "lib", contract.ENV_JOB_UID: "uid-me"}


def _runtime(tmp_path, steps=6, resume_from=None, environ=ME, summary="summary.json", count=1):
    manifest = pathways_job("lib")
    manifest["spec"]["slices"].update(count=count, minSlices=1)
    manifest["spec"]["training"].update(steps=steps, globalBatchSize=4)
    manifest["spec"]["controller"] = {"command": ["python", "train.py"]}
    manifest["spec"]["checkpoint"] = {"uri": str(tmp_path / "ckpt"), "intervalSteps": 2, "maxToKeep": 10,
                                      **({"resumeFrom": resume_from} if resume_from else {})}
    return Runtime(parse_manifest(manifest), TOKEN, summary_file=str(tmp_path / summary), environ=environ).start()


def _state(value):
    return {"w": jnp.full((4,), value, jnp.float32), "count": jnp.asarray(0, jnp.int32)}


def _train(rt, first, last):
    for step in range(first + 1, last + 1):
        rt.report_step(step, loss=1.0 / step)
        rt.save(step, _state(float(step)), data={"batch": step * 4})


def test_save_on_schedule_then_a_new_runtime_resumes_from_the_last_committed_step(tmp_path):
    rt = _runtime(tmp_path)
    target = _state(0.0)
    restored = rt.restore(target)
    assert restored.state is target and (restored.step, restored.data) == (0, {})  # nothing committed
    _train(rt, 0, 5)  # saves 2 and 4 (intervalSteps 2); 1, 3, 5 are not due
    assert rt.save(5, _state(5.0), data={"batch": 20}, force=True)  # the final save: committed when it returns
    client = ControlClient(f"http://127.0.0.1:{rt.port}", TOKEN)
    assert client.status().last_committed_checkpoint_step == 5
    final = close_while_polled(rt, client)  # (as the operator reads it; a read and a plain close waited 10 s)
    assert final.step == 5 and final.last_committed_checkpoint_step == 5, final
    client.close()
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["last_committed_checkpoint_step"] == 5 and s["restored_from_step"] is None and not s["succeeded"]
    assert sorted(int(p.name) for p in (tmp_path / "ckpt").iterdir() if p.name.isdigit()) == [2, 4, 5]

    again = _runtime(tmp_path, summary="again.json")
    state, step, data = again.restore(_state(0.0))
    assert step == 5 and data == {"batch": 20} and np.allclose(state["w"], 5.0)
    assert (again.step, again.loss, again.initial_loss, again.restored_from_step) == (5, 1.0 / 5, 1.0, 5)
    client = ControlClient(f"http://127.0.0.1:{again.port}", TOKEN)
    status = client.status()
    assert status.step == 5 and status.resumed_from.step == 5 and status.resumed_from.fallback_reason is None
    assert status.resumed_from.writer.uid == "uid-me"
    _train(again, 5, 6)
    again.save(6, _state(6.0), force=True)
    final = close_while_polled(again, client)
    assert final.step == 6 and final.phase == "Succeeded", final
    client.close()
    s = json.loads((tmp_path / "again.json").read_text())
    assert s["succeeded"] and s["steps"] == 6 and s["last_committed_checkpoint_step"] == 6
    assert s["restored_from_step"] == 5 and s["resumed_from"]["step"] == 5


def test_a_run_that_restores_the_last_step_and_makes_none_reports_no_loss(tmp_path):
    """A finished job run again: `restore` brings back step 6 and the losses saved with it, and no step is
    made. Its summary gave those losses as its own (`loss 1.000 -> 0.167`); now null: no step, no loss."""
    rt = _runtime(tmp_path)
    _train(rt, 0, 6)
    rt.save(6, _state(6.0), force=True)
    rt.close()
    again = _runtime(tmp_path, summary="again.json")
    assert again.restore(_state(0.0)).step == 6 and again.loss == 1.0 / 6  # (its books still say where it is)
    again.close()
    s = json.loads((tmp_path / "again.json").read_text())
    assert s["succeeded"] and s["steps"] == 6 and s["restored_from_step"] == 6, s
    assert s["initial_loss"] is None and s["final_loss"] is None and s["goodput"] is None, s


def test_a_corrupt_newest_step_falls_back_to_the_older_one(tmp_path):
    rt = _runtime(tmp_path)
    _train(rt, 0, 4)
    rt.close()
    metadata = tmp_path / "ckpt" / "4" / "state" / "_METADATA"
    metadata.write_bytes(metadata.read_bytes()[: metadata.stat().st_size // 2])
    again = _runtime(tmp_path, summary="again.json")
    state, step, data = again.restore(_state(0.0))
    assert step == 2 and data == {"batch": 8} and np.allclose(state["w"], 2.0)
    # (snapshot: the status read in-process; `status()` counts as a supervisor's read, which `close` then waits
    # up to 10 s to see again)
    assert "step 4" in again.snapshot().resumed_from.fallback_reason
    again.close()


def _truncate_largest_data_file(step_dir):
    """Cuts the largest array data file of a real Orbax step in half (what a full disk or a killed copy does)."""
    files = sorted((p for p in (step_dir / "state").rglob("*") if p.is_file() and p.parent.name == "d"),
                   key=lambda p: p.stat().st_size)
    files[-1].write_bytes(files[-1].read_bytes()[: files[-1].stat().st_size // 2])


def test_a_truncated_data_file_falls_back_with_a_short_readable_reason(tmp_path):
    """A new-user trial: the newest step's largest data file truncated. The fallback was right, but its
    reason (SUMMARY, /v1/status, the operator's status) held TensorStore's whole text, object reprs and all
    (`<bound method pybind11_detail_function_record_v1_...spec of TensorStore(...)>`). Now: the step, the
    exception type and the first line of its message, no reprs, bounded."""
    rt = _runtime(tmp_path)
    _train(rt, 0, 4)
    rt.close()
    _truncate_largest_data_file(tmp_path / "ckpt" / "4")
    again = _runtime(tmp_path, summary="again.json")
    state, step, data = again.restore(_state(0.0))
    assert step == 2 and data == {"batch": 8} and np.allclose(state["w"], 2.0)
    reason = again.snapshot().resumed_from.fallback_reason  # (in-process: see the test above)
    again.close()
    assert reason.startswith("newer committed steps could not be restored: step 4: ValueError: "), reason
    assert "<" not in reason and "\n" not in reason and len(reason) <= 300, reason
    s = json.loads((tmp_path / "again.json").read_text())
    assert s["resumed_from"]["fallbackReason"] == reason


def test_every_step_unreadable_says_so_not_that_the_state_does_not_fit(tmp_path):
    """Every committed step truncated: the error named a changed model ("does not fit this trainer's state").
    Now one line naming spec.checkpoint.uri, every step tried with its short reason, and the way out; a
    `CheckpointMismatchError` still (the job fails: unusable checkpoints)."""
    rt = _runtime(tmp_path)
    _train(rt, 0, 4)
    rt.close()
    for step in (2, 4):
        _truncate_largest_data_file(tmp_path / "ckpt" / str(step))
    again = _runtime(tmp_path, summary="again.json")
    with pytest.raises(CheckpointUnreadableError) as raised:
        again.restore(_state(0.0))
    again.close()
    message = str(raised.value)
    assert isinstance(raised.value, CheckpointMismatchError)
    assert message.startswith(f"spec.checkpoint.uri {str(tmp_path / 'ckpt')!r}: no committed checkpoint step "
                              "could be restored (4: ValueError: "), message
    assert "; 2: ValueError: " in message and message.endswith("delete them or use --fresh"), message
    assert "does not fit" not in message and "<" not in message and "\n" not in message, message


def test_a_state_of_another_shape_still_does_not_fit(tmp_path):
    """The genuine case keeps its message: intact steps of another shape (a changed model)."""
    rt = _runtime(tmp_path)
    _train(rt, 0, 4)
    rt.close()
    again = _runtime(tmp_path, summary="again.json")
    with pytest.raises(CheckpointMismatchError) as raised:
        again.restore({"w": jnp.zeros((8,), jnp.float32), "count": jnp.asarray(0, jnp.int32)})
    again.close()
    assert not isinstance(raised.value, CheckpointUnreadableError)
    assert "checkpoint step 4 does not fit this trainer's state" in str(raised.value)
    assert "is not compatible with the stored shape" in str(raised.value)


def test_another_jobs_checkpoint_is_refused_unless_resume_from_any(tmp_path):
    rt = _runtime(tmp_path)
    _train(rt, 0, 2)
    rt.close()
    other = {**ME, contract.ENV_JOB_UID: "uid-other"}
    stranger = _runtime(tmp_path, environ=other, summary="other.json")
    with pytest.raises(CheckpointForeignError, match="spec.checkpoint"):
        stranger.restore(_state(0.0))
    stranger.close()
    taker = _runtime(tmp_path, environ=other, resume_from="Any", summary="taker.json")
    assert taker.restore(_state(0.0)).step == 2
    taker.close()


def test_a_draining_slice_is_let_go_after_a_committed_save(tmp_path):
    rt = _runtime(tmp_path, count=2)
    client = ControlClient(f"http://127.0.0.1:{rt.port}", TOKEN)
    for index in (0, 1):
        client.report_slice(index, "Ready", time.time_ns(), addresses=[f"10.0.0.{index}:8471"])
    attempts = []

    @rt.elastic_retry(minimum_slice_count=1)
    def train():
        attempts.append(sorted(rt.active_slices))
        rt.report_step(len(attempts) * 3, loss=0.5)
        rt.check_drain(rt.step, _state(float(rt.step)), data={"batch": 1})  # no drain: nothing saved
        if len(attempts) == 1:
            client.report_slice(1, "Draining", time.time_ns(), reason="preempted soon")
            rt.check_drain(rt.step, _state(float(rt.step)), data={"batch": 1})
        return "done"

    assert train() == "done"
    assert attempts == [[0, 1], [0]]  # the draining slice was let go, training went on without it
    assert rt.last_committed_checkpoint_step == 3  # saved (step 3, not due by intervalSteps 2) before it went
    assert [(r.cause, r.slices, r.at_step) for r in client.status().recovery_history] == [("draining", [1], 3)]
    close_while_polled(rt, client)
    client.close()


_UNCAUGHT = '''
import sys
import jax.numpy as jnp
from tests.integration.test_runtime_checkpoints import _runtime
from pathlib import Path
rt = _runtime(Path(sys.argv[1]), summary="again.json")
rt.install_signal_handlers()
rt.restore({"w": jnp.zeros((7,), jnp.float32), "count": jnp.asarray(0, jnp.int32)})  # (before `with rt:`)
with rt:
    pass
'''


def test_the_uncaught_exception_that_ends_the_program_is_the_runs_failure_reason(tmp_path):
    """The new-user trial: a restore onto a target no committed step fits, before `with rt:` (as
    examples/04-own-loop.py calls it), raised CheckpointMismatchError, seen only in the traceback; the
    summary said "the program ended at step 0 of 6", and the exit printed a warning from the checkpointer
    closed after the interpreter's shutdown began ("cannot schedule new futures")."""
    import subprocess
    import sys

    from tests.support.runs import ROOT

    rt = _runtime(tmp_path)
    rt.save(5, _state(5.0), force=True)
    rt.close()
    run = subprocess.run([sys.executable, "-c", _UNCAUGHT, str(tmp_path)], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert run.returncode == 1, run.stderr[-3000:]
    s = json.loads((tmp_path / "again.json").read_text())
    reason = s["failure_reason"]
    assert reason.startswith("CheckpointMismatchError: spec.checkpoint.uri") and "\n" not in reason, s
    assert not s["succeeded"] and s["exit_code"] == 1, s
    assert "CheckpointMismatchError" in run.stderr  # the traceback still shows
    assert "cannot schedule new futures" not in run.stderr, run.stderr[-3000:]
