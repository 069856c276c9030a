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

The kwok and operator setup, the failure and its checks: `e2e/kwok/operator_run.py` (it skips without kwok).
"""

from __future__ import annotations

import pytest

from e2e.helpers import wait_for
from e2e.kwok import fleet
from e2e.kwok import operator_run as run
from e2e.kwok.operator_run import ejob_crd, kwok_operator, operator_kubeconfig  # noqa: F401

pytestmark = pytest.mark.timeout(300)

NAMESPACE = fleet.test_namespace("kwok-scale")
JOBS, SLICES, NODES = ["kw-a", "kw-b"], 2, 1


@pytest.fixture
def kwok_fleet(cluster, kwok_operator):  # noqa: F811
    fleet.install(cluster, NODES)
    return kwok_operator(NAMESPACE, cleanup=lambda: fleet.remove_nodes(cluster, NODES),
                         nodes_ready=lambda: fleet.kwok_nodes_ready(cluster, NODES), what="kwok node Ready",
                         timeout_s=60)


def test_serve_only_controllers_drive_kwok_workers(cluster, kwok_fleet):
    kwok, op = kwok_fleet
    requests_before = fleet.operator_requests(cluster)
    fleet.apply_jobs(cluster, NAMESPACE, JOBS, SLICES)
    run.wait_all_running(cluster, NAMESPACE, JOBS, SLICES, 120, kwok, op)
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
        client = run.client_of(cluster, NAMESPACE, job, ctrl)
        try:
            run.assert_both_slices_active(client)
        finally:
            client.close()

    job = JOBS[0]
    ctrl, victim = run.fail_slice_1_worker(cluster, NAMESPACE, by_job, job)
    client = run.client_of(cluster, NAMESPACE, job, ctrl)
    try:
        # the slice comes back: a new pod (new name), Ready from kwok, reported by the operator
        wait_for(lambda: (lambda p: p is not None and p["metadata"]["uid"] != victim["metadata"]["uid"])(
                     fleet.running_worker(fleet.pods_by_job(cluster, NAMESPACE)[job]["workers"], 1)),
                 timeout_s=90, what="replacement worker Running", explain=lambda: op.log()[-3000:])
        run.assert_slice_1_back(client)
    finally:
        client.close()
    run.assert_not_heard_by(cluster, NAMESPACE, by_job, JOBS[1])  # the other job never heard of it
