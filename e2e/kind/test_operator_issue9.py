"""The operator's remaining issue-9 findings, on the kind cluster with the chart's operator (real kubelet,
real Job/JobSet controllers, real admission):

- a job deleted and applied again at once under the same name never counts the old job's terminating
  pods as its own (no restart, no SliceDown from them) and trains;
- a foreign JobSet holding a slice's name is a ChildNameConflict condition and Event (not a silent
  Provisioning), and suspend toggled off right after it released the controller counts no loss;
- a worker pod the Job controller cannot create (a real ResourceQuota admitting the controller pod
  only) is a PodsNotStarting condition and an Event on the job with the API server's message, and the
  Events the operator posts name it (elastic-jax-operator), not kopf.

Every job runs in a fresh namespace enforcing PodSecurity ``restricted``.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from e2e.helpers import wait_for
from e2e.kind import demo
from e2e.operator_fixtures import example_manifest, get_job
from elastic_jax import contract

pytestmark = pytest.mark.timeout(3600)

UID_LABEL = "elasticjax.dev/job-uid"


def _apply(cluster, namespace, manifest):
    return cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest))


def _events_of(cluster, namespace, uid):
    items = cluster.api().get(f"/api/v1/namespaces/{namespace}/events",
                              fieldSelector=f"involvedObject.uid={uid}")["items"]
    return items


def _step(cluster, namespace, name):
    return int((get_job(cluster, namespace, name).get("status") or {}).get("step") or 0)


def test_job_deleted_and_reapplied_at_once_does_not_count_the_old_jobs_pods(cluster, namespace, operator):
    why = demo.explain(cluster.kind, namespace)
    manifest = example_manifest()
    manifest["spec"]["training"]["steps"] = 100000
    _apply(cluster, namespace, manifest)
    wait_for(lambda: _step(cluster, namespace, "cpu-job") >= 2, timeout_s=600, what="the first job trains",
             explain=why)
    old_uid = get_job(cluster, namespace, "cpu-job")["metadata"]["uid"]
    # kubectl waits for the object to go (kopf's finalizer), not for its pods: they terminate in the background
    cluster.kubectl("delete", "ejob", "cpu-job", "-n", namespace, timeout_s=120)
    _apply(cluster, namespace, manifest)
    old_pods = cluster.api().get(f"/api/v1/namespaces/{namespace}/pods",
                                 labelSelector=f"{UID_LABEL}={old_uid}")["items"]
    assert old_pods, "the old job's pods were gone before the re-apply: this run did not exercise the race"
    new = get_job(cluster, namespace, "cpu-job")
    new_uid = new["metadata"]["uid"]
    assert new_uid != old_uid
    wait_for(lambda: _step(cluster, namespace, "cpu-job") >= 3, timeout_s=600, what="the new job trains",
             explain=why)
    # its pods and JobSets carry its UID (the Job controller's pods through the JobSet's templates)
    ours = cluster.api().get(f"/api/v1/namespaces/{namespace}/pods", labelSelector=f"{UID_LABEL}={new_uid}")["items"]
    roles = sorted(p["metadata"]["labels"]["elasticjax.dev/role"] for p in ours if not p["metadata"].get(
        "deletionTimestamp"))
    assert roles.count("controller") == 1 and roles.count("worker") == 2, roles
    status = get_job(cluster, namespace, "cpu-job")["status"]
    assert int(status.get("controllerRestarts") or 0) == 0, status
    assert all("143" not in (s.get("reason") or "") for s in status.get("slices") or []), status["slices"]
    events = _events_of(cluster, namespace, new_uid)
    # nor a conflict over the old job's children still being garbage-collected (token Secret, ConfigMap ...)
    bad = [(e["reason"], e["message"]) for e in events
           if e["reason"] in ("SliceDown", "ControllerRestarted", "WorkerReplaced", "NodeLost",
                              "TokenSecretConflict", "ChildNameConflict")]
    assert bad == [], bad
    # the old job's pods went their own way: none was adopted, none is running now
    wait_for(lambda: not cluster.api().get(f"/api/v1/namespaces/{namespace}/pods",
                                           labelSelector=f"{UID_LABEL}={old_uid}")["items"],
             timeout_s=180, what="the old job's pods gone", explain=why)


def _foreign_jobset(name: str) -> dict:
    """A JobSet nobody's job owns, suspended (it runs nothing), holding a slice's name."""
    pod = {"restartPolicy": "Never", "containers": [{"name": "c", "image": "registry.invalid/nothing:1"}]}
    return {"apiVersion": contract.JOBSET_API_VERSION, "kind": "JobSet", "metadata": {"name": name},
            "spec": {"suspend": True, "replicatedJobs": [{"name": "w", "replicas": 1, "template": {
                "spec": {"template": {"spec": pod}}}}]}}


def _create_failed(cluster, namespace):
    status = get_job(cluster, namespace, "cpu-job").get("status") or {}
    return next((c for c in status.get("conditions") or [] if c["type"] == "CreateFailed"), None)


def test_a_foreign_jobset_on_a_slice_name_is_said_and_a_quick_suspend_toggle_counts_no_loss(cluster, namespace,
                                                                                           operator):
    why = demo.explain(cluster.kind, namespace)
    _apply(cluster, namespace, _foreign_jobset("cpu-job-slice-1"))
    manifest = example_manifest()
    manifest["spec"]["training"]["steps"] = 100000
    _apply(cluster, namespace, manifest)
    cond = wait_for(lambda: (c := _create_failed(cluster, namespace)) and c["status"] == "True" and c,
                    timeout_s=300, what="CreateFailed naming the foreign JobSet", explain=why)
    assert cond["reason"] == "ChildNameConflict", cond
    assert "JobSet cpu-job-slice-1 exists and is not owned by this job" in cond["message"], cond
    uid = get_job(cluster, namespace, "cpu-job")["metadata"]["uid"]
    wait_for(lambda: [e for e in _events_of(cluster, namespace, uid) if e["reason"] == "ChildNameConflict"],
             timeout_s=60, what="the ChildNameConflict Event", explain=why)
    # the operator neither used nor deleted it
    assert cluster.kubectl("get", "jobset", "cpu-job-slice-1", "-n", namespace, check=False).returncode == 0
    cluster.kubectl("delete", "jobset", "cpu-job-slice-1", "-n", namespace, "--wait=true", timeout_s=120)
    wait_for(lambda: _step(cluster, namespace, "cpu-job") >= 2, timeout_s=600, what="the job trains once it is gone",
             explain=why)
    assert _create_failed(cluster, namespace)["status"] == "False"

    # What happened before the suspend is not the toggle's: a loaded node may flap a worker's readiness
    # (a real SliceDown) or kill a starting controller. The toggle itself must add no loss.
    before = get_job(cluster, namespace, "cpu-job")["status"]
    restarts_before = int(before.get("controllerRestarts") or 0)
    suspended_pod = before["controllerPod"]
    seen_before = {e["metadata"]["uid"]: int(e.get("count") or 1) for e in _events_of(cluster, namespace, uid)}

    # suspend, and resume as soon as the operator has let go of the controller (it is checkpointing)
    def patch_suspend(value: bool):
        cluster.kubectl("patch", "ejob", "cpu-job", "-n", namespace, "--type=merge",
                        "-p", json.dumps({"spec": {"suspend": value}}))

    patch_suspend(True)

    def controller_deleting():
        pods = cluster.api().get(f"/api/v1/namespaces/{namespace}/pods",
                                 labelSelector="elasticjax.dev/role=controller")["items"]
        return all(p["metadata"].get("deletionTimestamp") for p in pods)

    wait_for(controller_deleting, timeout_s=120, what="the suspend deleting the controller pod", explain=why)
    patch_suspend(False)  # while it still checkpoints (its grace period), as the trial did

    suspended_uid = cluster.api().get(f"/api/v1/namespaces/{namespace}/pods/{suspended_pod}")["metadata"]["uid"]

    def resumed():
        # A new controller pod: <job>-controller-<n+1> while the suspended one is still known, or
        # <job>-controller-0 again when it was gone before the resume's pass (the name is free then).
        status = get_job(cluster, namespace, "cpu-job").get("status") or {}
        name = status.get("controllerPod")
        if status.get("phase") != "Running" or not name:
            return None
        pods = cluster.api().get(f"/api/v1/namespaces/{namespace}/pods",
                                 fieldSelector=f"metadata.name={name}")["items"]
        return pods and pods[0]["metadata"]["uid"] != suspended_uid and status

    status = wait_for(resumed, timeout_s=600, what=f"a new controller pod (not {suspended_pod}) runs after the resume",
                      explain=why)
    assert int(status.get("controllerRestarts") or 0) == restarts_before, status
    new_events = [e for e in _events_of(cluster, namespace, uid)
                  if int(e.get("count") or 1) > seen_before.get(e["metadata"]["uid"], 0)]
    bad = [(e["reason"], e["message"]) for e in new_events
           if e["reason"] in ("ControllerRestarted", "SliceDown", "SliceDraining")]
    assert bad == [], bad
    # the example's checkpoint is local to the released pod: the next controller starts from step 0, said
    reasons = {e["reason"] for e in new_events}
    assert {"SuspendDropsCheckpoints", "ResumedFromStepZero"} <= reasons, sorted(reasons)
    cluster.kubectl("delete", "ejob", "cpu-job", "-n", namespace, "--wait=false")


def test_worker_pod_refused_by_a_quota_is_a_condition_and_an_event_from_the_operator(cluster, namespace, operator):
    why = demo.explain(cluster.kind, namespace)
    # Admits the controller pod (the operator creates it first), refuses the workers the Job controller creates.
    cluster.kubectl("create", "quota", "one-pod", "-n", namespace, "--hard=pods=1")
    manifest = example_manifest()
    manifest["spec"]["training"]["steps"] = 20
    # the Job controller retries a refused pod with back-off (minutes): the controller waits that long
    manifest["spec"].setdefault("elasticity", {})["sliceWaitTimeoutSeconds"] = 1800
    _apply(cluster, namespace, manifest)

    def condition():
        status = get_job(cluster, namespace, "cpu-job").get("status") or {}
        return next((c for c in status.get("conditions") or []
                     if c["type"] == "PodsNotStarting" and c["status"] == "True"), None)
    cond = wait_for(condition, timeout_s=300, what="PodsNotStarting naming the quota", explain=why)
    assert cond["reason"] == "FailedCreate", cond
    assert "worker pods cannot be created" in cond["message"] and "exceeded quota: one-pod" in cond["message"], cond
    # Read from the slice's own Job (the operator finds it by UID under the slice's JobSet): the message
    # names that Job and a pod of it, of the same slice.
    assert re.search(r"slice (\d) worker pods cannot be created: Job cpu-job-slice-\1-worker-0: FailedCreate: .*"
                     r'pods "cpu-job-slice-\1-worker-0-', cond["message"]), cond
    uid = get_job(cluster, namespace, "cpu-job")["metadata"]["uid"]
    events = wait_for(lambda: [e for e in _events_of(cluster, namespace, uid) if e["reason"] == "FailedCreate"],
                      timeout_s=60, what="the FailedCreate Event on the job", explain=why)
    assert "exceeded quota: one-pod" in events[0]["message"], events[0]
    # Events say who posted them: the operator, not the library it is built on.
    for event in _events_of(cluster, namespace, uid):
        assert (event.get("source") or {}).get("component") == "elastic-jax-operator", event
        assert event.get("reportingComponent") == "elastic-jax-operator", event
    described = cluster.kubectl("describe", "ejob", "cpu-job", "-n", namespace).stdout
    assert "elastic-jax-operator" in described and "kopf" not in described.split("Events:")[-1], described
    # the quota is raised: the Job controller creates the workers, the condition clears, the job trains
    cluster.kubectl("delete", "quota", "one-pod", "-n", namespace)
    wait_for(lambda: (get_job(cluster, namespace, "cpu-job").get("status") or {}).get("phase") == "Succeeded",
             timeout_s=900, what="the job Succeeded once the quota is gone", explain=why)
    final = get_job(cluster, namespace, "cpu-job")["status"]
    cleared = next(c for c in final["conditions"] if c["type"] == "PodsNotStarting")
    assert cleared["status"] == "False", cleared


def _second_operator(kubeconfig, folder, namespace: str, identity: str):
    """A second `elastic-jax-operator` process on the host with another identity, watching one namespace
    through the kind API server (as a second release would); the test stops it by PID."""
    from e2e.operator_fixtures import OperatorProcess
    from elastic_jax.local.processes import free_port

    port = free_port()
    return OperatorProcess(kubeconfig, folder / "second-operator.log", port,
                           extra_args=("--identity", identity, "--namespace", namespace, "--node-lost-seconds", "0"))


def test_a_second_operator_leaves_a_job_the_first_claimed_alone_and_says_so(cluster, namespace, operator, tmp_path):
    why = demo.explain(cluster.kind, namespace)
    second = _second_operator(cluster.kubeconfig, tmp_path, namespace, "host/second")
    second.start()
    try:
        manifest = example_manifest()
        manifest["spec"]["training"]["steps"] = 100000
        # The chart's release claims it (set here so the test does not depend on which operator is faster;
        # the race itself is tests/unit/test_operator_claims.py).
        chart_identity = f"{demo.SYSTEM_NS}/{demo.RELEASE}"
        manifest["metadata"]["annotations"] = {"elasticjax.dev/claimed-by": chart_identity}
        _apply(cluster, namespace, manifest)
        uid = get_job(cluster, namespace, "cpu-job")["metadata"]["uid"]
        events = wait_for(lambda: [e for e in _events_of(cluster, namespace, uid)
                                   if e["reason"] == "ClaimedByAnotherOperator"],
                          timeout_s=120, what="the second operator's ClaimedByAnotherOperator Event", explain=why)
        assert "operator host/second leaves this job alone" in events[0]["message"], events[0]
        assert chart_identity in events[0]["message"], events[0]
        wait_for(lambda: _step(cluster, namespace, "cpu-job") >= 3, timeout_s=600, what="the job trains", explain=why)
        assert second.alive()
        assert "elasticjax_operator_jobs_claimed_elsewhere 1.0" in second.metrics()
        lines = [r for r in second.log_records() if r.get("claimed_by") == chart_identity]
        assert lines and lines[0]["job"] == "cpu-job" and lines[0]["level"] == "warning", lines
        status = get_job(cluster, namespace, "cpu-job")["status"]
        assert int(status.get("controllerRestarts") or 0) == 0
        assert len([e for e in _events_of(cluster, namespace, uid) if e["reason"] == "ClaimedByAnotherOperator"]) == 1
    finally:
        second.stop()


def test_the_chart_refuses_an_overlapping_second_release(cluster, operator):
    from e2e.kind.demo import REPO_ROOT

    result = cluster.helm("install", "second", str(REPO_ROOT / "helm" / "elastic-jax"), "-n", "second-system",
                          "--create-namespace", "--set", "watchNamespaces={team-a}", "--dry-run=server", check=False)
    assert result.returncode != 0
    assert f"overlaps release {demo.SYSTEM_NS}/{demo.RELEASE}" in result.stderr, result.stderr
