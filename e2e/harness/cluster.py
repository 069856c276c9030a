"""The whole local cluster: start, reuse, fail a node, stop.

State lives in one folder (:func:`e2e.harness.paths.cluster_dir`):
``pki/`` (CA, certificates, ``admin.kubeconfig``), ``etcd/``, ``logs/``,
``pids/`` and ``nodes/<node>/pods/<ns>/<pod>/<uid>/`` (each container's
output in ``logs/<container>.log`` and its PID in ``pids/<container>.pid``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from e2e.harness import controlplane, jobset, layout, processes
from e2e.harness.build import ensure_built
from e2e.harness.paths import REPO_ROOT, bin_dir, cluster_dir
from e2e.harness.ports import Ports, default_ports
from e2e.nodeagent.kubeapi import ApiError, KubeApi

CONTROL_PLANE = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "jobset-controller")


class ClusterError(RuntimeError):
    """The cluster could not be started, reached or stopped cleanly."""


class CommandError(subprocess.CalledProcessError):
    """kubectl or helm exited non-zero; unlike its base class, the message shows stderr."""

    def __str__(self) -> str:
        return f"{' '.join(map(str, self.cmd))} exited {self.returncode}: {(self.stderr or '').strip()}"


def _run(argv: list[str], env: dict[str, str], input: str | None, check: bool,
         timeout_s: float) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, input=input, capture_output=True, text=True, env=env, timeout=timeout_s)
    if check and proc.returncode != 0:
        raise CommandError(proc.returncode, argv, proc.stdout, proc.stderr)
    return proc


class LocalCluster:
    """A control plane plus node agents, all processes on this machine.

    Args:
        state: the cluster folder.
        ports: loopback ports; default ``E2E_PORT_BASE``, else the base the
            cluster in ``state`` was started with (so ``status``/``down`` find a
            cluster started with another base), else 16400.
        nodes: the node layout.
    """

    PORT_BASE_FILE = "port-base"

    def __init__(self, state: Path | None = None, ports: Ports | None = None,
                 nodes: list[layout.NodeSpec] | None = None):
        self.state = state or cluster_dir()
        recorded = self.state / self.PORT_BASE_FILE
        if ports is None and "E2E_PORT_BASE" not in os.environ and recorded.exists():
            ports = Ports.from_base(int(recorded.read_text()))
        self.ports = ports or default_ports()
        self.nodes = nodes or layout.nodes(address_octet=self.ports.address_octet)
        self.bin = bin_dir()

    # ---- paths and clients ------------------------------------------------------------

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (client certificate in system:masters)."""
        return self.state / "pki" / "admin.kubeconfig"

    @property
    def kubectl_path(self) -> Path:
        return self.bin / "kubectl"

    @property
    def helm_path(self) -> Path:
        return self.bin / "helm"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports.apiserver}"

    def api(self) -> KubeApi:
        """A small admin REST client (see :mod:`e2e.nodeagent.kubeapi`)."""
        return KubeApi("127.0.0.1", self.ports.apiserver, self.state / "pki")

    def env(self) -> dict[str, str]:
        """Environment for kubectl/helm: our kubeconfig, helm's folders inside the cluster folder."""
        env = dict(os.environ)
        env.update({
            "KUBECONFIG": str(self.kubeconfig),
            "HELM_CACHE_HOME": str(self.state / "helm" / "cache"),
            "HELM_CONFIG_HOME": str(self.state / "helm" / "config"),
            "HELM_DATA_HOME": str(self.state / "helm" / "data"),
        })
        return env

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                timeout_s: float = 60) -> subprocess.CompletedProcess:
        """Run kubectl against this cluster.

        Raises:
            CommandError: non-zero exit when ``check`` (its stderr is in the message and ``.stderr``).
        """
        return _run([str(self.kubectl_path), *args], self.env(), input, check, timeout_s)

    def helm(self, *args: str, check: bool = True, timeout_s: float = 120) -> subprocess.CompletedProcess:
        """Run helm against this cluster (same error contract as :meth:`kubectl`)."""
        return _run([str(self.helm_path), *args], self.env(), None, check, timeout_s)

    # ---- pods' files -------------------------------------------------------------------

    def node_dir(self, node: str) -> Path:
        return self.state / "nodes" / node

    def pod_dir(self, namespace: str, pod: str, uid: str | None = None) -> Path:
        """Folder of a pod's newest (or given ``uid``) incarnation on whichever node ran it.

        Raises:
            FileNotFoundError: no node ran that pod.
        """
        found = []
        for node in self.nodes:
            base = self.node_dir(node.name) / "pods" / namespace / pod
            if base.is_dir():
                for d in base.iterdir():
                    if uid is None or d.name == uid:
                        found.append(d)
        if not found:
            raise FileNotFoundError(f"no node has run pod {namespace}/{pod}" + (f" uid {uid}" if uid else ""))
        return max(found, key=lambda d: d.stat().st_mtime)

    def container_log(self, namespace: str, pod: str, container: str, uid: str | None = None) -> str:
        """Everything the container printed (stdout and stderr, all restarts).

        Raises:
            FileNotFoundError: the pod or container never started.
        """
        return (self.pod_dir(namespace, pod, uid) / "logs" / f"{container}.log").read_text(errors="replace")

    def container_pid(self, namespace: str, pod: str, container: str, uid: str | None = None) -> int:
        """PID of the container's current (last started) process.

        Raises:
            FileNotFoundError: the container never started.
        """
        return int((self.pod_dir(namespace, pod, uid) / "pids" / f"{container}.pid").read_text())

    def kill_container(self, namespace: str, pod: str, container: str, uid: str | None = None) -> bool:
        """SIGKILL the container's current process (a crash: no SIGTERM, nothing saved on the way out).

        Only a live process of this cluster is signalled: a PID file outlives its container, and the
        kernel may have given that PID to a stranger since.

        Returns:
            True when a process was killed; False when the container never started or has ended.
        """
        try:
            pid = self.container_pid(namespace, pod, container, uid)
        except (FileNotFoundError, ValueError):
            return False
        if not (processes.alive(pid) and processes.belongs(self.state, pid)):
            return False
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        return True

    # ---- lifecycle ---------------------------------------------------------------------

    def _start(self, name: str, argv: list[str], **kw) -> processes.Started:
        return processes.start(name, argv, state_dir=self.state, **kw)

    def _tail(self, name: str, lines: int = 30) -> str:
        try:
            text = (self.state / "logs" / f"{name}.log").read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return f"({name}: no log)"
        return f"--- last lines of logs/{name}.log ---\n" + "\n".join(text[-lines:])

    def _pid_alive(self, name: str) -> bool:
        pid = processes.read_pid(self.state, name)
        return pid is not None and processes.alive(pid)

    def apiserver_ready(self) -> bool:
        """True when the API server answers /readyz to the admin certificate."""
        if not self.kubeconfig.exists():
            return False
        try:
            ctx = controlplane.admin_ssl_context(self.state)
        except (OSError, ValueError):
            return False
        return controlplane.http_ok(f"{self.server}/readyz", ctx)

    def is_running(self) -> bool:
        """True when every process of this cluster is alive and the API server is ready."""
        names = list(CONTROL_PLANE) + [f"node-{n.name}" for n in self.nodes]
        return all(self._pid_alive(n) for n in names) and self.apiserver_ready()

    MANUAL_MARK = "started-by-hand"

    def mark_manual(self) -> None:
        """Record that this cluster was started by hand (``python -m e2e.harness up``): sessions leave it running."""
        (self.state / self.MANUAL_MARK).touch()

    def started_by_hand(self) -> bool:
        """True for a cluster started with ``up``; False for one a test session started (and may have leaked)."""
        return (self.state / self.MANUAL_MARK).exists()

    def start(self) -> None:
        """Build if needed, then start everything and wait until healthy (stale state is wiped).

        Raises:
            ClusterError: a part did not come up; the message holds its log tail.
            RuntimeError: the build failed.
        """
        ensure_built()
        self.stop(check=False)
        if self.state.exists():
            shutil.rmtree(self.state)
        self.state.mkdir(parents=True)
        (self.state / self.PORT_BASE_FILE).write_text(str(self.ports.etcd_client))
        pki = subprocess.run([str(self.bin / "localcluster"), "pki", f"--dir={self.state / 'pki'}",
                              f"--server={self.server}", f"--service-ip={controlplane.SERVICE_IP}"],
                             capture_output=True, text=True)
        if pki.returncode != 0:
            raise ClusterError(f"pki failed: {pki.stderr}")
        (self.state / "cluster.json").write_text(json.dumps(
            {"ports": self.ports.__dict__, "nodes": [n.name for n in self.nodes]}, indent=1))
        try:
            self._start_control_plane()
            self._start_jobset()
            for node in self.nodes:
                self.start_node(node.name)
            self.wait_nodes_ready([n.name for n in self.nodes])
            self._wait_defaults()
        except BaseException:
            self.stop(check=False)
            raise

    def _wait(self, check, what: str, log: str, timeout_s: float = 120) -> None:
        def alive_or_fail():
            if not self._pid_alive(log):
                raise ClusterError(f"{log} exited while waiting for {what}\n{self._tail(log)}")
            return check()
        try:
            controlplane.wait_until(alive_or_fail, timeout_s=timeout_s, what=what)
        except TimeoutError as e:
            raise ClusterError(f"{e}\n{self._tail(log)}") from None

    def _start_control_plane(self) -> None:
        b, s, p = self.bin, self.state, self.ports
        self._start("etcd", controlplane.etcd_argv(b, s, p))
        self._wait(lambda: controlplane.http_ok(f"http://127.0.0.1:{p.etcd_client}/health"), "etcd", "etcd")
        self._start("kube-apiserver", controlplane.apiserver_argv(b, s, p))
        self._wait(self.apiserver_ready, "kube-apiserver /readyz", "kube-apiserver")
        self._start("kube-controller-manager", controlplane.controller_manager_argv(b, s, p))
        self._start("kube-scheduler", controlplane.scheduler_argv(b, s, p))
        insecure = controlplane.insecure_context()
        self._wait(lambda: controlplane.http_ok(controlplane.component_healthy_url(p.controller_manager), insecure),
                   "kube-controller-manager /healthz", "kube-controller-manager")
        self._wait(lambda: controlplane.http_ok(controlplane.component_healthy_url(p.scheduler), insecure),
                   "kube-scheduler /healthz", "kube-scheduler")

    def _start_jobset(self) -> None:
        manifests = jobset.write_manifests(self.state, self.ports)
        for name in ("crd.yaml", "webhooks.yaml"):
            self.kubectl("apply", "--server-side", "-f", str(manifests / name))
        # kubectl wait fails at once ("status.conditions accessor error") while the new CRD has no
        # status yet, instead of waiting: retry it until the deadline.
        controlplane.wait_until(
            lambda: self.kubectl("wait", "--for=condition=Established", "crd/jobsets.jobset.x-k8s.io",
                                 "--timeout=10s", check=False).returncode == 0,
            timeout_s=60, what="JobSet CRD Established")
        self._start("jobset-controller", jobset.controller_argv(self.bin, self.state, self.ports),
                    env={**os.environ, "KUBECONFIG": str(self.kubeconfig)})
        self._wait(lambda: controlplane.http_ok(jobset.readyz_url(self.ports)),
                   "jobset-controller /readyz", "jobset-controller")

    def node_spec(self, name: str) -> layout.NodeSpec:
        """The layout entry of node ``name``.

        Raises:
            KeyError: no such node in the layout.
        """
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(f"no node {name!r} in the layout (nodes: {[n.name for n in self.nodes]})")

    def start_node(self, name: str) -> processes.Started:
        """Start (or restart after :meth:`fail_node`) the agent of node ``name``."""
        n = self.node_spec(name)
        argv = [sys.executable, "-m", "e2e.nodeagent", f"--name={n.name}", f"--host-ip={n.host_ip}",
                f"--api-port={self.ports.apiserver}", f"--pki-dir={self.state / 'pki'}",
                f"--state-dir={self.node_dir(n.name)}",
                f"--created-mountpoints={self.state / 'created-mountpoints.txt'}",
                f"--labels={json.dumps(n.labels)}", f"--taints={json.dumps(n.taints)}",
                f"--capacity={json.dumps(n.capacity)}"]
        env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
        return self._start(f"node-{n.name}", argv, env=env, cwd=REPO_ROOT)

    def node_ready(self, name: str) -> bool:
        """True when the Node's Ready condition is True and it carries no not-ready taint."""
        try:
            node = self.api().get(f"/api/v1/nodes/{name}")
        except (ApiError, OSError):
            return False
        ready = any(c["type"] == "Ready" and c["status"] == "True"
                    for c in node.get("status", {}).get("conditions", []))
        tainted = any(t["key"].startswith("node.kubernetes.io/") for t in node["spec"].get("taints") or [])
        return ready and not tainted

    def wait_nodes_ready(self, names: list[str], timeout_s: float = 60) -> None:
        """Wait until every node in ``names`` is Ready and untainted.

        Raises:
            ClusterError: not ready in time (the agent's log tail is attached).
        """
        for name in names:
            self._wait(lambda: self.node_ready(name), f"node {name} Ready", f"node-{name}", timeout_s)

    def _wait_defaults(self) -> None:
        """Wait for what the controller-manager creates that every pod needs."""
        api = self.api()

        def present(path: str) -> bool:
            try:
                api.get(path)
                return True
            except (ApiError, OSError):
                return False
        self._wait(lambda: present("/api/v1/namespaces/default/serviceaccounts/default")
                   and present("/api/v1/namespaces/default/configmaps/kube-root-ca.crt"),
                   "default ServiceAccount and kube-root-ca.crt", "kube-controller-manager")

    def fail_node(self, name: str, *, out_of_service: bool = True) -> None:
        """Simulate losing node ``name``: its agent and every container on it die at once (SIGKILL).

        With ``out_of_service``, the node also gets the
        ``node.kubernetes.io/out-of-service=nodeshutdown:NoExecute`` taint that
        an operator (or GKE's node repair) applies to a node that is gone; the
        pod GC controller then force-deletes its terminating pods, as for a
        non-graceful node shutdown.

        Raises:
            KeyError: unknown node.
        """
        self.node_spec(name)
        pid = processes.read_pid(self.state, f"node-{name}")
        if pid is not None and processes.alive(pid):
            os.kill(pid, signal.SIGKILL)
        # Containers die with their node: kill every container process group
        # recorded on it (PR_SET_PDEATHSIG covers direct children only). Only
        # groups that still hold a process of this cluster: a PID file outlives
        # its container, and the kernel may have handed that PID to a stranger.
        for pgid in {pgid for pgid, _, _ in self._node_groups(name)}:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        if pid is not None:
            deadline = time.monotonic() + 10
            while processes.alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            processes.forget(self.state, f"node-{name}")
        if out_of_service:
            self.kubectl("taint", "node", name, "node.kubernetes.io/out-of-service=nodeshutdown:NoExecute",
                         "--overwrite")

    def restore_node(self, name: str, timeout_s: float = 60) -> None:
        """Bring a failed node back (its agent restarts, re-registers, the out-of-service taint goes).

        Raises:
            ClusterError: the node did not become Ready.
        """
        self.kubectl("taint", "node", name, "node.kubernetes.io/out-of-service-", check=False)
        self.start_node(name)
        self.wait_nodes_ready([name], timeout_s)

    def add_node(self, spec: layout.NodeSpec, timeout_s: float = 60) -> None:
        """Start a node that is not in the layout (a node pool that appears, as GKE adds one) and wait until Ready.

        Its agent is recorded like the others (``stop`` ends it); ``remove_node`` ends it earlier.

        Raises:
            ValueError: a node of that name is already in the layout.
            ClusterError: the node did not become Ready.
        """
        if any(n.name == spec.name for n in self.nodes):
            raise ValueError(f"node {spec.name!r} is already in the layout")
        self.nodes.append(spec)
        self.start_node(spec.name)
        self.wait_nodes_ready([spec.name], timeout_s)

    def remove_node(self, name: str) -> None:
        """Stop a node ``add_node`` started (its agent and containers, by PID) and delete its Node object.

        Raises:
            KeyError: unknown node.
        """
        self.fail_node(name, out_of_service=False)
        self.kubectl("delete", "node", name, "--wait=false", check=False)
        self.nodes = [n for n in self.nodes if n.name != name]

    def node_processes(self, name: str) -> list[tuple[int, str]]:
        """Live container processes started by node ``name``'s agent: (pid, command line)."""
        return [(pid, cmd) for _, pid, cmd in self._node_groups(name)]

    def _node_groups(self, name: str) -> list[tuple[int, int, str]]:
        """(process group, pid, command line) of each live process of this cluster in a
        container process group node ``name``'s agent recorded.

        A recorded group counts only through processes that carry this cluster's
        marker environment (``processes.leftovers``), so a reused PID is never matched.
        """
        groups = set()
        for pidfile in (self.node_dir(name) / "pods").glob("*/*/*/pids/*.pid"):
            try:
                groups.add(int(pidfile.read_text()))
            except ValueError:
                pass
        out = []
        for pid, cmd in processes.leftovers(self.state):
            try:
                pgid = os.getpgid(pid)
            except ProcessLookupError:
                continue
            if pgid in groups:
                out.append((pgid, pid, cmd))
        return out

    def stop(self, check: bool = True) -> None:
        """Stop every process this cluster folder recorded, by PID, agents first.

        Raises:
            ClusterError: with ``check``, when any process of the cluster is
                still alive afterwards (listed in the message).
        """
        pid_dir = self.state / "pids"
        names = sorted(p.stem for p in pid_dir.glob("*.pid")) if pid_dir.exists() else []
        order = [n for n in names if n.startswith("node-")] + [n for n in reversed(CONTROL_PLANE) if n in names]
        order += [n for n in names if n not in order]
        for name in order:
            pid = processes.read_pid(self.state, name)
            if pid is not None:
                processes.stop(pid, grace_s=10)
            processes.forget(self.state, name)
        self._remove_created_mountpoints()
        if check:
            left = processes.leftovers(self.state)
            if left:
                raise ClusterError("still running after stop: " + "; ".join(f"{p} {c[:120]}" for p, c in left))

    def _remove_created_mountpoints(self) -> None:
        listing = self.state / "created-mountpoints.txt"
        if not listing.exists():
            return
        paths = sorted(set(listing.read_text().split()), key=lambda p: -p.count("/"))
        for raw in paths:
            p = Path(raw)
            try:
                if p.is_file() and p.stat().st_size == 0:
                    p.unlink()
                elif p.is_dir():
                    p.rmdir()  # only when empty: never remove what someone else put there
            except OSError:
                pass
        listing.unlink()
