"""A real kind cluster on this machine, offline: build, create, use, delete.

:func:`create` runs the real ``kind create cluster`` (the kind CLI pinned in
``e2e/build.sh``) with a node image built here (:mod:`e2e.kind.nodeimage.build`):
one control-plane and two worker nodes on a Docker network we create with a
known IPv4 subnet (``KIND_EXPERIMENTAL_DOCKER_NETWORK``). Then it waits for
every node to be Ready, removes CoreDNS's upstream forwarder (cluster DNS
answers cluster names and nothing else, so no test query leaves the
machine), and installs JobSet from the pinned module's kustomize config with
the controller image built here. :func:`delete` removes the cluster, its
network and its state folder, by name; :func:`attach` reopens a running one.

Workers carry the node-pool label the product's CPU jobs select
(:data:`WORKER_LABELS`).

Command line (with an engine from ``python -m e2e.kind.engine start``)::

    python -m e2e.kind.cluster create [NAME]   # prints the kubeconfig path and timings
    python -m e2e.kind.cluster delete [NAME]
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from e2e.harness import jobset as jobset_module
from e2e.harness.build import ensure_built
from e2e.harness.paths import bin_dir, build_dir
from e2e.kind.engine import Engine
from e2e.kind.nodeimage import build as nodeimage
from e2e.kind.nodeimage.build import NodeImage
from elastic_jax import contract

DEFAULT_NAME = "elastic-jax"

WORKERS = 2
WORKER_LABELS = {"cloud.google.com/gke-nodepool": "cpu-pool"}
"""Labels of every worker node (the product's CPU node pool)."""

SUBNET_PREFIX = "172.30"
"""The cluster's Docker network is a /24 under this prefix, chosen by the cluster name."""

KUBELET_PATCH = """\
kind: KubeletConfiguration
# The host's cgroups are v1, driven with cgroupfs (as Docker and the node's containerd).
cgroupDriver: cgroupfs
# kubelet 1.35 refuses cgroup v1 unless told.
failCgroupV1: false
# The node's Lease is renewed every quarter of this (upstream 40 s: every 10 s): every 5 s, so a
# node-monitor grace of NODE_MONITOR_GRACE_PERIOD is three missed renewals.
nodeLeaseDurationSeconds: 20
"""

NODE_MONITOR_GRACE_PERIOD = "15s"
"""How long the node controller waits for a silent kubelet before marking its node ``Ready=Unknown``.

Upstream's 50 s (k8s 1.35) would make every node-loss test wait that long before
anything can react (``test_node_failure.py``: pause a node, the operator acts
``--node-lost-seconds`` after the node controller's mark). 15 s is three of the
kubelet's lease renewals, every 5 s here (``nodeLeaseDurationSeconds`` 20 in
:data:`KUBELET_PATCH`; upstream renews every 10 s, and this was 20 s, two
renewals, until session 28), so a node slowed by a loaded machine does not flap;
the local control plane tier uses 8 s for the same reason."""

NODE_MONITOR_PERIOD = "2s"
"""How often the node controller looks at the nodes' Leases (upstream 5 s): the mark comes at most this
long after the grace ran out."""

CONTROLLER_MANAGER_PATCH = f"""\
kind: ClusterConfiguration
controllerManager:
  extraArgs:
    node-monitor-grace-period: "{NODE_MONITOR_GRACE_PERIOD}"
    node-monitor-period: "{NODE_MONITOR_PERIOD}"
"""

READY_TIMEOUT_S = 300.0
JOBSET_TIMEOUT_S = 300.0


class KindError(RuntimeError):
    """A kind step failed; the message holds what went wrong and the cluster's state."""


@dataclass
class KindCluster:
    """A kind cluster made by :func:`create`.

    Attributes:
      name: kind's cluster name (node containers are ``NAME-control-plane``, ``NAME-worker``, ...).
      engine: the Docker engine the nodes run in.
      network: the Docker network of the nodes.
      subnet: its IPv4 subnet.
      image: the node image.
      timings_s: seconds per step of :func:`create` (build steps included).
      preload: images :func:`create` is still copying into the workers (:class:`ImagePreload`); waited for by
        :meth:`load_images`.
    """

    name: str
    engine: Engine
    network: str
    subnet: str
    image: NodeImage
    timings_s: dict[str, float] = field(default_factory=dict)
    preload: ImagePreload | None = None

    @property
    def state_dir(self) -> Path:
        """See :func:`state_dir`."""
        return state_dir(self.name)

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (server on 127.0.0.1, a port Docker publishes)."""
        return self.state_dir / "kubeconfig"

    def kubectl(self, *args: str, input: str | None = None, timeout_s: float = 120,
                check: bool = True) -> subprocess.CompletedProcess:
        """Run our kubectl against this cluster; text output.

        Raises:
            KindError: ``check`` and a non-zero exit (stderr in the message).
        """
        argv = [str(bin_dir() / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args]
        proc = subprocess.run(argv, input=input, capture_output=True, text=True, timeout=timeout_s)
        if check and proc.returncode != 0:
            raise KindError(f"kubectl {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def helm(self, *args: str, timeout_s: float = 360) -> subprocess.CompletedProcess:
        """Run our helm against this cluster.

        Raises:
            KindError: a non-zero exit.
        """
        argv = [str(bin_dir() / "helm"), f"--kubeconfig={self.kubeconfig}", *args]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0:
            raise KindError(f"helm {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def load_images(self, refs: list[str], nodes: list[str] | None = None, timeout_s: float = 1200) -> None:
        """Copy images from the engine into ``nodes`` (default: every node) with ``kind load docker-image``.

        kind skips a node that already has an image's ID, so loading again is cheap.

        Raises:
            KindError: kind failed.
        """
        if self.preload is not None:
            # The images create() began copying in: wait for that copy; what it did not finish (it
            # failed: said here) kind loads below. kind skips every node that has an image's ID.
            error = self.preload.wait()
            self.timings_s.update({f"preload_{k}": v for k, v in self.preload.timings_s.items()})
            self.preload = None
            if error:
                print(f"kind: the preload into the nodes failed, loading again: {error}", file=sys.stderr)
        if refs:
            only = ["--nodes", ",".join(nodes)] if nodes else []
            _kind(self.engine, "load", "docker-image", "--name", self.name, *only, *refs, timeout_s=timeout_s)
            for node in nodes or self.nodes():
                _drop_import_names(self.engine, node)

    def nodes(self) -> list[str]:
        """Node container names, which are also the Kubernetes node names."""
        return _kind(self.engine, "get", "nodes", "--name", self.name).stdout.split()

    def workers(self) -> list[str]:
        """The worker nodes' names (``NAME-worker``, ``NAME-worker2``)."""
        return [n for n in self.nodes() if "-worker" in n]

    def delete(self, log=print) -> None:
        """See :func:`delete`."""
        delete(self.engine, self.name, log)


def _drop_import_names(engine: Engine, node: str) -> None:
    """Remove the ``import-<date>@sha256:...`` names ``ctr import --digests`` (what kind runs) adds.

    It names every image so besides its tag; when the tag moves to a rebuilt image the old one
    stays named and on disk (about 2.5 GB per node per rebuild of the product images: a kept
    cluster filled this machine's disk). The tags are what pods use.
    """
    engine.docker("exec", node, "sh", "-c",
                  'refs=$(ctr -n k8s.io images ls -q | grep "^import-"); '
                  '[ -z "$refs" ] || ctr -n k8s.io images rm $refs >/dev/null',
                  check=False, timeout=120)


class ImagePreload:
    """Images copied into a new cluster's worker nodes while :func:`create` is still making the cluster.

    ``kind load docker-image`` once the cluster is ready is two steps the tests then wait for, one
    after the other: ``docker save`` (dockerd tars every layer of the three product images: about
    25 s of its CPU, 1.8 GB) and ``ctr import`` on each node (about 30 s, the nodes in parallel);
    a session's chart install took 105-114 s, most of it this. Here the save starts with
    :func:`create`, beside the node image build and ``kind create cluster``, and the import into
    the workers (``kind load image-archive``, the same ``ctr import`` as ``kind load docker-image``)
    starts once they exist, beside the wait for Ready nodes, CoreDNS's restart, JobSet's
    install and the first tests. :meth:`KindCluster.load_images` waits for it and then finds the
    images there (kind skips every node that has an image's ID). Its processes are stopped by
    PID when it is cancelled (a failed or interrupted create).

    Args:
      engine: the engine holding the images.
      refs: image references (tags).
      folder: where the tar goes (deleted once imported).
    """

    def __init__(self, engine: Engine, refs: list[str], folder: Path):
        self.engine, self.refs = engine, list(refs)
        folder.mkdir(parents=True, exist_ok=True)
        self.tar = folder / "preload-images.tar"
        self.timings_s: dict[str, float] = {}
        self._cluster: str | None = None
        self._nodes: list[str] = []
        self._go = threading.Event()
        self._lock = threading.Lock()
        self._procs: list[subprocess.Popen] = []
        self._cancelled = False
        self._error: str | None = None
        self._thread = threading.Thread(target=self._run, name="kind-image-preload", daemon=True)
        self._thread.start()

    def load_into(self, cluster: str, nodes: list[str]) -> None:
        """Import the saved images into ``nodes`` of ``cluster`` once the save is done (returns at once)."""
        self._cluster, self._nodes = cluster, list(nodes)
        self._go.set()

    def _spawn(self, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
        with self._lock:
            if self._cancelled:
                raise RuntimeError("cancelled")
            # Its own process group: cancel() ends kind's `docker exec` children with it, by the group's PID.
            proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                    start_new_session=True)
            self._procs.append(proc)
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:3])} failed ({proc.returncode}): {(out + err).strip()[-3000:]}")
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    def _run(self) -> None:
        from e2e.kind.engine import docker_client
        try:
            t0 = time.monotonic()
            self._spawn([docker_client(), "save", "-o", str(self.tar), *self.refs], self.engine.env())
            self.timings_s["save"] = time.monotonic() - t0
            self._go.wait()
            if self._cancelled or self._cluster is None:
                return
            t0 = time.monotonic()
            env = self.engine.env()
            env.pop("KUBECONFIG", None)
            self._spawn([str(bin_dir() / "kind"), "load", "image-archive", str(self.tar), "--name", self._cluster,
                         "--nodes", ",".join(self._nodes)], env)
            for node in self._nodes:
                _drop_import_names(self.engine, node)
            self.timings_s["import"] = time.monotonic() - t0
        except Exception as e:  # said by wait(); the images are then loaded the usual way
            self._error = "" if self._cancelled else str(e) or type(e).__name__
        finally:
            shutil.rmtree(self.tar.parent, ignore_errors=True)

    def wait(self) -> str | None:
        """Wait until the images are in the nodes; what went wrong, if anything (None: they are there)."""
        self._go.set()  # never told where to load (create failed first): the thread ends after its save
        self._thread.join()
        if self._error is None and "import" not in self.timings_s:
            return "the nodes were never named"
        return self._error

    def cancel(self) -> None:
        """Stop what runs (its process group, by PID) and wait for the thread; the tar is deleted."""
        with self._lock:
            self._cancelled = True
            for proc in self._procs:
                if proc.poll() is None:
                    try:
                        os.killpg(proc.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        self._go.set()
        self._thread.join(60)


def state_dir(name: str) -> Path:
    """Where a cluster keeps its kind config and kubeconfig (under ``e2e/.build/kind``)."""
    return build_dir() / "kind" / "clusters" / name


def network_name(name: str) -> str:
    """The Docker network of cluster ``name`` (ours, not kind's shared ``kind`` network)."""
    return f"kind-{name}"


def build(engine: Engine, log=print) -> NodeImage:
    """Build (or find up to date) the binaries, root file systems, preloaded images and node image."""
    return nodeimage.node_image(engine, log)


def kind_config(name: str, workers: int = WORKERS) -> dict:
    """The kind cluster configuration: one control-plane, ``workers`` labelled workers, IPv4, cgroup v1 kubelet,
    node loss seen after :data:`NODE_MONITOR_GRACE_PERIOD`."""
    nodes = [{"role": "control-plane"}]
    nodes += [{"role": "worker", "labels": dict(WORKER_LABELS)} for _ in range(workers)]
    return {
        "kind": "Cluster",
        "apiVersion": "kind.x-k8s.io/v1alpha4",
        "name": name,
        "networking": {"ipFamily": "ipv4", "apiServerAddress": "127.0.0.1"},
        "nodes": nodes,
        "kubeadmConfigPatches": [KUBELET_PATCH, CONTROLLER_MANAGER_PATCH],
    }


def _kind(engine: Engine, *args: str, env_extra: dict[str, str] | None = None, timeout_s: float = 600,
          check: bool = True) -> subprocess.CompletedProcess:
    if not (bin_dir() / "kind").exists():
        # A fresh clone: the kind CLI is one of e2e/build.sh's Go binaries (the first call may be
        # `kind get clusters`, before anything else built them).
        print("kind: building e2e/build.sh's binaries first (seconds with warm Go caches, minutes on a fresh "
              "machine)", file=sys.stderr, flush=True)
        ensure_built()
    env = engine.env()
    env.pop("KUBECONFIG", None)
    env.update(env_extra or {})
    proc = subprocess.run([str(bin_dir() / "kind"), *args], env=env, capture_output=True, text=True,
                          timeout=timeout_s)
    if check and proc.returncode != 0:
        raise KindError(f"kind {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}"
                        f"\n{proc.stderr[-6000:]}")
    return proc


def clusters(engine: Engine) -> list[str]:
    """Names of the kind clusters in this engine (``kind get clusters``)."""
    return _kind(engine, "get", "clusters").stdout.split()


def attach(engine: Engine, name: str = DEFAULT_NAME, image: NodeImage | None = None,
           log=print) -> KindCluster | None:
    """The running cluster ``name`` that :func:`create` made (its kubeconfig is still there), else None.

    Args:
      engine: the engine it runs in.
      name: kind's cluster name.
      image: its node image; :func:`build` (a few seconds when up to date) when None.
      log: progress printer.
    """
    if name not in clusters(engine) or not (state_dir(name) / "kubeconfig").exists():
        return None
    proc = engine.docker("network", "inspect", "--format", "{{(index .IPAM.Config 0).Subnet}}",
                         network_name(name), check=False)
    return KindCluster(name=name, engine=engine, network=network_name(name),
                       subnet=proc.stdout.decode().strip(), image=image or build(engine, log))


def host_routes(table: str | None = None) -> list[ipaddress.IPv4Network]:
    """The IPv4 networks the host routes to (`/proc/net/route`, or `table` in its format), default route left out.

    A bridge of this host's (another Docker engine's cluster, a VPN) owns its subnet here: a cluster network on
    the same /24 would leave one of the two unreachable from the host.
    """
    if table is None:
        try:
            table = Path("/proc/net/route").read_text()
        except OSError:
            return []
    routes = []
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8:
            continue
        # Destination and Mask: 32-bit hex in host (little-endian) byte order.
        dest, mask = (int(fields[i], 16).to_bytes(4, "little") for i in (1, 7))
        if mask == b"\0\0\0\0":
            continue
        routes.append(ipaddress.IPv4Network((ipaddress.IPv4Address(dest), str(ipaddress.IPv4Address(mask))),
                                           strict=False))
    return routes


def candidate_subnets(name: str, routed: list[ipaddress.IPv4Network]) -> list[str]:
    """The /24s under SUBNET_PREFIX a cluster `name` may take, in order: 16 from one its name picks, less any
    the host routes (`routed`)."""
    first = int(hashlib.sha256(name.encode()).hexdigest(), 16) % 200
    subnets = [f"{SUBNET_PREFIX}.{(first + i) % 256}.0/24" for i in range(16)]
    return [s for s in subnets if not any(ipaddress.ip_network(s).overlaps(r) for r in routed)]


def _create_network(engine: Engine, name: str, log=print) -> str:
    """Create the cluster's bridge network (IPv4 only, no masquerading); return its subnet.

    The /24 is chosen from the cluster name, moving on past any the host already
    routes (another engine's cluster: each private engine sees only its own
    networks, so a second cluster of the same name got the same /24 and the
    host's route went to the first one's bridge; a new user's trial) and when
    Docker reports an overlap with another network.

    Raises:
        KindError: no free subnet.
    """
    network = network_name(name)
    engine.docker("network", "rm", network, check=False)
    routed = host_routes()
    errors = [f"every candidate is routed on this host ({', '.join(map(str, routed))})"]
    for subnet in candidate_subnets(name, routed):
        proc = engine.docker("network", "create", "--driver", "bridge", "--subnet", subnet,
                             "--opt", "com.docker.network.bridge.enable_ip_masquerade=false",
                             "--label", f"dev.elastic-jax.kind-cluster={name}", network, check=False)
        if proc.returncode == 0:
            log(f"kind: network {network} {subnet}")
            return subnet
        errors.append(proc.stderr.decode().strip())
    raise KindError(f"no free /24 under {SUBNET_PREFIX} for network {network}: {errors[-1]}")


def create(engine: Engine, name: str = DEFAULT_NAME, image: NodeImage | None = None, log=print,
           preload: list[str] | None = None) -> KindCluster:
    """Build what is missing, create the cluster with ``kind create cluster``, make it ready for tests.

    A cluster or network left with the same name (a killed run) is deleted
    first. On failure the cluster is deleted and the error says why, with the
    nodes' and pods' state and the kubelet's last log lines. The wait for Ready
    nodes, CoreDNS's restart and JobSet's install run side by side (each waits
    on the kubelets and pods starting; a pod is scheduled once its node is Ready).

    Args:
      engine: the private engine (:mod:`e2e.kind.engine`).
      name: kind's cluster name.
      image: a node image from :func:`build`; built when None.
      log: progress printer.
      preload: images (in ``engine``) to copy into the worker nodes meanwhile (:class:`ImagePreload`);
        the returned cluster's ``preload`` is still copying them, and :meth:`KindCluster.load_images`
        waits for it.

    Returns:
      The ready :class:`KindCluster`.

    Raises:
        KindError: a step failed or timed out.
        RuntimeError, subprocess.CalledProcessError: building failed.
    """
    timings: dict[str, float] = {}
    copying = ImagePreload(engine, preload, build_dir() / "kind" / f"preload-{name}") if preload else None
    try:
        if image is None:
            image = build(engine, log)
    except BaseException:
        if copying:
            copying.cancel()
        raise
    timings.update({f"build_{k}": v for k, v in image.step_s.items()})
    if name in clusters(engine):
        log(f"kind: deleting cluster {name} left by an earlier run")
    delete(engine, name, log=lambda m: None)
    subnet = _create_network(engine, name, log)
    folder = state_dir(name)
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "kind-config.yaml"
    config.write_text(json.dumps(kind_config(name), indent=2))
    cluster = KindCluster(name=name, engine=engine, network=network_name(name), subnet=subnet, image=image,
                          timings_s=timings)
    try:
        t0 = time.monotonic()
        log(f"kind: creating cluster {name} from {image.name}")
        _kind(engine, "create", "cluster", "--name", name, "--image", image.name, "--config", str(config),
              "--kubeconfig", str(cluster.kubeconfig), "--retain",
              env_extra={"KIND_EXPERIMENTAL_DOCKER_NETWORK": cluster.network}, timeout_s=900)
        timings["kind_create"] = time.monotonic() - t0
        if copying:
            copying.load_into(name, cluster.workers())
            cluster.preload = copying
        _side_by_side({"nodes_ready": lambda: wait_nodes_ready(cluster, 1 + WORKERS),
                       "coredns": lambda: isolate_dns(cluster), "jobset": lambda: install_jobset(cluster)}, timings)
    except BaseException as e:
        if copying:
            copying.cancel()
            cluster.preload = None
        detail = diagnostics(cluster) if not isinstance(e, KeyboardInterrupt) else ""
        delete(engine, name, log)
        if isinstance(e, KindError):
            raise KindError(f"{e}\n{detail}") from e
        if detail:
            log(f"kind: cluster {name} failed ({type(e).__name__}); its state was:\n{detail}")
        raise
    log("kind: cluster " + name + " ready (" + ", ".join(f"{k} {v:.0f}s" for k, v in timings.items()) + ")")
    return cluster


def _side_by_side(steps: dict, timings: dict[str, float]) -> None:
    """Run ``steps`` (name -> callable) in threads at once; record each one's seconds in ``timings``.

    Raises:
        the first step's exception (in ``steps``' order), once every step has ended.
    """
    errors: dict[str, BaseException] = {}

    def run(key, step):
        t0 = time.monotonic()
        try:
            step()
        except BaseException as e:  # raised below, in this thread's caller
            errors[key] = e
        timings[key] = time.monotonic() - t0
    threads = [threading.Thread(target=run, args=item, name=f"kind-{item[0]}", daemon=True) for item in steps.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for key in steps:
        if key in errors:
            raise errors[key]


def wait_nodes_ready(cluster: KindCluster, count: int, timeout_s: float = READY_TIMEOUT_S) -> None:
    """Wait until ``count`` nodes exist and all are Ready.

    Raises:
        KindError: not within ``timeout_s``.
    """
    deadline = time.monotonic() + timeout_s
    state = ""
    while time.monotonic() < deadline:
        proc = cluster.kubectl("get", "nodes", "-o", "json", check=False)
        if proc.returncode == 0:
            items = json.loads(proc.stdout)["items"]
            ready = [n["metadata"]["name"] for n in items
                     if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"].get("conditions", []))]
            state = f"{len(ready)}/{len(items)} Ready"
            if len(items) >= count and len(ready) == len(items):
                return
        time.sleep(2)
    raise KindError(f"nodes not Ready within {timeout_s:.0f}s ({state})")


def corefile_without_forward(corefile: str) -> str:
    """The Corefile with its ``forward`` directive (and its block, if any) removed.

    Raises:
        KindError: a ``forward`` is still there afterwards (an unexpected shape).
    """
    out = re.sub(r"^[ \t]*forward\b[^\n{]*\{[^}]*\}[ \t]*\n", "", corefile, flags=re.M)
    out = re.sub(r"^[ \t]*forward\b[^\n{]*\n", "", out, flags=re.M)
    if re.search(r"^\s*forward\b", out, re.M):
        raise KindError(f"could not remove the forward plugin from the Corefile:\n{corefile}")
    return out


def isolate_dns(cluster: KindCluster, timeout_s: float = 180) -> None:
    """Remove CoreDNS's upstream forwarder and restart it; wait until it is available again.

    Raises:
        KindError: kubectl failed or CoreDNS did not come back.
    """
    cm = json.loads(cluster.kubectl("-n", "kube-system", "get", "configmap", "coredns", "-o", "json").stdout)
    cm["data"]["Corefile"] = corefile_without_forward(cm["data"]["Corefile"])
    cluster.kubectl("replace", "-f", "-", input=json.dumps(cm))
    cluster.kubectl("-n", "kube-system", "rollout", "restart", "deployment/coredns")
    cluster.kubectl("-n", "kube-system", "rollout", "status", "deployment/coredns", f"--timeout={timeout_s:.0f}s",
                    timeout_s=timeout_s + 30)


def jobset_manifests(image: str) -> str:
    """Upstream's ``config/default`` of the pinned JobSet module, rendered, with the controller image replaced.

    Returns:
      A JSON ``List`` of every object, the manager container's image set to
      ``image`` with ``imagePullPolicy: Never`` (it is preloaded in every node).

    Raises:
        KindError: the rendered manifests have no controller Deployment with a ``manager`` container.
    """
    config = jobset_module.module_dir() / "config" / "default"
    rendered = subprocess.run([str(bin_dir() / "kubectl"), "kustomize", str(config)],
                              check=True, capture_output=True, text=True).stdout
    objects = [o for o in yaml.safe_load_all(rendered) if o]
    replaced = 0
    for obj in objects:
        if obj["kind"] == "Deployment":
            for container in obj["spec"]["template"]["spec"]["containers"]:
                if container["name"] == "manager":
                    container["image"] = image
                    container["imagePullPolicy"] = "Never"
                    replaced += 1
    if replaced != 1:
        raise KindError(f"expected one JobSet manager container in {config}, found {replaced}")
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": objects})


def install_jobset(cluster: KindCluster, timeout_s: float = JOBSET_TIMEOUT_S) -> None:
    """Apply JobSet's manifests; wait for the controller and for its webhooks to admit a JobSet.

    Raises:
        KindError: apply failed, or the controller or webhooks were not ready within ``timeout_s``.
    """
    cluster.kubectl("apply", "--server-side", "-f", "-", input=jobset_manifests(cluster.image.jobset_image))
    deadline = time.monotonic() + timeout_s
    cluster.kubectl("-n", "jobset-system", "rollout", "status", "deployment/jobset-controller-manager",
                    f"--timeout={timeout_s:.0f}s", timeout_s=timeout_s + 30)
    probe = json.dumps({
        "apiVersion": contract.JOBSET_API_VERSION, "kind": contract.JOBSET_KIND,
        "metadata": {"name": "webhook-probe", "namespace": "default"},
        "spec": {"replicatedJobs": [{"name": "w", "replicas": 1, "template": {"spec": {"template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "c", "image": cluster.image.tools_image, "command": ["true"]}]}}}}}]},
    })
    error = ""
    while time.monotonic() < deadline:
        proc = cluster.kubectl("create", "--dry-run=server", "-f", "-", input=probe, check=False)
        if proc.returncode == 0:
            return
        error = proc.stderr.strip()
        time.sleep(2)
    raise KindError(f"JobSet webhooks did not admit a JobSet within {timeout_s:.0f}s: {error}")


def diagnostics(cluster: KindCluster) -> str:
    """Nodes, pods and each node's last kubelet log lines, for an error message (never raises)."""
    parts = []
    try:
        if cluster.kubeconfig.exists():
            parts.append(cluster.kubectl("get", "nodes,pods", "-A", "-o", "wide", check=False).stdout)
        for node in cluster.nodes():
            out = cluster.engine.docker("exec", node, "journalctl", "--no-pager", "-n", "30", "-u", "kubelet",
                                        "-u", "containerd", "-u", "preload-images", check=False, timeout=30)
            parts.append(f"--- {node}\n{out.stdout.decode(errors='replace')}")
    except Exception as e:  # diagnostics must not hide the original error
        parts.append(f"(diagnostics failed: {e})")
    return "\n".join(parts)[-12000:]


def delete(engine: Engine, name: str = DEFAULT_NAME, log=print) -> None:
    """Delete the cluster (``kind delete cluster``: its containers and their volumes), its network and state.

    Safe to call when nothing exists.

    Raises:
        KindError: something of the cluster is still there afterwards.
    """
    folder = state_dir(name)
    _kind(engine, "delete", "cluster", "--name", name, "--kubeconfig", str(folder / "kubeconfig"), check=False)
    engine.docker("network", "rm", network_name(name), check=False)
    shutil.rmtree(folder, ignore_errors=True)
    left = engine.docker("ps", "-aq", "--filter", f"label=io.x-k8s.kind.cluster={name}").stdout.split()
    network_left = engine.docker("network", "inspect", network_name(name), check=False).returncode == 0
    if left or network_left:
        raise KindError(f"cluster {name} not fully deleted: containers {left}, network left: {network_left}")
    log(f"kind: cluster {name} deleted")


def main(argv: list[str]) -> int:
    """``create [NAME]`` | ``delete [NAME]`` with the engine of ``python -m e2e.kind.engine start``."""
    from e2e.kind import engine as engine_mod
    if not engine_mod.STATE_FILE.exists():
        print("kind: start an engine first: python -m e2e.kind.engine start", file=sys.stderr)
        return 2
    engine = Engine.from_json(engine_mod.STATE_FILE.read_text())
    name = argv[1] if len(argv) > 1 else DEFAULT_NAME
    if argv[:1] == ["create"]:
        cluster = create(engine, name)
        print(f"export KUBECONFIG={cluster.kubeconfig}")
        return 0
    if argv[:1] == ["delete"]:
        delete(engine, name)
        return 0
    print("usage: python -m e2e.kind.cluster create|delete [NAME]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
