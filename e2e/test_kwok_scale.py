"""The operator scale path, small: serve-only controllers and kwok workers (benchmarks/bench_operator_scale.py).

Two jobs of two slices on the local control plane: the controllers are
`elastic-jax-controller --serve-only` pods the node agent runs; the workers are
pods on kwok's fake nodes (sigs.k8s.io/kwok, `e2e/build_kwok.sh`). Checks that
the operator drives them as it drives real ones: every slice reported Ready to
its controller, the job Running; a worker pod whose status says its container
was SIGKILLed (as a kubelet writes it) becomes the operator's `Down` at that
controller, the JobSet controller replaces the slice, kwok makes the new pod
Ready, and the operator reports the slice Ready again. Also that the
operator's requests are counted at the API server under the benchmark's
FlowSchema (the count the benchmark reports).

Skips, saying why, when kwok is not built (it is not part of e2e/build.sh).
"""

from __future__ import annotations

import uuid

import pytest

from e2e.helpers import wait_for
from e2e.kwok import KwokProcess, binary
from e2e.kwok import fleet
from e2e.operator_fixtures import OperatorProcess, ejob_crd, operator_kubeconfig  # noqa: F401

from elastic_jax.api.client import ControlClient
from elastic_jax.local.processes import free_port

pytestmark = pytest.mark.timeout(300)

NAMESPACE = f"kwok-scale-{uuid.uuid4().hex[:6]}"
JOBS = ["kw-a", "kw-b"]
SLICES = 2
NODES = 1


@pytest.fixture
def kwok_fleet(cluster, ejob_crd, operator_kubeconfig, tmp_path):  # noqa: F811
    if not binary().exists():
        pytest.skip(f"{binary()} not built: run e2e/build_kwok.sh")
    fleet.install(cluster, NODES)
    kwok = KwokProcess(cluster.kubeconfig, tmp_path / "kwok.log", free_port())
    kwok.start()
    op = OperatorProcess(operator_kubeconfig, tmp_path / "operator.log", free_port())
    try:
        wait_for(lambda: fleet.kwok_nodes_ready(cluster, NODES), timeout_s=60, what="kwok node Ready",
                 explain=kwok.log)
        fleet.create_namespace(cluster, NAMESPACE)
        op.start()
        yield kwok, op
    finally:
        op.stop()
        # not waited for (the controller pods' 60 s grace): the namespace's name is this run's own
        cluster.kubectl("delete", "namespace", NAMESPACE, "--wait=false", check=False)
        kwok.stop()
        fleet.remove_nodes(cluster, NODES)


def test_serve_only_controllers_drive_kwok_workers(cluster, kwok_fleet):
    kwok, op = kwok_fleet
    requests_before = fleet.operator_requests(cluster)
    fleet.apply_jobs(cluster, NAMESPACE, JOBS, SLICES)
    wait_for(lambda: fleet.all_running(cluster, NAMESPACE, JOBS, SLICES), timeout_s=120, interval_s=1.0,
             what="both jobs active on both slices",
             explain=lambda: f"{fleet.job_statuses(cluster, NAMESPACE)}\n{op.log()[-3000:]}\n{kwok.log()[-2000:]}")
    assert fleet.operator_requests(cluster) > requests_before  # counted under the benchmark's FlowSchema

    by_job = fleet.pods_by_job(cluster, NAMESPACE)
    for job in JOBS:
        workers = by_job[job]["workers"]
        assert len(workers) == SLICES
        # kwok's pods, on kwok's node, with kwok's addresses; the controller is the node agent's process
        assert all(p["spec"]["nodeName"].startswith("kwok-") for p in workers)
        assert all(p["status"]["podIP"].startswith("10.") for p in workers)
        ctrl = by_job[job]["controller"][0]
        assert ctrl["spec"]["nodeName"].startswith("cpu-pool-")
        assert "--serve-only" not in str(ctrl["spec"])  # the image's entrypoint, not a rendered flag
        client = ControlClient(f"http://{ctrl['status']['podIP']}:8080", fleet.token(cluster, NAMESPACE, job))
        try:
            assert fleet.slice_states(client) == {0: "Active", 1: "Active"}
            assert client.status().phase == "Running"
        finally:
            client.close()

    job = JOBS[0]
    ctrl = by_job[job]["controller"][0]
    victim = fleet.running_worker(by_job[job]["workers"], 1)
    sent = fleet.fail_pod(cluster, NAMESPACE, victim)
    applied = fleet.wait_down_applied(cluster, NAMESPACE, ctrl, 1, sent, timeout_s=60)
    assert applied >= sent
    client = ControlClient(f"http://{ctrl['status']['podIP']}:8080", fleet.token(cluster, NAMESPACE, job))
    try:
        # the slice comes back: a new pod (new name), Ready from kwok, reported by the operator
        wait_for(lambda: (lambda p: p is not None and p["metadata"]["uid"] != victim["metadata"]["uid"])(
                     fleet.running_worker(fleet.pods_by_job(cluster, NAMESPACE)[job]["workers"], 1)),
                 timeout_s=90, what="replacement worker Running", explain=lambda: op.log()[-3000:])
        wait_for(lambda: fleet.slice_states(client) == {0: "Active", 1: "Active"}, timeout_s=60,
                 what="slice 1 Active again", explain=lambda: str(client.status()))
        assert next(s for s in client.status().slices if s.index == 1).failures == 1
    finally:
        client.close()
    # the other job never heard of it
    other = by_job[JOBS[1]]["controller"][0]
    assert fleet.down_applied_at(cluster, NAMESPACE, other, 1, 0.0) is None
