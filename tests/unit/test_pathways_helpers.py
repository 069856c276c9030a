"""Pure helpers of the pathways backend and the snapshot logic, with fake device objects."""

from types import SimpleNamespace

import numpy as np
import pytest
from jax.sharding import PartitionSpec

from elastic_jax.controller.backend_pathways import batch_spec, default_slice_of, slice_to_devices
from elastic_jax.controller.snapshot import HostSnapshotter, choose_restore_source


def fake_devices(slices, per_slice):
    return [SimpleNamespace(id=s * per_slice + i, slice_index=s) for s in range(slices) for i in range(per_slice)]


def test_slice_to_devices_groups_by_slice_index():
    devices = fake_devices(3, 4)[::-1]  # order of jax.devices() is not guaranteed
    groups = slice_to_devices(devices)
    assert list(groups) == [0, 1, 2]
    assert all(len(g) == 4 and {d.slice_index for d in g} == {i} for i, g in groups.items())


def test_cpu_device_has_no_slice_index():
    import jax

    with pytest.raises(ValueError, match="CPU device with no slice_index: the pathways backend needs TPU devices"):
        default_slice_of(jax.devices()[0])


@pytest.mark.parametrize("device, slice_index", [
    (SimpleNamespace(id=0, platform="tpu", slice_index=3), 3),  # Pathways / multi-slice
    (SimpleNamespace(id=0, platform="tpu", slice_index=0), 0),
    # issue 29 fault 5: a single-host v5e VM reports slice_index None (measured); it was refused
    (SimpleNamespace(id=0, platform="tpu", slice_index=None), 0),
    (SimpleNamespace(id=0, platform="tpu"), 0),
])
def test_tpu_devices_without_a_slice_index_are_one_slice(device, slice_index):
    assert default_slice_of(device) == slice_index


def test_a_single_host_tpu_vm_is_one_slice_of_all_its_chips():
    chips = [SimpleNamespace(id=i, platform="tpu", slice_index=None) for i in range(8)]
    assert {i: [d.id for d in ds] for i, ds in slice_to_devices(chips).items()} == {0: list(range(8))}


@pytest.mark.parametrize(
    "batch, shape, expected",
    [(32, (2, 4), PartitionSpec(("slice", "data"))), (6, (2, 4), PartitionSpec("slice")), (5, (2, 4), PartitionSpec())],
)
def test_batch_spec(batch, shape, expected):
    assert batch_spec(batch, SimpleNamespace(devices=np.empty(shape))) == expected


def test_choose_restore_source():
    assert choose_restore_source(None, None) == "init"
    assert choose_restore_source(30, None) == "snapshot"
    assert choose_restore_source(None, 20) == "checkpoint"
    assert choose_restore_source(30, 20) == "snapshot"
    assert choose_restore_source(20, 20) == "snapshot"
    assert choose_restore_source(10, 20) == "checkpoint"


def test_snapshotter_copies_to_host_off_the_training_thread():
    import jax.numpy as jnp

    snap = HostSnapshotter(every_steps=5)
    assert snap.maybe_take(1, {"w": jnp.ones(3)}, {"next_batch_index": 1})  # the first is due
    landed = snap.settle(timeout_s=60)
    assert landed.step == 1 and isinstance(landed.state["w"], np.ndarray)
    assert landed.data_state == {"next_batch_index": 1}
    assert not HostSnapshotter(0).maybe_take(5, {"w": jnp.ones(3)}, {})


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _snapshotter(every_steps, copy_seconds, clock, gate=None, landed=None):
    """A snapshotter whose copy takes `copy_seconds` on `clock` (waits for `gate`, then appends to `landed`)."""
    def copy(state):
        if gate is not None:
            gate.wait(60)
        clock.now += copy_seconds
        if landed is not None:
            landed.append(state["w"])
        return dict(state)
    return HostSnapshotter(every_steps, copy=copy, clock=clock)


def _steps(snap, clock, steps, step_seconds=1.0):
    """Calls maybe_take once per step, `step_seconds` apart, each after the previous copy landed; the steps taken."""
    taken = []
    for step in steps:
        clock.now = step * step_seconds  # (the copy ran beside the step: its own seconds do not delay the next)
        if snap.maybe_take(step, {"w": step}, {}):
            taken.append(step)
        snap.settle(60)
    return taken


def test_a_copy_that_fits_in_a_step_is_taken_every_step():
    clock = _Clock()
    snap = _snapshotter(10, copy_seconds=0.25, clock=clock)
    assert _steps(snap, clock, range(1, 13)) == list(range(1, 13))
    assert snap.latest.step == 12 and snap.slow_copy is None


def test_a_copy_longer_than_a_step_is_taken_every_k_steps():
    clock = _Clock()
    snap = _snapshotter(5, copy_seconds=3.0, clock=clock)
    assert _steps(snap, clock, range(1, 13)) == [1, 5, 10]  # the first (to measure), then the multiples
    assert snap.slow_copy == (3.0, 1.0)  # the training waits 3 s every 5 s: the runtime warns


def test_copies_that_fail_in_a_row_are_reported_once_one_landing_clears_it():
    """One failed copy is a lost slice's (no report); `FAILING_AFTER` in a row are the caller's state itself."""
    from elastic_jax.controller.snapshot import FAILING_AFTER

    broken = set(range(3, 3 + FAILING_AFTER))

    def copy(state):
        if state["w"] in broken:
            raise RuntimeError("Array has been deleted with shape=float32[4].")
        return dict(state)

    snap = HostSnapshotter(1, copy=copy, clock=_Clock())
    seen = []
    for step in range(1, 8):
        snap.maybe_take(step, {"w": step}, {})
        snap.settle(60)
        seen.append(snap.failing)
    assert seen[:FAILING_AFTER + 1] == [None] * (FAILING_AFTER + 1)
    assert seen[FAILING_AFTER + 1] == "RuntimeError: Array has been deleted with shape=float32[4]."
    assert seen[-1] is None and snap.latest.step == 7


def test_a_copy_that_does_not_fit_is_waited_for_at_once():
    """No copy outlasting a step runs beside the training (it would hold its state's device buffers)."""
    import threading

    clock, gate, landed = _Clock(), threading.Event(), []
    snap = _snapshotter(2, copy_seconds=3.0, clock=clock, gate=gate, landed=landed)
    gate.set()
    clock.now = 1.0
    assert snap.maybe_take(1, {"w": 1}, {}) and snap.settle(60).step == 1  # measured: 3 s, a step is 1 s
    clock.now = 2.0  # (the copy moved the clock to 4.0; the step after it starts at 2.0 on this clock)
    gate.clear()
    threading.Timer(0.2, gate.set).start()
    assert snap.maybe_take(2, {"w": 2}, {})
    assert landed == [1, 2] and snap.latest.step == 2  # landed before maybe_take returned


def test_a_copy_in_flight_is_skipped_until_due_then_waited_for():
    import threading

    clock, gate, landed = _Clock(), threading.Event(), []
    snap = _snapshotter(4, copy_seconds=0.0, clock=clock, gate=gate, landed=landed)
    assert snap.maybe_take(1, {"w": 1}, {})
    assert not snap.maybe_take(2, {"w": 2}, {}) and not snap.maybe_take(3, {"w": 3}, {})  # in flight: skipped
    assert snap.latest is None
    threading.Timer(0.2, gate.set).start()
    assert snap.maybe_take(4, {"w": 4}, {})  # due (a multiple of 4): waits for step 1's copy, then starts
    assert landed[0] == 1
    assert snap.settle(60).step == 4 and landed == [1, 4]


def test_a_failed_or_late_copy_keeps_the_snapshot_before_it(caplog):
    import threading

    clock, gate = _Clock(), threading.Event()
    snap = _snapshotter(1, copy_seconds=0.0, clock=clock)
    snap.maybe_take(1, {"w": 1}, {})
    assert snap.settle(60).step == 1
    snap._copy = lambda state: (_ for _ in ()).throw(RuntimeError("DATA_LOSS: slice 0 is gone"))
    snap.maybe_take(2, {"w": 2}, {})
    assert snap.settle(60).step == 1
    assert "host snapshot of step 2 failed (RuntimeError: DATA_LOSS: slice 0 is gone)" in caplog.text
    snap._copy = lambda state: gate.wait(60) and dict(state)
    snap.maybe_take(3, {"w": 3}, {})
    assert snap.settle(0.05).step == 1  # not landed in time: dropped, with a warning
    assert "host snapshot of step 3 did not land within" in caplog.text
    gate.set()


def test_a_snapshot_older_than_the_newest_is_refused_and_a_rewind_forgets_later_ones():
    """A new user's trial: take_host_snapshot(3, state of step 15) replaced the snapshot of step 15, and a
    loss then went back to "step 3" with step 15's values."""
    clock = _Clock()
    snap = _snapshotter(10, copy_seconds=0.0, clock=clock)
    assert _steps(snap, clock, [14, 15]) == [14, 15]
    with pytest.raises(ValueError, match=r"take_host_snapshot\(step=3\): older than the newest snapshot \(step 15\)"):
        snap.maybe_take(3, {"w": 15}, {})
    snap.forget_after(14)  # the run went back to step 14
    assert snap.latest is None
    assert snap.maybe_take(14, {"w": 14}, {}) and snap.settle(60).step == 14
