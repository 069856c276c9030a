"""The spec's pod fields on a real cluster: pull secrets, scheduling, an admin-allowed ServiceAccount, metrics.

- A job using ``imagePullSecrets``, ``priorityClassName``, ``nodeSelector`` and
  ``tolerations`` (controller and workers) and a ``serviceAccountName`` the
  admin allowed (Helm ``controllerServiceAccounts.allowed``) is admitted in a
  PodSecurity ``restricted`` namespace, trains, and its pods carry the fields
  (no ServiceAccount token mounted; the default requests set).
- A ServiceAccount the admin did not allow fails the job with a condition and
  an Event naming ``spec.controller.serviceAccountName``; no pod is created.
  So does a PriorityClass the admin did not list (Helm ``podFields``), which
  also lists the test's toleration key and pull Secret.
- ``kubectl port-forward`` to the controller pod reaches ``/metrics``: 200 with
  our metric names with the job's token, 401 without.
"""

from __future__ import annotations

import base64
import json
import subprocess
import urllib.error
import urllib.request
import uuid

import pytest
import yaml

from e2e.harness.paths import bin_dir
from e2e.kind import demo, target
from elastic_jax.local.processes import free_port

pytestmark = pytest.mark.timeout(3600)

SA = "trainer"
POOL_LABEL = "cloud.google.com/gke-nodepool"  # kind's worker nodes carry cpu-pool (e2e/kind/cluster.py)


def _manifest(name: str, **spec) -> str:
    manifest = yaml.safe_load(demo.EXAMPLE.read_text())
    manifest["metadata"]["name"] = name
    manifest["spec"]["training"]["steps"] = 100000
    manifest["spec"].update(spec)
    return yaml.safe_dump(manifest)


def _allow(cluster: target.KindTarget, operator: target.ChartOperator, entries: list[str],
           pod_fields: dict | None = None) -> None:
    """helm upgrade of the session's release with controllerServiceAccounts.allowed = entries and the
    podFields allow lists; operator Ready."""
    pod_fields = pod_fields or {"priorityClassNames": [], "tolerationKeys": [], "imagePullSecrets": []}
    # --set-json: helm's --set turns {} into [""], which the values schema refuses.
    cluster.helm("upgrade", demo.RELEASE, str(demo.REPO_ROOT / "helm" / "elastic-jax"), "-n", demo.SYSTEM_NS,
                 "--reuse-values", "--set-json", f"controllerServiceAccounts.allowed={json.dumps(entries)}",
                 "--set-json", f"podFields={json.dumps(pod_fields)}",
                 "--wait", "--timeout", "300s", timeout_s=420)
    target.wait_operator_ready(operator)


def _get(url: str, token: str | None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""


def test_pull_secrets_scheduling_and_allowed_service_account_reach_the_pods(elastic_jax, cluster, operator, namespace):
    ns = namespace
    why = demo.explain(elastic_jax, ns)
    priority = f"ej-test-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "serviceaccount", SA, "-n", ns)
    # A pull secret for a registry nobody pulls from here: the images are loaded into the nodes.
    cluster.kubectl("create", "secret", "docker-registry", "regcred", "-n", ns, "--docker-server=registry.invalid",
                    "--docker-username=u", "--docker-password=p")
    cluster.kubectl("create", "priorityclass", priority, "--value=1000", "--description=elastic-jax e2e")
    scheduling = {"nodeSelector": {POOL_LABEL: "cpu-pool"},
                  "tolerations": [{"key": "elasticjax.dev/e2e", "operator": "Exists", "effect": "NoSchedule"}]}
    _allow(cluster, operator, [f"{ns}/{SA}"], {"priorityClassNames": [priority], "tolerationKeys": ["elasticjax.dev/e2e"],
                                              "imagePullSecrets": [f"{ns}/regcred"]})
    port_forward = None
    try:
        # Refused: an account the admin did not list (the namespace's own default one).
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=_manifest(
            "refused", controller={"serviceAccountName": "default"}))

        def failed():
            status = demo.get(elastic_jax, "-n", ns, "ejob", "refused").get("status") or {}
            return status if status.get("phase") == "Failed" else None
        status = demo.wait_for(failed, 180, "the job refused for its ServiceAccount", why)
        (cond,) = [c for c in status["conditions"] if c["type"] == "Failed"]
        assert "spec.controller.serviceAccountName 'default' is not allowed" in cond["message"], cond

        def event():
            events = json.loads(cluster.kubectl("get", "events", "-n", ns, "--field-selector",
                                                "involvedObject.name=refused", "-o", "json").stdout)["items"]
            return [e for e in events if e.get("reason") == "InvalidSpec"
                    and "spec.controller.serviceAccountName" in (e.get("message") or "")]
        demo.wait_for(event, 60, "a Warning Event naming spec.controller.serviceAccountName", why)
        assert not demo.pods(elastic_jax, ns, "elasticjax.dev/job-name=refused")

        # Refused: a PriorityClass the admin did not list (podFields.priorityClassNames).
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=_manifest(
            "refused-priority", priorityClassName="system-node-critical"))
        status = demo.wait_for(lambda: (lambda s: s if s.get("phase") == "Failed" else None)(
            demo.get(elastic_jax, "-n", ns, "ejob", "refused-priority").get("status") or {}),
            180, "the job refused for its priority class", why)
        (cond,) = [c for c in status["conditions"] if c["type"] == "Failed"]
        assert "spec.priorityClassName 'system-node-critical' is not allowed" in cond["message"], cond
        assert not demo.pods(elastic_jax, ns, "elasticjax.dev/job-name=refused-priority")

        # Allowed: everything set, admitted under PodSecurity restricted, trains.
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=_manifest(
            "fields", imagePullSecrets=[{"name": "regcred"}], priorityClassName=priority,
            controller={"serviceAccountName": SA, **scheduling}, worker=scheduling))
        demo.wait_for(lambda: (demo.get(elastic_jax, "-n", ns, "ejob", "fields").get("status") or {}).get("step", 0) >= 1,
                      600, "training started", why)
        (controller,) = demo.pods(elastic_jax, ns, "elasticjax.dev/job-name=fields,elasticjax.dev/role=controller")
        worker = demo.wait_for(lambda: demo.live_worker(elastic_jax, ns, "fields", 0), 120, "a ready worker", why)
        for pod in (controller, worker):
            spec = pod["spec"]
            assert spec["imagePullSecrets"] == [{"name": "regcred"}], spec
            assert spec["priorityClassName"] == priority and spec["priority"] == 1000, spec
            assert spec["nodeSelector"] == {POOL_LABEL: "cpu-pool"}, spec
            assert {"key": "elasticjax.dev/e2e", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
            assert spec["automountServiceAccountToken"] is False
            # No projected ServiceAccount token volume was added by admission.
            assert not [v for v in spec["volumes"] if "projected" in v], spec["volumes"]
            assert spec["containers"][0]["resources"]["requests"] == {"cpu": "250m", "memory": "512Mi"}
        assert controller["spec"]["serviceAccountName"] == SA
        assert worker["spec"]["serviceAccountName"] == "default"

        # kubectl port-forward to the controller pod, then /metrics with and without the token.
        secret = json.loads(cluster.kubectl("get", "secret", "fields-token", "-n", ns, "-o", "json").stdout)
        token = base64.b64decode(secret["data"]["token"]).decode()
        port = free_port()
        port_forward = subprocess.Popen(
            [str(bin_dir() / "kubectl"), "port-forward", "-n", ns, f"pod/{controller['metadata']['name']}",
             f"{port}:8080", "--address", "127.0.0.1"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cluster.env())
        line = port_forward.stdout.readline()  # "Forwarding from 127.0.0.1:<port> -> 8080" once listening
        assert "Forwarding from" in line, line + port_forward.stdout.read() if port_forward.poll() is not None else line
        status_code, body = _get(f"http://127.0.0.1:{port}/metrics", token)
        assert status_code == 200
        for metric in ("elastic_jax_step", "elastic_jax_active_slices", "elastic_jax_goodput_ratio"):
            assert metric in body, body[:2000]
        assert _get(f"http://127.0.0.1:{port}/metrics", None)[0] == 401
        assert _get(f"http://127.0.0.1:{port}/metrics", "not-the-token")[0] == 401
    finally:
        if port_forward is not None:
            port_forward.kill()
            port_forward.wait(timeout=30)
        cluster.kubectl("delete", "ejob", "--all", "-n", ns, "--wait=true", check=False, timeout_s=180)
        cluster.kubectl("delete", "priorityclass", priority, check=False)
        _allow(cluster, operator, [])
