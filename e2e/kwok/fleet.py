"""Many ElasticTrainingJobs at once on the local control plane: serve-only controllers, kwok workers.

Shared by `benchmarks/bench_operator_scale.py` (50 jobs) and `e2e/test_kwok_scale.py` (a few). Each job's
controller pod is real (the node agent runs `elastic-jax-controller --serve-only` at its own pod IP, the
endpoint the operator reports to); its worker pods are kwok's, on nodes labelled `kwok-pool`.

Backend pathways (`e2e/test_kwok_pathways.py`, the benchmark's `--backend pathways`): each job's
controller pod is its Pathways head, on a node agent's CPU node (`HEAD_POOL`, added by `add_head_node`):
the resource-manager and proxy sidecars are the stand-ins the node agent runs for Google's images
(`e2e/nodeagent/images.py`), the controller container is `--serve-only`. Each slice is a JobSet of
`hosts` Pathways worker pods on a kwok TPU node pool of its own (`install_tpu_pools`), one pod per host.

What the operator does is unchanged: it runs as a host process with its least-privilege ServiceAccount
(`OperatorProcess`), and its requests are counted at the API server under a FlowSchema that matches only
that ServiceAccount (`OPERATOR_FLOW_SCHEMA`).
"""

from __future__ import annotations

import base64
import json
import re
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from e2e.harness import layout
from e2e.helpers import wait_for
from e2e.kwok import KWOK_NODE_LABEL, POOL, POOL_LABEL, failed_status, fake_node, tpu_node
from e2e.nodeagent import images as node_images
from e2e.operator_fixtures import CRD, SA, SYSTEM_NS

from elastic_jax.api import labels as lbl

OPERATOR_FLOW_SCHEMA = "elastic-jax-operator-bench"
_DISPATCHED = re.compile(r'^apiserver_flowcontrol_dispatched_requests_total\{([^}]*)\}\s+([0-9.e+]+)$', re.M)


# Backend pathways: the heads' node (a node agent, so their processes run), sized for 50 heads: each asks
# for the resource manager's and proxy's limits (8 + 16 CPUs, 32G + 100G) as the renderer sets them.
HEAD_POOL = layout.PoolSpec("kwok-head-pool", 1, "n2-standard-64", cpu="1500", memory="8000Gi")
# Its node index among the nodes added to a running cluster (clear of e2e/test_pathways_operator.py's).
HEAD_NODE_INDEX = layout.EXTRA_NODE_INDEX + 60
# TPU v5e (4 chips a host, ct5lp-hightpu-4t): the topology of a slice of that many hosts. No v5e topology
# has 2 hosts: 2x4 is the single-host 8-chip machine (ct5lp-hightpu-8t; `tpu_shapes.slice_shape`).
TPU_ACCELERATOR = "tpu-v5-lite-podslice"
TOPOLOGY_BY_HOSTS = {1: "2x2", 4: "4x4", 8: "4x8"}
TPU_POOL_PREFIX = "kwok-tpu-"


def tpu_topology(hosts: int) -> str:
    """The v5e topology of a slice of `hosts` hosts.

    Raises:
      ValueError: no v5e topology of 4-chip hosts has that many hosts (1, 4 or 8).
    """
    try:
        return TOPOLOGY_BY_HOSTS[hosts]
    except KeyError:
        raise ValueError(f"hosts per slice {hosts}: one of {sorted(TOPOLOGY_BY_HOSTS)} for {TPU_ACCELERATOR}") from None


def job_manifest(name: str, slices: int, hosts: int = 1, backend: str = "cpu") -> dict:
    """An ElasticTrainingJob whose controller is serve-only and whose workers are kwok pods.

    Backend cpu: the controller on the node agent's CPU pool, the workers on `kwok-pool`. Requests are small so
    50 controller pods fit two simulated nodes. Backend pathways: the controller pod (with the Pathways head)
    on `HEAD_POOL`, each slice a v5e slice of `hosts` hosts (`tpu_topology`) on kwok's TPU pools; no worker
    node selector: the TPU labels the operator renders and exclusive placement put each slice on a pool.

    Raises:
      ValueError: backend pathways with a number of hosts `tpu_topology` has no topology for.
    """
    small = {"requests": {"cpu": "10m", "memory": "64Mi"}}
    if backend == "pathways":
        return {
            "apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": {"name": name},
            "spec": {
                "backend": "pathways",
                "slices": {"count": slices, "minSlices": 1, "accelerator": TPU_ACCELERATOR,
                           "topology": tpu_topology(hosts)},
                "controller": {"image": node_images.SERVE_ONLY_CONTROLLER, "resources": small,
                               "nodeSelector": {POOL_LABEL: HEAD_POOL.name}},
                "worker": {"resources": small},
                # (two examples per chip: 4-chip v5e hosts; the operator refuses a batch the chips do not share)
                "training": {"steps": 1_000_000, "globalBatchSize": 8 * hosts * slices},
                # never written: a serve-only controller saves nothing (Pathways needs a gs:// location)
                "checkpoint": {"uri": f"gs://elastic-jax-scale/{name}"},
                "elasticity": {"maxRestarts": 100_000, "maxRestartsPerSlice": 10_000},
            },
        }
    return {
        "apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": {"name": name},
        "spec": {
            "backend": "cpu",
            "slices": {"count": slices, "minSlices": 1, "hostsPerSlice": hosts},
            "controller": {"image": node_images.SERVE_ONLY_CONTROLLER, "resources": small,
                           "nodeSelector": {POOL_LABEL: "cpu-pool"}},
            "worker": {"resources": small, "nodeSelector": {POOL_LABEL: POOL}},
            "training": {"steps": 1_000_000, "globalBatchSize": 8 * slices},
            "checkpoint": {"uri": f"/tmp/elastic-jax-scale/{name}/checkpoints"},
            "elasticity": {"maxRestarts": 100_000, "maxRestartsPerSlice": 10_000},
        },
    }


def install(cluster, kwok_nodes: int, pods_per_node: int = 1000) -> None:
    """CRD, the operator's counting FlowSchema, and `kwok_nodes` fake nodes (admin credentials)."""
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    cluster.kubectl("wait", "--for=condition=Established", "crd/elastictrainingjobs.elasticjax.dev", "--timeout=60s")
    flow = {
        "apiVersion": "flowcontrol.apiserver.k8s.io/v1", "kind": "FlowSchema",
        "metadata": {"name": OPERATOR_FLOW_SCHEMA},
        # Same priority level as the built-in `service-accounts` schema it would otherwise fall under
        # (workload-low), so counting changes nothing about how the operator's requests are served.
        "spec": {"matchingPrecedence": 1000, "priorityLevelConfiguration": {"name": "workload-low"},
                 "distinguisherMethod": {"type": "ByUser"},
                 "rules": [{"subjects": [{"kind": "ServiceAccount",
                                          "serviceAccount": {"name": SA, "namespace": SYSTEM_NS}}],
                            "resourceRules": [{"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"],
                                               "clusterScope": True, "namespaces": ["*"]}],
                            "nonResourceRules": [{"verbs": ["*"], "nonResourceURLs": ["*"]}]}]},
    }
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump(flow))
    api = cluster.api()
    for i in range(kwok_nodes):
        name = f"kwok-{i}"
        try:
            api.get(f"/api/v1/nodes/{name}")
        except Exception:  # noqa: BLE001 - absent: create it
            api.create("/api/v1/nodes", fake_node(name, i, pods_per_node))


def add_head_node(cluster, timeout_s: float = 300) -> str:
    """Starts `HEAD_POOL`'s node (a node agent) on the running cluster and waits up to `timeout_s` seconds for it
    to be Ready; returns its name (`cluster.remove_node`).

    Raises:
      ClusterError: not Ready in time (its agent is stopped again).
    """
    (spec,) = layout.nodes((HEAD_POOL,), address_octet=cluster.ports.address_octet, first_index=HEAD_NODE_INDEX)
    try:
        cluster.add_node(spec, timeout_s=timeout_s)
    except Exception:
        if any(n.name == spec.name for n in cluster.nodes):
            cluster.remove_node(spec.name)
        raise
    return spec.name


def tpu_node_names(pools: int, hosts: int) -> list[str]:
    """The names `install_tpu_pools` gives: `kwok-tpu-<pool>-<host>`."""
    return [f"{TPU_POOL_PREFIX}{p:03d}-{h}" for p in range(pools) for h in range(hosts)]


def install_tpu_pools(cluster, pools: int, hosts: int, threads: int = 8) -> list[str]:
    """`pools` kwok TPU node pools of `hosts` nodes each (`kwok.tpu_node`, v5e `tpu_topology(hosts)`), created
    with admin credentials from `threads` threads; nodes that exist are kept. Returns the node names.

    Raises:
      ValueError: see `tpu_topology`.
    """
    topology = tpu_topology(hosts)
    api = cluster.api()
    names = tpu_node_names(pools, hosts)

    def create(i_name):
        i, name = i_name
        try:
            api.get(f"/api/v1/nodes/{name}")
        except Exception:  # noqa: BLE001 - absent: create it
            pool = name.rsplit("-", 1)[0]
            api.create("/api/v1/nodes", tpu_node(name, pool, i, TPU_ACCELERATOR, topology))

    with ThreadPoolExecutor(max_workers=threads) as executor:
        list(executor.map(create, enumerate(names)))
    return names


def tpu_nodes_ready(cluster, names: list[str]) -> bool:
    """Every node in `names` reports Ready (kwok manages them); one list request."""
    items = cluster.api().get("/api/v1/nodes", labelSelector=f"{KWOK_NODE_LABEL}=tpu")["items"]
    ready = {n["metadata"]["name"] for n in items
             if any(c["type"] == "Ready" and c["status"] == "True" for c in (n.get("status") or {}).get("conditions") or [])}
    return set(names) <= ready


def remove_tpu_nodes(cluster) -> None:
    """Deletes every kwok TPU node (`install_tpu_pools`), in one request."""
    cluster.kubectl("delete", "node", "-l", f"{KWOK_NODE_LABEL}=tpu", "--ignore-not-found", "--wait=false",
                    check=False, timeout_s=300)


def kwok_nodes_ready(cluster, count: int) -> bool:
    """The first `count` fake nodes report Ready (kwok manages them)."""
    items = cluster.api().get("/api/v1/nodes", labelSelector=f"{POOL_LABEL}={POOL}")["items"]
    ready = {n["metadata"]["name"] for n in items
             if any(c["type"] == "Ready" and c["status"] == "True" for c in (n.get("status") or {}).get("conditions") or [])}
    return all(f"kwok-{i}" in ready for i in range(count))


def remove_nodes(cluster, count: int) -> None:
    """Deletes the fake nodes `install` created."""
    for i in range(count):
        cluster.kubectl("delete", "node", f"kwok-{i}", "--ignore-not-found", "--wait=false", check=False)


def test_namespace(prefix: str) -> str:
    """A namespace name of this test run's own: `prefix` and six random hex digits."""
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def create_namespace(cluster, namespace: str) -> None:
    """Creates `namespace` and waits (up to 30 s) for its default ServiceAccount, which pods need before the
    Job controller can create them."""
    cluster.kubectl("create", "namespace", namespace)
    wait_for(lambda: cluster.kubectl("get", "serviceaccount", "default", "-n", namespace,
                                     check=False).returncode == 0, timeout_s=30, what="default ServiceAccount")


def slice_states(client) -> dict[int, str]:
    """Slice index -> state in the controller's `/v1/status` (`client`: its `ControlClient`)."""
    return {s.index: s.state for s in client.status().slices}


def operator_requests(cluster) -> float:
    """Requests the API server dispatched for the operator's ServiceAccount so far (its FlowSchema's counter)."""
    text = cluster.kubectl("get", "--raw", "/metrics").stdout
    total = 0.0
    for labels_text, value in _DISPATCHED.findall(text):
        if f'flow_schema="{OPERATOR_FLOW_SCHEMA}"' in labels_text:
            total += float(value)
    return total


def apply_jobs(cluster, namespace: str, names: list[str], slices: int, hosts: int = 1, backend: str = "cpu") -> None:
    """Creates the jobs (`job_manifest`) in one `kubectl apply`."""
    docs = [job_manifest(n, slices, hosts, backend) for n in names]
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(docs), timeout_s=300)


def job_statuses(cluster, namespace: str) -> dict[str, dict]:
    """name -> status of every ElasticTrainingJob in `namespace` (one list request)."""
    items = cluster.api().get(f"/apis/elasticjax.dev/v1alpha1/namespaces/{namespace}/elastictrainingjobs")["items"]
    return {j["metadata"]["name"]: (j.get("status") or {}) for j in items}


def all_running(cluster, namespace: str, names: list[str], slices: int) -> bool:
    """Every job in `names` reports all `slices` slices active (the operator read it from its controller)."""
    st = job_statuses(cluster, namespace)
    return all((st.get(n) or {}).get("activeSlices") == slices for n in names)


def pods_by_job(cluster, namespace: str) -> dict[str, dict[str, list[dict]]]:
    """job -> {"controller": [...], "workers": [...]} from one pod list."""
    items = cluster.api().get(f"/api/v1/namespaces/{namespace}/pods")["items"]
    out: dict[str, dict[str, list[dict]]] = {}
    for p in items:
        job = (p["metadata"].get("labels") or {}).get(lbl.JOB_NAME)
        if not job:
            continue
        role = (p["metadata"].get("labels") or {}).get(lbl.ROLE)
        out.setdefault(job, {"controller": [], "workers": []})[
            "controller" if role == lbl.ROLE_CONTROLLER else "workers"].append(p)
    return out


def running_worker(pods: list[dict], slice_index: int) -> dict | None:
    """A Running, Ready, not-deleting worker pod of that slice."""
    for p in pods:
        if (p["metadata"]["labels"].get(lbl.SLICE_INDEX) == str(slice_index) and p["status"].get("phase") == "Running"
                and not p["metadata"].get("deletionTimestamp")
                and any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions") or [])):
            return p
    return None


def token(cluster, namespace: str, job: str) -> str:
    """The job's control-API token (its Secret)."""
    secret = cluster.api().get(f"/api/v1/namespaces/{namespace}/secrets/{job}-token")
    return base64.b64decode(secret["data"]["token"]).decode()


def fail_pod(cluster, namespace: str, pod: dict) -> float:
    """Writes the status of a pod that failed for good into `pod`, as its kubelet would (`kwok.failed_status`:
    a SIGKILLed container under restartPolicy Never, an eviction under OnFailure); returns the wall time just
    before the request was sent (Unix seconds)."""
    sent = time.time()
    cluster.api().merge_patch(f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}/status",
                              failed_status(pod))
    return sent


def fail_pods(cluster, namespace: str, pods: list[dict]) -> list[float]:
    """`fail_pod` for all of them at once (one thread each); the send times, in order."""
    with ThreadPoolExecutor(max_workers=max(1, len(pods))) as pool:
        return list(pool.map(lambda p: fail_pod(cluster, namespace, p), pods))


def down_applied_at(cluster, namespace: str, controller_pod: dict, slice_index: int, after: float) -> float | None:
    """When the controller applied a `Down` report for `slice_index` (Unix seconds, ms precision, from its JSON
    log line `slice N reported Down`), the first one at or after `after`; None if not yet."""
    text = cluster.container_log(namespace, controller_pod["metadata"]["name"], "controller",
                                 controller_pod["metadata"]["uid"])
    needle = f"slice {slice_index} reported Down"
    for line in text.splitlines():
        if needle not in line:
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("msg", "").startswith(needle) and float(rec["ts"]) >= after - 0.002:
            return float(rec["ts"])
    return None


def wait_down_applied(cluster, namespace: str, controller_pod: dict, slice_index: int, after: float,
                      timeout_s: float = 60) -> float:
    """`down_applied_at`, waited for (polls the log file, not the controller)."""
    return wait_for(lambda: down_applied_at(cluster, namespace, controller_pod, slice_index, after),
                    timeout_s=timeout_s, interval_s=0.2, what=f"slice {slice_index} Down applied")


def workdir_of(base: Path, name: str) -> Path:
    """A folder under `base` (created)."""
    path = base / name
    path.mkdir(parents=True, exist_ok=True)
    return path
