"""What only a real kubelet and real containers show, on the kind cluster with the images built here.

- The rendered pods are admitted where PodSecurity ``restricted`` is enforced,
  run as uid 65532 with a read-only root file system, and the controller reads
  its token Secret as mounted (the job trains: the operator's calls with the
  token succeed).
- Admission refusing a pod (a ResourceQuota here) is a condition and an Event
  naming the reason, never a silent Pending.
- A worker pod resolves the job's Service by its DNS name (CoreDNS) and
  reaches the controller through it (kube-proxy).
- The kubelet runs the controller's livenessProbe: a frozen (SIGSTOPped)
  controller is killed by it, and the operator replaces the pod and counts it.

Graceful deletion (SIGTERM within the grace period) is
``test_operator_lifecycle.py``'s suspend (the controller checkpoints the step
it reached and exits well before its 60 s grace) and
``test_operator_resilience.py``'s drained worker.

The worker-process SIGKILL through the whole product is ``test_kind.py``
(``run.sh --air-gapped``).
"""

from __future__ import annotations

import json

import pytest
import yaml

from e2e.kind import demo
from elastic_jax import contract

# The first test of a session also pays for what its fixtures build (images, node
# image, cluster, chart: up to ~30 min on a fresh machine under load).
pytestmark = pytest.mark.timeout(3600)


# The job the uid/read-only/token test and the Service DNS test read and the liveness test then freezes
# (one start instead of three).
SHARED_JOB = "sec"


def _job_manifest(name: str, steps: int) -> str:
    manifest = yaml.safe_load(demo.EXAMPLE.read_text())
    manifest["metadata"]["name"] = name
    manifest["spec"]["training"]["steps"] = steps
    return yaml.safe_dump(manifest)


@pytest.fixture(scope="class")
def training_job(elastic_jax, module_operator):
    """One job training in a restricted namespace, for ``TestOneTrainingJob``: (namespace, name).

    At step 5 and more: trained, so the liveness test freezes a controller that trains."""
    cluster = elastic_jax
    ns = demo.restricted_namespace(cluster, "sec")
    why = demo.explain(cluster, ns)
    try:
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=_job_manifest(SHARED_JOB, steps=100000))
        demo.wait_for(lambda: (demo.get(cluster, "-n", ns, "ejob", SHARED_JOB).get("status") or {}).get("step", 0)
                      >= 5, 600, "training reached step 5", why)
        yield ns, SHARED_JOB
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


class TestOneTrainingJob:
    """Three tests share one training job (one job start instead of three): two only read it, the last
    freezes its controller (pytest runs a class's tests in the order written). It is deleted when the
    class ends, so it does not train beside the tests after it."""

    def test_pods_run_as_65532_read_only_and_read_their_token(self, elastic_jax, operator, training_job):
        cluster = elastic_jax
        ns, job = training_job
        why = demo.explain(cluster, ns)
        (controller,) = demo.pods(cluster, ns, f"elasticjax.dev/job-name={job},elasticjax.dev/role=controller")
        worker = demo.wait_for(lambda: demo.live_worker(cluster, ns, job, 0), 120, "a ready worker", why)
        for pod, container in ((controller, "controller"), (worker, "worker")):
            name = pod["metadata"]["name"]
            ident = cluster.kubectl("exec", "-n", ns, name, "-c", container, "--", "id", "-u").stdout.strip()
            assert ident == "65532", (name, ident)
            # The image's own files cannot be changed by the process.
            proc = cluster.kubectl("exec", "-n", ns, name, "-c", container, "--", "python3", "-c",
                                   "open('/opt/venv/pyvenv.cfg', 'a')", check=False)
            assert proc.returncode != 0 and ("Read-only" in proc.stderr or "Permission" in proc.stderr), proc.stderr
            assert not pod["spec"].get("automountServiceAccountToken", True), name
        token_path = next(e["value"] for e in controller["spec"]["containers"][0]["env"]
                          if e["name"] == contract.ENV_TOKEN_FILE)
        # Readable by uid 65532 through fsGroup, as mounted by the kubelet (its length only: never print it).
        size = cluster.kubectl("exec", "-n", ns, controller["metadata"]["name"], "--", "python3", "-c",
                               f"print(len(open({token_path!r}).read().strip()))").stdout.strip()
        assert int(size) >= 32

    def test_a_worker_reaches_the_controller_by_the_services_dns_name(self, elastic_jax, operator,
                                                                      training_job):
        """The job's Service, resolved by CoreDNS from a worker pod, routes to the controller (kube-proxy):
        the path Pathways workers take to the resource manager and users take to the control API."""
        from elastic_jax.k8s_operator import names
        cluster = elastic_jax
        ns, job = training_job
        why = demo.explain(cluster, ns)
        worker = demo.wait_for(lambda: demo.live_worker(cluster, ns, job, 0), 120, "a ready worker", why)
        # The Service routes once the controller pod is Ready and kube-proxy has programmed its
        # endpoint, which on a loaded node trails the pod's Ready by seconds: wait for both.
        demo.wait_for(lambda: all(demo.is_ready(p) for p in demo.pods(
            cluster, ns, f"elasticjax.dev/job-name={job},elasticjax.dev/role=controller")), 120, "a ready controller", why)
        host = f"{names.service(job)}.{ns}.svc.cluster.local"
        probe = ("import socket, urllib.request; "
                 f"print(socket.gethostbyname({host!r})); "
                 f"print(urllib.request.urlopen('http://{host}:{names.CONTROLLER_PORT}/healthz', timeout=10).status)")
        last: list[str] = []

        def answered() -> list[str] | None:
            proc = cluster.kubectl("exec", "-n", ns, worker["metadata"]["name"], "-c", "worker", "--",
                                   "python3", "-c", probe, check=False)
            last[:] = [proc.stdout, proc.stderr[-400:]]
            return proc.stdout.split() if proc.returncode == 0 else None
        out = demo.wait_for(answered, 60, "the controller answering through its Service", lambda: f"{why()}\n{last}")
        service_ip = demo.get(cluster, "-n", ns, "service", names.service(job))["spec"]["clusterIP"]
        assert out == [service_ip, "200"], out

    def test_a_hung_controller_is_killed_by_the_kubelets_liveness_probe_and_replaced(self, elastic_jax, operator,
                                                                                      training_job):
        """SIGSTOP freezes the controller process (a hang: no step, no HTTP answer); the kubelet's
        livenessProbe fails, the kubelet kills the container, and the operator replaces the pod and counts it.

        The class's last test: it ends the shared job's first controller (before, a job of its own: one
        more job start, about 40 s)."""
        cluster = elastic_jax
        ns, job = training_job
        why = demo.explain(cluster, ns)
        selector = f"elasticjax.dev/job-name={job},elasticjax.dev/role=controller"

        # The livenessProbe runs only once the startupProbe passed (the container's `started`); a
        # controller frozen before that is the startupProbe's to kill, ten minutes later.
        def started() -> dict | None:
            (pod,) = demo.pods(cluster, ns, selector)
            return pod if any(s.get("started") for s in pod["status"].get("containerStatuses", [])) else None
        controller = demo.wait_for(started, 120, "the controller's startupProbe passing", why)
        assert (demo.get(cluster, "-n", ns, "ejob", job).get("status") or {}).get("controllerRestarts", 0) == 0
        demo.kill_container_process(cluster, controller, "controller", signal="STOP")

        def unhealthy():
            events = json.loads(cluster.kubectl("get", "events", "-n", ns, "--field-selector",
                                                f"involvedObject.name={controller['metadata']['name']}",
                                                "-o", "json").stdout)["items"]
            return [e for e in events if e.get("reason") == "Unhealthy" and "Liveness" in (e.get("message") or "")]
        # 6 failures 10 s apart (each with a 10 s budget): about 60-70 s.
        demo.wait_for(unhealthy, 240, "the kubelet's liveness probe failing", why)

        # The test ends once the new pod runs: a replaced controller training again is
        # test_operator_lifecycle.py's killed controller (and e2e/test_chaos_cluster.py's restart arm).
        new_pod = f"{job}-controller-1"

        def replaced():
            status = demo.get(cluster, "-n", ns, "ejob", job).get("status") or {}
            if status.get("controllerRestarts") != 1 or status.get("controllerPod") != new_pod:
                return None
            new = demo.pods(cluster, ns, selector)
            return status if any(p["metadata"]["name"] == new_pod and p["status"].get("phase") == "Running"
                                 for p in new) else None
        demo.wait_for(replaced, 300, "controller replaced and counted, the new pod Running", why)


def test_admission_refusal_is_a_condition_and_an_event(elastic_jax, operator):
    cluster = elastic_jax
    ns = demo.restricted_namespace(cluster, "quota")
    why = demo.explain(cluster, ns)
    try:
        cluster.kubectl("create", "quota", "no-pods", "-n", ns, "--hard=pods=0")
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=_job_manifest("refused", steps=100))

        def refused():
            status = demo.get(cluster, "-n", ns, "ejob", "refused").get("status") or {}
            conds = [c for c in status.get("conditions", []) if c.get("status") == "True"
                     and "quota" in (c.get("message") or "").lower()]
            return conds
        (cond,) = demo.wait_for(refused, 180, "a condition naming the quota", why)[:1]
        assert "no-pods" in cond["message"] or "exceeded quota" in cond["message"], cond
        events = json.loads(cluster.kubectl("get", "events", "-n", ns, "--field-selector",
                                            "involvedObject.name=refused", "-o", "json").stdout)["items"]
        assert any("quota" in (e.get("message") or "").lower() for e in events), [e.get("message") for e in events]
    finally:
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
