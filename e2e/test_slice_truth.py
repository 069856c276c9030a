"""Issue 11 (status truth for slices), two findings of session 10's new-user trials, on the local control plane
with the real operator (least-privilege process) and real controller and worker processes:

- a worker lost while the operator itself was down (its pod already replaced by the JobSet when the operator
  came back) was counted (`sliceReplacements`, the slice's `restarts`) but got no `SliceDown` Event: the new
  operator posts exactly one, and no more on its later passes;
- the replacement, Ready again, compiles its step programs before the controller lets it join: it read `Ready`
  with no reason meanwhile. While the controller warms it, `status.slices[0].reason` says so (read on a watch:
  every version of the job the API server sends, nothing polled that could miss one).
"""

from __future__ import annotations

import os
import signal

from e2e.helpers import is_ready, pods, wait_for
from e2e.operator_fixtures import (  # noqa: F401  (fixtures)
    ejob_crd, get_job, job_events, operator, operator_kubeconfig, start_training_job,
)
from e2e.test_operator_counters import _counts, _reconciles
from e2e.test_status_truth import JobWatch
from elastic_jax.k8s_operator.slice_warming import WARMING_TO_JOIN


def test_a_worker_lost_while_the_operator_was_down_gets_one_slice_down_and_its_replacement_reads_warming(
        cluster, kube, namespace, operator):
    manifest, status, explain, _ = start_training_job(cluster, namespace, operator, "e2e-slice-truth", slices=2)
    name = manifest["metadata"]["name"]
    assert _counts(status())[1:] == (0, 0), status()
    selector = f"elasticjax.dev/job-name={name},elasticjax.dev/slice-index=0"
    victim = next(p for p in pods(cluster, namespace, selector)
                  if p["status"].get("phase") == "Running" and is_ready(p) and not p["metadata"].get("deletionTimestamp"))

    operator.kill()  # an operator crash: no pass sees what follows
    os.kill(cluster.container_pid(namespace, victim["metadata"]["name"], "worker", victim["metadata"]["uid"]),
            signal.SIGKILL)

    def replaced():
        fresh = [p for p in pods(cluster, namespace, selector) if p["metadata"]["uid"] != victim["metadata"]["uid"]
                 and p["status"].get("phase") == "Running" and is_ready(p)]
        gone = all(p["metadata"]["uid"] != victim["metadata"]["uid"] for p in pods(cluster, namespace, selector))
        return fresh if fresh and gone else None
    wait_for(replaced, timeout_s=300, what="slice 0's worker replaced by its JobSet (no operator running)",
             interval_s=0.5, explain=explain)
    job = get_job(cluster, namespace, name)
    watch = JobWatch(kube, namespace, name, job["metadata"]["resourceVersion"])
    try:
        operator.start()
        operator.wait_up()
        # (its first pass, before the controller answered it, keeps the old operator's Running on 2 slices)
        wait_for(lambda: (lambda s: s if s.get("sliceReplacements") == 1 and s.get("phase") == "Degraded" else None)(
            status()), timeout_s=300, what="the replacement counted, the controller training on slice 1",
            interval_s=0.5, explain=explain)
        # the replacement compiles (tens of seconds on a loaded machine) before it joins
        wait_for(lambda: (lambda s: s if s.get("phase") == "Running" and s.get("activeSlices") == 2 else None)(
            status()), timeout_s=600, what="the replacement back in the mesh", interval_s=0.5, explain=explain)
        passes = _reconciles(operator)
        wait_for(lambda: _reconciles(operator) >= passes + 10, timeout_s=120, what="ten more operator passes",
                 explain=explain)
    finally:
        seen = watch.stop()
    events = job_events(cluster, namespace, name)
    # The surviving slice 1 is never lost. In 2 of 5 runs of session 12 (loaded machine) it was, once the
    # replacement joined: its own SliceDown, "force-deleted (grace 0)", i.e. the controller marked it Down
    # and the operator replaced its worker. Not reproduced in 7 runs of session 13; the one check at a join
    # without the step path's stall excuse, the 5 s health-check ping of every Ready slice, now has it
    # (tests/integration/test_faults.py::test_a_health_check_that_expired_while_the_controller_was_frozen_blames_no_slice).
    # Should it happen again, the failure shows the controller's own account of slice 1.
    lost = [e for e in events if e.get("reason") in ("SliceDown", "WorkerReplaced")
            and e.get("message", "").startswith(("slice 1 ", "controller saw slice 1 "))]
    assert not lost, (lost, _controller_account(cluster, namespace, status().get("controllerPod") or f"{name}-controller-0"))
    # Slice 0's loss (the one while no operator ran): exactly one Event.
    downs = [e for e in events if e.get("reason") == "SliceDown" and e.get("message", "").startswith("slice 0 ")]
    assert len(downs) == 1 and sum(e.get("count") or 1 for e in downs) == 1, downs
    assert "slice 0 was replaced 1 time(s) while the operator was not running" in downs[0]["message"], downs
    assert downs[0]["type"] == "Warning", downs
    # the replacement, Ready to the operator, warmed before it joined: some version says so
    slice0 = [next(s for s in o["status"]["slices"] if s["index"] == 0) for o in seen if (o.get("status") or {}).get("slices")]
    assert any(s["state"] == "Ready" and s["reason"] == WARMING_TO_JOIN for s in slice0), slice0
    assert seen[-1]["status"]["slices"][0]["reason"] == "", seen[-1]["status"]["slices"]


def _controller_account(cluster, namespace: str, pod: str) -> str:
    """The controller's log lines about slice 1 and its elastic events (why it marked a slice Down)."""
    try:
        log = cluster.container_log(namespace, pod, "controller")
    except FileNotFoundError as e:
        return f"no controller log: {e}"
    keys = ("slice 1", "slices [1", "elastic", "health check", "stalled", "deadline")
    return "\n".join(line[:400] for line in log.splitlines() if any(k in line for k in keys))[-6000:]
