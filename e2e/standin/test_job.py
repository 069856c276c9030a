"""SIGKILL of a Job's pod: the real Job controller replaces it, within ``backoffLimit``.

(`backoffLimit` exhausted -> `BackoffLimitExceeded` was a test of its own until session 27: that is the Job
controller's logic, not the stand-in's; what the stand-in must do for it, report a container's non-zero exit as
the pod's `Failed`, is `test_pod_runtime.py::test_never_policy_reports_exit_code`, and a failed pod failing its
Job and JobSet is `test_jobset.py::test_without_failure_policy_a_failed_job_fails_the_jobset`.)
"""

from __future__ import annotations

import os
import signal

from e2e.helpers import apply, pods, summary, wait_for

JOB = """
apiVersion: batch/v1
kind: Job
metadata: {name: train}
spec:
  backoffLimit: 2
  template:
    spec:
      restartPolicy: Never
      nodeSelector: {cloud.google.com/gke-nodepool: cpu-pool}
      containers:
      - name: main
        image: busybox
        command: ["sh", "-c", "echo started; sleep 4; echo finished"]
"""


def test_sigkilled_pod_is_replaced_by_the_job_controller(cluster, namespace):
    apply(cluster, JOB, namespace)
    first = wait_for(lambda: [p for p in pods(cluster, namespace, "job-name=train")
                              if p["status"].get("phase") == "Running"],
                     timeout_s=30, what="first pod running")[0]
    name = first["metadata"]["name"]
    wait_for(lambda: "started" in cluster.container_log(namespace, name, "main"), timeout_s=10, what="output")
    os.kill(cluster.container_pid(namespace, name, "main"), signal.SIGKILL)

    job = wait_for(lambda: _job_done(cluster, namespace), timeout_s=60, what="job completes",
                   explain=lambda: summary(pods(cluster, namespace)))
    assert job["status"]["succeeded"] == 1 and job["status"]["failed"] == 1
    all_pods = pods(cluster, namespace, "job-name=train")
    assert len(all_pods) == 2
    killed = next(p for p in all_pods if p["metadata"]["name"] == name)
    term = killed["status"]["containerStatuses"][0]["state"]["terminated"]
    assert killed["status"]["phase"] == "Failed" and term["exitCode"] == 137
    replacement = next(p for p in all_pods if p["metadata"]["name"] != name)
    assert replacement["status"]["phase"] == "Succeeded"
    assert "finished" in cluster.container_log(namespace, replacement["metadata"]["name"], "main")


def _job(cluster, namespace):
    return cluster.api().get(f"/apis/batch/v1/namespaces/{namespace}/jobs/train")


def _job_done(cluster, namespace):
    return _job_condition(cluster, namespace, "Complete")


def _job_condition(cluster, namespace, ctype):
    job = _job(cluster, namespace)
    if any(c["type"] == ctype and c["status"] == "True" for c in job["status"].get("conditions", [])):
        return job
    return None
