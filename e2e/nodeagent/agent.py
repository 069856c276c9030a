"""The node agent's main loop: watch this node's pods, drive one PodWorker each.

Threads: one watches pods bound to the node (``spec.nodeName``), one renews
the Lease and node status. Every container process is started from the main
thread, because ``PR_SET_PDEATHSIG`` fires when the *thread* that forked the
child exits.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from pathlib import Path

from e2e.nodeagent.kubeapi import ApiError, KubeApi
from e2e.nodeagent.node import LEASE_RENEW_S, STATUS_EVERY_S, NodeHeartbeat
from e2e.nodeagent.podworker import NodeContext, PodWorker

log = logging.getLogger("nodeagent")

LOOP_PERIOD_S = 0.25  # how often processes and probes are checked without API events
SHUTDOWN_GRACE_S = 3.0


class PodIPs:
    """Hands out 127.0.N.2-254 on the node whose InternalIP is 127.0.N.1.

    Raises (from ``allocate``):
        RuntimeError: all 253 addresses are in use.
    """

    def __init__(self, host_ip: str):
        parts = host_ip.split(".")
        if len(parts) != 4 or parts[0] != "127" or parts[3] != "1":
            raise ValueError(f"host IP {host_ip!r} must look like 127.X.Y.1")
        self.prefix = ".".join(parts[:3])
        self.used: set[int] = set()

    def allocate(self) -> str:
        for last in range(2, 255):
            if last not in self.used:
                self.used.add(last)
                return f"{self.prefix}.{last}"
        raise RuntimeError(f"no free pod IP in {self.prefix}.0/24")

    def release(self, ip: str) -> None:
        self.used.discard(int(ip.rsplit(".", 1)[1]))


class Agent:
    """Runs one node until SIGTERM/SIGINT.

    Args:
        heartbeat: the node's registration and heartbeats.
        ctx: shared context for pod workers.
    """

    def __init__(self, heartbeat: NodeHeartbeat, ctx: NodeContext):
        self.heartbeat = heartbeat
        self.ctx = ctx
        self.api: KubeApi = ctx.api
        self.ips = PodIPs(ctx.host_ip)
        self.pods: dict[str, dict] = {}
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.stopping = threading.Event()
        self.workers: dict[str, PodWorker] = {}
        self.finished: set[str] = set()
        self.confirmed: set[str] = set()

    # ---- threads -------------------------------------------------------------------

    def _heartbeat_loop(self) -> None:
        last_status = time.monotonic()
        while not self.stopping.wait(LEASE_RENEW_S):
            try:
                self.heartbeat.renew_lease()
                if time.monotonic() - last_status >= STATUS_EVERY_S:
                    self.heartbeat.report_status()
                    last_status = time.monotonic()
            except (ApiError, OSError) as e:
                log.warning("heartbeat failed: %s", e)

    def _watch_loop(self) -> None:
        path = "/api/v1/pods"
        selector = f"spec.nodeName={self.heartbeat.name}"
        while not self.stopping.is_set():
            try:
                listing = self.api.get(path, fieldSelector=selector)
                with self.lock:
                    self.pods = {p["metadata"]["uid"]: p for p in listing.get("items", [])}
                self.wake.set()
                rv = listing["metadata"]["resourceVersion"]
                while not self.stopping.is_set():
                    for event in self.api.watch(path, rv, timeout_s=30, fieldSelector=selector):
                        obj = event["object"]
                        rv = obj["metadata"].get("resourceVersion", rv)
                        if event["type"] == "BOOKMARK":
                            continue
                        with self.lock:
                            if event["type"] == "DELETED":
                                self.pods.pop(obj["metadata"]["uid"], None)
                            else:
                                self.pods[obj["metadata"]["uid"]] = obj
                        self.wake.set()
            except (ApiError, OSError, ValueError) as e:
                if not self.stopping.is_set():
                    log.info("pod watch restarts: %s", e)
                    time.sleep(1)

    # ---- main loop -------------------------------------------------------------------

    def _sync_once(self) -> None:
        with self.lock:
            snapshot = dict(self.pods)
        for uid, pod in snapshot.items():
            if uid in self.workers:
                continue
            if pod["metadata"].get("deletionTimestamp"):
                # No process of ours runs for it (finished, or deleted before it
                # started): confirm the deletion at once, as the kubelet does.
                if uid not in self.confirmed:
                    self._confirm_unstarted_deletion(pod)
                    self.confirmed.add(uid)
                continue
            if uid in self.finished or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                # Finished here, or under an earlier agent process: nothing to run.
                self.finished.add(uid)
                continue
            self.workers[uid] = PodWorker(self.ctx, pod, self.ips.allocate())
            log.info("pod %s/%s (%s) starts on %s", pod["metadata"]["namespace"],
                     pod["metadata"]["name"], uid, self.workers[uid].pod_ip)
        for uid, worker in list(self.workers.items()):
            try:
                done = worker.sync(snapshot.get(uid))
            except (ApiError, OSError) as e:
                log.warning("pod %s/%s: %s", worker.ns, worker.name, e)
                continue
            if done:
                log.info("pod %s/%s (%s) is gone", worker.ns, worker.name, uid)
                self.ips.release(worker.pod_ip)
                del self.workers[uid]
                self.finished.add(uid)

    def _confirm_unstarted_deletion(self, pod: dict) -> None:
        meta = pod["metadata"]
        try:
            self.api.delete(f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                            {"gracePeriodSeconds": 0, "preconditions": {"uid": meta["uid"]}})
        except ApiError as e:
            if e.status not in (404, 409):
                log.warning("deleting %s: %s", meta["name"], e)

    def run(self) -> None:
        """Register the node and run pods until SIGTERM or SIGINT.

        Raises:
            ApiError: the node could not be registered.
        """
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: (self.stopping.set(), self.wake.set()))
        self.heartbeat.register()
        log.info("node %s registered (InternalIP %s)", self.heartbeat.name, self.ctx.host_ip)
        threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True).start()
        threading.Thread(target=self._watch_loop, name="watch", daemon=True).start()
        while not self.stopping.is_set():
            self.wake.wait(LOOP_PERIOD_S)
            self.wake.clear()
            self._sync_once()
        log.info("stopping: %d pods", len(self.workers))
        for worker in self.workers.values():
            worker.shutdown(SHUTDOWN_GRACE_S)


def pods_dir(state_dir: Path) -> Path:
    """Where the node keeps pod folders: ``<state>/pods/<ns>/<pod>/<uid>/``."""
    return state_dir / "pods"


def marker_env() -> dict[str, str]:
    """The harness's process marker, passed on to every container."""
    key = "E2E_LOCALCLUSTER"
    return {key: os.environ[key]} if key in os.environ else {}
