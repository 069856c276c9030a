"""Library mode under the operator: examples/04-own-loop.yaml (the user's own JAX + optax loop as
spec.controller.command) trains on the local control plane and survives a worker SIGKILL with the
controller process unchanged, then succeeds (the program's exit 0 read by the operator)."""

from __future__ import annotations

import os
import signal

from e2e.helpers import is_ready, pod, pods, wait_for
from e2e.operator_fixtures import (  # noqa: F401  (fixtures)
    REPO_ROOT, apply_job, ejob_crd, example_manifest, operator, operator_kubeconfig, wait_phase,
)

EXAMPLE = REPO_ROOT / "examples" / "04-own-loop.yaml"
STEPS = 10000  # a few hundred steps a second here: long enough to kill a worker mid-run


def test_own_loop_survives_a_worker_sigkill_with_the_same_controller_process(cluster, namespace, operator):
    manifest = example_manifest(EXAMPLE)
    name = manifest["metadata"]["name"]
    spec = manifest["spec"]
    # The example's command as is: `python examples/04-own-loop.py`, relative to the image's WORKDIR, where
    # the controller image has the file (a trial's `kubectl apply` of the example failed here before).
    assert spec["controller"]["command"] == ["python", "examples/04-own-loop.py"]
    spec["training"]["steps"] = STEPS
    spec["checkpoint"]["uri"] = f"/tmp/elastic-jax/e2e-own-loop/{namespace}/checkpoints"
    status, explain = apply_job(cluster, namespace, manifest, operator)

    def training_on_both(min_step: int):
        def check():
            s = status()
            ok = s.get("phase") == "Running" and s.get("activeSlices") == 2 and s.get("step", 0) >= min_step
            return s if ok else None
        return check

    s = wait_for(training_on_both(5), timeout_s=300, what="the program training on both slices", interval_s=0.5,
                 explain=explain)
    controller = pod(cluster, namespace, s["controllerPod"])
    controller_pid = cluster.container_pid(namespace, s["controllerPod"], "controller", controller["metadata"]["uid"])
    assert s["step"] < STEPS, "the job finished before a worker could be killed: raise spec.training.steps"

    victim = next(p for p in pods(cluster, namespace, f"elasticjax.dev/job-name={name},elasticjax.dev/slice-index=1")
                  if p["status"].get("phase") == "Running" and is_ready(p) and not p["metadata"].get("deletionTimestamp"))
    os.kill(cluster.container_pid(namespace, victim["metadata"]["name"], "worker", victim["metadata"]["uid"]),
            signal.SIGKILL)

    def recovered():  # (whether the replaced worker rejoins before the last step depends on the machine's load)
        s = status()
        return s if int(s.get("recoveries") or 0) >= 1 else None
    s = wait_for(recovered, timeout_s=300, what="the slice loss counted as a recovery", interval_s=0.5,
                 explain=explain)
    # the same controller pod (restartPolicy Never) and the same process in it: the node agent records
    # the PID of each start of the container
    assert s["controllerPod"] == controller["metadata"]["name"] and int(s.get("controllerRestarts") or 0) == 0, s
    assert cluster.container_pid(namespace, s["controllerPod"], "controller", controller["metadata"]["uid"]) \
        == controller_pid
    job = wait_phase(cluster, namespace, name, ("Succeeded",), timeout_s=600, explain=explain)
    s = job["status"]
    assert s["step"] == STEPS and int(s.get("recoveries") or 0) >= 1, s
    assert int(s.get("controllerRestarts") or 0) == 0, s
