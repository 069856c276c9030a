"""The job's life beyond worker failures: controller loss, suspend/resume, TTL.

On the kind cluster, with the chart's operator and checkpoints on GCS (a
fake-gcs-server in the test's namespace, :mod:`e2e.kind.gcs`), so that they
outlive the controller pod as on GKE:

- failure flow 3: SIGKILL of the controller pod's process. The operator
  creates a new controller pod (restartPolicy Never, so a new name), counts
  it in `status.controllerRestarts` with a condition and an Event, keeps the
  worker pods (same UIDs), and the new process resumes from the latest
  committed checkpoint and trains; a later worker loss does not count as a
  controller restart. (A new controller pod from a checkpoint running on to
  Succeeded is the suspend test's resume here and e2e/test_chaos_cluster.py's
  restart arm.)
- `spec.suspend: true` mid-training: the controller checkpoints the step it
  reached (SIGTERM, graceful delete), every pod goes, phase Suspended;
  `suspend: false` brings the children back and training resumes from that
  checkpoint to Succeeded;
- `ttlSecondsAfterFinished`: a finished job and all its children are deleted.

Each run gets its own bucket and a shortened step count, so the file stays
within a few minutes on two shared cores.
"""

from __future__ import annotations

import json
import re
import signal
import time

import pytest
import yaml

from elastic_jax.logs import read_events

from e2e.helpers import is_ready, pods, summary, wait_for
from e2e.kind import gcs as gcs_mod
from e2e.kind.target import LogFollower
from e2e.nodeagent.kubeapi import ApiError
from e2e.operator_fixtures import (example_manifest, get_job, job_children, job_events, wait_finished_while_training,
                                   wait_phase)

# The first test of a session also pays for what its fixtures build (images, node
# image, cluster, chart: up to ~30 min on a fresh machine under load).
pytestmark = pytest.mark.timeout(3600)

JOB = "cpu-job"
SEL = f"elasticjax.dev/job-name={JOB}"
CONTROLLERS = f"{SEL},elasticjax.dev/role=controller"
WORKERS = f"{SEL},elasticjax.dev/role=worker"
RESTORED = re.compile(r"restored checkpoint step (\d+)")
# The suspend lands a few dozen steps past 30; the rest after the resume is what reaches Succeeded.
STEPS_SUSPEND = 600


def _apply(cluster, namespace, gcs, steps: int, **spec) -> dict:
    """Applies examples/01-cpu-job.yaml with `steps`, checkpoints in the namespace's GCS (the
    example's local path, in the controller pod, when `gcs` is None) and `spec` overrides."""
    manifest = example_manifest()
    manifest["spec"]["training"]["steps"] = steps
    if gcs is not None:
        manifest["spec"]["checkpoint"]["uri"] = f"{gcs.make_bucket('ckpt')}/{JOB}"
        manifest["spec"]["controller"]["env"] = gcs_mod.controller_env(namespace)
    manifest["spec"].update(spec)
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest))
    return manifest


def _explain(cluster, namespace, operator):
    def job_state() -> str:
        job = get_job(cluster, namespace, JOB)
        meta = {k: job["metadata"].get(k) for k in ("deletionTimestamp", "finalizers")}
        return json.dumps({"metadata": meta, "status": job.get("status") or {}}, indent=1)[:2500]
    return lambda: (summary(pods(cluster, namespace)) + "\n" + job_state()
                    + "\n" + operator.log()[-2500:])


def _status(cluster, namespace) -> dict:
    return get_job(cluster, namespace, JOB).get("status") or {}


def _running_controller(cluster, namespace, not_uid: str = "") -> dict | None:
    """The controller pod that is Running (and not `not_uid`), or None."""
    live = [p for p in pods(cluster, namespace, CONTROLLERS)
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
            and p["metadata"]["uid"] != not_uid]
    return live[-1] if live else None


def _live_workers(cluster, namespace) -> dict[str, str]:
    """name → UID of the Running, Ready worker pods."""
    return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods(cluster, namespace, WORKERS)
            if p["status"].get("phase") == "Running" and is_ready(p) and not p["metadata"].get("deletionTimestamp")}


def _restored_step(cluster, namespace, pod: dict) -> int | None:
    """N from the controller's `restored checkpoint step N` log line, None before it is written."""
    try:
        text = cluster.container_log(namespace, pod["metadata"]["name"], "controller", pod["metadata"]["uid"])
    except FileNotFoundError:
        return None
    found = RESTORED.findall(text)
    return int(found[-1]) if found else None


def _reasons(cluster, namespace) -> list[tuple[str, str]]:
    return [(e["reason"], e["message"]) for e in job_events(cluster, namespace, JOB)]


def test_controller_killed_is_recreated_and_resumes_from_checkpoint(cluster, namespace, operator, gcs):
    """Failure flow 3: a SIGKILLed controller is replaced and counted; workers stay; training resumes."""
    # Never reached: the test ends while the job trains, whatever the machine's speed.
    manifest = _apply(cluster, namespace, gcs, steps=100_000)
    explain = _explain(cluster, namespace, operator)
    # Wait past the first committed checkpoint (intervalSteps 50), so there is one to resume from.
    wait_for(lambda: (_status(cluster, namespace).get("lastCheckpointStep") or 0) >= 50, timeout_s=180,
             what="first checkpoint committed", explain=explain)
    old = _running_controller(cluster, namespace)
    workers = _live_workers(cluster, namespace)
    assert old is not None and len(workers) == 2, explain()
    committed_before = max(gcs.committed_steps(manifest["spec"]["checkpoint"]["uri"]))

    cluster.signal_container(namespace, old["metadata"]["name"], "controller", signal.SIGKILL)
    new = wait_for(lambda: _running_controller(cluster, namespace, not_uid=old["metadata"]["uid"]), timeout_s=60,
                   what="a new controller pod", explain=explain)
    assert new["metadata"]["name"] == f"{JOB}-controller-1", new["metadata"]["name"]
    restored = wait_for(lambda: _restored_step(cluster, namespace, new), timeout_s=90,
                        what="new controller restored a checkpoint", explain=explain)
    # The newest committed step at the kill, or a later one that committed while the old process died.
    assert restored >= committed_before, (restored, committed_before)

    # Training continues on the same worker processes: the pods were never replaced.
    wait_for(lambda: _status(cluster, namespace).get("step", 0) > restored, timeout_s=90,
             what="new controller trains", explain=explain)
    assert _live_workers(cluster, namespace) == workers
    status = _status(cluster, namespace)
    assert status["controllerRestarts"] == 1
    assert status["controllerPod"] == f"{JOB}-controller-1"
    assert all(s["restarts"] == 0 for s in status["slices"]), status["slices"]

    # A worker failure under the new controller is a slice replacement, never a controller restart.
    victim = sorted(workers)[0]
    cluster.signal_container(namespace, victim, "worker", signal.SIGKILL)
    wait_for(lambda: victim not in _live_workers(cluster, namespace) and len(_live_workers(cluster, namespace)) == 2,
             timeout_s=90, what="killed worker replaced", explain=explain)

    # The operator has counted the replacement and the new controller trains on both slices again:
    # only then is "not a controller restart" a statement about the worker loss.
    step_replaced = _status(cluster, namespace).get("step", 0)

    def recovered() -> dict | None:
        st = _status(cluster, namespace)
        return st if (st.get("sliceReplacements", 0) >= 1 and st.get("activeSlices") == 2
                      and st.get("step", 0) > step_replaced) else None
    status = wait_for(recovered, timeout_s=120, what="replacement counted, both slices training", explain=explain)
    assert status["controllerRestarts"] == 1, "the worker loss did not count as a controller restart"
    assert status["controllerPod"] == f"{JOB}-controller-1", status
    cond = next(c for c in status["conditions"] if c["type"] == "ControllerRestarted")
    assert cond["status"] == "True" and cond["reason"] == "ControllerPodLost", cond
    restarted = [m for r, m in _reasons(cluster, namespace) if r == "ControllerRestarted"]
    assert len(restarted) == 1 and old["metadata"]["name"] in restarted[0] and "exit code 137" in restarted[0], restarted
    # The dead pod is deleted by the operator; exactly one controller pod (the new one) is left.
    wait_for(lambda: [p["metadata"]["uid"] for p in pods(cluster, namespace, CONTROLLERS)] == [new["metadata"]["uid"]],
             timeout_s=60, what="only the new controller pod left", explain=explain)


def test_suspend_checkpoints_tears_down_and_resume_continues(cluster, namespace, operator, gcs, tmp_path):
    """suspend: true → checkpoint at the step reached, no pods, Suspended; false → resumes from it."""
    # minSlices = count (pause and resume): a worker gone before the controller's last step would
    # make it wait for the slice instead of checkpointing, so this also shows the teardown order.
    manifest = _apply(cluster, namespace, gcs, steps=STEPS_SUSPEND,
                      slices={**example_manifest()["spec"]["slices"], "minSlices": 2})
    uri = manifest["spec"]["checkpoint"]["uri"]
    explain = _explain(cluster, namespace, operator)
    wait_for(lambda: _status(cluster, namespace).get("step", 0) >= 30, timeout_s=180, what="training started",
             explain=explain)
    first = _running_controller(cluster, namespace)
    first_loss = _status(cluster, namespace)["initialLoss"]
    # The pod is deleted by the suspend before its log could be read: follow it from now.
    follower = LogFollower(cluster, namespace, first["metadata"]["name"], "controller", tmp_path / "first.log")
    try:
        cluster.kubectl("patch", "ejob", JOB, "-n", namespace, "--type", "merge", "-p", '{"spec":{"suspend":true}}')
        # Well under the controller's 60 s grace: it stopped by itself, it was not SIGKILLed.
        wait_for(lambda: not pods(cluster, namespace, SEL), timeout_s=45, what="every pod gone after suspend",
                 explain=explain)
        log = follower.wait_ended(timeout_s=30)
    finally:
        follower.stop()
    status = wait_phase(cluster, namespace, JOB, ("Suspended",), timeout_s=30)["status"]
    cond = next(c for c in status["conditions"] if c["type"] == "Suspended")
    assert cond["status"] == "True" and cond["observedGeneration"] == 2, cond
    assert status["activeSlices"] == 0 and status["controllerPod"] == "", status

    # The controller stopped at a step boundary on SIGTERM and committed exactly that step.
    finished = [e for e in read_events(log) if e.get("event") == "finished"]
    assert finished, log[-3000:]
    reached = finished[-1]["steps"]
    assert 30 <= reached < manifest["spec"]["training"]["steps"], finished[-1]
    assert finished[-1]["last_committed_checkpoint_step"] == reached, finished[-1]
    assert finished[-1]["recoveries"] == [], "the workers outlived the controller's last step"
    assert max(gcs.committed_steps(uri)) == reached, gcs.committed_steps(uri)
    # Nothing comes back while suspended.
    time.sleep(3)
    assert not pods(cluster, namespace, SEL)

    cluster.kubectl("patch", "ejob", JOB, "-n", namespace, "--type", "merge", "-p", '{"spec":{"suspend":false}}')
    second = wait_for(lambda: _running_controller(cluster, namespace), timeout_s=60, what="controller after resume",
                      explain=explain)
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    restored = wait_for(lambda: _restored_step(cluster, namespace, second), timeout_s=90,
                        what="resumed controller restored a checkpoint", explain=explain)
    assert restored == reached
    # (at load 20-30 on 2 cores the steps left can take minutes; only a stall fails)
    job = wait_finished_while_training(cluster, namespace, JOB, stall_s=120)
    status = job["status"]
    assert status["phase"] == "Succeeded", status
    assert status["step"] == manifest["spec"]["training"]["steps"]
    assert status["initialLoss"] == first_loss, "the initial loss travels with the checkpoint"
    assert status["loss"] < status["initialLoss"], status
    assert status["controllerRestarts"] == 0, "a suspend is not a controller loss"
    suspended = next(c for c in status["conditions"] if c["type"] == "Suspended")
    assert suspended["status"] == "False", suspended
    phases = [m for r, m in _reasons(cluster, namespace) if r == "PhaseChanged"]
    assert any(m.endswith("-> Suspended") for m in phases) and "Suspended -> Pending" in phases, phases


def test_ttl_deletes_finished_job_and_children(cluster, namespace, operator):
    """ttlSecondsAfterFinished: 5 → the job and every child are gone within a stated bound."""
    _apply(cluster, namespace, None, steps=20, ttlSecondsAfterFinished=5)
    explain = _explain(cluster, namespace, operator)
    job = wait_phase(cluster, namespace, JOB, ("Succeeded", "Failed"), timeout_s=180, explain=explain)
    assert job["status"]["phase"] == "Succeeded", job["status"]
    succeeded_at = time.monotonic()
    api = cluster.api()

    def job_gone():
        try:
            get_job(cluster, namespace, JOB)
            return False
        except ApiError as e:
            return e.status == 404

    def children():
        return job_children(api, namespace, JOB)

    # Not before the TTL: the finished controller pod stays for its logs until then.
    time.sleep(2)
    assert not job_gone()
    # Bound: TTL 5 s, completionTime has 1 s resolution, the timer runs every 1 s, and the
    # garbage collector deletes the children after the owner: 20 s from Succeeded seen.
    wait_for(job_gone, timeout_s=20 - (time.monotonic() - succeeded_at), what="job deleted by TTL", explain=explain)
    deleted_after = time.monotonic() - succeeded_at
    # The children go by the API server's garbage collector after the owner; its queue
    # lags under load (once over 15 s here), so that part has a looser bound of 60 s.
    wait_for(lambda: not children(), timeout_s=60 - (time.monotonic() - succeeded_at),
             what="children garbage-collected", explain=lambda: str(children()))
    assert deleted_after >= 3, f"deleted {deleted_after:.1f}s after Succeeded: before the TTL of 5 s"
