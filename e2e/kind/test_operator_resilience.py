"""The chart's operator on kind under node loss, its own crash mid-recovery, a drain, and job deletion.

A lost node is a frozen node container (kubelet, containerd and its pods stop
at once) with the out-of-service taint; the operator's crash is a SIGKILL of
its process, which the kubelet restarts.
"""

from __future__ import annotations

import signal

import pytest
import yaml

from e2e.helpers import is_ready, pods, summary, wait_for
from e2e.operator_fixtures import example_manifest, get_job, job_children, job_events, wait_phase

# The first test of a session also pays for what its fixtures build (images, node
# image, cluster, chart: up to ~30 min on a fresh machine under load).
pytestmark = pytest.mark.timeout(3600)

JOB = "cpu-job"
SEL = f"elasticjax.dev/job-name={JOB}"


def _start(cluster, namespace, operator, min_step=20, steps=None):
    manifest = example_manifest()
    if steps is not None:
        # Long enough that the replacement (node NotReady, eviction, pod GC) arrives before the end.
        manifest["spec"]["training"]["steps"] = steps
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest))
    explain = lambda: summary(pods(cluster, namespace)) + "\n" + operator.log()[-3000:]  # noqa: E731
    wait_for(lambda: (get_job(cluster, namespace, JOB).get("status") or {}).get("step", 0) >= min_step,
             timeout_s=180, what="training started", explain=explain)
    return explain


def _live(cluster, namespace, selector):
    return [p for p in pods(cluster, namespace, selector)
            if p["status"].get("phase") == "Running" and is_ready(p) and not p["metadata"].get("deletionTimestamp")]


def _controller(cluster, namespace):
    # Running is enough: its readiness probe may blink under load, which is not what these tests are about.
    return [p for p in pods(cluster, namespace, f"{SEL},elasticjax.dev/role=controller")
            if p["status"].get("phase") == "Running"][0]


def test_worker_node_loss(cluster, namespace, operator):
    explain = _start(cluster, namespace, operator, steps=100000)
    ctrl = _controller(cluster, namespace)
    workers = _live(cluster, namespace, f"{SEL},elasticjax.dev/role=worker")
    apart = [w for w in workers if w["spec"]["nodeName"] != ctrl["spec"]["nodeName"]]
    victim = (apart or workers)[0]
    node = victim["spec"]["nodeName"]
    lost = {p["metadata"]["name"] for p in workers if p["spec"]["nodeName"] == node}
    step_before = (get_job(cluster, namespace, JOB).get("status") or {}).get("step", 0)
    cluster.fail_node(node)
    try:
        def replaced():
            live = _live(cluster, namespace, f"{SEL},elasticjax.dev/role=worker")
            names = {p["metadata"]["name"] for p in live}
            return len(live) == 2 and not names & lost
        # The node controller marks the node NotReady after its grace period; then the pod GC
        # force-deletes the pods of an out-of-service node and the JobSet replaces the slice.
        wait_for(replaced, timeout_s=240, what="lost workers replaced on another node", explain=explain)

        def rejoined():
            st = get_job(cluster, namespace, JOB).get("status") or {}
            return st if st.get("activeSlices") == 2 and st.get("phase") == "Running" else None
        status = wait_for(rejoined, timeout_s=120, what="replaced slice back in training", explain=explain)
    finally:
        cluster.restore_node(node)
    if apart:
        # It trained on past the loss (a loss below the first step's is no sign of that after a few dozen
        # steps: CI under load read 6.040 beside 6.030)
        assert status["step"] > step_before, (status["step"], step_before)
        # The controller's node survived: its pod is untouched.
        after = pods(cluster, namespace, f"{SEL},elasticjax.dev/role=controller")
        assert [p["metadata"]["uid"] for p in after] == [ctrl["metadata"]["uid"]]
        assert status["controllerRestarts"] == 0
    else:
        # Every pod shared the node: the controller was lost too, recreated and counted (its local checkpoints
        # went with it: it trains again from step 0, CI read step 7 after 25)
        assert status["controllerRestarts"] == 1
    reasons = [e["reason"] for e in job_events(cluster, namespace, JOB)]
    assert "SliceDown" in reasons and "SliceReady" in reasons


def test_operator_killed_mid_recovery(cluster, namespace, operator):
    # 600 steps can finish within seconds on an idle machine, before the kill even lands.
    explain = _start(cluster, namespace, operator, steps=3000)
    ctrl = _controller(cluster, namespace)
    victim = _live(cluster, namespace, f"{SEL},elasticjax.dev/slice-index=0")[0]
    operator.kill()  # SIGKILL: no cleanup, no state handed over
    cluster.signal_container(namespace, victim["metadata"]["name"], "worker", signal.SIGKILL)
    # The JobSet replaces the worker whether or not an operator runs; the controller saw its RPC fail.
    # The kubelet restarts the operator; the fresh process rebuilds its view from the cluster.
    operator.wait_restarted()
    new = wait_for(lambda: [p for p in _live(cluster, namespace, f"{SEL},elasticjax.dev/slice-index=0")
                            if p["metadata"]["name"] != victim["metadata"]["name"]],
                   timeout_s=120, what="slice 0 worker replaced", explain=explain)[0]
    address = f"{new['status']['podIP']}:8471"

    def both_active():
        st = get_job(cluster, namespace, JOB).get("status") or {}
        return st.get("activeSlices") == 2 or st.get("phase") == "Succeeded"
    wait_for(both_active, timeout_s=120, what="replacement slice rejoined after operator restart", explain=explain)
    job = wait_phase(cluster, namespace, JOB, ("Succeeded", "Failed"), timeout_s=300)
    assert job["status"]["phase"] == "Succeeded", job["status"]
    after = pods(cluster, namespace, f"{SEL},elasticjax.dev/role=controller")
    assert [p["metadata"]["uid"] for p in after] == [ctrl["metadata"]["uid"]]
    assert after[0]["status"]["containerStatuses"][0]["restartCount"] == 0
    assert job["status"]["controllerRestarts"] == 0
    ready = [e["message"] for e in job_events(cluster, namespace, JOB) if e["reason"] == "SliceReady"]
    assert any(address in m for m in ready), ready


def test_gracefully_deleted_worker_pod_is_replaced(cluster, namespace, operator):
    """`kubectl delete pod` (a drain, GKE maintenance): SIGTERM, not SIGKILL. The worker exits 143,
    its Job fails and the JobSet replaces the slice; with exit 0 the Job was Complete and the slice lost."""
    explain = _start(cluster, namespace, operator, steps=100000)
    ctrl = _controller(cluster, namespace)
    victim = _live(cluster, namespace, f"{SEL},elasticjax.dev/role=worker")[0]
    cluster.kubectl("delete", "pod", "-n", namespace, victim["metadata"]["name"], "--wait=false")

    def replaced():
        live = _live(cluster, namespace, f"{SEL},elasticjax.dev/role=worker")
        return len(live) == 2 and victim["metadata"]["uid"] not in {p["metadata"]["uid"] for p in live}
    wait_for(replaced, timeout_s=150, what="gracefully deleted worker replaced", explain=explain)
    wait_for(lambda: (get_job(cluster, namespace, JOB).get("status") or {}).get("activeSlices") == 2,
             timeout_s=120, what="both slices active again", explain=explain)
    after = _controller(cluster, namespace)
    assert after["metadata"]["uid"] == ctrl["metadata"]["uid"]
    assert after["status"]["containerStatuses"][0]["restartCount"] == 0
    cluster.kubectl("delete", "ejob", "-n", namespace, JOB, "--wait=false")


def test_deleting_the_job_cleans_up_everything(cluster, namespace, operator):
    explain = _start(cluster, namespace, operator, min_step=1)
    cluster.kubectl("delete", "ejob", "-n", namespace, JOB, "--wait=false")
    api = cluster.api()

    def children():
        return job_children(api, namespace, JOB)
    wait_for(lambda: not children(), timeout_s=120, what="every child garbage-collected",
             explain=lambda: f"{children()}\n{explain()}")
    # The same name again, same operator process: a new job, created from scratch (its
    # ConfigMap and Service too), not a ghost of the old one.
    wait_for(lambda: not cluster.kubectl("get", "ejob", "-n", namespace, "-o", "name").stdout.strip(),
             timeout_s=60, what="job gone")
    _start(cluster, namespace, operator, min_step=1)
