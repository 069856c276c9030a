"""`kubectl apply -f examples/04-own-loop.yaml` on kind: the user's own loop (library mode) in the real
controller image trains, survives a worker process SIGKILLed in its container with the same controller
container (same container ID, restartCount 0), and succeeds."""

from __future__ import annotations

import json
import signal

import pytest
import yaml

from e2e.helpers import is_ready, pods, wait_for
from e2e.operator_fixtures import REPO_ROOT, example_manifest, get_job, wait_phase

# The first test of a session also pays for what its fixtures build (images, node image, cluster, chart).
pytestmark = pytest.mark.timeout(3600)

EXAMPLE = REPO_ROOT / "examples" / "04-own-loop.yaml"
STEPS = 10000  # hundreds of steps a second: long enough to kill a worker mid-run, short enough to finish


def _controller_container(cluster, namespace, name):
    (ctrl,) = pods(cluster, namespace, f"elasticjax.dev/job-name={name},elasticjax.dev/role=controller")
    (cs,) = ctrl["status"]["containerStatuses"]
    return ctrl["metadata"]["uid"], cs.get("containerID"), cs["restartCount"]


def test_own_loop_example_in_the_controller_image_survives_a_worker_sigkill(cluster, namespace, operator):
    manifest = example_manifest(EXAMPLE)
    name = manifest["metadata"]["name"]
    # As shipped (the image carries examples/04-own-loop.py at its working directory); only longer.
    assert manifest["spec"]["controller"]["command"] == ["python", "examples/04-own-loop.py"]
    manifest["spec"]["training"]["steps"] = STEPS
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest))

    def status() -> dict:
        return get_job(cluster, namespace, name).get("status") or {}

    def explain() -> str:
        return json.dumps(status(), indent=1)[:3000] + "\n" + operator.log()[-3000:]

    def training_on_both():
        s = status()
        return s if s.get("phase") == "Running" and s.get("activeSlices") == 2 and s.get("step", 0) >= 5 else None

    s = wait_for(training_on_both, timeout_s=600, what="the program training on both slices", interval_s=0.5,
                 explain=explain)
    assert s["step"] < STEPS, "the job finished before a worker could be killed: raise STEPS"
    before = _controller_container(cluster, namespace, name)

    victim = next(p for p in pods(cluster, namespace, f"elasticjax.dev/job-name={name},elasticjax.dev/slice-index=1")
                  if p["status"].get("phase") == "Running" and is_ready(p) and not p["metadata"].get("deletionTimestamp"))
    cluster.signal_container(namespace, victim["metadata"]["name"], "worker", signal.SIGKILL)

    def recovered():
        s = status()
        return s if int(s.get("recoveries") or 0) >= 1 else None
    wait_for(recovered, timeout_s=300, what="the slice loss counted as a recovery", interval_s=0.5, explain=explain)
    job = wait_phase(cluster, namespace, name, ("Succeeded", "Failed"), timeout_s=900, explain=explain)
    s = job["status"]
    assert s["phase"] == "Succeeded", s
    assert s["step"] == STEPS and int(s.get("recoveries") or 0) >= 1, s
    assert int(s.get("controllerRestarts") or 0) == 0, s
    # the same controller container (restartPolicy Never: the same process), never restarted
    uid, container_id, restarts = _controller_container(cluster, namespace, name)
    assert (uid, container_id) == before[:2] and restarts == 0, (before, (uid, container_id, restarts))
    log = cluster.container_log(namespace, s["controllerPod"], "controller")
    assert f"done: step {STEPS}" in log, log[-2000:]
