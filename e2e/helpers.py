"""Small helpers shared by the e2e tests: apply YAML, list pods, poll with a deadline."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from e2e.harness.cluster import LocalCluster

T = TypeVar("T")


def wait_for(check: Callable[[], T], *, timeout_s: float, what: str, interval_s: float = 0.25,
             explain: Callable[[], str] | None = None) -> T:
    """Poll ``check()`` until it returns something truthy, and return that.

    Raises:
        TimeoutError: nothing truthy within ``timeout_s``; the message names
            ``what`` and adds ``explain()`` (the state seen last).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = f"\n{explain()}" if explain else ""
            raise TimeoutError(f"{what}: not within {timeout_s:.0f}s{detail}")
        time.sleep(interval_s)


def create_namespace(cluster: LocalCluster, name: str, timeout_s: float = 30) -> str:
    """Creates namespace ``name`` and waits for its ``default`` ServiceAccount (pods need it); returns ``name``.

    Raises:
        CommandError: kubectl refused (e.g. it exists).
        TimeoutError: no ``default`` ServiceAccount within ``timeout_s`` (the ServiceAccount controller is down).
    """
    cluster.kubectl("create", "namespace", name)
    wait_for(lambda: cluster.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode == 0,
             timeout_s=timeout_s, what=f"the default ServiceAccount in {name}", interval_s=0.2)
    return name


def apply(cluster: LocalCluster, manifest: str, namespace: str) -> str:
    """``kubectl apply -f -`` into ``namespace``; returns kubectl's output.

    Raises:
        CommandError: kubectl refused (its stderr is in the message).
    """
    return cluster.kubectl("apply", "-n", namespace, "-f", "-", input=manifest).stdout


def sleeper_deployment(name: str, *, pool: str, replicas: int = 1, command: str = "sleep 300",
                       tpu_chips: int = 0, grace_s: int = 30) -> str:
    """A Deployment manifest whose pods run ``command`` (busybox sh) on node pool ``pool``.

    Pods get ``$NODE`` (their node's name, from the downward API) and, with
    ``tpu_chips``, a ``google.com/tpu`` limit.
    """
    limits = f"\n        resources: {{limits: {{google.com/tpu: {tpu_chips}}}}}" if tpu_chips else ""
    return f"""
apiVersion: apps/v1
kind: Deployment
metadata: {{name: {name}}}
spec:
  replicas: {replicas}
  selector: {{matchLabels: {{app: {name}}}}}
  template:
    metadata: {{labels: {{app: {name}}}}}
    spec:
      nodeSelector: {{cloud.google.com/gke-nodepool: {pool}}}
      terminationGracePeriodSeconds: {grace_s}
      containers:
      - name: main
        image: busybox
        command: ["sh", "-c", {command!r}]
        env: [{{name: NODE, valueFrom: {{fieldRef: {{fieldPath: spec.nodeName}}}}}}]{limits}
"""


def pods(cluster: LocalCluster, namespace: str, selector: str = "") -> list[dict]:
    """Pods in ``namespace`` matching the label ``selector``, oldest first."""
    query = {"labelSelector": selector} if selector else {}
    items = cluster.api().get(f"/api/v1/namespaces/{namespace}/pods", **query)["items"]
    return sorted(items, key=lambda p: p["metadata"]["creationTimestamp"])


def pod(cluster: LocalCluster, namespace: str, name: str) -> dict:
    """One pod object (raises ``ApiError`` 404 when gone)."""
    return cluster.api().get(f"/api/v1/namespaces/{namespace}/pods/{name}")


def phase(p: dict) -> str:
    return (p.get("status") or {}).get("phase", "")


def is_ready(p: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in (p.get("status") or {}).get("conditions", []))


def summary(items: list[dict]) -> str:
    """One line per pod: name, node, phase, container states; for timeout messages."""
    lines = []
    for p in items:
        states = [(c["name"], list(c.get("state", {}))[:1], c.get("restartCount"))
                  for c in (p.get("status") or {}).get("containerStatuses", [])]
        lines.append(f"{p['metadata']['name']} node={p['spec'].get('nodeName')} phase={phase(p)} "
                     f"deleting={bool(p['metadata'].get('deletionTimestamp'))} {states}")
    return "\n".join(lines) or "(no pods)"
