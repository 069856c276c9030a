"""helm (built from helm.sh/helm/v3) installs and uninstalls a chart on the cluster."""

from __future__ import annotations

import json


def test_helm_install_and_uninstall(cluster, namespace, tmp_path):
    chart = tmp_path / "demo"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: demo\nversion: 0.1.0\nkubeVersion: '>=1.30.0-0'\n")
    (chart / "values.yaml").write_text("slices: 2\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: {{ .Release.Name }}-settings}\n"
        "data: {slices: {{ .Values.slices | quote }}}\n")
    cluster.helm("install", "demo", str(chart), "-n", namespace, "--set", "slices=3", "--wait")
    cm = json.loads(cluster.kubectl("get", "configmap", "demo-settings", "-n", namespace, "-o", "json").stdout)
    assert cm["data"] == {"slices": "3"}
    assert cm["metadata"]["annotations"]["meta.helm.sh/release-name"] == "demo"
    releases = json.loads(cluster.helm("list", "-n", namespace, "-o", "json").stdout)
    assert [r["name"] for r in releases] == ["demo"] and releases[0]["status"] == "deployed"
    cluster.helm("uninstall", "demo", "-n", namespace, "--wait")
    gone = cluster.kubectl("get", "configmap", "demo-settings", "-n", namespace, check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr
