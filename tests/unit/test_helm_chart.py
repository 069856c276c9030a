"""The Helm chart (helm/elastic-jax): lint, render, Kubernetes schemas, values schema.

Uses the real `helm` the e2e build produces (e2e/build.sh, a no-op when up to
date; CI builds it for the e2e suite anyway): marked ``go_binaries``, so these
tests run after the rest of tests/, while the build runs in the background. Rendered objects are checked
field by field against the Kubernetes OpenAPI models (tests/support/kube_models);
e2e/kind/test_helm_install.py adds the API server's dry run and a real install.
"""

from __future__ import annotations

import base64
import functools
import json
import shutil
import subprocess

import pytest
import yaml

from elastic_jax import __version__
from elastic_jax import contract
from elastic_jax.api import images
from elastic_jax.k8s_operator import network_policies
from e2e.harness.paths import REPO_ROOT, bin_dir
from tests.support.kube_models import validate

CHART = REPO_ROOT / "helm" / "elastic-jax"
KUBE_VERSION = "1.35.4"  # the local control plane's version (e2e/localcluster/go.mod)
RELEASE, NAMESPACE = "ej", "elastic-jax-system"

pytestmark = pytest.mark.go_binaries

# Value sets that switch every template branch on.
VARIANTS = {
    "defaults": [],
    "namespaced+servicemonitor": ["--set", "watchNamespaces={team-a,team-b}",
                                  "--set", "metrics.serviceMonitor.enabled=true",
                                  "--set", "metrics.grafanaDashboard.enabled=true",
                                  "--set", "serviceAccount.annotations.iam\\.gke\\.io/gcp-service-account=op@p.iam.gserviceaccount.com",
                                  "--set", "imagePullSecrets[0].name=regcred", "--set", "operator.verbose=true",
                                  "--set", "nodeSelector.cloud\\.google\\.com/gke-nodepool=cpu-pool"],
    "no-peering, existing account": ["--set", "peering.enabled=false", "--set", "serviceAccount.create=false",
                                     "--set", "serviceAccount.name=ops", "--set", "rbac.create=false",
                                     "--set", "metrics.service.enabled=false", "--set", "operatorKey.existingSecret=ops-key"],
}


@pytest.fixture(scope="module")
def helm() -> str:
    path = bin_dir() / "helm"
    if not path.exists():
        if shutil.which("go") is None:
            pytest.skip(f"no {path} and no Go toolchain to build it (e2e/build.sh)")
        from e2e.harness.build import ensure_built
        ensure_built()
    return str(path)


def run_helm(helm: str, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([helm, *args], capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc


def render(helm: str, *values: str, crds: bool = False) -> list[dict]:
    out = run_helm(helm, "template", RELEASE, str(CHART), "-n", NAMESPACE, "--kube-version", KUBE_VERSION,
                   *(["--include-crds"] if crds else []), *values).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def operator_args(helm: str, *values: str) -> list[str]:
    """The operator container's args as the chart renders them with `values` (helm flags)."""
    return by_kind(render(helm, *values), "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]


def test_lint_strict(helm):
    for values in VARIANTS.values():
        proc = run_helm(helm, "lint", str(CHART), "--strict", "--kube-version", KUBE_VERSION, *values)
        assert "0 chart(s) failed" in proc.stdout, proc.stdout


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_rendered_objects_match_the_kubernetes_schemas(helm, variant):
    docs = render(helm, *VARIANTS[variant], crds=True)
    checked = 0
    for doc in docs:
        if doc["apiVersion"].startswith(("kopf.dev/", "monitoring.coreos.com/")):
            continue  # custom resources: checked against their CRDs in the e2e dry run
        assert validate(doc) == [], doc["kind"]
        checked += 1
    assert checked >= 3


def test_validator_catches_unknown_fields_and_wrong_types(helm):
    (deployment,) = by_kind(render(helm), "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["imagePullPolice"] = "Always"
    container["ports"][0]["containerPort"] = "9090"
    problems = validate(deployment)
    assert any("imagePullPolice: unknown field of V1Container" in p for p in problems), problems
    assert any("containerPort: expected an integer" in p for p in problems), problems


def test_default_objects(helm):
    docs = render(helm)
    assert sorted(d["kind"] for d in docs) == sorted(
        ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "ClusterKopfPeering", "Service", "Deployment", "Secret"])
    (deployment,) = by_kind(docs, "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 1 and spec["strategy"] == {"type": "Recreate"}
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == images.OPERATOR_IMAGE, "chart default = elastic_jax.api.images.OPERATOR_IMAGE"
    assert container["imagePullPolicy"] == "IfNotPresent"
    assert pod["serviceAccountName"] == by_kind(docs, "ServiceAccount")[0]["metadata"]["name"]
    assert container["resources"]["requests"] == {"cpu": "100m", "memory": "256Mi"}
    (service,) = by_kind(docs, "Service")
    assert service["spec"]["selector"] == spec["selector"]["matchLabels"]
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    assert {p["name"] for p in container["ports"]} == {"metrics", "health"}


def test_pod_meets_pod_security_restricted(helm):
    # The checks of the "restricted" PodSecurity profile (the e2e install also
    # runs the API server's admission with enforce=restricted).
    (deployment,) = by_kind(render(helm), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    sc, psc = container["securityContext"], pod["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert psc["runAsNonRoot"] is True and psc["runAsUser"] != 0
    assert psc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert all(not v.get("hostPath") for v in pod.get("volumes", []))
    assert not pod.get("hostNetwork") and not pod.get("hostPID")


def test_rbac_is_the_operator_rules_file(helm):
    rules = yaml.safe_load((CHART / "files" / "operator-rbac-rules.yaml").read_text())
    docs = render(helm)
    (role,) = by_kind(docs, "ClusterRole")
    assert role["rules"] == rules
    (binding,) = by_kind(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": f"{RELEASE}-elastic-jax", "namespace": NAMESPACE}]


def test_peering_and_namespaces(helm):
    docs = render(helm, *VARIANTS["namespaced+servicemonitor"])
    (deployment,) = by_kind(docs, "Deployment")
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--peering=ej-elastic-jax" in args and "--priority=auto" in args
    assert [a for a in args if a.startswith("--namespace=")] == ["--namespace=team-a", "--namespace=team-b"]
    # Namespaced: one KopfPeering and one RoleBinding per watched namespace, no cluster-wide binding.
    assert sorted(p["metadata"]["namespace"] for p in by_kind(docs, "KopfPeering")) == ["team-a", "team-b"]
    assert sorted(b["metadata"]["namespace"] for b in by_kind(docs, "RoleBinding")) == ["team-a", "team-b"]
    assert not by_kind(docs, "ClusterKopfPeering")
    # ... except for nodes (cluster-scoped, so a RoleBinding cannot grant them): the rules file's
    # node rule alone, read only, through the one cluster-wide binding (issue 9 item 5).
    (binding,) = by_kind(docs, "ClusterRoleBinding")
    roles = {r["metadata"]["name"]: r for r in by_kind(docs, "ClusterRole")}
    file_rules = yaml.safe_load((CHART / "files" / "operator-rbac-rules.yaml").read_text())
    assert roles[binding["roleRef"]["name"]]["rules"] == [r for r in file_rules if "nodes" in r["resources"]] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]
    assert all(b["roleRef"]["name"] != binding["roleRef"]["name"] for b in by_kind(docs, "RoleBinding"))
    (monitor,) = by_kind(docs, "ServiceMonitor")
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"

    default_args = by_kind(render(helm), "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    (peering,) = by_kind(render(helm), "ClusterKopfPeering")
    assert f"--peering={peering['metadata']['name']}" in default_args
    assert not [a for a in default_args if a.startswith("--namespace")]

    plain = render(helm, *VARIANTS["no-peering, existing account"])
    assert sorted(d["kind"] for d in plain) == ["Deployment"]
    args = plain[0]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not [a for a in args if a.startswith("--peering")]
    assert plain[0]["spec"]["template"]["spec"]["serviceAccountName"] == "ops"


@pytest.mark.parametrize(("values", "message"), [
    (["--set", "image.pullPolicy=Sometimes"], "/image/pullPolicy"),
    (["--set", "metrics.port=70000"], "/metrics/port"),
    (["--set", "resources.requests.cpu=lots"], "/resources/requests/cpu"),
    (["--set", "watchNamespaces={Team_A}"], "/watchNamespaces/0"),
    (["--set", "operator.logFormat=xml"], "/operator/logFormat"),
    (["--set", "replicaCount=2"], "additional properties 'replicaCount' not allowed"),
    (["--set", "peering.enabled=yes"], "/peering/enabled"),
    (["--set", "metrics.grafanaDashboard.enabled=yes"], "/metrics/grafanaDashboard/enabled"),
    (["--set", "metrics.grafanaDashboard.namespace=Team_A"], "/metrics/grafanaDashboard/namespace"),
    (["--set", "fullnameOverride=UPPER_case"], "/fullnameOverride"),
    (["--set", "podSecurityContext.runAsUser=0"], "/podSecurityContext/runAsUser"),
])
def test_wrong_values_fail_the_schema(helm, values, message):
    proc = run_helm(helm, "template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION, *values, check=False)
    assert proc.returncode != 0
    assert "values don't meet the specifications of the schema" in proc.stderr, proc.stderr
    assert message in proc.stderr, proc.stderr


def test_grafana_dashboard_configmap_carries_the_dashboard_json_with_the_sidecar_label(helm):
    import json

    assert not by_kind(render(helm), "ConfigMap"), "the dashboard is off by default"
    (cm,) = by_kind(render(helm, "--set", "metrics.grafanaDashboard.enabled=true"), "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1" and cm["metadata"]["namespace"] == NAMESPACE
    assert json.loads(cm["data"]["elastic-jax.json"]) == json.loads(
        (CHART / "dashboards" / "elastic-jax.json").read_text())
    (elsewhere,) = by_kind(render(helm, "--set", "metrics.grafanaDashboard.enabled=true",
                                  "--set", "metrics.grafanaDashboard.namespace=monitoring",
                                  "--set", "metrics.grafanaDashboard.annotations.grafana_folder=ml"), "ConfigMap")
    assert elsewhere["metadata"]["namespace"] == "monitoring"
    assert elsewhere["metadata"]["annotations"] == {"grafana_folder": "ml"}


def test_service_monitor_needs_the_service(helm):
    proc = run_helm(helm, "template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION,
                    "--set", "metrics.serviceMonitor.enabled=true", "--set", "metrics.service.enabled=false",
                    check=False)
    assert proc.returncode != 0 and "needs metrics.service.enabled" in proc.stderr


def test_health_and_metrics_ports_must_differ(helm):
    proc = run_helm(helm, "template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION,
                    "--set", "operator.healthPort=9090", "--set", "metrics.port=9090", check=False)
    assert proc.returncode != 0 and "operator.healthPort and metrics.port must differ" in proc.stderr


def test_chart_crd_is_the_generated_crd():
    # Helm installs crds/ before the templates; it must be the generated file
    # (python -m elastic_jax.api.crd), byte for byte.
    generated = REPO_ROOT / "crds" / "elastictrainingjobs.yaml"
    copy = CHART / "crds" / "elastictrainingjobs.yaml"
    assert copy.read_text() == generated.read_text(), f"stale chart CRD: cp {generated} {copy}"


def test_chart_versions_follow_the_package():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == __version__
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert f"{values['image']['repository']}:{chart['appVersion']}" == images.OPERATOR_IMAGE


def test_node_lost_seconds_reaches_the_operator_and_zero_is_kept(helm):
    args = functools.partial(operator_args, helm)
    assert "--node-lost-seconds=30" in args()
    assert "--node-lost-seconds=0" in args("--set", "operator.nodeLostSeconds=0")  # 0 (off) is not "unset"
    proc = run_helm(helm, "template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION,
                    "--set", "operator.nodeLostSeconds=-5", check=False)
    assert proc.returncode != 0 and "/operator/nodeLostSeconds" in proc.stderr, proc.stderr


def test_nodes_are_read_only(helm):
    (role,) = by_kind(render(helm), "ClusterRole")
    (rule,) = [r for r in role["rules"] if "nodes" in r["resources"]]
    assert rule == {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}


def test_operator_reads_no_secret_and_mounts_its_key(helm):
    # Issue 9, item 15: no get/list/watch on Secrets anywhere; create only.
    docs = render(helm)
    (role,) = by_kind(docs, "ClusterRole")
    for rule in role["rules"]:
        if "secrets" in rule["resources"]:
            assert rule["verbs"] == ["create"], rule
    (key,) = [d for d in by_kind(docs, "Secret") if d["metadata"]["name"].endswith("-operator-key")]
    assert key["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert len(base64.b64decode(key["data"]["key"])) >= 32
    pod = by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert env[contract.ENV_OPERATOR_KEY_FILE] == mounts["operator-key"] + "/key"
    assert volumes["operator-key"]["secret"]["secretName"] == key["metadata"]["name"]
    # Bring your own key: the chart creates none and mounts that one.
    docs = render(helm, "--set", "operatorKey.existingSecret=my-key")
    assert not [d for d in by_kind(docs, "Secret") if d["metadata"]["name"].endswith("-operator-key")]
    pod = by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]
    assert {v["name"]: v for v in pod["volumes"]}["operator-key"]["secret"]["secretName"] == "my-key"


def _control_api_from(docs) -> list | None:
    env = {e["name"]: e for e in by_kind(docs, "Deployment")[0]["spec"]["template"]["spec"]["containers"][0]["env"]}
    return json.loads(env[contract.ENV_CONTROL_API_FROM]["value"]) if contract.ENV_CONTROL_API_FROM in env else None


def test_the_operator_is_told_who_reaches_control_apis_so_every_job_gets_network_policies(helm):
    """The chart makes no NetworkPolicy itself (they are per job, made by the operator, in any namespace):
    it tells the operator the peers of the control API, its own pods first, by default and cluster-wide."""
    docs = render(helm)
    assert by_kind(docs, "NetworkPolicy") == []
    operator_labels = by_kind(docs, "Deployment")[0]["spec"]["selector"]["matchLabels"]
    peers = _control_api_from(docs)
    assert peers == [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}},
                      "podSelector": {"matchLabels": operator_labels}}]
    assert network_policies.parse_peers(json.dumps(peers)) == peers  # what the operator accepts at startup
    prometheus = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    docs = render(helm, "--set-json", f"networkPolicy.controlApiFrom=[{json.dumps(prometheus)}]")
    assert _control_api_from(docs) == [*peers, prometheus]
    assert _control_api_from(render(helm, "--set", "networkPolicy.enabled=false")) is None
    # The retired per-namespace setting is refused by the schema, not silently ignored.
    with pytest.raises(AssertionError, match="namespaces"):
        render(helm, "--set", "networkPolicy.namespaces={team-a}")
    # A peer the operator would refuse at startup (a crash loop) is refused by `helm install` instead.
    for bad in ({"podselector": {}}, {}, {"podSelector": {"app": "x"}}):
        with pytest.raises(AssertionError, match="controlApiFrom"):
            render(helm, "--set-json", f"networkPolicy.controlApiFrom=[{json.dumps(bad)}]")


def test_controller_service_accounts_reach_the_operator_and_bad_entries_fail_the_schema(helm):
    args = functools.partial(operator_args, helm)
    # None allowed by default: no flag, the operator's empty policy.
    assert not [a for a in args() if a.startswith("--allowed-")]
    got = args("--set", "controllerServiceAccounts.allowed={ml/trainer,ml/reader}",
               "--set", "controllerServiceAccounts.allowTokenMount={ml/api-user}")
    assert "--allowed-service-accounts=ml/trainer,ml/reader" in got
    assert "--allowed-token-service-accounts=ml/api-user" in got
    proc = run_helm(helm, "template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION,
                    "--set", "controllerServiceAccounts.allowed={trainer}", check=False)
    assert proc.returncode != 0 and "/controllerServiceAccounts/allowed/0" in proc.stderr, proc.stderr


def test_pod_field_allow_lists_reach_the_operator_and_bad_entries_fail_the_schema(helm):
    args = functools.partial(operator_args, helm)
    # Nothing allowed by default: no flag, the operator's safe defaults (docs/security.md).
    assert not [a for a in args() if a.startswith("--allowed-")]
    got = args("--set", "podFields.priorityClassNames={training-low,training-high}",
               "--set", "podFields.tolerationKeys={ml-pool}",
               "--set", "podFields.imagePullSecrets={ml/registry,ml2/*}",
               "--set", "podFields.compilationCacheClaims={ml/xla-cache}")
    assert "--allowed-priority-classes=training-low,training-high" in got
    assert "--allowed-toleration-keys=ml-pool" in got
    assert "--allowed-image-pull-secrets=ml/registry,ml2/*" in got
    assert "--allowed-compilation-cache-claims=ml/xla-cache" in got
    for value in ("podFields.imagePullSecrets={registry}", "podFields.compilationCacheClaims={xla-cache}"):
        proc = run_helm(helm, "template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION, "--set", value,
                        check=False)
        assert proc.returncode != 0 and f"/{value.split('=')[0].replace('.', '/')}/0" in proc.stderr, proc.stderr


def test_pod_listen_address_reaches_the_operator_as_a_word(helm):
    args = functools.partial(operator_args, helm)
    assert "--pod-listen-address=all" in args()
    assert "--pod-listen-address=pod-ip" in args("--set", "operator.podListenAddress=pod-ip")
    proc = run_helm(helm, "template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION,
                    "--set", "operator.podListenAddress=$(POD_IP)", check=False)
    assert proc.returncode != 0 and "/operator/podListenAddress" in proc.stderr, proc.stderr


def test_denied_namespaces_reach_the_operator_with_the_release_namespace(helm, tmp_path):
    args = functools.partial(operator_args, helm)
    # By default: the cluster's own namespaces and the release's (where the operator key Secret lives).
    assert f"--denied-namespaces=kube-system,kube-public,kube-node-lease,{NAMESPACE}" in args()
    assert "--denied-namespaces=ops" in args("--set", "deniedNamespaces={ops}", "--set", "denyReleaseNamespace=false")
    # An empty list with the release namespace off: the flag with nothing (none denied), not the operator's default.
    (tmp_path / "none.yaml").write_text("deniedNamespaces: []\ndenyReleaseNamespace: false\n")
    assert "--denied-namespaces=" in args("-f", str(tmp_path / "none.yaml"))
    # Values reused from a release without the key (`helm upgrade --reuse-values`): the operator's default.
    assert not [a for a in args("--set", "deniedNamespaces=null") if a.startswith("--denied-namespaces")]
    assert f"--denied-namespaces={NAMESPACE}" in args("--set", f"deniedNamespaces={{{NAMESPACE}}}")  # once
    proc = run_helm(helm, "template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION,
                    "--set", "deniedNamespaces={Kube_System}", check=False)
    assert proc.returncode != 0 and "/deniedNamespaces/0" in proc.stderr, proc.stderr


def test_checkpoint_prefixes_reach_the_operator_and_bad_entries_fail_the_schema(helm, tmp_path):
    args = functools.partial(operator_args, helm)
    # None by default: any location (the residual risk docs/security.md names).
    assert not [a for a in args() if a.startswith("--checkpoint-prefixes")]
    (tmp_path / "prefixes.yaml").write_text("checkpointPrefixes: ['gs://ml-ckpt/{namespace}/', gs://shared-ro]\n")
    got = args("-f", str(tmp_path / "prefixes.yaml"))
    assert "--checkpoint-prefixes=gs://ml-ckpt/{namespace}/,gs://shared-ro" in got
    proc = run_helm(helm, "template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION,
                    "--set", "checkpointPrefixes={s3://b/x}", check=False)
    assert proc.returncode != 0 and "/checkpointPrefixes/0" in proc.stderr, proc.stderr


@pytest.mark.parametrize("typo", ["gs:/bucket", "gcs://bucket/x", "gs://bucket//x", "gs://b/../x", "gs://b/./x",
                                  "gs://Bucket/x", "gs://b./x"])
def test_a_checkpoint_prefix_typo_fails_the_schema_as_the_operator_refuses_it(helm, typo):
    """New-user trial: `gs://bucket//x` (and the like) rendered into the Deployment, and the operator then refused
    its flag at start (a crash loop after `helm install` had succeeded). The schema carries the operator's own
    pattern (`checkpoint_prefixes.TEMPLATE_PATTERN`) and its rule in the description."""
    from elastic_jax.k8s_operator import checkpoint_prefixes

    schema = json.loads((CHART / "values.schema.json").read_text())["properties"]["checkpointPrefixes"]
    assert schema["items"]["pattern"] == checkpoint_prefixes.TEMPLATE_PATTERN
    assert checkpoint_prefixes.TEMPLATE_RULE in schema["description"]
    proc = run_helm(helm, "template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION,
                    "--set", f"checkpointPrefixes[0]={typo}", check=False)
    assert proc.returncode != 0 and "/checkpointPrefixes/0" in proc.stderr, proc.stderr
    with pytest.raises(ValueError, match="is not gs://bucket"):
        checkpoint_prefixes.parse_templates(typo)
