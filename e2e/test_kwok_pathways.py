"""The operator scale path with backend pathways: Pathways heads on the node agent, multi-host slices on kwok TPU pools.

Two pathways jobs of two v5e 4x4 slices (four hosts each) on the local
control plane (`e2e/kwok/fleet.py`). Each controller pod is a Pathways head
on a node agent's CPU node: the resource-manager and proxy sidecars are the
stand-ins the node agent runs for Google's images, the controller container is
the product's `elastic-jax-controller --serve-only`. The worker pods are kwok's
(sigs.k8s.io/kwok, `e2e/build_kwok.sh`), on kwok nodes shaped as GKE TPU node
pools (pool, accelerator and topology labels, `google.com/tpu` capacity, the
`google.com/tpu` NoSchedule taint), one pool per slice.

Checks that the operator drives them as on GKE: it creates the slice JobSets
once each head's resource manager listens; the real scheduler puts each slice's
four workers on one pool of their own (the JobSet webhook's exclusive
placement), one per host, tolerating the TPU taint; every slice is reported
Ready to its controller and the job is Running. A worker evicted (the status a
kubelet posts; under restartPolicy OnFailure a killed container restarts in
place, an eviction ends the pod) reaches that controller as `Down`; the Job
replaces the pod in the same pool, kwok makes it Ready, and the operator
reports the slice Ready again; the other job hears nothing.

Setup (kwok, the operator, the namespace), the failure and the checks shared with e2e/test_kwok_scale.py:
`e2e/kwok/operator_run.py`, which skips, saying why, when kwok is not built.
"""

from __future__ import annotations

import pytest

from e2e.helpers import wait_for
from e2e.kwok import fleet
from e2e.kwok import operator_run as run
from e2e.kwok.operator_run import ejob_crd, kwok_operator, operator_kubeconfig  # noqa: F401

from elastic_jax.api import labels as lbl

pytestmark = pytest.mark.timeout(420)

NAMESPACE = fleet.test_namespace("kwok-pw")
JOBS, SLICES, HOSTS = ["kp-a", "kp-b"], 2, 4
POOLS = len(JOBS) * SLICES + 1  # one spare pool: the scheduler, not the test, picks which pools are used


@pytest.fixture
def kwok_pathways_fleet(cluster, kwok_operator):  # noqa: F811
    fleet.install(cluster, 0)  # the CRD and the counting FlowSchema; no CPU kwok node
    nodes = fleet.install_tpu_pools(cluster, POOLS, HOSTS)
    heads: list[str] = []

    def remove_nodes() -> None:
        for head in heads:
            cluster.remove_node(head)  # its agent and the heads' processes, by PID
        fleet.remove_tpu_nodes(cluster)
    kwok, op = kwok_operator(NAMESPACE, cleanup=remove_nodes,
                             nodes_ready=lambda: fleet.tpu_nodes_ready(cluster, nodes), what="kwok TPU nodes Ready",
                             timeout_s=90, after_ready=lambda: heads.append(fleet.add_head_node(cluster)))
    return kwok, op, heads[0]


def _pool(pod: dict) -> str:
    return pod["spec"]["nodeName"].rsplit("-", 1)[0]


def _live(pods: list[dict]) -> list[dict]:
    return [p for p in pods if p["status"].get("phase") != "Failed" and not p["metadata"].get("deletionTimestamp")]


def test_pathways_heads_drive_multi_host_slices_on_kwok_tpu_pools(cluster, kwok_pathways_fleet):
    kwok, op, head = kwok_pathways_fleet
    fleet.apply_jobs(cluster, NAMESPACE, JOBS, SLICES, HOSTS, backend="pathways")
    run.wait_all_running(cluster, NAMESPACE, JOBS, SLICES, 240, kwok, op)

    by_job = fleet.pods_by_job(cluster, NAMESPACE)
    pools_used: list[str] = []
    for job in JOBS:
        ctrl = by_job[job]["controller"][0]
        assert ctrl["spec"]["nodeName"] == head  # the head runs on the node agent, off the TPU pools
        assert [c["name"] for c in ctrl["spec"]["initContainers"]] == ["pathways-rm", "pathways-proxy"]
        workers = _live(by_job[job]["workers"])
        assert len(workers) == SLICES * HOSTS
        by_slice: dict[str, list[dict]] = {}
        for p in workers:
            by_slice.setdefault(p["metadata"]["labels"][lbl.SLICE_INDEX], []).append(p)
        assert sorted(by_slice) == ["0", "1"]
        for pods in by_slice.values():
            # one pool per slice, one worker per host (each asks for the host's 4 chips), the TPU taint tolerated
            assert len({_pool(p) for p in pods}) == 1 and _pool(pods[0]).startswith(fleet.TPU_POOL_PREFIX)
            assert len({p["spec"]["nodeName"] for p in pods}) == HOSTS
            pools_used.append(_pool(pods[0]))
            for p in pods:
                assert p["spec"]["containers"][0]["resources"]["limits"]["google.com/tpu"] == "4"
                assert any(t.get("key") == "google.com/tpu" for t in p["spec"].get("tolerations") or [])
                assert p["spec"]["hostNetwork"] is True
                node = cluster.api().get(f"/api/v1/nodes/{p['spec']['nodeName']}")
                (ip,) = [a["address"] for a in node["status"]["addresses"] if a["type"] == "InternalIP"]
                assert p["status"]["podIP"] == ip  # host network: its kwok node's address
        client = run.client_of(cluster, NAMESPACE, job, ctrl)
        try:
            run.assert_both_slices_active(client)
        finally:
            client.close()
    assert len(set(pools_used)) == len(JOBS) * SLICES, pools_used  # exclusive: no pool holds two slices

    job = JOBS[0]
    ctrl, victim = run.fail_slice_1_worker(cluster, NAMESPACE, by_job, job)
    client = run.client_of(cluster, NAMESPACE, job, ctrl)
    try:
        # the Job replaces the evicted pod (same host index, same pool), kwok makes it Ready, the operator says so
        def replacement():
            pods = [p for p in _live(fleet.pods_by_job(cluster, NAMESPACE)[job]["workers"])
                    if p["metadata"]["labels"][lbl.SLICE_INDEX] == "1"
                    and p["metadata"]["labels"].get(lbl.JOB_COMPLETION_INDEX)
                    == victim["metadata"]["labels"].get(lbl.JOB_COMPLETION_INDEX)
                    and p["metadata"]["uid"] != victim["metadata"]["uid"] and p["status"].get("phase") == "Running"]
            return pods[0] if pods else None
        new = wait_for(replacement, timeout_s=90, what="replacement worker Running", explain=lambda: op.log()[-3000:])
        assert _pool(new) == _pool(victim)
        run.assert_slice_1_back(client)
    finally:
        client.close()
    run.assert_not_heard_by(cluster, NAMESPACE, by_job, JOBS[1])  # the other job never heard of it
