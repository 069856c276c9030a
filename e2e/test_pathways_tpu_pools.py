"""The pathways backend on simulated TPU node pools (the local control plane's node agents).

No TPUs or Pathways images exist here, so nothing trains. kind cannot give a
node the GKE TPU pool labels and ``google.com/tpu`` capacity the scheduler
needs without changing the nodes every other kind test uses; the node agent
simulates four such pools. (The server-side dry run of every rendered child is
``e2e/kind/test_pathways_render.py``.) What is real here:

- the operator accepting `backend: pathways`: with examples/02 it creates
  the Pathways head (the controller pod with its resource-manager sidecar)
  and no slice JobSet until that resource manager listens (issue 10 item 5:
  workers are started after their head). The head asks for more CPU than
  the simulated CPU pool has, so it stays Pending: the job says so in its
  PodsNotStarting condition, and no JobSet appears.
- the slice JobSets the operator then creates (rendered here by its renderer,
  annotated with the head incarnation, as `reconcile.decide` does once the
  resource manager started): the scheduler puts each slice's worker on a TPU
  pool (node selectors, the `google.com/tpu` limit and its toleration), with
  the JobSet webhook's exclusive-placement rules per node pool, while the
  controller pod stays off TPU nodes. (The head's networking on a real
  kubelet, with stand-ins: ``e2e/kind/test_pathways_standin.py``; the whole
  job driven by the operator, with stand-ins on simulated pools:
  ``e2e/test_pathways_operator.py``.) (An accelerator the operator does not
  know fails the job with a condition naming `spec.slices.accelerator`:
  test_operator_invalid.py.)
"""

from __future__ import annotations

from pathlib import Path

import yaml

from e2e.helpers import wait_for
from e2e.operator_fixtures import ejob_crd, get_job, operator, operator_kubeconfig  # noqa: F401  (fixtures)

from elastic_jax import contract
from elastic_jax.api import labels
from elastic_jax.api.manifest import parse_manifest
from elastic_jax.k8s_operator import backends
from elastic_jax.k8s_operator.backends import pathways

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "02-tpu-v5e-pathways.yaml"


def _example() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def _pods(cluster, namespace: str, selector: str) -> list[dict]:
    return cluster.api().get(f"/api/v1/namespaces/{namespace}/pods", labelSelector=selector)["items"]


def test_operator_creates_tpu_slices_on_tpu_pools(cluster, namespace, operator):
    manifest = _example()
    result = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest), check=False)
    assert result.returncode == 0, result.stderr
    name = manifest["metadata"]["name"]
    explain = lambda: yaml.safe_dump(get_job(cluster, namespace, name).get("status"))[:2000]  # noqa: E731

    def head_not_starting():
        conds = (get_job(cluster, namespace, name).get("status") or {}).get("conditions") or []
        return next((c for c in conds if c["type"] == "PodsNotStarting" and c["status"] == "True"), None)
    cond = wait_for(head_not_starting, timeout_s=60, what="PodsNotStarting for the Pathways head", explain=explain)
    assert "controller-0" in cond["message"], cond
    # The start order: no worker before its head's resource manager listens.
    jobsets = cluster.api().get(contract.jobsets_path(namespace))["items"]
    assert jobsets == [], [j["metadata"]["name"] for j in jobsets]

    # What the operator creates next, once the resource manager listens (rendered by its renderer).
    job = backends.resolve(parse_manifest({**manifest, "metadata": {**manifest["metadata"], "namespace": namespace}}))
    for i in range(job.spec.slices.count):
        js = pathways.PathwaysRenderer().worker_jobset(job, i)
        js["metadata"]["annotations"][labels.PATHWAYS_HEAD] = pathways.head_incarnation(f"{name}-controller-0", 0)
        result = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(js), check=False)
        assert result.returncode == 0, result.stderr

    def scheduled_workers():
        pods = [p for p in _pods(cluster, namespace, f"elasticjax.dev/job-name={name},elasticjax.dev/role=worker")
                if p["spec"].get("nodeName")]
        by_slice = {p["metadata"]["labels"]["elasticjax.dev/slice-index"]: p for p in pods}
        return by_slice if set(by_slice) == {"0", "1"} else None
    workers = wait_for(scheduled_workers, timeout_s=60, what="both slices' workers bound to nodes", explain=explain)
    for p in workers.values():
        assert p["spec"]["nodeName"].startswith("tpu-pool-"), p["spec"]["nodeName"]
        assert p["spec"]["containers"][0]["resources"]["limits"]["google.com/tpu"] == "4"
        # Exclusive placement, as injected by the JobSet webhook. Which pools the two
        # slices get is not asserted here (test_jobset.py shows the exclusivity with pods
        # that run; the workers here are stand-ins whose head never starts).
        (term,) = p["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == "cloud.google.com/gke-nodepool"

    job = get_job(cluster, namespace, name)
    assert (job.get("status") or {}).get("phase") != "Failed", job.get("status")
    (controller,) = _pods(cluster, namespace, f"elasticjax.dev/job-name={name},elasticjax.dev/role=controller")[:1]
    assert [c["name"] for c in controller["spec"]["initContainers"]] == ["pathways-rm", "pathways-proxy"]
    # Off the TPU pools: either on the CPU pool or, here, Pending, as the Pathways head
    # asks more CPU than the simulated pool's 8 per node.
    node = controller["spec"].get("nodeName") or ""
    assert not node.startswith("tpu-pool-"), node

