"""The Helm chart on kind: dry run, install, upgrade, a job that trains, uninstall.

The operator runs as a pod of the chart's Deployment from the operator image
built here (``image.pullPolicy=Never``: it was loaded into the nodes), with
the chart's ServiceAccount and RBAC, in a namespace that enforces the
PodSecurity "restricted" profile. Then ``kubectl apply -f
examples/01-cpu-job.yaml`` trains under the upgraded release (a worker loss
recovered to Succeeded by the chart's operator is test_operator_recovery.py).
The session's own release (``elastic-jax``) is uninstalled first, so one
operator acts; this file runs last in e2e/kind (its conftest orders it), so
no later test pays for installing it again.
"""

from __future__ import annotations

import json

import pytest
import yaml

from e2e.harness.paths import REPO_ROOT
from e2e.helpers import is_ready, pods, summary, wait_for
from e2e.kind import demo
from e2e.operator_fixtures import example_manifest, get_job, job_events
from elastic_jax.api.images import OPERATOR_IMAGE

# The first test of a session also pays for what its fixtures build (images, node
# image, cluster, chart: up to ~30 min on a fresh machine under load).
pytestmark = pytest.mark.timeout(3600)

CHART = REPO_ROOT / "helm" / "elastic-jax"
RELEASE = "ej"
FULLNAME = f"{RELEASE}-elastic-jax"
JOB = "cpu-job"
# The operator image built here and loaded into the nodes: never pulled.
KIND_VALUES = ["--set", "image.pullPolicy=Never"]
OPERATOR_SELECTOR = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=operator"


@pytest.fixture
def system_namespace(cluster, elastic_jax):
    """The release's namespace, enforcing PodSecurity "restricted" (the API server's admission checks the pod)."""
    name = demo.restricted_namespace(cluster.kind, "ej-system")
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture
def only_this_release(cluster):
    """The session's release uninstalled, so that the release under test is the one operator acting."""
    cluster.helm("uninstall", demo.RELEASE, "-n", demo.SYSTEM_NS, "--wait", "--timeout", "120s", check=False,
                 timeout_s=180)


def _operator_pods(cluster, namespace) -> list[dict]:
    return [p for p in pods(cluster, namespace, OPERATOR_SELECTOR) if not p["metadata"].get("deletionTimestamp")]


def _running_operator(cluster, namespace) -> dict | None:
    live = [p for p in _operator_pods(cluster, namespace) if is_ready(p)]
    return live[0] if len(live) == 1 else None


def _operator_log(cluster, namespace) -> str:
    out = []
    for p in pods(cluster, namespace, OPERATOR_SELECTOR):
        try:
            out.append(cluster.container_log(namespace, p["metadata"]["name"], "operator",
                                             uid=p["metadata"]["uid"])[-3000:])
        except OSError:
            pass
    return "\n".join(out)


def _metrics(cluster, pod: dict) -> str:
    """The pod's /metrics, through the API server's pod proxy."""
    return cluster.raw(f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}:9090"
                       "/proxy/metrics")


def _peering_holders(cluster, name: str) -> set[str]:
    obj = cluster.api().get(f"/apis/kopf.dev/v1/clusterkopfpeerings/{name}")
    return set((obj.get("status") or {}).keys())


def _helm(cluster, *args: str, explain) -> None:
    """Runs helm; a failure shows helm's error and the cluster's state."""
    proc = cluster.helm(*args, check=False, timeout_s=300)
    assert proc.returncode == 0, f"helm {args[0]} failed: {proc.stderr}\n{explain()}"


def test_rendered_chart_passes_the_api_servers_dry_run(cluster, system_namespace):
    # Every object the chart renders, with every template branch on, checked by the
    # real API server (schemas, strict field validation, admission) without persisting.
    # The CRDs go first (a real apply: their custom resources need them to be served).
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CHART / "crds"))
    for crd in ("elastictrainingjobs.elasticjax.dev", "clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"):
        cluster.kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=60s")
    for values in ([], ["--set", f"watchNamespaces={{{system_namespace}}}"]):
        rendered = cluster.helm("template", RELEASE, str(CHART), "-n", system_namespace,
                                "--kube-version", "1.35.4", *values).stdout
        out = cluster.kubectl("apply", "--dry-run=server", "--validate=strict", "-n", system_namespace,
                              "-f", "-", input=rendered)
        kinds = {line.split("/")[0] for line in out.stdout.splitlines()}
        assert {"serviceaccount", "deployment.apps", "service"} <= kinds, out.stdout
    # A Deployment that breaks the restricted profile is refused by the same admission.
    bad = yaml.safe_load_all(cluster.helm("template", RELEASE, str(CHART), "-n", system_namespace,
                                          "--kube-version", "1.35.4", "--set",
                                          "securityContext.allowPrivilegeEscalation=true").stdout)
    (deployment,) = [d for d in bad if d and d["kind"] == "Deployment"]
    spec = dict(deployment["spec"]["template"]["spec"], serviceAccountName="default")  # the release's SA is not created
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "psa-check"}, "spec": spec}
    refused = cluster.kubectl("apply", "--dry-run=server", "-n", system_namespace, "-f", "-",
                              input=json.dumps(pod), check=False)
    assert refused.returncode != 0 and "allowPrivilegeEscalation" in refused.stderr, refused.stderr


def test_helm_install_upgrade_job_trains_uninstall(cluster, system_namespace, namespace, only_this_release):
    explain = lambda: (summary(pods(cluster, system_namespace)) + "\n" + summary(pods(cluster, namespace))  # noqa: E731
                       + "\n" + _operator_log(cluster, system_namespace))
    installed = False
    try:
        # 1. Install: CRDs from crds/, then the operator; --wait returns when its pod is Ready.
        _helm(cluster, "install", RELEASE, str(CHART), "-n", system_namespace, *KIND_VALUES,
              "--wait", "--timeout", "180s", explain=explain)
        installed = True
        first = wait_for(lambda: _running_operator(cluster, system_namespace), timeout_s=60,
                         what="operator pod Ready", explain=explain)
        assert first["spec"]["serviceAccountName"] == FULLNAME
        assert first["spec"]["containers"][0]["image"] == OPERATOR_IMAGE
        wait_for(lambda: first["metadata"]["name"] in _peering_holders(cluster, FULLNAME), timeout_s=60,
                 what="operator holds the peering", explain=explain)
        assert "elasticjax_operator" in _metrics(cluster, first)

        # 2. Upgrade: a changed value rolls the pod (Recreate: the old one is gone
        # before the new one starts), and the new pod takes over the peering.
        _helm(cluster, "upgrade", RELEASE, str(CHART), "-n", system_namespace, *KIND_VALUES,
              "--set", "operator.workers=4", "--wait", "--timeout", "180s", explain=explain)
        releases = json.loads(cluster.helm("list", "-n", system_namespace, "-o", "json").stdout)
        assert [(r["name"], r["revision"], r["status"]) for r in releases] == [(RELEASE, "2", "deployed")]

        def rolled():
            pod = _running_operator(cluster, system_namespace)
            return pod if pod and pod["metadata"]["uid"] != first["metadata"]["uid"] else None
        operator = wait_for(rolled, timeout_s=120, what="operator pod replaced by the upgrade", explain=explain)
        assert "--workers=4" in operator["spec"]["containers"][0]["args"]
        wait_for(lambda: _peering_holders(cluster, FULLNAME) == {operator["metadata"]["name"]}, timeout_s=90,
                 what="only the new pod in the peering", explain=explain)

        # The metrics Service selects exactly the operator pod, and serves its metrics
        # (endpoints, kube-proxy's ClusterIP path through the API server's service proxy).
        service = cluster.api().get(f"/api/v1/namespaces/{system_namespace}/services/{FULLNAME}-metrics")
        selector = ",".join(f"{k}={v}" for k, v in service["spec"]["selector"].items())
        selected = [p["metadata"]["uid"] for p in pods(cluster, system_namespace, selector)
                    if not p["metadata"].get("deletionTimestamp")]
        assert selected == [operator["metadata"]["uid"]], selected

        def endpoints():
            slices = cluster.api().get(f"/apis/discovery.k8s.io/v1/namespaces/{system_namespace}/endpointslices",
                                       labelSelector=f"kubernetes.io/service-name={FULLNAME}-metrics")["items"]
            return sorted(a for s in slices for e in s.get("endpoints") or []
                          if (e.get("conditions") or {}).get("ready") for a in e["addresses"])
        wait_for(lambda: endpoints() == [operator["status"]["podIP"]], timeout_s=60,
                 what="the metrics Service's one ready endpoint is the operator pod", explain=lambda: str(endpoints()))
        port = service["spec"]["ports"][0]["port"]
        assert "elasticjax_operator" in cluster.raw(
            f"/api/v1/namespaces/{system_namespace}/services/{FULLNAME}-metrics:{port}/proxy/metrics")

        # 3. The upgraded release's operator runs the CPU example: it creates the children, tells the
        # controller its slices and posts Events under this release's RBAC, so training starts. (A worker
        # loss recovered through to Succeeded by the chart's operator is test_operator_recovery.py's.)
        manifest = example_manifest()
        # Never reached: the test ends once training runs, whatever the machine's speed.
        manifest["spec"]["training"]["steps"] = 100_000
        cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest))
        wait_for(lambda: (get_job(cluster, namespace, JOB).get("status") or {}).get("step", 0) >= 20,
                 timeout_s=240, what="training started", explain=explain)
        status = get_job(cluster, namespace, JOB)["status"]
        assert status["activeSlices"] == 2 and status["phase"] == "Running", status
        reasons = {e["reason"] for e in job_events(cluster, namespace, JOB)}
        assert "SliceReady" in reasons, sorted(reasons)
        # The operator that did it is the chart's pod, and it has not restarted.
        current = _running_operator(cluster, system_namespace)
        assert current["metadata"]["uid"] == operator["metadata"]["uid"]
        assert current["status"]["containerStatuses"][0]["restartCount"] == 0
        operator_container = (current["spec"]["nodeName"], current["status"]["containerStatuses"][0]["containerID"])

        # 4. Uninstall removes the operator and everything the templates made; the
        # CRDs stay (Helm never deletes crds/: that would delete every job).
        cluster.kubectl("delete", "ejob", JOB, "-n", namespace, "--wait=true", "--timeout=60s")
        _helm(cluster, "uninstall", RELEASE, "-n", system_namespace, "--wait", "--timeout", "120s", explain=explain)
        installed = False
        for kind, name, ns in (("deployment", FULLNAME, system_namespace), ("serviceaccount", FULLNAME, system_namespace),
                               ("service", f"{FULLNAME}-metrics", system_namespace), ("clusterrole", FULLNAME, None),
                               ("clusterrolebinding", FULLNAME, None), ("clusterkopfpeering", FULLNAME, None)):
            args = ["get", kind, name] + (["-n", ns] if ns else [])
            gone = cluster.kubectl(*args, check=False)
            assert gone.returncode != 0 and "NotFound" in gone.stderr, (kind, gone.stdout)
        wait_for(lambda: not _operator_pods(cluster, system_namespace), timeout_s=60,
                 what="operator pod gone", explain=explain)

        # And its container is gone from the node, not only the pod object.
        wait_for(lambda: not cluster.container_running(*operator_container), timeout_s=60,
                 what=f"operator container {operator_container} stopped on its node")
        cluster.kubectl("get", "crd", "elastictrainingjobs.elasticjax.dev")
    finally:
        if installed:
            cluster.helm("uninstall", RELEASE, "-n", system_namespace, "--wait", "--timeout", "120s",
                         check=False, timeout_s=180)
