"""Pure parts of the pathways backend's recovery: the FSDP partition rule, the program cache, and the
manager's default-device hook (issue 29 item 3, item 4, fault 3). The whole path runs in
tests/integration/test_pathways_recovery.py."""

import threading

import jax
import pytest
from jax.sharding import PartitionSpec

from elastic_jax.api.control import SliceReport
from elastic_jax.controller.elastic.errors import SliceDownError
from elastic_jax.controller.elastic.manager import Manager
from elastic_jax.controller.elastic.slice_set import SliceSet
from elastic_jax.controller.mesh_programs import ProgramCache, ProgramKey
from elastic_jax.controller.state_layout import fsdp_spec


@pytest.mark.parametrize("shape, n, expected", [
    ((64, 32), 2, PartitionSpec("data", None)),      # the largest axis
    ((32, 64), 4, PartitionSpec(None, "data")),
    ((2, 16, 32), 4, PartitionSpec(None, None, "data")),
    ((3, 5), 2, PartitionSpec()),                     # no axis divides: replicated
    ((), 2, PartitionSpec()),                         # a scalar (Adam's count)
    ((64, 32), 1, PartitionSpec()),                   # one device per slice
    ((2, 64), 4, PartitionSpec(None, "data")),        # an axis smaller than the devices is never split
    ((16, 16), 2, PartitionSpec("data", None)),       # a tie: the earlier axis
])
def test_fsdp_spec_splits_the_largest_divisible_axis_over_data_and_never_names_slice(shape, n, expected):
    assert fsdp_spec(shape, n) == expected


def key(active):
    return ProgramKey("step", len, tuple(active), (None, ()), ())


def test_program_cache_keeps_programs_and_compiles_ahead_off_the_callers_thread():
    threads = []

    def compile_fn(k):
        threads.append(threading.current_thread() is threading.main_thread())
        return f"program{k.active}"

    cache = ProgramCache(compile_fn)
    assert cache.get(key([0, 1])) == "program(0, 1)"
    assert cache.get(key([0, 1])) == "program(0, 1)"  # kept: compiled once
    cache.ahead([key([0]), key([1]), key([0, 1])])
    assert cache.wait(60)
    assert cache.ready(key([0])) and cache.ready(key([1]))
    assert cache.get(key([1])) == "program(1,)"
    assert threads == [True, False, False]  # only the first on the caller's thread
    assert cache.compiled_here == [key([0, 1])]
    cache.close()


def test_a_program_that_fails_to_compile_is_not_kept():
    calls = []

    def compile_fn(k):
        calls.append(k)
        if len(calls) == 1:
            raise ValueError("boom")
        return "ok"

    cache = ProgramCache(compile_fn)
    cache.ahead([key([2])])
    assert cache.wait(60) and not cache.ready(key([2]))
    assert cache.get(key([2])) == "ok"
    cache.close()


def test_each_attempt_runs_under_the_default_device_of_its_active_slices():
    s = SliceSet(2)
    for i in range(2):
        s.apply_report(i, SliceReport(state="Ready", generation=1, addresses=[f"h:{i}"]))
    device = jax.devices()[0]
    asked, seen = [], []

    def default_device(active):
        asked.append(sorted(active))
        return device

    m = Manager(s, poll_interval_s=0.05, default_device=default_device)

    @m.elastic_retry(minimum_slice_count=1, timeout_s=1)
    def train():
        seen.append(jax.config.jax_default_device)
        if len(seen) == 1:
            s.mark_down([0], "lost")
            raise SliceDownError("slice 0 lost", [0])

    train()
    assert asked == [[0, 1], [1]]
    assert seen == [device, device]
    assert jax.config.jax_default_device is None  # only inside the attempt


def test_an_abstract_state_gets_the_layout_without_devices_touched():
    from jax.sharding import Mesh, NamedSharding
    import numpy as np

    from elastic_jax.controller.state_layout import relayout

    target = NamedSharding(Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("slice", "data")), PartitionSpec())
    out = relayout(jax.ShapeDtypeStruct((4, 2), np.float32), target, alive=())
    assert isinstance(out, jax.ShapeDtypeStruct) and out.sharding == target and out.shape == (4, 2)
