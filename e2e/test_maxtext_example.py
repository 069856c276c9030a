"""examples/03-maxtext-pathways.yaml (MaxText as the controller command) against a real API server.

No TPUs, Pathways or MaxText image exist here, so nothing trains. What is real:
the API server's validation of the job itself (the CRD schema and its CEL
rules) and a server-side dry run (`kubectl apply --dry-run=server`) of every
child the operator renders for it (Secret, ConfigMap, the two Services, the
controller Pod running `python -m elastic_jax.run_module maxtext...` with the
Pathways head as native sidecars, one JobSet per slice against the JobSet CRD
schema), in a namespace enforcing PodSecurity ``baseline`` (what Google's root
Pathways images meet: docs/security.md). The same dry run of examples/02 on kind,
with the JobSet webhooks: ``e2e/kind/test_pathways_render.py``.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from e2e.operator_fixtures import ejob_crd  # noqa: F401  (fixture)

from elastic_jax.api.manifest import parse_manifest
from elastic_jax.k8s_operator import backends, children

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "03-maxtext-pathways.yaml"


def _dry_run(cluster, namespace: str, objs: list[dict]):
    return cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-",
                           input=yaml.safe_dump_all(objs, sort_keys=False), check=False)


def test_maxtext_job_and_its_children_pass_server_side_validation(cluster, namespace, ejob_crd):  # noqa: F811
    cluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=baseline")
    manifest = yaml.safe_load(EXAMPLE.read_text())
    result = _dry_run(cluster, namespace, [manifest])
    assert result.returncode == 0, result.stderr
    assert f'{manifest["metadata"]["name"]} created (server dry run)' in result.stdout, result.stdout

    job = parse_manifest({**manifest, "metadata": {**manifest["metadata"], "namespace": namespace}})
    objs = children.render_children(backends.resolve(job), token="dry-run-token")
    assert [o["kind"] for o in objs] == ["Secret", "ConfigMap", "Service", "Service", "Pod", "JobSet", "JobSet"]
    pod = next(o for o in objs if o["kind"] == "Pod")
    assert pod["spec"]["containers"][0]["command"] == ["python", "-m", "elastic_jax.run_module"]
    result = _dry_run(cluster, namespace, objs)
    assert result.returncode == 0, result.stderr
    for o in objs:
        assert f'{o["metadata"]["name"]} created (server dry run)' in result.stdout, result.stdout


def test_baseline_namespace_does_refuse_what_it_should(cluster, namespace):
    # The dry run above can fail: the same Pod with a privileged container is refused by PodSecurity.
    cluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=baseline")
    manifest = yaml.safe_load(EXAMPLE.read_text())
    job = parse_manifest({**manifest, "metadata": {**manifest["metadata"], "namespace": namespace}})
    pod = next(o for o in children.render_children(backends.resolve(job), token="t") if o["kind"] == "Pod")
    pod["spec"]["containers"][0]["securityContext"]["privileged"] = True
    result = _dry_run(cluster, namespace, [pod])
    assert result.returncode != 0 and "privileged" in result.stderr, result.stdout + result.stderr
