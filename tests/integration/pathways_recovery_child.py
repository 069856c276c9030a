"""Child process for test_pathways_recovery.py: 8 CPU devices standing in for 4 slices of 2 chips.

The real `TrainingRun` on the real `PathwaysBackend` (issue 29 items 3 and 4, fault 3); only
`device.slice_index` is replaced (CPU devices have none) by `device.id // 2`. A slice loss is
injected as Pathways raises it: the step's program fails with `JaxRuntimeError("DATA_LOSS: ...")`
and the lost slice's health check fails from then on. Its devices' shards of the state are
overwritten with NaN first (what a lost slice's memory is worth): a recovery that read one would
train on NaN. Compiles are counted with JAX's own monitoring event, per thread.
Prints one JSON line of results.
"""

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"

import json  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402

from elastic_jax.api.control import SliceReport  # noqa: E402
from elastic_jax.api.manifest import parse_manifest  # noqa: E402
from elastic_jax.controller.backend_pathways import PathwaysBackend  # noqa: E402
from elastic_jax.controller.builtin_lm import make_trainer  # noqa: E402
from elastic_jax.controller.checkpointing import Checkpointer  # noqa: E402
from elastic_jax.controller.elastic.errors import ScaleUpSignalError  # noqa: E402
from elastic_jax.controller.elastic.slice_set import SliceSet  # noqa: E402
from elastic_jax.controller.loop import TrainingRun  # noqa: E402
from elastic_jax.controller.metrics import ControllerMetrics  # noqa: E402

TINY = {"seqLen": 32, "dModel": 32, "numLayers": 1, "numHeads": 2, "mlpDim": 64, "maxBytes": 100_000}
STEPS = 16
LOST_AT_CALL = 7  # the 7th step program's launch: 5 steps done, the 6th running (launched ahead)
BACK_AT_CALL = 10

COMPILES: list[dict] = []  # every backend compile: the thread and the window open then


def _on_event(event, seconds, **kwargs):
    if event.endswith("backend_compile_duration"):
        COMPILES.append({"main": threading.current_thread() is threading.main_thread(), "window": WINDOW["open"]})


WINDOW = {"open": None}  # "loss" / "rejoin" from the elastic event until the next step completes
jax.monitoring.register_event_duration_secs_listener(_on_event)


def slice_of(device):
    return device.id // 2


def ready(slice_set, index, generation):
    slice_set.apply_report(index, SliceReport(state="Ready", generation=generation, addresses=[f"127.0.0.1:{8470 + index}"]))


def job(tmp, name, count, spares, snapshot_every=100, checkpoint_every=100):
    return parse_manifest({
        "apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": {"name": name},
        "spec": {"backend": "pathways",
                 "slices": {"count": count, "spares": spares, "minSlices": 1, "accelerator": "cpu", "topology": "1x2"},
                 "training": {"steps": STEPS, "globalBatchSize": 24, "logEverySteps": 100},
                 "checkpoint": {"uri": f"{tmp}/{name}", "intervalSteps": checkpoint_every},
                 "elasticity": {"hostSnapshotIntervalSteps": snapshot_every}}})


def poisoned(state, lost_devices):
    """`state` with every shard on `lost_devices` overwritten (NaN, or -7 for integers)."""
    def leaf(x):
        pieces = []
        for shard in x.addressable_shards:
            data = shard.data
            if shard.device in lost_devices:
                bad = np.full(data.shape, np.nan if np.issubdtype(data.dtype, np.floating) else -7, data.dtype)
                data = jax.device_put(bad, shard.device)
            pieces.append(data)
        return jax.make_array_from_single_device_arrays(x.shape, x.sharding, pieces)
    return jax.tree_util.tree_map(leaf, state)


def bytes_per_device(state):
    out: dict[int, int] = {}
    for x in jax.tree_util.tree_leaves(state):
        for shard in x.addressable_shards:
            out[shard.device.id] = out.get(shard.device.id, 0) + shard.data.nbytes
    return out


class Recorder:
    """Wraps a run's `report_step` and `check_scale_up`: per-step losses, the recovery windows."""

    def __init__(self, run):
        self.losses: dict[int, list[float]] = {}
        real_report, real_scale = run.runtime.report_step, run.runtime.check_scale_up

        def report_step(step, loss=None):
            self.losses.setdefault(step, []).append(loss)
            WINDOW["open"] = None
            return real_report(step, loss)

        def check_scale_up():
            try:
                real_scale()
            except ScaleUpSignalError:
                WINDOW["open"] = "rejoin"
                raise

        run.runtime.report_step, run.runtime.check_scale_up = report_step, check_scale_up


def four_slices(tmp, trainer, name):
    """A `TrainingRun` on 4 Ready slices of 2 devices, with its backend, checkpointer and `Recorder`."""
    slice_set = SliceSet(4)
    for i in range(4):
        ready(slice_set, i, 1)
    backend = PathwaysBackend(slice_set, slice_of=slice_of)
    checkpointer = Checkpointer(f"{tmp}/{name}", 100, 2)
    run = TrainingRun(job(tmp, name, 4, 0), trainer, backend, slice_set, checkpointer, ControllerMetrics())
    return slice_set, backend, checkpointer, run, Recorder(run)


def reference(tmp, trainer):
    _, backend, checkpointer, run, rec = four_slices(tmp, trainer, "ref")
    summary = _run_to_end(run, backend, checkpointer, {})
    assert summary.succeeded, summary.failure_reason
    return {s: v[0] for s, v in rec.losses.items()}


def loss_and_rejoin(tmp, trainer):
    """Slice 0 (which holds jax.devices()[0]) is lost after 6 steps, then comes back."""
    slice_set, backend, checkpointer, run, rec = four_slices(tmp, trainer, "loss")
    out = {"actives": [], "default_slices": [], "bytes_before": None, "bytes_after": None}
    real_execute, real_probe = backend._execute, backend._probe
    calls = {"n": 0}

    def lost_probe(index):
        if index == 0:
            raise jax.errors.JaxRuntimeError("DATA_LOSS: slice 0: TPU worker heartbeat lost")
        return real_probe(index)

    def execute(program, state, batch):
        calls["n"] += 1
        active = sorted({slice_of(d) for x in jax.tree_util.tree_leaves(state) for d in x.sharding.device_set})
        out["actives"].append(active)
        default = jax.config.jax_default_device
        out["default_slices"].append(None if default is None else slice_of(default))
        if calls["n"] == LOST_AT_CALL:
            # The programs of the meshes one slice smaller are compiling ahead since the first step: a
            # condition, not a sleep (on a loaded machine they may take a while).
            assert backend.wait_for_programs(300)
            out["bytes_before"] = bytes_per_device(run.state)
            leaves = jax.tree_util.tree_leaves(run.state)
            out["total_bytes"] = sum(x.nbytes for x in leaves)
            out["unsplit_bytes"] = sum(x.nbytes for x in leaves if x.ndim == 0 or all(n % 2 for n in x.shape))
            lost = set(backend.slices[0])
            run.state = poisoned(run.state, lost)
            backend._probe = lost_probe
            WINDOW["open"] = "loss"
            raise jax.errors.JaxRuntimeError("DATA_LOSS: slice 0: TPU worker heartbeat lost")
        if calls["n"] == LOST_AT_CALL + 1:
            out["bytes_after"] = bytes_per_device(state)
        if calls["n"] == BACK_AT_CALL:
            backend._probe = real_probe  # the replaced slice answers again, and the operator says Ready
            ready(slice_set, 0, 2)
        return real_execute(program, state, batch)

    backend._execute = execute
    summary = _run_to_end(run, backend, checkpointer, out)
    out.update(causes=[r["cause"] for r in summary.recoveries],
               losses={s: v for s, v in rec.losses.items()},
               compiled_here=[list(k.active) for k in backend._programs.compiled_here])
    return out


def no_replica(tmp, trainer):
    """One active slice and a spare: the mesh's only slice (slice 0) is lost; nothing survives, the
    checkpoint of step 5 is restored (2 steps lost) onto a target initialised on the spare's devices."""
    devices = jax.devices()[:4]
    slice_set = SliceSet(1, 1)
    for i in range(2):
        ready(slice_set, i, 1)
    backend = PathwaysBackend(slice_set, devices=devices, slice_of=slice_of)
    checkpointer = Checkpointer(f"{tmp}/single", 5, 2)
    run = TrainingRun(job(tmp, "single", 1, 1, snapshot_every=0, checkpoint_every=5), trainer, backend, slice_set,
                      checkpointer, ControllerMetrics())
    out = {"init_slices": []}
    real_init = run.initial_state

    def initial_state():
        state = real_init()
        out["init_slices"].append(sorted({slice_of(d) for x in jax.tree_util.tree_leaves(state)
                                          for d in x.sharding.device_set}))
        return state

    run.initial_state = initial_state
    real_execute, real_probe = backend._execute, backend._probe
    calls = {"n": 0}

    def execute(program, state, batch):
        calls["n"] += 1
        # The 9th launch: 7 steps done (the loop launches step n+1 before it reads step n); the newest
        # checkpoint is step 5's.
        if calls["n"] == 9:
            checkpointer.wait_until_finished()  # (its async save committed: a condition, not a sleep)
            run.state = poisoned(run.state, set(backend.slices[0]))
            backend._probe = lambda i: (_ for _ in ()).throw(jax.errors.JaxRuntimeError("DATA_LOSS: slice 0")) \
                if i == 0 else real_probe(i)
            raise jax.errors.JaxRuntimeError("DATA_LOSS: slice 0 lost")
        return real_execute(program, state, batch)

    backend._execute = execute
    _run_to_end(run, backend, checkpointer, out)
    return out


def _run_to_end(run, backend, checkpointer, out):
    """Runs `run` to its end, closes its backend and checkpointer, and records in `out` what every scenario
    reports (succeeded, failure, steps, steps_lost); returns the run summary for the scenario's own fields."""
    summary = run.run()
    backend.close()
    checkpointer.close()
    out.update(succeeded=summary.succeeded, failure=summary.failure_reason, steps=summary.steps,
               steps_lost=summary.steps_lost)
    return summary


def main(tmp):
    trainer = make_trainer(dict(TINY))
    ref = reference(tmp, trainer)
    run = loss_and_rejoin(tmp, trainer)
    single = no_replica(tmp, trainer)
    print("RESULT " + json.dumps({"reference": ref, "run": run, "single": single,
                                  "compiles": COMPILES}))


if __name__ == "__main__":
    main(sys.argv[1])
