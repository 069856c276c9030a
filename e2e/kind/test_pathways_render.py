"""The pathways backend's objects against the kind cluster's API server and JobSet webhooks.

No TPUs or Pathways images exist here, so nothing trains. What is real: a
server-side dry run (`kubectl apply --dry-run=server`) of every child the
operator renders for a pathways job (Secret, ConfigMap, the controller's
Service and the Pathways head's headless Service, controller Pod with native
sidecars and the resource manager's startupProbe, one JobSet per slice), in a namespace enforcing
PodSecurity ``baseline`` (Google's Pathways images run as root, so the
Pathways controller pod meets ``baseline``, not ``restricted``; TPU workers
need ``hostNetwork``: docs/security.md): the API
server's validation and admission, the JobSet CRD schema and its mutating and
validating webhooks. Scheduling onto
TPU node pools needs nodes that advertise ``google.com/tpu``:
``e2e/test_pathways_tpu_pools.py`` on the local control plane.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from e2e.kind import demo

from elastic_jax.api.manifest import parse_manifest
from elastic_jax.k8s_operator import backends, children

# The first test of a session also pays for what its fixtures build (images, node
# image, cluster, chart: up to ~30 min on a fresh machine under load).
pytestmark = pytest.mark.timeout(3600)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "02-tpu-v5e-pathways.yaml"


def _example() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


@pytest.fixture
def namespace(cluster):
    """A namespace enforcing PodSecurity ``baseline`` (what the Pathways controller pod meets), deleted afterwards."""
    name = demo.restricted_namespace(cluster.kind, "pw", profile="baseline")
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def _children(manifest: dict, namespace: str) -> list[dict]:
    manifest = {**manifest, "metadata": {**manifest["metadata"], "namespace": namespace}}
    return children.render_children(backends.resolve(parse_manifest(manifest)), token="dry-run-token")


def _dry_run(cluster, namespace: str, objs: list[dict]):
    return cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-",
                           input=yaml.safe_dump_all(objs, sort_keys=False), check=False)


@pytest.mark.parametrize("accelerator, topology", [
    ("tpu-v5-lite-podslice", "2x2"), ("tpu-v5p-slice", "2x2x2"), ("tpu-v6e-slice", "4x4"), ("tpu7x", "2x2x1"),
])
def test_rendered_children_pass_server_side_validation(cluster, namespace, accelerator, topology):
    manifest = _example()
    manifest["spec"]["slices"].update(accelerator=accelerator, topology=topology)
    objs = _children(manifest, namespace)
    # the controller's Service and the Pathways head's headless one (publishNotReadyAddresses)
    assert [o["kind"] for o in objs] == ["Secret", "ConfigMap", "Service", "Service", "Pod", "JobSet", "JobSet"]
    result = _dry_run(cluster, namespace, objs)
    assert result.returncode == 0, result.stderr
    for o in objs:
        assert f'{o["metadata"]["name"]} created (server dry run)' in result.stdout, result.stdout


@pytest.mark.parametrize("kind, break_it, message", [
    # a native sidecar's restartPolicy may only be Always: proves init containers are validated
    ("Pod", lambda o: o["spec"]["initContainers"][0].update(restartPolicy="Sometimes"), "restartPolicy"),
    # the JobSet schema from its CRD
    ("JobSet", lambda o: o["spec"]["replicatedJobs"][0].update(replicas="two"), "replicas"),
])
def test_dry_run_does_refuse_a_broken_object(cluster, namespace, kind, break_it, message):
    obj = next(o for o in _children(_example(), namespace) if o["kind"] == kind)
    break_it(obj)
    result = _dry_run(cluster, namespace, [obj])
    assert result.returncode != 0 and message in result.stderr, result.stderr
