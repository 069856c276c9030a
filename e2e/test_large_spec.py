"""A job with a large spec is handled like any other: status written, and `kubectl delete` completes.

kopf's diff-base used to copy the whole spec into an annotation: a spec over ~128 KiB (kubectl's own
last-applied copy made two) passed the API server's create and then every later patch was refused
("metadata.annotations: Too long: may not be more than 262144 bytes"). Status froze and the finalizer
could never be removed, so `kubectl delete` hung: a tenant could leave undeletable objects. Now kopf
keeps only a small "creation handled" marker (`main.HandledMarkerDiffBase`).

Both ways a user applies such a spec: `kubectl apply` (client side, its last-applied annotation holds
one copy: ~150 KiB here) and `kubectl apply --server-side` (no copy: ~300 KiB). A suspended job is
enough: no pods, and each reconcile pass still writes its status.
"""

from __future__ import annotations

import json

import yaml

from e2e.helpers import wait_for
from e2e.operator_fixtures import (  # noqa: F401  (fixtures)
    ejob_crd, example_manifest, get_job, operator, operator_kubeconfig, wait_phase,
)
from elastic_jax.api import labels


def _large_job(name: str, config_bytes: int) -> dict:
    manifest = example_manifest()
    manifest["metadata"]["name"] = name
    manifest["spec"]["suspend"] = True
    trainer = manifest["spec"].setdefault("controller", {}).setdefault("trainer", {})
    trainer.setdefault("config", {})["notes"] = ["x" * 999 for _ in range(config_bytes // 1000)]
    return manifest


def _annotation_bytes(job: dict) -> int:
    return sum(len(k) + len(v) for k, v in (job["metadata"].get("annotations") or {}).items())


def test_a_large_spec_job_gets_status_and_deletes(cluster, namespace, operator):
    for name, apply_args, size in (("big-client", (), 150_000), ("big-server", ("--server-side",), 300_000)):
        manifest = _large_job(name, size)
        result = cluster.kubectl("apply", *apply_args, "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest),
                                 check=False)
        assert result.returncode == 0, result.stderr
        job = wait_phase(cluster, namespace, name, ("Suspended",), timeout_s=120,
                         explain=lambda: operator.log()[-3000:])
        assert job["status"].get("conditions"), job["status"]
        own = {k: v for k, v in job["metadata"]["annotations"].items() if k.startswith("elasticjax.dev/")}
        assert sum(len(k) + len(v) for k, v in own.items()) < 1000, own  # no copy of the spec
        assert _annotation_bytes(job) < 262144

        result = cluster.kubectl("delete", "-n", namespace, "elastictrainingjob", name, "--wait=false", check=False)
        assert result.returncode == 0, result.stderr

        def gone():
            listed = cluster.api().get(f"/apis/elasticjax.dev/v1alpha1/namespaces/{namespace}/elastictrainingjobs")
            return name not in [j["metadata"]["name"] for j in listed["items"]]
        wait_for(gone, timeout_s=120, what=f"job {name} deleted (finalizer removed)", interval_s=0.5,
                 explain=lambda: operator.log()[-3000:])
    assert "Too long" not in operator.log()


def test_a_job_whose_kubectl_copy_leaves_no_room_for_the_operators_annotations_still_deletes(cluster, namespace,
                                                                                             operator):
    """Plain `kubectl apply` of a job just under the annotations limit: the operator's own few annotations
    (claim, kopf's marker) may not fit (`validate --cluster` warns). Whatever the operator can write, the
    finalizer's removal patch adds no annotation, so `kubectl delete` completes."""
    from elastic_jax.api.size_limits import ANNOTATIONS_MAX_BYTES, OPERATOR_ANNOTATIONS_RESERVE_BYTES

    manifest = _large_job("big-edge", 1000)
    base = len(json.dumps(manifest, separators=(",", ":")))
    manifest["spec"]["controller"]["trainer"]["config"]["pad"] = "p" * (ANNOTATIONS_MAX_BYTES - 700 - base)
    result = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest), check=False)
    assert result.returncode == 0, result.stderr
    job = get_job(cluster, namespace, "big-edge")
    copy = job["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
    assert len(copy) > ANNOTATIONS_MAX_BYTES - OPERATOR_ANNOTATIONS_RESERVE_BYTES, len(copy)

    def finalized():
        return labels.FINALIZER in (get_job(cluster, namespace, "big-edge")["metadata"].get("finalizers") or [])
    wait_for(finalized, timeout_s=120, what="the operator's finalizer on big-edge", interval_s=0.5,
             explain=lambda: operator.log()[-3000:])
    result = cluster.kubectl("delete", "-n", namespace, "elastictrainingjob", "big-edge", "--wait=false", check=False)
    assert result.returncode == 0, result.stderr

    def gone():
        listed = cluster.api().get(f"/apis/elasticjax.dev/v1alpha1/namespaces/{namespace}/elastictrainingjobs")
        return "big-edge" not in [j["metadata"]["name"] for j in listed["items"]]
    wait_for(gone, timeout_s=120, what="job big-edge deleted (finalizer removed)", interval_s=0.5,
             explain=lambda: operator.log()[-3000:])
