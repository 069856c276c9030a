"""Controller start-up on the pathways backend: persistence is on before Pathways initializes, and a slice
missing from `jax.devices()` is waited for, not refused (issue 10 items 3 and 6).

`pathwaysutils` is replaced by a recorder (it needs a Pathways proxy); the
devices are stand-ins with a `slice_index`, as on Pathways.
"""

from __future__ import annotations

import dataclasses
import sys
import types

import numpy as np
import pytest

from elastic_jax.controller import pathways_connect
from elastic_jax.controller.backend_pathways import PathwaysBackend
from elastic_jax.controller.elastic.manager import Manager
from elastic_jax.controller.elastic.slice_set import SliceSet


@dataclasses.dataclass(frozen=True)
class FakeDevice:
    id: int
    slice_index: int


def test_persistence_is_enabled_before_pathways_initializes(monkeypatch):
    seen = {}
    fake = types.ModuleType("pathwaysutils")
    fake.initialize = lambda: seen.setdefault("env", pathways_connect.os.environ.get("ENABLE_PATHWAYS_PERSISTENCE"))
    monkeypatch.setitem(sys.modules, "pathwaysutils", fake)
    monkeypatch.delenv("ENABLE_PATHWAYS_PERSISTENCE", raising=False)
    with pytest.raises(ValueError, match="no slice_index"):  # CPU devices here: past initialize, as wanted
        pathways_connect.connect(slice_set=SliceSet(1))
    assert seen["env"] == "1"


def test_a_user_can_still_turn_persistence_off(monkeypatch, caplog):
    fake = types.ModuleType("pathwaysutils")
    fake.initialize = lambda: None
    monkeypatch.setitem(sys.modules, "pathwaysutils", fake)
    monkeypatch.setenv("ENABLE_PATHWAYS_PERSISTENCE", "0")
    with pytest.raises(ValueError):
        pathways_connect.connect(slice_set=SliceSet(1))
    assert "checkpoints pass through the Pathways proxy" in caplog.text


def _backend(listing, count=2, monkeypatch=None):
    monkeypatch.setattr("elastic_jax.controller.backend_pathways.DEVICE_REFRESH_S", 0.0)
    return PathwaysBackend(slice_set=SliceSet(count), devices=listing)


def test_a_slice_missing_at_start_is_waited_for(monkeypatch):
    visible = [FakeDevice(0, 0), FakeDevice(1, 0)]
    backend = _backend(lambda: list(visible), monkeypatch=monkeypatch)  # did raise ValueError: exit 2, Failed
    assert backend.missing_slices() == [1] and backend.visible_slices() == {0}
    probed = []
    backend._probe = lambda i: probed.append(i) or np.full(2, 100.0, np.float32)
    assert backend.health_check([0, 1]) == {0} and probed == [0]  # never probes a slice without devices
    visible += [FakeDevice(2, 1), FakeDevice(3, 1)]  # the node pool came up, its workers registered
    assert backend.visible_slices() == {0, 1} and backend.missing_slices() == []


def test_devices_beyond_the_slice_count_are_still_refused(monkeypatch):
    with pytest.raises(ValueError, match="include slices \\[2\\]"):
        _backend([FakeDevice(0, 0), FakeDevice(1, 2)], monkeypatch=monkeypatch)


def test_manager_neither_marks_down_nor_joins_a_ready_slice_without_devices():
    slice_set = SliceSet(2)
    from elastic_jax.api.control import SliceReport

    for i in range(2):
        slice_set.apply_report(i, SliceReport(state="Ready", generation=1, addresses=[f"10.0.0.{i}:1"]))
    visible = {0}
    manager = Manager(slice_set, health_check=lambda ix: frozenset(ix), visible=lambda: frozenset(visible),
                      poll_interval_s=0.01)
    assert manager.wait_for_slices(1, timeout_s=5) == {0}
    slice_set.set_active({0})
    assert manager.available_inactive_slices() == frozenset()  # no scale-up churn every step
    assert slice_set.record(1).state == "Ready"  # not marked down: it is coming
    visible.add(1)
    assert manager.available_inactive_slices() == {1}
