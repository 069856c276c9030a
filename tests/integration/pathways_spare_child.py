"""Child process for test_backend_pathways.py: 6 CPU devices standing in for 3 slices of 2 chips, one a hot spare.

The pathways backend's real mesh, health-check, snapshot-restore and swap paths under the real
`TrainingRun`; only `device.slice_index` is replaced (CPU devices have none) by `device.id // 2`.
Prints one JSON line of results.
"""

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=6"
os.environ["JAX_PLATFORMS"] = "cpu"

import json  # noqa: E402
import sys  # noqa: E402

from elastic_jax.api.control import SliceReport  # noqa: E402
from elastic_jax.api.manifest import parse_manifest  # noqa: E402
from elastic_jax.controller.backend_pathways import PathwaysBackend  # noqa: E402
from elastic_jax.controller.builtin_lm import make_trainer  # noqa: E402
from elastic_jax.controller.checkpointing import Checkpointer  # noqa: E402
from elastic_jax.controller.elastic.errors import SliceDownError  # noqa: E402
from elastic_jax.controller.elastic.slice_set import SliceSet  # noqa: E402
from elastic_jax.controller.loop import TrainingRun  # noqa: E402
from elastic_jax.controller.metrics import ControllerMetrics  # noqa: E402

TINY = {"seqLen": 32, "dModel": 32, "numLayers": 1, "numHeads": 2, "mlpDim": 64, "maxBytes": 100_000}
LOST_AT_CALL = 16  # the 16th launch: 14 steps done, the 15th running (launched ahead)
BACK_AT_CALL = 22


def ready(slice_set, index, generation):
    slice_set.apply_report(index, SliceReport(state="Ready", generation=generation, addresses=[f"127.0.0.1:{8470 + index}"]))


def main(tmp):
    job = parse_manifest({
        "apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": {"name": "pw-spare"},
        "spec": {"backend": "pathways",
                 "slices": {"count": 2, "spares": 1, "minSlices": 1, "accelerator": "cpu", "topology": "1x2"},
                 "training": {"steps": 30, "globalBatchSize": 8, "logEverySteps": 10},
                 "checkpoint": {"uri": f"{tmp}/ckpt", "intervalSteps": 100},
                 "elasticity": {"hostSnapshotIntervalSteps": 5}}})
    trainer = make_trainer(dict(TINY))
    slice_set = SliceSet(job.spec.slices.count, job.spec.slices.spares)
    for i in range(slice_set.total):
        ready(slice_set, i, 1)
    backend = PathwaysBackend(slice_set, slice_of=lambda d: d.id // 2)
    calls = {"n": 0}
    actives: list[list[int]] = []
    spares_seen: list[list[int]] = []
    real = backend.launch

    def step(fn, params, batch, active):
        calls["n"] += 1
        if calls["n"] == LOST_AT_CALL:
            # What Pathways raises when a slice's workers go away mid-step (the backend's own path is
            # test_backend_pathways' first test); the operator's Down report arrives with it.
            slice_set.mark_down([1], "test: slice 1 lost")
            raise SliceDownError("DATA_LOSS: slice 1 lost", [1])
        if calls["n"] == BACK_AT_CALL:
            ready(slice_set, 1, 2)  # the operator replaced slice 1: it comes back as the spare
        actives.append(sorted(active))
        spares_seen.append(sorted(slice_set.spare_indices()))
        return real(fn, params, batch, active)

    backend.launch = step
    checkpointer = Checkpointer(job.spec.checkpoint.uri, 100, 2)
    summary = TrainingRun(job, trainer, backend, slice_set, checkpointer, ControllerMetrics()).run()
    checkpointer.close()
    print("RESULT " + json.dumps({
        "succeeded": summary.succeeded, "failure": summary.failure_reason, "steps": summary.steps,
        "steps_lost": summary.steps_lost, "causes": [r["cause"] for r in summary.recoveries],
        "actives": actives, "spares_seen": spares_seen, "loss_down": summary.final_loss < summary.initial_loss,
    }))


if __name__ == "__main__":
    main(sys.argv[1])
