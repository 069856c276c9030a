"""Issue 31 item 13 (nvidia-resiliency-ext#129): a step slower than the deadline on every slice.

With `spec.elasticity.stepDeadlineSeconds` below the real step time, every
healthy worker missed the deadline each step, was marked down and replaced,
until "restart budget exhausted", and the field was never named. When every
active slice misses it in the same step with none answering, the slices are
not the problem: none is marked down, the step runs on (deadline doubled, at
least twice and up to `firstStepDeadlineSeconds`), the run keeps the longer deadline, and a warning names the field
and the observed step time. A slice that misses it while another answers is
still a hang. Real worker processes, frozen (SIGSTOP) past the deadline from the
step's dispatch, then thawed.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import psutil
import pytest

from elastic_jax.api.control import SliceReport
from elastic_jax.controller.backend_cpu import CpuBackend
from elastic_jax.controller.elastic.errors import SliceDownError
from elastic_jax.controller.elastic.slice_set import SliceSet
from tests.support.workers import TOKEN


def spin(params, chunk):
    """Runs `chunk["n"][0]` rounds of a 256x256 matmul: a step as long as its input says."""
    out = jax.lax.fori_loop(0, chunk["n"][0], lambda _, a: jnp.tanh(a @ a) * 0.5, params["x"])
    return {"sum": jnp.sum(out) * 0 + chunk["n"].shape[0]}


def _batch(rounds: int) -> dict[str, np.ndarray]:
    return {"n": np.full((2,), rounds, np.int32)}


@pytest.fixture()
def two_slices(worker_factory):
    workers = worker_factory.start_many(2)
    slices = SliceSet(2)
    for i, worker in enumerate(workers):
        slices.apply_report(i, SliceReport(state="Ready", generation=1, addresses=[worker.address]))
    slices.set_active([0, 1])
    backend = CpuBackend(slices, step_deadline_s=60.0, first_step_deadline_s=120.0, token=TOKEN)
    try:
        yield workers, slices, backend
    finally:
        backend.close()


def _step_seconds(backend: CpuBackend, params, rounds: int) -> float:
    started = time.monotonic()
    out = backend.map_sum(spin, params, _batch(rounds), [0, 1])
    assert float(out["sum"]) == 2.0
    return time.monotonic() - started


def _frozen(pids: list[int]) -> None:
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    for pid in pids:
        while psutil.Process(pid).status() != psutil.STATUS_STOPPED:
            time.sleep(0.05)


def _thaw(pids: list[int]) -> None:
    for pid in pids:
        os.kill(pid, signal.SIGCONT)


def _step_while_frozen(backend: CpuBackend, params, workers, frozen_s: float) -> float:
    """One step's seconds with every worker frozen (SIGSTOP) from its dispatch for `frozen_s`, then thawed."""
    pids = [w.popen.pid for w in workers]
    _frozen(pids)
    thaw = threading.Timer(frozen_s, _thaw, (pids,))
    thaw.start()
    try:
        return _step_seconds(backend, params, 1)
    finally:
        thaw.cancel()
        _thaw(pids)


def test_every_slice_slower_than_the_deadline_marks_none_down_and_names_the_field(two_slices):
    workers, slices, backend = two_slices
    params = {"x": np.eye(256, dtype=np.float32)}
    _step_seconds(backend, params, 1)  # compiled on both workers (their first step)
    backend.step_deadline_s = backend.configured_step_deadline_s = 2.0
    # Both workers frozen (SIGSTOP) for 3 s from the step's dispatch: every slice misses the 2 s deadline with
    # none answering, and both answer once thawed, well inside the 8 s (4x) the run may wait. (A step made
    # genuinely longer by its size was load-fragile: under load one worker finished inside the deadline and
    # the other's miss was, rightly, a hang.)
    seconds = _step_while_frozen(backend, params, workers, 3.0)
    assert seconds > backend.configured_step_deadline_s
    assert slices.active == {0, 1}  # no slice marked down
    assert all(w.popen.poll() is None for w in workers)
    [warning] = backend.setting_warnings
    assert warning.startswith("spec.elasticity.stepDeadlineSeconds") and "took" in warning, warning
    assert backend.step_deadline_s == backend.configured_step_deadline_s * 4 or \
        backend.step_deadline_s == backend.configured_step_deadline_s * 2, backend.step_deadline_s
    # The run keeps the longer deadline; the next step runs through, still on both slices.
    _step_seconds(backend, params, 1)
    assert slices.active == {0, 1} and len(backend.setting_warnings) == 1


def test_a_deadline_far_below_the_step_time_extends_up_to_the_first_step_deadline(two_slices):
    """A new user's `stepDeadlineSeconds: 0.001` (a trial finding): 4x that is still far below any step, so with
    two doublings only every healthy slice was marked down each step until the restart budget was spent. The
    deadline doubles up to `firstStepDeadlineSeconds` (20 s here) instead: no slice down, one warning."""
    workers, slices, backend = two_slices
    params = {"x": np.eye(256, dtype=np.float32)}
    _step_seconds(backend, params, 1)
    backend.step_deadline_s = backend.configured_step_deadline_s = 0.001
    backend.first_step_deadline_s = 20.0
    assert backend.extensions_allowed() == 15  # 0.001 * 2**15 = 32.8 s >= 20 s
    seconds = _step_while_frozen(backend, params, workers, 1.0)  # ~1 s, whatever the load: 1000x the deadline
    assert slices.active == {0, 1} and all(w.popen.poll() is None for w in workers)
    [warning] = backend.setting_warnings
    assert "(0.001 s) is shorter than a step" in warning, warning
    assert seconds <= backend.step_deadline_s < 20.0 * 2, (seconds, backend.step_deadline_s)


def test_one_slice_missing_the_deadline_while_another_answers_is_still_a_hang(two_slices):
    workers, slices, backend = two_slices
    params = {"x": np.eye(256, dtype=np.float32)}
    _step_seconds(backend, params, 1)
    backend.step_deadline_s = backend.configured_step_deadline_s = 2.0
    os.kill(workers[1].popen.pid, signal.SIGSTOP)
    try:
        while psutil.Process(workers[1].popen.pid).status() != psutil.STATUS_STOPPED:
            time.sleep(0.05)
        with pytest.raises(SliceDownError) as e:
            backend.map_sum(spin, params, _batch(1), [0, 1])
        assert e.value.cause == "step_deadline" and e.value.slice_indices == (1,)
        assert slices.active == {0} and backend.setting_warnings == []
    finally:
        os.kill(workers[1].popen.pid, signal.SIGCONT)
