"""The Pathways head and workers find each other on a real kubelet, before the controller is Ready, and again
after the controller pod is replaced (issue 10 items 1, 2 and 5).

What the operator renders for a pathways job (every child, as
``children.render_children`` gives it) runs here with stand-in processes
(``pathways_standin.py``) in place of Google's images: the resource manager
and proxy sidecars listen on the rendered ports; the controller container is
Ready only once every worker registered with the resource manager (as the real
one is Ready only after ``jax.devices()`` returned); each worker connects to
``--resource_manager_address`` exactly as rendered, from the host network, as
on GKE. Kept from the rendering: names, Services (the controller's and the
head's headless one), ports, args, env, probes, restart policies, host
networking and DNS policy. Changed: images (the worker image built here, for
its Python), commands, one shared emptyDir for the stand-ins' bookkeeping,
and what only TPU nodes satisfy (node selectors, ``google.com/tpu`` limits,
the exclusive-placement annotations: scheduling onto TPU pools is
``e2e/test_pathways_tpu_pools.py``).

The steps are the operator's (``reconcile.decide`` for backend pathways),
done by the test: the controller pod first; each slice's JobSet once the
resource manager's startupProbe passed, annotated with the head incarnation;
after the controller pod is replaced, the old JobSets deleted and created again
for the new head. With the renderer before issue 10 (workers reaching the
resource manager through the controller's ClusterIP Service, which routes only
to Ready pods) the controller never becomes Ready here: the start-up deadlock.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from e2e.helpers import wait_for
from e2e.kind import demo

from elastic_jax.api import images, labels
from elastic_jax.api.manifest import parse_manifest
from elastic_jax.k8s_operator import backends, children, names
from elastic_jax.k8s_operator.backends import pathways

pytestmark = pytest.mark.timeout(3600)

JOB = "pw-standin"
SLICES = 2
STANDIN = Path(__file__).with_name("pathways_standin.py")
STATE = "/standin-state"
TIMEOUT_S = 300


def _job(namespace: str):
    return backends.resolve(parse_manifest({
        "apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob",
        "metadata": {"name": JOB, "namespace": namespace},
        "spec": {"backend": "pathways",
                 "slices": {"count": SLICES, "accelerator": "tpu-v5-lite-podslice", "topology": "2x2"},
                 "training": {"steps": 10, "globalBatchSize": 8}, "checkpoint": {"uri": "gs://bucket/pw-standin"}},
    }))


def _standin(container: dict, role: str, expected: int = 0) -> None:
    """Runs `role` of the stand-in in `container`, keeping its rendered args, env, ports and probes."""
    container["image"] = images.WORKER_IMAGE
    container["imagePullPolicy"] = "Never"
    container["command"] = ["python", "/standin/pathways_standin.py", role]
    container.setdefault("env", []).append({"name": "STANDIN_STATE", "value": STATE})
    if expected:
        container["env"].append({"name": "STANDIN_EXPECTED", "value": str(expected)})
    container.setdefault("volumeMounts", []).extend([{"name": "standin", "mountPath": "/standin", "readOnly": True},
                                                     {"name": "standin-state", "mountPath": STATE}])
    container.get("resources", {}).pop("limits", None)  # 8 CPU / 32G and google.com/tpu: not on kind nodes
    container.get("resources", {}).pop("requests", None)


def _volumes(pod_spec: dict) -> None:
    pod_spec.setdefault("volumes", []).extend([{"name": "standin", "configMap": {"name": "pathways-standin"}},
                                               {"name": "standin-state", "emptyDir": {}}])


def controller_pod(job, attempt: int) -> dict:
    pod = pathways.PathwaysRenderer().controller_pod(job, attempt)
    spec = pod["spec"]
    rm, proxy = spec["initContainers"]
    _standin(rm, "rm")
    _standin(proxy, "proxy")
    _standin(spec["containers"][0], "controller", expected=SLICES * job.spec.slices.hosts_per_slice)
    _volumes(spec)
    spec.pop("affinity")  # "not a TPU node": every kind node is not one
    return pod


def worker_jobset(job, index: int, head: str) -> dict:
    js = pathways.PathwaysRenderer().worker_jobset(job, index)
    js["metadata"]["annotations"] = {labels.PATHWAYS_HEAD: head}  # the operator's, instead of exclusive placement
    template = js["spec"]["replicatedJobs"][0]["template"]
    template["metadata"].pop("annotations")
    pod = template["spec"]["template"]["spec"]
    pod.pop("nodeSelector")
    (worker,) = pod["containers"]
    _standin(worker, "worker")
    _volumes(pod)
    return js


@pytest.fixture
def namespace(cluster):
    """PodSecurity ``privileged``: the rendered TPU workers use the host network (docs/security.md)."""
    name = demo.restricted_namespace(cluster.kind, "pws", profile="privileged")
    wait_for(lambda: cluster.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode == 0,
             timeout_s=60, what=f"default ServiceAccount in {name}")
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _apply(cluster, namespace: str, *objs: dict) -> None:
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump_all(list(objs), sort_keys=False))


def _pod(cluster, namespace: str, name: str) -> dict | None:
    result = cluster.kubectl("get", "pod", "-n", namespace, name, "-o", "json", check=False)
    return json.loads(result.stdout) if result.returncode == 0 else None


def _rm_started(pod: dict | None) -> bool:
    statuses = ((pod or {}).get("status") or {}).get("initContainerStatuses") or []
    return any(s["name"] == pathways.RM_CONTAINER and s.get("started") for s in statuses)


def _ready(pod: dict | None) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in ((pod or {}).get("status") or {}).get("conditions") or [])


def _worker_logs(cluster, namespace: str) -> str:
    return cluster.kubectl("logs", "-n", namespace, "-l", f"{labels.ROLE}={labels.ROLE_WORKER}", "--tail=200",
                           "--prefix", check=False).stdout


def _start_head_then_workers(cluster, namespace: str, job, attempt: int) -> str:
    """The operator's order: the head pod, then (its resource manager listening) the slices' JobSets."""
    name = names.controller_pod(JOB, attempt)
    _apply(cluster, namespace, controller_pod(job, attempt))
    explain = lambda: cluster.kubectl("get", "pods", "-n", namespace, "-o", "wide", check=False).stdout  # noqa: E731
    pod = wait_for(lambda: (p := _pod(cluster, namespace, name)) and _rm_started(p) and p, timeout_s=TIMEOUT_S,
                   what=f"{name}: resource manager started", explain=explain)
    assert not _ready(pod), "the controller must not be Ready before any worker registered"
    rm_restarts = next(s.get("restartCount", 0) for s in pod["status"]["initContainerStatuses"]
                       if s["name"] == pathways.RM_CONTAINER)
    head = pathways.head_incarnation(name, rm_restarts)
    _apply(cluster, namespace, *(worker_jobset(job, i, head) for i in range(SLICES)))
    return name


def test_workers_reach_the_head_before_it_is_ready_and_again_after_it_is_replaced(cluster, namespace):
    job = _job(namespace)
    static = [o for o in children.render_children(job, token="standin-token") if o["kind"] in
              ("Secret", "ConfigMap", "Service")]
    assert [o["metadata"]["name"] for o in static if o["kind"] == "Service"] == \
        [names.service(JOB), names.pathways_head(JOB)]
    standin = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "pathways-standin"},
               "data": {"pathways_standin.py": STANDIN.read_text()}}
    _apply(cluster, namespace, standin, *static)
    explain = lambda: "\n".join([  # noqa: E731
        cluster.kubectl("get", "pods,jobsets,endpointslices", "-n", namespace, "-o", "wide", check=False).stdout,
        _worker_logs(cluster, namespace)[-3000:]])

    # 1. First start: the head, then the workers; the controller turns Ready because they registered.
    first = _start_head_then_workers(cluster, namespace, job, 0)
    wait_for(lambda: _ready(_pod(cluster, namespace, first)), timeout_s=TIMEOUT_S,
             what=f"{first} Ready (every worker registered with its resource manager)", explain=explain)
    logs = _worker_logs(cluster, namespace)
    assert logs.count(f"registered with {first}") >= SLICES, logs
    assert f"resource manager address {names.pathways_head(JOB)}.{namespace}.svc:{pathways.RM_PORT}" in logs, logs
    rm_log = cluster.kubectl("logs", "-n", namespace, first, "-c", pathways.RM_CONTAINER).stdout
    assert sorted(line.split()[2] for line in rm_log.splitlines() if line.startswith("registered slice")) == \
        [str(i) for i in range(SLICES)], rm_log

    # 2. The controller pod is lost. As the operator does: a new incarnation, and the JobSets of
    #    the old head deleted and created again once the new resource manager listens.
    #    All deleted at once (their grace periods run side by side); the new head and JobSets (same
    #    names) come only once the old head, the old JobSets and their workers are gone.
    old = [f"pod/{first}", *(f"jobset/{names.slice_jobset(JOB, i)}" for i in range(SLICES))]
    cluster.kubectl("delete", "-n", namespace, *old, "--wait=false", timeout_s=TIMEOUT_S)
    wait_for(lambda: not cluster.kubectl("get", "-n", namespace, *old, "--ignore-not-found", "-o", "name").stdout.strip()
             and not cluster.kubectl("get", "pods", "-n", namespace, "-l", f"{labels.ROLE}={labels.ROLE_WORKER}",
                                     "-o", "name").stdout.strip(),
             timeout_s=TIMEOUT_S, what="the old head, its JobSets and their workers gone", explain=explain)
    second = _start_head_then_workers(cluster, namespace, job, 1)
    wait_for(lambda: _ready(_pod(cluster, namespace, second)), timeout_s=TIMEOUT_S,
             what=f"{second} Ready (the new workers registered with the new head)", explain=explain)
    logs = _worker_logs(cluster, namespace)
    assert logs.count(f"registered with {second}") >= SLICES and f"registered with {first}" not in logs, logs
    jobsets = json.loads(cluster.kubectl("get", "jobsets", "-n", namespace, "-o", "json").stdout)["items"]
    assert {js["metadata"]["annotations"][labels.PATHWAYS_HEAD] for js in jobsets} == {f"{second}.rm-0"}


def test_stand_in_keeps_what_the_renderer_gives_the_network():
    """The stand-in changes images, commands and TPU scheduling only: what this file shows is about the
    rendered network (names, ports, args, env, probes, restart policy, host network)."""
    job = _job("ns")
    rendered, standin = pathways.PathwaysRenderer().controller_pod(job, 0), controller_pod(job, 0)
    for a, b in zip(rendered["spec"]["initContainers"] + rendered["spec"]["containers"],
                    standin["spec"]["initContainers"] + standin["spec"]["containers"]):
        for key in ("name", "args", "ports", "startupProbe", "readinessProbe", "restartPolicy"):
            assert a.get(key) == b.get(key), key
        assert a.get("env", []) == b["env"][:len(a.get("env", []))]
    rendered = pathways.PathwaysRenderer().worker_jobset(job, 0)["spec"]["replicatedJobs"][0]["template"]["spec"]
    standin = copy.deepcopy(worker_jobset(job, 0, "h"))["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert rendered["backoffLimit"] == standin["backoffLimit"]
    for key in ("restartPolicy", "hostNetwork", "dnsPolicy", "terminationGracePeriodSeconds"):
        assert rendered["template"]["spec"][key] == standin["template"]["spec"][key], key
    (a,), (b,) = rendered["template"]["spec"]["containers"], standin["template"]["spec"]["containers"]
    assert a["args"] == b["args"] and a["ports"] == b["ports"] and a["env"] == b["env"][:len(a["env"])]
