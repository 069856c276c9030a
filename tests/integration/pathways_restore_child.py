"""Child process for test_pathways_restore.py: resume under Orbax's Pathways array handler, on 4 CPU devices.

Issue 29 fault 2. With Pathways persistence on, `pathwaysutils.initialize()`
registers Orbax's `CloudPathwaysArrayHandler` for `jax.Array`; it restores only
onto `NamedSharding` targets. Here the real pathwaysutils (0.1.13) registers it
exactly so: `initialize()` runs while `jax_platforms` names the proxy (what it
checks), then JAX is pointed back at the CPU devices before any backend starts
(no proxy exists here). The handler's own `deserialize` runs, its sharding check
included; only the read it then asks the TPU workers for
(`cloud_pathways_helper.read_arrays`, a plugin program only the Pathways proxy
compiles) is replaced by a read of the same committed step from disk, placed with
the shardings the handler asks for. The devices stand in for 2 slices of 2 chips
(`device.id // 2`), as in pathways_child.py.

Prints one JSON line of results.
"""

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=4"
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ["ENABLE_PATHWAYS_PERSISTENCE"] = "1"

import concurrent.futures  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
import warnings  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402

from elastic_jax.api.control import SliceReport  # noqa: E402
from elastic_jax.api.manifest import parse_manifest  # noqa: E402
from elastic_jax.controller.backend_pathways import PathwaysBackend  # noqa: E402
from elastic_jax.controller.builtin_lm import make_trainer  # noqa: E402
from elastic_jax.controller.checkpointing import Checkpointer  # noqa: E402
from elastic_jax.controller.elastic.slice_set import SliceSet  # noqa: E402
from elastic_jax.controller.loop import TrainingRun  # noqa: E402
from elastic_jax.controller.metrics import ControllerMetrics  # noqa: E402
from elastic_jax.controller.runtime import Runtime  # noqa: E402

TINY = {"seqLen": 32, "dModel": 32, "numLayers": 1, "numHeads": 2, "mlpDim": 64, "maxBytes": 100_000}


def slice_of(device):
    return device.id // 2


def register_pathways_handler() -> str:
    """pathwaysutils.initialize() as under JAX_PLATFORMS=proxy; returns the jax.Array handler's class name."""
    import pathwaysutils

    jax.config.update("jax_platforms", "proxy")
    pathwaysutils.initialize()
    jax.config.update("jax_platforms", "cpu")  # no proxy here: the CPU devices play the slices
    return type(ocp.type_handlers.get_type_handler(jax.Array)).__name__


def job(tmp, steps):
    return parse_manifest({
        "apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": {"name": "pwr"},
        "spec": {"backend": "pathways", "slices": {"count": 2, "minSlices": 1, "accelerator": "cpu", "topology": "1x2"},
                 "training": {"steps": steps, "globalBatchSize": 8, "logEverySteps": 10},
                 "checkpoint": {"uri": f"{tmp}/ckpt", "intervalSteps": 3, "resumeFrom": "Any"}}})


def run_for(tmp, steps, trainer):
    slice_set = SliceSet(2)
    for i in range(2):
        slice_set.apply_report(i, SliceReport(state="Ready", generation=1, addresses=[f"127.0.0.1:{8470 + i}"]))
    backend = PathwaysBackend(slice_set, slice_of=slice_of)
    checkpointer = Checkpointer(f"{tmp}/ckpt", 3, 3)
    return TrainingRun(job(tmp, steps), trainer, backend, slice_set, checkpointer, ControllerMetrics()), checkpointer


def stored_arrays(tmp, step):
    """Every array of committed `step`, as NumPy, by Orbax's parameter name (what the handler asks for)."""
    with warnings.catch_warnings(), ocp.PyTreeCheckpointer() as checkpointer:
        warnings.simplefilter("ignore")
        path = f"{tmp}/ckpt/{step}/state"
        meta = checkpointer.metadata(path).item_metadata
        tree = getattr(meta, "tree", meta)
        args = jax.tree.map(lambda m: ocp.RestoreArgs(restore_type=np.ndarray), tree)
        values = checkpointer.restore(path, restore_args=args)
    return {".".join(map(str, k)): v for k, v in ocp.tree.to_flat_dict(values).items()}


def main(tmp):
    out = {}
    trainer = make_trainer(dict(TINY))
    # 1. A run of 6 steps commits steps 3 and 6 with Orbax's standard handler (as before persistence).
    run, checkpointer = run_for(tmp, 6, trainer)
    summary = run.run()
    checkpointer.close()
    out["first_run"] = {"succeeded": summary.succeeded, "committed": summary.last_committed_checkpoint_step}
    saved = jax.tree.map(np.asarray, jax.device_get(run.state))
    values = stored_arrays(tmp, 6)

    # 2. Pathways' handler, registered by pathwaysutils; its worker read replaced as the docstring says.
    out["handler"] = register_pathways_handler()
    out["compilation_cache_enabled"] = bool(jax.config.jax_enable_compilation_cache)
    from orbax.checkpoint._src.serialization import cloud_pathways_helper

    asked = []

    def read_arrays(location, names, dtypes, shapes, shardings, devices, timeout):
        asked.extend({"sharding": type(s).__name__, "devices": len(s.device_set)} for s in shardings)
        arrays = [jax.device_put(values[n].astype(d).reshape(shape), s)
                  for n, d, shape, s in zip(names, dtypes, shapes, shardings)]
        done = concurrent.futures.Future()
        done.set_result(None)
        return arrays, done

    cloud_pathways_helper.read_arrays = read_arrays

    # 3. The loop's resume (a recreated controller): its restore target, restored by the Pathways handler.
    run, checkpointer = run_for(tmp, 12, trainer)
    try:
        state = run._restore_or_init()
        leaves = jax.tree.leaves(state)
        out["resume"] = {
            "restored_from": run.restored_from_step,
            "shardings": sorted({type(x.sharding).__name__ for x in leaves}),
            "devices": sorted({len(x.sharding.device_set) for x in leaves}),
            "equal": all(np.array_equal(np.asarray(a), b) for a, b in zip(leaves, jax.tree.leaves(saved))),
        }
    except Exception as e:  # noqa: BLE001 - the fault: reported, not raised
        out["resume"] = {"error": f"{type(e).__name__}: {e}"[:1000]}
    checkpointer.close()
    out["asked"] = sorted({json.dumps(a, sort_keys=True) for a in asked})

    # 4. The library's restore (`Runtime.restore`) onto a plain jit output, as a user's own loop passes it.
    asked.clear()
    runtime = Runtime(job(tmp, 12), "t0ken")
    target = jax.jit(lambda key: {"params": trainer.init_params(key)})(jax.random.key(0))
    try:
        restored = runtime.restore({"params": target["params"], "opt_state": run.initial_state()["opt_state"]})
        out["library"] = {"step": restored.step,
                          "shardings": sorted({type(x.sharding).__name__ for x in jax.tree.leaves(restored.state)})}
    except Exception as e:  # noqa: BLE001
        out["library"] = {"error": f"{type(e).__name__}: {e}"[:1000]}
    runtime.close()
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
