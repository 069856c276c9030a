"""The kind cluster as the operator's e2e tests drive it: kubectl, helm, the API, containers, nodes.

The operator tests (``e2e/kind/test_operator_*.py``, ``test_helm_install.py``)
were written against the local control plane; :class:`KindTarget` gives them
the same verbs on a real kubelet:

- ``kubectl`` / ``helm`` / ``api()`` with the cluster's admin credentials;
- a container's log (``kubectl logs``: what the kubelet kept) and a signal to
  its main process, sent from its node by PID (``crictl inspect``), as the OOM
  killer or a crash would;
- node loss: the node container is frozen (``docker pause``: kubelet,
  containerd and every container on it stop at once, the network stays up but
  nothing answers), optionally with the ``out-of-service`` taint an operator
  or GKE's node repair puts on a node that is gone; ``restore_node`` thaws it.

:class:`ChartOperator` is the operator the chart installed (a Deployment in
``elastic-jax-system``), with the handles the tests need: its log, its
metrics through the API server's proxy, a crash (SIGKILL of its process; the
kubelet restarts the container).
"""

from __future__ import annotations

import base64
import json
import os
import signal as signals
import subprocess
import time
from pathlib import Path
from urllib.parse import urlparse

import yaml

from e2e.harness.cluster import CommandError
from e2e.harness.paths import bin_dir
from e2e.helpers import is_ready, wait_for
from e2e.kind import cluster as kind
from e2e.kind import demo
from e2e.nodeagent.kubeapi import KubeApi

OUT_OF_SERVICE = "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"


def docker_retrying(engine, verb: str, container: str, attempts: int = 5) -> None:
    """``docker pause|unpause CONTAINER``, retried: freezing a busy cgroup (v1 freezer) can fail transiently.

    Raises:
        RuntimeError: every attempt failed (the engine's last message included).
    """
    for _ in range(attempts):
        proc = engine.docker(verb, container, check=False, timeout=60)
        if proc.returncode == 0:
            return
        time.sleep(2)
    raise RuntimeError(f"docker {verb} {container} failed {attempts} times: {proc.stderr.decode().strip()}")


class KindTarget:
    """A :class:`~e2e.kind.cluster.KindCluster` with the interface of the operator tests.

    Args:
      cluster: a running kind cluster.
    """

    def __init__(self, cluster: kind.KindCluster):
        self.kind = cluster
        self.engine = cluster.engine
        self.state = cluster.state_dir
        self._pki = self.state / "pki"
        config = yaml.safe_load(cluster.kubeconfig.read_text())
        self.server = config["clusters"][0]["cluster"]["server"]
        self._write_pki(config)

    def _write_pki(self, config: dict) -> None:
        """The kubeconfig's CA, client certificate and key as files, for :class:`KubeApi`."""
        self._pki.mkdir(parents=True, exist_ok=True)
        user = config["users"][0]["user"]
        for name, data in (("ca.crt", config["clusters"][0]["cluster"]["certificate-authority-data"]),
                           ("admin.crt", user["client-certificate-data"]),
                           ("admin.key", user["client-key-data"])):
            path = self._pki / name
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(base64.b64decode(data))

    @property
    def kubeconfig(self) -> Path:
        return self.kind.kubeconfig

    def env(self) -> dict[str, str]:
        """kubectl/helm environment: this cluster's kubeconfig, helm's folders in its state folder."""
        env = dict(os.environ)
        env.update({"KUBECONFIG": str(self.kubeconfig),
                    "HELM_CACHE_HOME": str(self.state / "helm" / "cache"),
                    "HELM_CONFIG_HOME": str(self.state / "helm" / "config"),
                    "HELM_DATA_HOME": str(self.state / "helm" / "data")})
        return env

    def _run(self, argv: list[str], input: str | None, check: bool, timeout_s: float) -> subprocess.CompletedProcess:
        proc = subprocess.run(argv, input=input, capture_output=True, text=True, env=self.env(), timeout=timeout_s)
        if check and proc.returncode != 0:
            raise CommandError(proc.returncode, argv, proc.stdout, proc.stderr)
        return proc

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout_s: float = 60) -> subprocess.CompletedProcess:
        """Run kubectl against this cluster.

        Raises:
            CommandError: a non-zero exit when ``check`` (its stderr in the message).
        """
        return self._run([str(bin_dir() / "kubectl"), *args], input, check, timeout_s)

    def helm(self, *args: str, check: bool = True, timeout_s: float = 120) -> subprocess.CompletedProcess:
        """Run helm against this cluster (same error contract as :meth:`kubectl`)."""
        return self._run([str(bin_dir() / "helm"), *args], None, check, timeout_s)

    def api(self) -> KubeApi:
        """A small admin REST client (:mod:`e2e.nodeagent.kubeapi`) on the API server's published port."""
        url = urlparse(self.server)
        return KubeApi(url.hostname, url.port, self._pki, timeout_s=30)

    def pod(self, namespace: str, name: str) -> dict:
        """The pod object (raises ``ApiError`` 404 when gone)."""
        return self.api().get(f"/api/v1/namespaces/{namespace}/pods/{name}")

    def container_log(self, namespace: str, pod: str, container: str, uid: str | None = None,
                      previous: bool = False) -> str:
        """What the container printed, as the kubelet kept it (``kubectl logs``).

        ``uid`` is accepted for the local control plane's signature: a pod name
        names one incarnation here while the object exists.

        Raises:
            FileNotFoundError: the pod is gone or the container has not started.
        """
        args = ["logs", "-n", namespace, pod, "-c", container] + (["--previous"] if previous else [])
        proc = self.kubectl(*args, check=False, timeout_s=60)
        if proc.returncode != 0:
            raise FileNotFoundError(f"no log of {namespace}/{pod}/{container}: {proc.stderr.strip()}")
        return proc.stdout

    def signal_container(self, namespace: str, pod: str, container: str, sig: int = signals.SIGKILL) -> int:
        """Send ``sig`` to the container's main process from its node; return its PID there.

        Raises:
            RuntimeError: the container is not running, or crictl/kill failed on the node.
        """
        obj = self.pod(namespace, pod)
        try:
            return demo.kill_container_process(self.kind, obj, container, signal=signals.Signals(sig).name[3:])
        except (KeyError, StopIteration, subprocess.CalledProcessError) as e:
            raise RuntimeError(f"cannot signal {namespace}/{pod}/{container}: {e}") from e

    def container_running(self, node: str, container_id: str) -> bool:
        """Whether containerd on ``node`` still runs the container (``containerd://ID`` or ID)."""
        cid = container_id.split("://", 1)[-1]
        proc = self.engine.docker("exec", node, "crictl", "ps", "-q", "--id", cid, check=False, timeout=60)
        return bool(proc.stdout.decode().strip())

    def nodes(self) -> list[str]:
        return self.kind.nodes()

    def node_ready(self, name: str) -> bool:
        node = self.api().get(f"/api/v1/nodes/{name}")
        return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))

    def fail_node(self, name: str, *, out_of_service: bool = True) -> None:
        """Lose node ``name`` at once: its container is frozen (kubelet, containerd, pods).

        With ``out_of_service``, the node also gets the
        ``node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`` taint (a
        non-graceful node shutdown): the pod GC controller then force-deletes
        its pods.

        Raises:
            RuntimeError: docker refused five times.
        """
        docker_retrying(self.engine, "pause", name)
        if out_of_service:
            self.kubectl("taint", "node", name, OUT_OF_SERVICE, "--overwrite")

    def restore_node(self, name: str, timeout_s: float = 120) -> None:
        """Thaw a failed node, drop the taint, wait until it is Ready again.

        Raises:
            TimeoutError: the node did not report Ready within ``timeout_s``.
        """
        docker_retrying(self.engine, "unpause", name)
        self.kubectl("taint", "node", name, "node.kubernetes.io/out-of-service-", check=False)
        wait_for(lambda: self.node_ready(name), timeout_s=timeout_s, interval_s=1, what=f"node {name} Ready again")

    def raw(self, path: str) -> str:
        """``kubectl get --raw PATH`` (a GET through the API server, e.g. a service proxy)."""
        return self.kubectl("get", "--raw", path, timeout_s=60).stdout


class ChartOperator:
    """The chart's operator (Deployment ``elastic-jax`` in ``elastic-jax-system``) as the tests use it.

    Args:
      target: the cluster.
      namespace: the release's namespace.
      release: the Helm release (the Deployment's name).
    """

    def __init__(self, target: KindTarget, namespace: str = demo.SYSTEM_NS, release: str = demo.RELEASE):
        self.target, self.namespace, self.release = target, namespace, release
        self.selector = f"app.kubernetes.io/instance={release},app.kubernetes.io/component=operator"

    def pods(self) -> list[dict]:
        items = self.target.api().get(f"/api/v1/namespaces/{self.namespace}/pods", labelSelector=self.selector)
        return [p for p in items["items"] if not p["metadata"].get("deletionTimestamp")]

    def pod(self) -> dict | None:
        """The one Ready operator pod, else None."""
        ready = [p for p in self.pods() if is_ready(p)]
        return ready[0] if len(ready) == 1 else None

    def alive(self) -> bool:
        return self.pod() is not None

    def restarts(self) -> int:
        pod = self.pod()
        return pod["status"]["containerStatuses"][0]["restartCount"] if pod else -1

    def kill(self) -> None:
        """SIGKILL the operator's process in its container (a crash: no cleanup); the kubelet restarts it."""
        pod = self.pod()
        assert pod is not None, "no Ready operator pod to kill"
        self._killed = (pod["metadata"]["uid"], pod["status"]["containerStatuses"][0]["restartCount"])
        self.target.signal_container(self.namespace, pod["metadata"]["name"], "operator", signals.SIGKILL)

    def wait_restarted(self, timeout_s: float = 120) -> dict:
        """After :meth:`kill`: wait until the kubelet restarted the container and it is Ready; the pod."""
        uid, restarts = self._killed

        def back():
            pod = self.pod()
            if pod and pod["metadata"]["uid"] == uid and pod["status"]["containerStatuses"][0]["restartCount"] > restarts:
                return pod
            return None
        return wait_for(back, timeout_s=timeout_s, interval_s=1, what="operator container restarted by the kubelet",
                        explain=lambda: json.dumps([p.get("status") for p in self.pods()])[:3000])

    def log(self) -> str:
        """The operator's log: the previous container's (after a crash) then the current one's."""
        out = []
        for pod in self.pods():
            name = pod["metadata"]["name"]
            for previous in (True, False):
                try:
                    out.append(self.target.container_log(self.namespace, name, "operator", previous=previous))
                except FileNotFoundError:
                    pass
        return "\n".join(out)

    def log_records(self) -> list[dict]:
        records = []
        for line in self.log().splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                pass
        return records

    def metrics(self) -> str:
        """Its Prometheus text, fetched through the API server's pod proxy (port 9090)."""
        pod = self.pod()
        assert pod is not None, "no Ready operator pod"
        return self.target.raw(f"/api/v1/namespaces/{self.namespace}/pods/{pod['metadata']['name']}:9090/proxy/metrics")


def wait_operator_ready(operator: ChartOperator, timeout_s: float = 180) -> dict:
    """Wait for one Ready operator pod; return it."""
    return wait_for(operator.pod, timeout_s=timeout_s, interval_s=1, what="operator pod Ready",
                    explain=lambda: json.dumps([p.get("status") for p in operator.pods()])[:3000])


class LogFollower:
    """``kubectl logs -f`` of one container into a file, for a pod that will be deleted before it is read.

    Stopped by PID with :meth:`stop` (the test that starts it stops it).

    Args:
      target: the cluster.
      namespace, pod, container: what to follow.
      path: where the text goes.
    """

    def __init__(self, target: KindTarget, namespace: str, pod: str, container: str, path: Path):
        self.path = path
        with open(path, "wb") as out:
            self.proc = subprocess.Popen([str(bin_dir() / "kubectl"), "logs", "-f", "-n", namespace, pod,
                                          "-c", container], stdout=out, stderr=subprocess.STDOUT,
                                         env=target.env(), start_new_session=True)

    def text(self) -> str:
        return self.path.read_text(errors="replace")

    def wait_ended(self, timeout_s: float = 60) -> str:
        """Wait until the container's output ended (kubectl exits with it); the whole text."""
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            pass
        return self.text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signals.SIGKILL)
            self.proc.wait(10)
