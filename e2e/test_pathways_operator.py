"""The operator drives a pathways job end to end, with stand-ins for Google's images (issue 10, "Must be shown").

What is real: the operator (least-privilege identity, as the chart runs it),
the API server, scheduler, Job/JobSet controllers (with the JobSet webhook's
exclusive placement) and garbage collector,
simulated GKE node pools with TPU labels, taints and ``google.com/tpu``
capacity. Every child is the operator's, rendered and created by it, unchanged:
the pinned Pathways images are played by stand-ins (the node agent's image
table, ``e2e/nodeagent/images.py``, runs ``e2e/kind/pathways_standin.py`` for
them): the resource manager and proxy listen on the rendered ports, workers
connect to ``--resource_manager_address`` as rendered (the head's headless
Service name, resolved to the pods it selects as CoreDNS would; e2e/nodeagent/dns.py); the
controller image is a stand-in too (``spec.controller.image``), serving the
control API the operator drives, Ready once ``jax.devices()`` would return.

The job asks for two v6e 2x2 slices with ``minSlices: 2`` and starts with one
v6e pool only:

1. The head's resource manager is held from listening: the job says so
   (WaitingForResourceManager, an Event) and no slice JobSet exists.
2. It listens: the operator creates both JobSets, annotated with the head.
   One slice's worker registers with the resource manager before the controller
   is Ready (which needs a registered slice); the other cannot be scheduled: the
   job waits, PodsNotStarting names it and the scheduler's reason, no
   step is made.
3. The second pool appears: the other slice registers, the job runs on both.
4. The controller pod is deleted: the operator creates the next one, restarts
   both worker JobSets (WorkersRestarted) for the new head, whose workers
   register with it; the job runs again.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from e2e.harness import layout
from e2e.helpers import is_ready, pods, summary, wait_for
from e2e.nodeagent import images as node_images
from e2e.operator_fixtures import ejob_crd, get_job, job_events, operator, operator_kubeconfig  # noqa: F401

from elastic_jax.api import labels
from elastic_jax.k8s_operator import names
from elastic_jax.k8s_operator.backends import pathways

pytestmark = pytest.mark.timeout(900)

JOB = "pw-op"
TIMEOUT_S = 180
HEAD_POOL = layout.PoolSpec("pw-head-pool", 1, "n2-standard-64", cpu="64", memory="256Gi")


def _tpu_pool(name: str) -> layout.PoolSpec:
    return layout.PoolSpec(name, 1, "ct6e-standard-4t", cpu="180", memory="720Gi",
                           tpu_accelerator="tpu-v6e-slice", tpu_topology="2x2", tpu_chips=4)


def _nodes(cluster, *pools: layout.PoolSpec, first: int) -> list[layout.NodeSpec]:
    return layout.nodes(pools, address_octet=cluster.ports.address_octet, first_index=layout.EXTRA_NODE_INDEX + first)


def _manifest() -> dict:
    return {
        "apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": {"name": JOB},
        "spec": {
            "backend": "pathways",
            "slices": {"count": 2, "minSlices": 2, "accelerator": "tpu-v6e-slice", "topology": "2x2"},
            "controller": {"image": node_images.PATHWAYS_STANDIN_CONTROLLER},
            "training": {"steps": 100000, "globalBatchSize": 8},
            "checkpoint": {"uri": f"gs://bucket/{JOB}"},
        },
    }


def _condition(job: dict, type_: str) -> dict | None:
    return next((c for c in (job.get("status") or {}).get("conditions") or [] if c["type"] == type_), None)


def _jobsets(cluster, namespace: str) -> list[dict]:
    return cluster.api().get(f"/apis/jobset.x-k8s.io/v1alpha2/namespaces/{namespace}/jobsets")["items"]


def _log(cluster, namespace: str, pod: str, container: str) -> str:
    try:
        return cluster.container_log(namespace, pod, container)
    except FileNotFoundError:
        return ""


def _workers(cluster, namespace: str, head: str) -> dict[int, dict]:
    """Running worker pods of JobSets created for `head`, by slice."""
    by_name = {js["metadata"]["name"]: js for js in _jobsets(cluster, namespace)
               if (js["metadata"].get("annotations") or {}).get(labels.PATHWAYS_HEAD) == head}
    out = {}
    for p in pods(cluster, namespace, f"{labels.JOB_NAME}={JOB},{labels.ROLE}={labels.ROLE_WORKER}"):
        if p["metadata"].get("deletionTimestamp") or (p.get("status") or {}).get("phase") != "Running":
            continue
        if p["metadata"]["labels"].get(labels.JOBSET_NAME) in by_name:
            out[int(p["metadata"]["labels"][labels.SLICE_INDEX])] = p
    return out


def _registered(cluster, namespace: str, worker: dict, head_pod: str) -> bool:
    return f"registered with {head_pod}" in _log(cluster, namespace, worker["metadata"]["name"], "pathways-worker")


@pytest.fixture
def pools(cluster):
    """The head's CPU pool and the first v6e pool; the test adds the second. Each node stopped by PID after."""
    added: list[str] = []

    def add(*specs: layout.NodeSpec) -> None:
        for spec in specs:
            cluster.add_node(spec)
            added.append(spec.name)
    add(*_nodes(cluster, HEAD_POOL, _tpu_pool("pw-v6e-a"), first=0))
    try:
        yield add
    finally:
        for name in added:
            cluster.remove_node(name)


def test_operator_drives_a_pathways_job_through_a_missing_pool_and_a_head_restart(cluster, namespace, operator,
                                                                                   pools):
    first, second = names.controller_pod(JOB, 0), names.controller_pod(JOB, 1)
    hold = Path(node_images.RM_HOLD_DIR) / f"{namespace}.{first}"
    hold.parent.mkdir(parents=True, exist_ok=True)
    hold.touch()
    explain = lambda: "\n".join([  # noqa: E731
        yaml.safe_dump((get_job(cluster, namespace, JOB).get("status") or {}), sort_keys=False)[:3000],
        summary(pods(cluster, namespace)),
        "\n".join(f"{e['reason']}: {e['message'][:300]}" for e in job_events(cluster, namespace, JOB)[-15:]),
        operator.log()[-2000:]])
    try:
        result = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(_manifest()), check=False)
        assert result.returncode == 0, result.stderr

        # 1. The resource manager does not listen yet: a condition and an Event say so; no worker exists.
        cond = wait_for(lambda: (c := _condition(get_job(cluster, namespace, JOB), "WaitingForResourceManager"))
                        and c["status"] == "True" and "does not listen on port 29001 yet" in c["message"] and c,
                        timeout_s=TIMEOUT_S, what="WaitingForResourceManager True", explain=explain)
        assert cond["reason"] == "ResourceManagerStarting" and first in cond["message"], cond
        wait_for(lambda: any(e["reason"] == "ResourceManagerStarting" for e in job_events(cluster, namespace, JOB)),
                 timeout_s=60, what="Event ResourceManagerStarting", explain=explain)
        assert _jobsets(cluster, namespace) == []
        head = cluster.api().get(f"/api/v1/namespaces/{namespace}/pods/{first}")
        assert not is_ready(head)
        rm_status = next(s for s in head["status"]["initContainerStatuses"] if s["name"] == pathways.RM_CONTAINER)
        assert "running" in rm_status["state"] and not rm_status["started"], rm_status
        # the kubelet's order: the controller container waits for the sidecar's startupProbe
        assert all("running" not in s["state"] for s in head["status"]["containerStatuses"]), head["status"]

        # 2. It listens: both JobSets, for this head; slice 0 registers, slice 1 has no pool.
        hold.unlink()
        wait_for(lambda: (c := _condition(get_job(cluster, namespace, JOB), "WaitingForResourceManager"))
                 and c["status"] == "False" and c["reason"] == "ResourceManagerListening",
                 timeout_s=TIMEOUT_S, what="WaitingForResourceManager False", explain=explain)
        head_0 = pathways.head_incarnation(first, 0)
        wait_for(lambda: len([js for js in _jobsets(cluster, namespace)
                              if js["metadata"]["annotations"].get(labels.PATHWAYS_HEAD) == head_0]) == 2,
                 timeout_s=TIMEOUT_S, what="both slice JobSets for the first head", explain=explain)
        # Which slice's worker the one pool takes is the scheduler's choice (CI once bound slice 1's first).
        def registered() -> tuple[int] | None:
            return next(((i,) for i, w in _workers(cluster, namespace, head_0).items()
                         if _registered(cluster, namespace, w, first)), None)

        (got,) = wait_for(registered, timeout_s=TIMEOUT_S, what="a slice registered with the first head",
                          explain=explain)
        other = 1 - got
        worker_0 = _workers(cluster, namespace, head_0)[got]
        worker_log = _log(cluster, namespace, worker_0["metadata"]["name"], "pathways-worker")
        assert f"resource manager address {names.pathways_head(JOB)}.{namespace}.svc:{pathways.RM_PORT}" in worker_log
        assert worker_0["spec"]["nodeName"].startswith("pw-v6e-a"), worker_0["spec"]["nodeName"]
        waiting = wait_for(lambda: (c := _condition(get_job(cluster, namespace, JOB), "PodsNotStarting"))
                           and c["status"] == "True" and c["message"].endswith(f"[slices waiting: {other}]") and c,
                           timeout_s=TIMEOUT_S, what=f"PodsNotStarting naming slice {other}", explain=explain)
        assert f"slice {other} worker pod" in waiting["message"] and "cannot be scheduled" in waiting["message"], waiting
        wait_for(lambda: any(e["reason"] == waiting["reason"] and f"slice {other} worker pod" in e["message"]
                             for e in job_events(cluster, namespace, JOB)),
                 timeout_s=60, what="an Event naming the waiting slice", explain=explain)
        # the head is Ready only because one slice registered with it; the job pauses (minSlices 2)
        wait_for(lambda: is_ready(cluster.api().get(f"/api/v1/namespaces/{namespace}/pods/{first}")),
                 timeout_s=TIMEOUT_S, what=f"{first} Ready", explain=explain)
        rm_log = _log(cluster, namespace, first, pathways.RM_CONTAINER)
        assert f"registered slice {got}" in rm_log and f"registered slice {other}" not in rm_log, rm_log
        # the controller lists that slice and pauses for minSlices=2: no step is made
        assert get_job(cluster, namespace, JOB)["status"].get("step", 0) == 0, get_job(cluster, namespace, JOB)["status"]

        # 3. The second pool appears: the other slice registers and the job trains on both slices.
        pools(*_nodes(cluster, _tpu_pool("pw-v6e-b"), first=2))
        wait_for(lambda: (s := get_job(cluster, namespace, JOB).get("status") or {}).get("phase") == "Running"
                 and s.get("activeSlices") == 2 and s.get("step", 0) > 0,
                 timeout_s=TIMEOUT_S, what="Running on 2 slices", explain=explain)
        assert f"registered slice {other}" in _log(cluster, namespace, first, pathways.RM_CONTAINER)
        assert _condition(get_job(cluster, namespace, JOB), "PodsNotStarting")["status"] == "False"

        # 4. The controller pod is lost: a new head, the workers restarted for it.
        cluster.kubectl("delete", "pod", "-n", namespace, first, "--wait=false")
        head_1 = pathways.head_incarnation(second, 0)
        wait_for(lambda: {i for i, w in _workers(cluster, namespace, head_1).items()
                          if _registered(cluster, namespace, w, second)} == {0, 1},
                 timeout_s=TIMEOUT_S, what="both slices registered with the second head", explain=explain)
        restarted = wait_for(lambda: [e for e in job_events(cluster, namespace, JOB) if e["reason"] == "WorkersRestarted"],
                             timeout_s=60, what="Event WorkersRestarted", explain=explain)
        assert restarted and head_0 in restarted[0]["message"] and head_1 in restarted[0]["message"], restarted
        assert {js["metadata"]["annotations"][labels.PATHWAYS_HEAD] for js in _jobsets(cluster, namespace)
                if not js["metadata"].get("deletionTimestamp")} == {head_1}
        job = wait_for(lambda: (j := get_job(cluster, namespace, JOB)) and (s := j.get("status") or {})
                       .get("controllerPod") == second and s.get("phase") == "Running" and s.get("activeSlices") == 2
                       and j, timeout_s=TIMEOUT_S, what="Running on 2 slices with the second head", explain=explain)
        assert job["status"]["controllerRestarts"] == 1, job["status"]
        for w in _workers(cluster, namespace, head_1).values():
            assert f"registered with {first}" not in _log(cluster, namespace, w["metadata"]["name"], "pathways-worker")
    finally:
        hold.unlink(missing_ok=True)
        cluster.kubectl("delete", "elastictrainingjob", "-n", namespace, JOB, "--wait=false", check=False)
