"""``kubectl apply -f`` of a Deployment: scheduled onto the CPU pool, run as processes, Ready by probe."""

from __future__ import annotations

import ipaddress

from e2e.helpers import apply, is_ready, pods, summary, wait_for

DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web, tier: frontend}
    spec:
      nodeSelector:
        cloud.google.com/gke-nodepool: cpu-pool
      containers:
      - name: server
        image: python:3.11
        command: ["python", "-c"]
        args:
        - |
          import http.server, os
          print("serving on", os.environ["POD_IP"], "tier", os.environ["TIER"], flush=True)
          http.server.HTTPServer((os.environ["POD_IP"], 8080), http.server.SimpleHTTPRequestHandler).serve_forever()
        env:
        - name: POD_IP
          valueFrom: {fieldRef: {fieldPath: status.podIP}}
        - name: TIER
          valueFrom: {fieldRef: {fieldPath: "metadata.labels['tier']"}}
        ports:
        - {name: http, containerPort: 8080}
        readinessProbe:
          httpGet: {path: /, port: http}
          periodSeconds: 1
"""


def test_deployment_runs_on_the_cpu_pool(cluster, namespace):
    apply(cluster, DEPLOYMENT, namespace)
    cluster.kubectl("rollout", "status", "deployment/web", "-n", namespace, "--timeout=60s", timeout_s=70)
    running = wait_for(lambda: [p for p in pods(cluster, namespace, "app=web") if is_ready(p)][:2] or None,
                       timeout_s=10, what="2 ready pods", explain=lambda: summary(pods(cluster, namespace)))
    cpu_nodes = {n.name for n in cluster.nodes if n.pool == "cpu-pool"}
    ips = set()
    for p in running:
        assert p["spec"]["nodeName"] in cpu_nodes
        assert p["status"]["phase"] == "Running"
        ip = p["status"]["podIP"]
        assert ipaddress.ip_address(ip).is_loopback
        ips.add(ip)
        log = wait_for(lambda: cluster.container_log(namespace, p["metadata"]["name"], "server"),
                       timeout_s=10, what="server output")
        assert f"serving on {ip} tier frontend" in log
    assert len(ips) == 2, "each pod has its own loopback address"
