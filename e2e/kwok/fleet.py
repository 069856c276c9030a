"""Many ElasticTrainingJobs at once on the local control plane: serve-only controllers, kwok workers.

Shared by `benchmarks/bench_operator_scale.py` (50 jobs) and `e2e/test_kwok_scale.py` (a few). Each job's
controller pod is real (the node agent runs `elastic-jax-controller --serve-only` at its own pod IP, the
endpoint the operator reports to); its worker pods are kwok's, on nodes labelled `kwok-pool`.

What the operator does is unchanged: it runs as a host process with its least-privilege ServiceAccount
(`OperatorProcess`), and its requests are counted at the API server under a FlowSchema that matches only
that ServiceAccount (`OPERATOR_FLOW_SCHEMA`).
"""

from __future__ import annotations

import base64
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

from e2e.helpers import wait_for
from e2e.kwok import POOL, POOL_LABEL, failed_status, fake_node
from e2e.nodeagent import images as node_images
from e2e.operator_fixtures import CRD, SA, SYSTEM_NS

from elastic_jax.api import labels as lbl

OPERATOR_FLOW_SCHEMA = "elastic-jax-operator-bench"
_DISPATCHED = re.compile(r'^apiserver_flowcontrol_dispatched_requests_total\{([^}]*)\}\s+([0-9.e+]+)$', re.M)


def job_manifest(name: str, slices: int, hosts: int = 1) -> dict:
    """An ElasticTrainingJob whose controller is serve-only on the node agent's CPU pool and whose workers
    are kwok pods (`kwok-pool`). Requests are small so 50 controller pods fit two simulated nodes."""
    small = {"requests": {"cpu": "10m", "memory": "64Mi"}}
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


def operator_requests(cluster) -> float:
    """Requests the API server dispatched for the operator's ServiceAccount so far (its FlowSchema's counter)."""
    text = cluster.kubectl("get", "--raw", "/metrics").stdout
    total = 0.0
    for labels_text, value in _DISPATCHED.findall(text):
        if f'flow_schema="{OPERATOR_FLOW_SCHEMA}"' in labels_text:
            total += float(value)
    return total


def apply_jobs(cluster, namespace: str, names: list[str], slices: int, hosts: int = 1) -> None:
    """Creates the jobs in one `kubectl apply`."""
    docs = [job_manifest(n, slices, hosts) for n in names]
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
    """Writes a SIGKILLed container's status into `pod` (as its kubelet would); returns the wall time just
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
