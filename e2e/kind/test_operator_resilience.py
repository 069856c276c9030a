"""The chart's operator on kind under its own crash mid-recovery, a drain, and job deletion.

The operator's crash is a SIGKILL of its process, which the kubelet restarts. The drain
and the crash share one job (``TestOneTrainingJob``: one job start instead of two).
A lost node is test_node_failure.py (a frozen node, no taint; SliceDown and
SliceReady Events) and e2e/test_chaos_cluster.py's elastic arm (the
out-of-service taint, no step lost, the same controller).
"""

from __future__ import annotations

import signal

import pytest
import yaml

from e2e.helpers import is_ready, pods, summary, wait_for
from e2e.kind import demo
from e2e.operator_fixtures import example_manifest, get_job, job_children, job_events

# The first test of a session also pays for what its fixtures build (images, node
# image, cluster, chart: up to ~30 min on a fresh machine under load).
pytestmark = pytest.mark.timeout(3600)

JOB = "cpu-job"
SEL = f"elasticjax.dev/job-name={JOB}"


def _start(cluster, namespace, operator, min_step=20, steps=None):
    manifest = example_manifest()
    if steps is not None:
        # Long enough that the replacement (node NotReady, eviction, pod GC) arrives before the end.
        manifest["spec"]["training"]["steps"] = steps
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest))
    explain = lambda: summary(pods(cluster, namespace)) + "\n" + operator.log()[-3000:]  # noqa: E731
    wait_for(lambda: (get_job(cluster, namespace, JOB).get("status") or {}).get("step", 0) >= min_step,
             timeout_s=180, what="training started", explain=explain)
    return explain


def _live(cluster, namespace, selector):
    return [p for p in pods(cluster, namespace, selector)
            if p["status"].get("phase") == "Running" and is_ready(p) and not p["metadata"].get("deletionTimestamp")]


def _controller(cluster, namespace):
    # Running is enough: its readiness probe may blink under load, which is not what these tests are about.
    return [p for p in pods(cluster, namespace, f"{SEL},elasticjax.dev/role=controller")
            if p["status"].get("phase") == "Running"][0]


@pytest.fixture(scope="class")
def training_job(cluster, module_operator):
    """One job training (never to its end) in a restricted namespace of its own, for ``TestOneTrainingJob``:
    the namespace and the ``explain`` of :func:`_start`."""
    ns = demo.restricted_namespace(cluster.kind, "res")
    try:
        wait_for(lambda: cluster.kubectl("get", "serviceaccount", "default", "-n", ns, check=False).returncode == 0,
                 timeout_s=60, what=f"default ServiceAccount in {ns}")
        # Never reached: the tests end once their recovery is finished, whatever the machine's speed.
        yield ns, _start(cluster, ns, module_operator, steps=100000)
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


class TestOneTrainingJob:
    """A drained worker, then the operator killed mid-recovery, on one job (one job start instead of
    two; pytest runs a class's tests in the order written). Each ends with both slices training again
    under the same controller, which is where the next one starts."""

    def test_gracefully_deleted_worker_pod_is_replaced(self, cluster, operator, training_job):
        """`kubectl delete pod` (a drain, GKE maintenance): SIGTERM, not SIGKILL. The worker exits 143,
        its Job fails and the JobSet replaces the slice; with exit 0 the Job was Complete and the slice lost."""
        namespace, explain = training_job
        ctrl = _controller(cluster, namespace)
        victim = _live(cluster, namespace, f"{SEL},elasticjax.dev/role=worker")[0]
        cluster.kubectl("delete", "pod", "-n", namespace, victim["metadata"]["name"], "--wait=false")

        def replaced():
            live = _live(cluster, namespace, f"{SEL},elasticjax.dev/role=worker")
            return len(live) == 2 and victim["metadata"]["uid"] not in {p["metadata"]["uid"] for p in live}
        wait_for(replaced, timeout_s=150, what="gracefully deleted worker replaced", explain=explain)
        wait_for(lambda: (get_job(cluster, namespace, JOB).get("status") or {}).get("activeSlices") == 2,
                 timeout_s=120, what="both slices active again", explain=explain)
        after = _controller(cluster, namespace)
        assert after["metadata"]["uid"] == ctrl["metadata"]["uid"]
        assert after["status"]["containerStatuses"][0]["restartCount"] == 0

    def test_operator_killed_mid_recovery(self, cluster, operator, training_job):
        namespace, explain = training_job
        ctrl = _controller(cluster, namespace)
        # The recoveries the job counted so far (the drain's, when the test above ran): this one adds one.
        recoveries = (get_job(cluster, namespace, JOB).get("status") or {}).get("recoveries", 0)
        victim = _live(cluster, namespace, f"{SEL},elasticjax.dev/slice-index=0")[0]
        operator.kill()  # SIGKILL: no cleanup, no state handed over
        cluster.signal_container(namespace, victim["metadata"]["name"], "worker", signal.SIGKILL)
        # The JobSet replaces the worker whether or not an operator runs; the controller saw its RPC fail.
        # The kubelet restarts the operator; the fresh process rebuilds its view from the cluster.
        operator.wait_restarted()
        new = wait_for(lambda: [p for p in _live(cluster, namespace, f"{SEL},elasticjax.dev/slice-index=0")
                                if p["metadata"]["name"] != victim["metadata"]["name"]],
                       timeout_s=120, what="slice 0 worker replaced", explain=explain)[0]
        address = f"{new['status']['podIP']}:8471"
        # The fresh process saw the replacement Ready and said where it is.
        ready = wait_for(lambda: [e["message"] for e in job_events(cluster, namespace, JOB)
                                  if e["reason"] == "SliceReady" and address in e["message"]],
                         timeout_s=120, what=f"SliceReady naming {address}", explain=explain)
        assert ready[0].startswith("slice 0 "), ready

        def both_active():
            # Status the fresh process wrote (the old one's last said 2 before the loss): slice 0 at the
            # new address, and the controller, which counted the recovery, training on both slices again.
            st = get_job(cluster, namespace, JOB).get("status") or {}
            slice0 = next((s for s in st.get("slices") or [] if s["index"] == 0), {})
            return st if (st.get("activeSlices") == 2 and st.get("recoveries", 0) >= recoveries + 1
                          and slice0.get("addresses") == [address]) else None
        status = wait_for(both_active, timeout_s=120, what="replacement slice rejoined after operator restart",
                          explain=explain)
        # (Running on to Succeeded after a worker loss is test_operator_recovery.py's and test_kind.py's; with
        # the operator killed too, e2e/test_chaos_cluster.py's elastic arm.)
        after = pods(cluster, namespace, f"{SEL},elasticjax.dev/role=controller")
        assert [p["metadata"]["uid"] for p in after] == [ctrl["metadata"]["uid"]]
        assert after[0]["status"]["containerStatuses"][0]["restartCount"] == 0
        assert status["controllerRestarts"] == 0


def test_deleting_the_job_cleans_up_everything(cluster, namespace, operator):
    explain = _start(cluster, namespace, operator, min_step=1)
    cluster.kubectl("delete", "ejob", "-n", namespace, JOB, "--wait=false")
    api = cluster.api()

    def children():
        return job_children(api, namespace, JOB)
    wait_for(lambda: not children(), timeout_s=120, what="every child garbage-collected",
             explain=lambda: f"{children()}\n{explain()}")
    # The same name again, same operator process: a new job, created from scratch (its
    # ConfigMap and Service too), not a ghost of the old one.
    wait_for(lambda: not cluster.kubectl("get", "ejob", "-n", namespace, "-o", "name").stdout.strip(),
             timeout_s=60, what="job gone")
    _start(cluster, namespace, operator, min_step=1)
