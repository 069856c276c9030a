"""`Runtime.take_host_snapshot` / `state_lost` / `recover`: the pathways restore of state lost with a slice, as a library.

A library-mode pathways job (its runtime has no cpu workers: the state is the
program's, on the slices' devices), real HTTP slice reports, real Orbax
checkpoints on local disk. A slice loss inside `elastic_retry` marks the state
lost; the next attempt's `recover` restores the newer of the host snapshot and
the last committed checkpoint, rewinds the step, counts the steps lost and
moves their seconds to `recovering`.
"""

from __future__ import annotations

import json
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import elastic_jax
from elastic_jax.api.client import ControlClient
from elastic_jax.api.manifest import parse_manifest
from elastic_jax.controller.runtime import Runtime
from elastic_jax.controller.snapshot import HostSnapshotter
from tests.support.bad_manifests import pathways_job
from tests.support.runs import close_while_polled

TOKEN = "t0ken"


def _job(ckpt_uri: str, snapshot_every: int, checkpoint_every: int = 1000) -> dict:
    manifest = pathways_job("recover")
    manifest["spec"]["slices"].update(count=2, minSlices=1)
    manifest["spec"]["training"].update(steps=50, globalBatchSize=4)
    manifest["spec"]["controller"] = {"command": ["python", "train.py"]}
    manifest["spec"]["checkpoint"] = {"uri": ckpt_uri, "intervalSteps": checkpoint_every}
    manifest["spec"]["elasticity"] = {"maxRestarts": 3, "sliceWaitTimeoutSeconds": 600,
                                      "hostSnapshotIntervalSteps": snapshot_every}
    return manifest


@pytest.fixture
def runtime_of(tmp_path):
    opened = []

    def make(fill_in=False, **kw):
        rt = Runtime(parse_manifest(_job(str(tmp_path / "ckpt"), **kw)), TOKEN, host="127.0.0.1", port=0,
                     summary_file=str(tmp_path / "summary.json")).start()
        if not fill_in:  # snapshots exactly every `snapshot_every` steps: the tests know which step one holds
            rt._snapshots = HostSnapshotter(rt._snapshots.every_steps, fill_in=False)
        client = ControlClient(f"http://127.0.0.1:{rt.port}", TOKEN)
        opened.append((rt, client))
        for index in (0, 1):
            client.report_slice(index, "Ready", time.time_ns(), addresses=[f"10.0.0.{index}:8471"])
        return rt, client

    yield make
    for rt, client in opened:
        close_while_polled(rt, client)  # (closed as the operator reads it: no 10 s wait for a final read)
        client.close()


def _state(value: float) -> dict:
    return {"w": jnp.full((4,), value, jnp.float32)}


def _train_losing_slice_1_at(rt, client, lose_at: int, until: int, save_at: tuple[int, ...] = (),
                             after_step: dict | None = None):
    """A user's loop: one step adds 1 to w; slice 1 is lost once, after step `lose_at` completed
    (`after_step`: step -> a call made once after it). Returns the attempts' (first step, w[0] at the start) and what `recover` returned."""
    attempts, recovered = [], []
    state = {"s": _state(0.0)}

    @rt.elastic_retry()
    def train():
        if rt.state_lost:
            restored = rt.recover(_state(0.0))
            recovered.append(restored)
            state["s"] = {"w": jnp.asarray(restored.state["w"])}
        attempts.append((rt.step, float(state["s"]["w"][0])))
        while rt.step < until:
            step = rt.step + 1
            state["s"] = {"w": state["s"]["w"] + 1.0}
            rt.report_step(step, loss=1.0 / step)
            rt.take_host_snapshot(step, state["s"], data={"position": step})
            if step in save_at:
                rt.save(step, state["s"], data={"position": step}, force=True)
            if step in (after_step or {}) and len(attempts) == 1:
                after_step[step]()
            if step == lose_at and len(attempts) == 1:
                client.report_slice(1, "Down", time.time_ns(), reason="worker killed")
                raise elastic_jax.SliceDownError("slice 1 lost", [1])
        return state["s"]

    final = train()
    return attempts, recovered, final


def test_recover_restores_the_newest_host_snapshot_and_counts_the_steps_lost(runtime_of, tmp_path):
    rt, client = runtime_of(snapshot_every=5)
    attempts, recovered, final = _train_losing_slice_1_at(rt, client, lose_at=7, until=10)
    # steps 6 and 7 lived only on the devices: redone from the snapshot of step 5
    assert [(r.step, r.data) for r in recovered] == [(5, {"position": 5})]
    assert isinstance(recovered[0].state["w"], np.ndarray)  # a host copy: the caller places it
    assert attempts == [(0, 0.0), (5, 5.0)]
    assert float(final["w"][0]) == 10.0  # 10 steps of +1, none counted twice
    assert rt.steps_lost == 2 and not rt.state_lost
    status = client.status()
    assert status.step == 10
    assert 'elastic_jax_steps_lost_total 2.0' in client.metrics_text()
    close_while_polled(rt, client)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["steps_lost"] == 2  # measured now, no longer n/a for a loop that recovers


def test_recover_waits_for_the_copy_in_flight_and_restores_the_newest_started(runtime_of):
    """The runtime's own snapshotter: a copy starts every step while the previous has landed in time (off
    the training thread), and `recover` waits for the copy in flight: the newest copy started is restored,
    so a loss right after a step whose copy started costs no step although the interval is 5."""
    rt, client = runtime_of(snapshot_every=5, fill_in=True)
    state, started, recovered = {"s": _state(0.0)}, [], []

    @rt.elastic_retry()
    def train():
        if rt.state_lost:
            recovered.append(rt.recover(_state(0.0)))
            state["s"] = {"w": jnp.asarray(recovered[-1].state["w"])}
        while rt.step < 10:
            step = rt.step + 1
            state["s"] = {"w": state["s"]["w"] + 1.0}
            rt.report_step(step, loss=1.0 / step)
            time.sleep(0.05)  # a step long enough for a copy of 16 bytes
            if rt.take_host_snapshot(step, state["s"], data={"position": step}) and not recovered:
                started.append(step)
            if step == 7 and not recovered:
                client.report_slice(1, "Down", time.time_ns(), reason="worker killed")
                raise elastic_jax.SliceDownError("slice 1 lost", [1])
        return state["s"]

    final = train()
    newest = max(started)  # (which steps copied depends on the copies' seconds: the rule's unit tests)
    assert [(r.step, r.data) for r in recovered] == [(newest, {"position": newest})]
    assert rt.steps_lost == 7 - newest and float(final["w"][0]) == 10.0


def test_a_host_copy_the_training_waits_for_too_often_is_a_setting_warning(runtime_of):
    """A state whose copy outlasts a step is copied every `hostSnapshotIntervalSteps` steps while the training
    waits: when that wait is more than a tenth of the time, the run says so once, naming the field and a value
    that keeps it under (as on the chip: a 5 GiB state copies in 1.4 s against a 0.077 s step)."""
    rt, client = runtime_of(snapshot_every=2)

    def slow_copy(state):
        time.sleep(0.5)
        return jax.device_get(state)

    rt._snapshots = HostSnapshotter(2, copy=slow_copy)
    for step in range(1, 6):
        time.sleep(0.02)  # the step's own seconds (a loop that waits for its steps, as the built-in one)
        rt.report_step(step, loss=1.0)
        rt.take_host_snapshot(step, _state(float(step)))
    warnings = client.status().setting_warnings
    assert len(warnings) == 1 and warnings[0].startswith("spec.elasticity.hostSnapshotIntervalSteps (2): a host "
                                                         "snapshot of the state takes"), warnings
    assert "longer than a step" in warnings[0] and "training waits for it every 2 steps; set it to" in warnings[0]


def test_a_state_deleted_before_its_copy_is_a_setting_warning(runtime_of):
    """A loop that donates (or deletes) the state it hands to take_host_snapshot fails every copy: no snapshot
    lands, so a slice loss would go back to the last checkpoint. The run says so once, on its own output."""
    rt, client = runtime_of(snapshot_every=1)
    for step in range(1, 6):
        rt.report_step(step, loss=1.0)
        state = _state(float(step))
        jax.tree_util.tree_map(lambda a: a.delete(), state)  # (as a donated buffer is, by the next step)
        rt.take_host_snapshot(step, state)
    rt._snapshots.settle(60)
    rt.report_step(6, loss=1.0)
    rt.take_host_snapshot(6, _state(6.0))  # lands, but the warning stays for the run
    # (the steps here take milliseconds, so a slow-copy warning may come too: only this one's is checked)
    warnings = [w for w in client.status().setting_warnings if "every host snapshot fails" in w]
    assert len(warnings) == 1 and warnings[0].startswith("spec.elasticity.hostSnapshotIntervalSteps (1): every host "
                                                         "snapshot fails (RuntimeError: Array has been deleted"), warnings
    assert "last committed checkpoint" in warnings[0]


def test_recover_prefers_a_newer_committed_checkpoint_and_keeps_resumed_from(runtime_of):
    rt, client = runtime_of(snapshot_every=5)
    attempts, recovered, _ = _train_losing_slice_1_at(rt, client, lose_at=8, until=9, save_at=(6,))
    assert [(r.step, r.data) for r in recovered] == [(6, {"position": 6})]
    assert float(recovered[0].state["w"][0]) == 6.0
    assert rt.steps_lost == 2
    assert client.status().resumed_from is None  # a mid-run recovery is not the run's resume


def test_a_corrupt_newer_checkpoint_falls_back_to_the_host_snapshot(runtime_of, tmp_path):
    rt, client = runtime_of(snapshot_every=5)

    def corrupt_step_6():  # step 6 was saved and committed (forced); now its files are damaged
        metadata = tmp_path / "ckpt" / "6" / "state" / "_METADATA"
        metadata.write_bytes(metadata.read_bytes()[: metadata.stat().st_size // 2])

    attempts, recovered, _ = _train_losing_slice_1_at(rt, client, lose_at=8, until=9, save_at=(6,),
                                                      after_step={7: corrupt_step_6})
    # the newest committed step (6) does not restore: the snapshot of step 5 beats starting over at 0
    assert [(r.step, r.data) for r in recovered] == [(5, {"position": 5})]
    assert rt.steps_lost == 3


def test_the_seconds_of_lost_steps_move_from_productive_to_recovering(runtime_of):
    rt, client = runtime_of(snapshot_every=100)  # no snapshot before the loss: back to step 0
    booked = {}

    @rt.elastic_retry()
    def train():
        if rt.state_lost:
            booked["before"] = dict(rt.record.ledger.seconds())
            assert rt.recover(_state(0.0)).step == 0
            booked["after"] = dict(rt.record.ledger.seconds())
            return
        for step in (1, 2, 3):
            time.sleep(0.2)  # each step takes 0.2 s
            rt.report_step(step, loss=1.0)
        client.report_slice(1, "Down", time.time_ns(), reason="worker killed")
        raise elastic_jax.SliceDownError("slice 1 lost", [1])

    train()
    before, after = booked["before"], booked["after"]
    # step 1 was start-up (it compiled: `starting`, not progress); steps 2 and 3 were productive
    assert before["productive"] >= 0.4
    assert after["productive"] <= before["productive"] - 0.4 + 0.05  # the lost steps' 0.4 s left productive
    assert after["recovering"] >= before["recovering"] + 0.4 - 0.05
    assert after["starting"] == pytest.approx(before["starting"])  # start-up stays start-up
    assert rt.steps_lost == 3 and rt.step == 0


def test_a_cpu_runtime_never_marks_state_lost():
    from tests.support.bad_manifests import cpu_job

    manifest = cpu_job("keeps")
    manifest["spec"]["controller"] = {"command": ["python", "train.py"]}
    rt = Runtime(parse_manifest(manifest), TOKEN)
    try:
        assert rt.keeps_state and not rt.state_lost
        assert rt.take_host_snapshot(0, _state(1.0)) is False  # the state is this process's: no copies
    finally:
        rt.close()


RECOVERING_PROGRAM = """
import elastic_jax, jax.numpy as jnp
rt = elastic_jax.connect()
with rt:
    state, step, _ = rt.restore({"w": jnp.zeros((4,), jnp.float32)})
    while rt.step < rt.job.spec.training.steps:
        state = {"w": state["w"] + 1.0}
        rt.report_step(rt.step + 1, loss=1.0 / (rt.step + 1))
        if rt.step == 4:
            rt.save(4, state, force=True)
        if rt.step == 6 and not rt.steps_lost:
            state = rt.recover({"w": jnp.zeros((4,), jnp.float32)}).state  # back to step 4: 2 steps lost
    rt.save(rt.step, state, force=True)
"""


def test_elastic_jax_run_reports_the_steps_a_library_loop_recovered(tmp_path):
    """Trial: the program's summary said 20 steps lost, `elastic-jax run` printed n/a (library mode was n/a always)."""
    from tests.support.runs import job_manifest, run_cli

    (tmp_path / "prog.py").write_text(RECOVERING_PROGRAM)
    manifest = job_manifest("librecover", tmp_path)
    manifest["spec"]["controller"] = {"command": ["python", str(tmp_path / "prog.py")]}
    manifest["spec"]["training"]["steps"] = 8
    manifest["spec"]["checkpoint"] = {"uri": str(tmp_path / "ckpt"), "intervalSteps": 100}
    run = run_cli(manifest, tmp_path, "--no-failure")
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.summary["steps_lost"] == 2 and run.summary["steps"] == 8, run.summary
    assert "steps lost 2" in run.stderr + run.stdout, run.stderr[-2000:]


def test_recover_with_a_surviving_replica_keeps_the_step_and_loses_none(runtime_of, tmp_path):
    """Issue 29 item 3 as a library: the program rebuilt the state from the surviving slices' replicas
    (the built-in trainer's `PathwaysBackend.recover_state`); `recover` returns it at the current step."""
    rt, client = runtime_of(snapshot_every=5)
    state = {"s": _state(0.0)}
    seen = []

    @rt.elastic_retry()
    def train():
        if rt.state_lost:
            restored = rt.recover(_state(0.0), replica=state["s"])
            seen.append((restored.step, float(restored.state["w"][0])))
        while rt.step < 10:
            step = rt.step + 1
            state["s"] = {"w": state["s"]["w"] + 1.0}
            rt.report_step(step, loss=1.0 / step)
            rt.take_host_snapshot(step, state["s"])
            if step == 7 and not seen:
                client.report_slice(1, "Down", time.time_ns(), reason="worker killed")
                raise elastic_jax.SliceDownError("slice 1 lost", [1])

    train()
    assert seen == [(7, 7.0)]  # not the snapshot of step 5
    assert rt.steps_lost == 0 and not rt.state_lost and rt.step == 10
    rt.close()
    assert json.loads((tmp_path / "summary.json").read_text())["steps_lost"] == 0


def test_a_snapshot_of_a_step_not_reported_yet_is_refused(runtime_of):
    rt, _ = runtime_of(snapshot_every=1)
    rt.report_step(1, loss=1.0)
    with pytest.raises(ValueError, match=r"take_host_snapshot\(step=2\): beyond the reported step 1; call it after "
                                         r"report_step\(step\)"):
        rt.take_host_snapshot(2, _state(2.0))
    assert rt.take_host_snapshot(1, _state(1.0))
