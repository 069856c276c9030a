"""The API server's size limits that a job's objects must fit, and the one-line problems naming them.

Pure (no Kubernetes client): the API server refuses the manifest ConfigMap
the operator makes for a job's controller (`elastic_jax.k8s_operator.children`)
past `CONFIGMAP_MAX_BYTES`; `elastic-jax validate --cluster` says so before,
and warns when plain `kubectl apply` would leave the operator no room.
"""

from __future__ import annotations

import json

from elastic_jax.api.job import ElasticTrainingJob
from elastic_jax.api.manifest import controller_manifest, dump_yaml

# The API server refuses a ConfigMap whose data is larger (core validation, `MaxSecretSize`/ConfigMap
# `validateConfigMapData`); the job's manifest, with spec.controller.trainer.config, must fit.
CONFIGMAP_MAX_BYTES = 1024 * 1024


def manifest_size_problem(job: ElasticTrainingJob) -> str | None:
    """Why the job's manifest ConfigMap would be refused as too large (naming the free-form field), or None.

    Counts the bytes of the ConfigMap's one data value, `dump_yaml(controller_manifest(job))`.
    """
    size = len(dump_yaml(controller_manifest(job)).encode())
    if size <= CONFIGMAP_MAX_BYTES:
        return None
    return (f"spec.controller.trainer.config: the manifest is {size} bytes in the ConfigMap the operator makes "
            f"for the controller; a ConfigMap holds at most {CONFIGMAP_MAX_BYTES} bytes (put large data in files "
            "the trainer reads, not in its config)")


# All of an object's annotations together (keys and values) may hold at most this many bytes (API server
# validation, `TotalAnnotationSizeLimitB`). Plain `kubectl apply` copies the whole manifest into one of
# them (`kubectl.kubernetes.io/last-applied-configuration`); the operator's own (claim, kopf's marker and
# progress) take under a KiB, so the copy must leave that much.
ANNOTATIONS_MAX_BYTES = 262144
OPERATOR_ANNOTATIONS_RESERVE_BYTES = 4096


def client_apply_size_problem(job: ElasticTrainingJob) -> str | None:
    """Why plain (client-side) `kubectl apply` of this job would be refused or leave the operator no room, or None.

    `kubectl apply --server-side` and `kubectl create` keep no copy: only `manifest_size_problem` applies there.
    """
    manifest = {"apiVersion": job.api_version, "kind": job.kind, "metadata": {"name": job.metadata.name},
                "spec": job.spec.to_manifest()}
    size = len(json.dumps(manifest, separators=(",", ":")).encode()) + 1
    limit = ANNOTATIONS_MAX_BYTES - OPERATOR_ANNOTATIONS_RESERVE_BYTES
    if size <= limit:
        return None
    return (f"the job is {size} bytes as JSON: plain `kubectl apply` copies it into the annotation "
            f"kubectl.kubernetes.io/last-applied-configuration, and all annotations together may hold at most "
            f"{ANNOTATIONS_MAX_BYTES} bytes ({OPERATOR_ANNOTATIONS_RESERVE_BYTES} kept for the operator's own); "
            f"use `kubectl apply --server-side` or `kubectl create` (no copy; up to {CONFIGMAP_MAX_BYTES} bytes)")
