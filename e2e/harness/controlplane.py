"""Command lines and health checks of the control-plane processes.

All parts come from the one ``localcluster`` binary (see
``e2e/localcluster/main.go``) and listen on 127.0.0.1 only. Flags that differ
from upstream defaults carry a comment saying why.
"""

from __future__ import annotations

import os
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path

from e2e.harness.ports import Ports

# The in-cluster "kubernetes" Service gets the first IP of this range; no
# kube-proxy exists, so pods reach the API server at 127.0.0.1 instead.
SERVICE_CIDR = "10.0.0.0/24"
SERVICE_IP = "10.0.0.1"

# How long a node may miss heartbeats before it is NotReady, and how long pods
# tolerate a NotReady/unreachable node before eviction. Upstream: 40s and
# 300s; shortened so node-loss tests finish in seconds.
NODE_MONITOR_GRACE_S = 8
NOT_READY_TOLERATION_S = 2
# Moves NODE_MONITOR_GRACE_S for one cluster (read when it starts). The operator-at-scale benchmark's
# 1600 kwok nodes renew their leases every quarter of it: at 8 s that is 800 lease writes a second,
# more than a 2-core machine serves beside everything else (benchmarks/bench_operator_scale.py).
NODE_MONITOR_GRACE_ENV = "E2E_NODE_MONITOR_GRACE_S"


def node_monitor_grace_s() -> int:
    """Seconds a node may miss lease renewals before the controller manager calls it NotReady:
    ``$E2E_NODE_MONITOR_GRACE_S`` if set, else NODE_MONITOR_GRACE_S.

    Raises:
        ValueError: the variable is not a whole number of seconds >= 1.
    """
    raw = os.environ.get(NODE_MONITOR_GRACE_ENV, "")
    if not raw:
        return NODE_MONITOR_GRACE_S
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{NODE_MONITOR_GRACE_ENV}={raw!r} is not a whole number of seconds") from None
    if value < 1:
        raise ValueError(f"{NODE_MONITOR_GRACE_ENV}={raw!r} must be at least 1")
    return value


def etcd_argv(bin_dir: Path, state: Path, ports: Ports) -> list[str]:
    """etcd: one member, plain HTTP on loopback (only the API server talks to it)."""
    peer = f"http://127.0.0.1:{ports.etcd_peer}"
    client = f"http://127.0.0.1:{ports.etcd_client}"
    return [
        str(bin_dir / "etcd"),
        "--name=default",
        f"--data-dir={state / 'etcd'}",
        f"--listen-client-urls={client}", f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}", f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=default={peer}",
        # A test cluster's data is disposable; fsync costs the JAX tests disk time.
        "--unsafe-no-fsync=true",
        # Keep memory small: fewer in-memory raft entries, small backend quota.
        "--snapshot-count=5000",
        "--quota-backend-bytes=1073741824",
        "--log-level=warn",
    ]


def apiserver_argv(bin_dir: Path, state: Path, ports: Ports) -> list[str]:
    """kube-apiserver with TLS from ``state/pki``, RBAC, and service-account signing."""
    pki = state / "pki"
    return [
        str(bin_dir / "kube-apiserver"),
        f"--etcd-servers=http://127.0.0.1:{ports.etcd_client}",
        "--bind-address=127.0.0.1", f"--secure-port={ports.apiserver}",
        "--advertise-address=127.0.0.1",
        f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        "--authorization-mode=RBAC",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        # The endpoint reconciler would publish 127.0.0.1 as the kubernetes
        # Service endpoint, which Endpoints validation rejects (loopback).
        "--endpoint-reconciler-type=none",
        f"--default-not-ready-toleration-seconds={NOT_READY_TOLERATION_S}",
        f"--default-unreachable-toleration-seconds={NOT_READY_TOLERATION_S}",
        # GKE's admission: pods requesting google.com/tpu tolerate the TPU node taint.
        "--enable-admission-plugins=ExtendedResourceToleration",
        "--allow-privileged=true",
        "--profiling=false",
        "--v=0",
    ]


def _component_flags(name: str, state: Path, port: int) -> list[str]:
    """Flags kube-controller-manager and kube-scheduler share: admin identity, loopback, no leader election."""
    kubeconfig = state / "pki" / "admin.kubeconfig"
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1", f"--secure-port={port}",
        f"--cert-dir={state / name}",
        # One control plane: no leader election traffic.
        "--leader-elect=false",
        "--profiling=false",
        "--v=0",
    ]


def controller_manager_argv(bin_dir: Path, state: Path, ports: Ports) -> list[str]:
    """kube-controller-manager with every default controller, each with its own ServiceAccount."""
    pki = state / "pki"
    return [
        str(bin_dir / "kube-controller-manager"),
        *_component_flags("controller-manager", state, ports.controller_manager),
        "--controllers=*",
        # Each controller uses its own ServiceAccount token, so RBAC is real.
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--root-ca-file={pki / 'ca.crt'}",
        f"--cluster-signing-cert-file={pki / 'ca.crt'}", f"--cluster-signing-key-file={pki / 'ca.key'}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--node-monitor-period=1s",
        f"--node-monitor-grace-period={node_monitor_grace_s()}s",
    ]


def scheduler_argv(bin_dir: Path, state: Path, ports: Ports) -> list[str]:
    """kube-scheduler with the default profile."""
    return [str(bin_dir / "kube-scheduler"), *_component_flags("scheduler", state, ports.scheduler)]


def admin_ssl_context(state: Path) -> ssl.SSLContext:
    """TLS context that trusts the cluster CA and presents the admin client certificate."""
    pki = state / "pki"
    ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
    return ctx


def http_ok(url: str, ctx: ssl.SSLContext | None = None, timeout_s: float = 2.0) -> bool:
    """True when GET ``url`` answers 200."""
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=timeout_s) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError, ssl.SSLError):
        return False


def component_healthy_url(port: int) -> str:
    """The always-allowed /healthz of a controller-manager or scheduler."""
    return f"https://127.0.0.1:{port}/healthz"


def insecure_context() -> ssl.SSLContext:
    """For the self-signed /healthz of the controller-manager and scheduler (loopback only)."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def wait_until(check, *, timeout_s: float, what: str, interval_s: float = 0.25,
               on_timeout=None) -> None:
    """Poll ``check()`` until it returns true.

    Raises:
        TimeoutError: not true within ``timeout_s``; the message names ``what``
            and adds ``on_timeout()`` (e.g. a log tail) when given.
    """
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(interval_s)
    extra = f"\n{on_timeout()}" if on_timeout else ""
    raise TimeoutError(f"{what} not ready after {timeout_s:.0f}s{extra}")
