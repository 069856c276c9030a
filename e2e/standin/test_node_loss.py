"""Losing a node: its processes die, its pods go away, and they come back on the same pool."""

from __future__ import annotations

import os
import signal
import subprocess
import time

from e2e.helpers import apply, pods, sleeper_deployment, summary, wait_for
from e2e.nodeagent.kubeapi import ApiError

# Node NotReady after the 8 s monitor grace, eviction right after (out-of-service
# taint), replacement scheduled at once, old pod force-deleted by the pod GC
# controller on its next 20 s pass: 60 s covers it with margin on a busy machine.
RESCHEDULE_BOUND_S = 60

DEPLOYMENT = sleeper_deployment("slice", pool="tpu-pool-c", command="echo up on $NODE; sleep 300", tpu_chips=4)


def _live(cluster, namespace):
    return [p for p in pods(cluster, namespace, "app=slice")
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]


def test_failed_node_pods_are_rescheduled_in_the_same_pool(cluster, namespace):
    apply(cluster, DEPLOYMENT, namespace)
    old = wait_for(lambda: _live(cluster, namespace), timeout_s=60, what="slice pod running",
                   explain=lambda: summary(pods(cluster, namespace)))[0]
    node = old["spec"]["nodeName"]
    old_name = old["metadata"]["name"]
    assert cluster.node_processes(node), "the pod runs as a process of its node"

    # A container's PID file outlives it and the kernel reuses PIDs: a stale file
    # naming a stranger's process group must not get that group killed.
    stranger = subprocess.Popen(["sleep", "300"], start_new_session=True)
    stale = cluster.node_dir(node) / "pods" / "gone-ns" / "gone-pod" / "gone-uid" / "pids" / "main.pid"
    stale.parent.mkdir(parents=True)
    stale.write_text(str(stranger.pid))
    failed_at = time.monotonic()
    try:
        cluster.fail_node(node)
        assert stranger.poll() is None, "fail_node killed a process group that is not the cluster's"
    finally:
        os.kill(stranger.pid, signal.SIGKILL)
        stranger.wait()
        stale.unlink()
    try:
        assert not cluster.node_processes(node), "a lost node's processes die with it"
        wait_for(lambda: not cluster.node_ready(node), timeout_s=30, what=f"{node} NotReady")

        def replaced():
            live = _live(cluster, namespace)
            return live if live and live[0]["metadata"]["name"] != old_name else None
        new = wait_for(replaced, timeout_s=RESCHEDULE_BOUND_S, what="replacement running",
                       explain=lambda: summary(pods(cluster, namespace)))[0]

        def old_gone():
            try:
                cluster.api().get(f"/api/v1/namespaces/{namespace}/pods/{old_name}")
                return False
            except ApiError as e:
                return e.status == 404
        wait_for(old_gone, timeout_s=RESCHEDULE_BOUND_S, what="old pod deleted")
        elapsed = time.monotonic() - failed_at
        print(f"node {node} lost -> replacement Running on the same pool and old pod deleted: {elapsed:.1f}s")
        assert new["spec"]["nodeName"] != node
        assert new["spec"]["nodeName"].startswith("tpu-pool-c-")
        assert "up on " + new["spec"]["nodeName"] in cluster.container_log(namespace, new["metadata"]["name"], "main")
        assert elapsed < RESCHEDULE_BOUND_S, f"took {elapsed:.0f}s"
    finally:
        cluster.restore_node(node)
