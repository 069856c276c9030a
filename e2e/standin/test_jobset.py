"""JobSets through the real JobSet controller and webhooks: placement on TPU pools, failure policy."""

from __future__ import annotations

import os
import signal

from e2e.helpers import apply, pods, summary, wait_for
from elastic_jax import contract

RESTART_LABEL = "jobset.sigs.k8s.io/restart-attempt"


def jobset_manifest(name: str, command: str, failure_policy: str = "") -> str:
    """Two replicated Jobs (one per slice), each one pod taking a whole 2x2 v5e node."""
    return f"""
apiVersion: jobset.x-k8s.io/v1alpha2
kind: JobSet
metadata:
  name: {name}
  annotations:
    alpha.jobset.sigs.k8s.io/exclusive-topology: cloud.google.com/gke-nodepool
spec:
  {failure_policy}
  replicatedJobs:
  - name: slice
    replicas: 2
    template:
      spec:
        parallelism: 1
        completions: 1
        backoffLimit: 0
        template:
          spec:
            restartPolicy: Never
            nodeSelector:
              cloud.google.com/gke-tpu-accelerator: tpu-v5-lite-podslice
              cloud.google.com/gke-tpu-topology: 2x2
            containers:
            - name: worker
              image: busybox
              command: ["sh", "-c", {command!r}]
              env:
              - name: ATTEMPT
                valueFrom: {{fieldRef: {{fieldPath: "metadata.labels['{RESTART_LABEL}']"}}}}
              - name: JOB_INDEX
                valueFrom: {{fieldRef: {{fieldPath: "metadata.labels['jobset.sigs.k8s.io/job-index']"}}}}
              resources:
                limits: {{google.com/tpu: 4}}
"""


def _jobset(cluster, namespace, name):
    return cluster.api().get(f"{contract.jobsets_path(namespace)}/{name}")


def _condition(cluster, namespace, name, ctype):
    js = _jobset(cluster, namespace, name)
    conds = (js.get("status") or {}).get("conditions", [])
    return js if any(c["type"] == ctype and c["status"] == "True" for c in conds) else None


def test_jobset_places_each_slice_on_its_own_tpu_pool(cluster, namespace):
    apply(cluster, jobset_manifest("place", "echo slice $JOB_INDEX on $HOSTNAME; sleep 1"), namespace)
    wait_for(lambda: _condition(cluster, namespace, "place", "Completed"), timeout_s=90,
             what="JobSet completes", explain=lambda: summary(pods(cluster, namespace)))
    done = pods(cluster, namespace, "jobset.sigs.k8s.io/jobset-name=place")
    assert len(done) == 2 and all(p["status"]["phase"] == "Succeeded" for p in done), summary(done)
    pools = {n.name: n.pool for n in cluster.nodes}
    used = [pools[p["spec"]["nodeName"]] for p in done]
    assert all(pool.startswith("tpu-pool-") for pool in used)
    assert len(set(used)) == 2, f"exclusive placement: one slice per node pool, got {used}"
    indexes = sorted(cluster.container_log(namespace, p["metadata"]["name"], "worker").split()[1] for p in done)
    assert indexes == ["0", "1"]


def test_failure_policy_restarts_the_whole_jobset(cluster, namespace):
    # Attempt 0 runs until killed; after the restart every slice finishes at once.
    cmd = 'if [ "$ATTEMPT" = 0 ]; then echo waiting; sleep 300; else echo attempt $ATTEMPT; fi'
    apply(cluster, jobset_manifest("elastic", cmd, "failurePolicy: {maxRestarts: 1}"), namespace)
    first = wait_for(lambda: _running(cluster, namespace, "elastic", 2), timeout_s=90,
                     what="both slices running", explain=lambda: summary(pods(cluster, namespace)))
    victim = first[0]["metadata"]["name"]
    wait_for(lambda: "waiting" in cluster.container_log(namespace, victim, "worker"), timeout_s=10, what="output")
    os.kill(cluster.container_pid(namespace, victim, "worker"), signal.SIGKILL)

    js = wait_for(lambda: _condition(cluster, namespace, "elastic", "Completed"), timeout_s=120,
                  what="JobSet completes after one restart", explain=lambda: summary(pods(cluster, namespace)))
    assert js["status"]["restarts"] == 1
    after = [p for p in pods(cluster, namespace, f"{RESTART_LABEL}=1")]
    assert len(after) == 2, "both slices were recreated, not only the failed one: " + summary(after)
    for p in after:
        assert "attempt 1" in cluster.container_log(namespace, p["metadata"]["name"], "worker")


def test_without_failure_policy_a_failed_job_fails_the_jobset(cluster, namespace):
    apply(cluster, jobset_manifest("strict", 'if [ "$JOB_INDEX" = 1 ]; then exit 5; fi; sleep 300'), namespace)
    js = wait_for(lambda: _condition(cluster, namespace, "strict", "Failed"), timeout_s=90,
                  what="JobSet fails", explain=lambda: summary(pods(cluster, namespace)))
    assert js["status"].get("restarts", 0) == 0


def _running(cluster, namespace, name, count):
    found = [p for p in pods(cluster, namespace, f"jobset.sigs.k8s.io/jobset-name={name}")
             if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]
    return found if len(found) >= count else None
