"""The operator scale path with backend pathways: Pathways heads on the node agent, multi-host slices on kwok TPU pools.

Two pathways jobs of two v5e 2x4 slices (two hosts each) on the local
control plane (`e2e/kwok/fleet.py`). Each controller pod is a Pathways head
on a node agent's CPU node: the resource-manager and proxy sidecars are the
stand-ins the node agent runs for Google's images, the controller container is
the product's `elastic-jax-controller --serve-only`. The worker pods are kwok's
(sigs.k8s.io/kwok, `e2e/build_kwok.sh`), on kwok nodes shaped as GKE TPU node
pools (pool, accelerator and topology labels, `google.com/tpu` capacity, the
`google.com/tpu` NoSchedule taint), one pool per slice.

Checks that the operator drives them as on GKE: it creates the slice JobSets
once each head's resource manager listens; the real scheduler puts each slice's
two workers on one pool of their own (the JobSet webhook's exclusive
placement), one per host, tolerating the TPU taint; every slice is reported
Ready to its controller and the job is Running. A worker evicted (the status a
kubelet posts; under restartPolicy OnFailure a killed container restarts in
place, an eviction ends the pod) reaches that controller as `Down`; the Job
replaces the pod in the same pool, kwok makes it Ready, and the operator
reports the slice Ready again; the other job hears nothing.

Skips, saying why, when kwok is not built (it is not part of e2e/build.sh).
"""

from __future__ import annotations

import uuid

import pytest

from e2e.helpers import wait_for
from e2e.kwok import KwokProcess, binary
from e2e.kwok import fleet
from e2e.operator_fixtures import OperatorProcess, ejob_crd, operator_kubeconfig  # noqa: F401

from elastic_jax.api import labels as lbl
from elastic_jax.api.client import ControlClient
from elastic_jax.local.processes import free_port

pytestmark = pytest.mark.timeout(420)

NAMESPACE = f"kwok-pw-{uuid.uuid4().hex[:6]}"
JOBS = ["kp-a", "kp-b"]
SLICES = 2
HOSTS = 2
POOLS = len(JOBS) * SLICES + 1  # one spare pool: the scheduler, not the test, picks which pools are used


@pytest.fixture
def kwok_pathways_fleet(cluster, ejob_crd, operator_kubeconfig, tmp_path):  # noqa: F811
    if not binary().exists():
        pytest.skip(f"{binary()} not built: run e2e/build_kwok.sh")
    fleet.install(cluster, 0)  # the CRD and the counting FlowSchema; no CPU kwok node
    nodes = fleet.install_tpu_pools(cluster, POOLS, HOSTS)
    head = None
    kwok = KwokProcess(cluster.kubeconfig, tmp_path / "kwok.log", free_port())
    kwok.start()
    op = OperatorProcess(operator_kubeconfig, tmp_path / "operator.log", free_port())
    try:
        wait_for(lambda: fleet.tpu_nodes_ready(cluster, nodes), timeout_s=90, what="kwok TPU nodes Ready",
                 explain=kwok.log)
        head = fleet.add_head_node(cluster)
        fleet.create_namespace(cluster, NAMESPACE)
        op.start()
        yield kwok, op, head
    finally:
        op.stop()
        # not waited for (the controller pods' grace): the namespace's name is this run's own
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
        kwok.stop()
        if head is not None:
            cluster.remove_node(head)  # its agent and the heads' processes, by PID
        fleet.remove_tpu_nodes(cluster)


def _pool(pod: dict) -> str:
    return pod["spec"]["nodeName"].rsplit("-", 1)[0]


def _live(pods: list[dict]) -> list[dict]:
    return [p for p in pods if p["status"].get("phase") != "Failed" and not p["metadata"].get("deletionTimestamp")]


def test_pathways_heads_drive_multi_host_slices_on_kwok_tpu_pools(cluster, kwok_pathways_fleet):
    kwok, op, head = kwok_pathways_fleet
    fleet.apply_jobs(cluster, NAMESPACE, JOBS, SLICES, HOSTS, backend="pathways")
    wait_for(lambda: fleet.all_running(cluster, NAMESPACE, JOBS, SLICES), timeout_s=240, interval_s=1.0,
             what="both jobs active on both slices",
             explain=lambda: f"{fleet.job_statuses(cluster, NAMESPACE)}\n{op.log()[-3000:]}\n{kwok.log()[-2000:]}")

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
        client = ControlClient(f"http://{ctrl['status']['podIP']}:8080", fleet.token(cluster, NAMESPACE, job))
        try:
            assert fleet.slice_states(client) == {0: "Active", 1: "Active"}
            assert client.status().phase == "Running"
        finally:
            client.close()
    assert len(set(pools_used)) == len(JOBS) * SLICES, pools_used  # exclusive: no pool holds two slices

    job = JOBS[0]
    ctrl = by_job[job]["controller"][0]
    victim = fleet.running_worker(by_job[job]["workers"], 1)
    sent = fleet.fail_pod(cluster, NAMESPACE, victim)
    applied = fleet.wait_down_applied(cluster, NAMESPACE, ctrl, 1, sent, timeout_s=60)
    assert applied >= sent
    client = ControlClient(f"http://{ctrl['status']['podIP']}:8080", fleet.token(cluster, NAMESPACE, job))
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
        wait_for(lambda: fleet.slice_states(client) == {0: "Active", 1: "Active"}, timeout_s=60,
                 what="slice 1 Active again", explain=lambda: str(client.status()))
        assert next(s for s in client.status().slices if s.index == 1).failures == 1
    finally:
        client.close()
    # the other job never heard of it
    other = by_job[JOBS[1]]["controller"][0]
    assert fleet.down_applied_at(cluster, NAMESPACE, other, 1, 0.0) is None
