"""Container probes (readiness, liveness, startup): exec (inside the container's mount namespace), httpGet, tcpSocket.

Timing fields (initialDelaySeconds, periodSeconds, timeoutSeconds,
successThreshold, failureThreshold) mean what they mean for the kubelet; what
a result does (gate Ready, restart the container) is the pod worker's job.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import subprocess
import time


class Probe:
    """Tracks one probe of one container.

    Args:
        spec: the probe object (``readinessProbe``, ``livenessProbe`` or ``startupProbe``).
        container: the container spec (for named ports).
    """

    def __init__(self, spec: dict, container: dict):
        self.spec = spec
        self.container = container
        self.initial_delay_s = spec.get("initialDelaySeconds", 0)
        self.period_s = spec.get("periodSeconds", 10)
        self.timeout_s = spec.get("timeoutSeconds", 1)
        self.success_threshold = spec.get("successThreshold", 1)
        self.failure_threshold = spec.get("failureThreshold", 3)
        self.reset(time.monotonic())

    def reset(self, started_at: float) -> None:
        """Forget results: the container (re)started at ``started_at`` (monotonic seconds)."""
        self.started_at = started_at
        self.next_at = started_at + self.initial_delay_s
        self.successes = 0
        self.failures = 0
        self.ready = False

    def _port(self, port) -> int:
        if isinstance(port, int) or str(port).isdigit():
            return int(port)
        for p in self.container.get("ports") or []:
            if p.get("name") == port:
                return int(p["containerPort"])
        raise ValueError(f"named port {port!r} not declared by the container")

    def _check(self, pod_ip: str, pid: int, env: dict[str, str]) -> bool:
        if "exec" in self.spec:
            cmd = ["nsenter", f"--target={pid}", "--mount", "--", *self.spec["exec"]["command"]]
            try:
                return subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                      timeout=self.timeout_s).returncode == 0
            except subprocess.TimeoutExpired:
                return False
        if "httpGet" in self.spec:
            g = self.spec["httpGet"]
            host = g.get("host") or pod_ip
            port = self._port(g["port"])
            if g.get("scheme", "HTTP").upper() == "HTTPS":
                ctx = ssl.create_default_context()
                ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE  # kubelet skips verification too
                conn = http.client.HTTPSConnection(host, port, timeout=self.timeout_s, context=ctx)
            else:
                conn = http.client.HTTPConnection(host, port, timeout=self.timeout_s)
            try:
                headers = {h["name"]: h["value"] for h in g.get("httpHeaders") or []}
                conn.request("GET", g.get("path", "/"), headers=headers)
                return 200 <= conn.getresponse().status < 400
            except OSError:
                return False
            finally:
                conn.close()
        if "tcpSocket" in self.spec:
            t = self.spec["tcpSocket"]
            try:
                with socket.create_connection((t.get("host") or pod_ip, self._port(t["port"])),
                                              timeout=self.timeout_s):
                    return True
            except OSError:
                return False
        raise ValueError(f"probe has no exec, httpGet or tcpSocket: {sorted(self.spec)}")

    @property
    def failed(self) -> bool:
        """True once ``failureThreshold`` checks in a row failed (liveness/startup: restart the container)."""
        return self.failures >= self.failure_threshold

    def maybe_run(self, now: float, pod_ip: str, pid: int, env: dict[str, str]) -> bool:
        """Run the probe if it is due; return True when readiness changed."""
        if now < self.next_at:
            return False
        self.next_at = now + self.period_s
        before = self.ready
        if self._check(pod_ip, pid, env):
            self.successes, self.failures = self.successes + 1, 0
            if self.successes >= self.success_threshold:
                self.ready = True
        else:
            self.failures, self.successes = self.failures + 1, 0
            if self.failures >= self.failure_threshold:
                self.ready = False
        return before != self.ready
