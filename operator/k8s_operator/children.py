"""Spec → the backend-independent children (Secret, ConfigMap, Service, NetworkPolicies) and the full child set.

Pure functions: no API calls. Owner references are added by the handler
with `kopf.adopt`, so deleting the job garbage-collects everything.
"""

from __future__ import annotations

import base64
import copy
import hashlib
import json
from typing import Any


from elastic_jax.api import labels
from elastic_jax.api.job import ElasticTrainingJob
from elastic_jax.api.manifest import controller_manifest, dump_yaml
from elastic_jax.k8s_operator import names
from elastic_jax.k8s_operator.backends import renderer_for
from elastic_jax.k8s_operator.network_policies import network_policies


def spec_hash(job: ElasticTrainingJob) -> str:
    """Short stable hash of the spec fields the controller reads (not suspend/TTL)."""
    spec = job.spec.to_manifest()
    for mutable in ("suspend", "ttlSecondsAfterFinished"):
        spec.pop(mutable, None)
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


def token_secret(job: ElasticTrainingJob, token: str) -> dict[str, Any]:
    """The Secret with the control-API bearer token (`token` key)."""
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "Opaque",
        "metadata": {"name": names.secret(job.metadata.name), "labels": labels.job_selector(job.metadata.name, job.metadata.uid)},
        "data": {labels.TOKEN_KEY: base64.b64encode(token.encode()).decode()},
    }


def manifest_configmap(job: ElasticTrainingJob) -> dict[str, Any]:
    """The ConfigMap with the manifest the controller reads (status and server fields dropped; its size limit:
    `elastic_jax.api.size_limits`)."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": names.configmap(job.metadata.name),
                     "labels": labels.job_selector(job.metadata.name, job.metadata.uid),
                     "annotations": {labels.SPEC_HASH: spec_hash(job)}},
        # (quoted where kubectl would read a string as another type: the controller reads it with load_manifest)
        "data": {labels.MANIFEST_KEY: dump_yaml(controller_manifest(job))},
    }


def controller_service(job: ElasticTrainingJob) -> dict[str, Any]:
    """A Service selecting the controller pod (its control API, for users): routes only once the pod is Ready.

    Pathways workers do not use it: they reach the resource manager through
    `backends.pathways.head_service`, published before the pod is Ready.
    """
    name = job.metadata.name
    ports = [{"name": "control", "port": names.CONTROLLER_PORT, "targetPort": names.CONTROLLER_PORT}]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": names.service(name), "labels": labels.job_selector(name, job.metadata.uid)},
        "spec": {
            # with the UID: never the controller of an earlier job of the same name that is still terminating
            "selector": {**labels.job_selector(name, job.metadata.uid), labels.ROLE: labels.ROLE_CONTROLLER},
            "ports": ports,
        },
    }


def static_children(job: ElasticTrainingJob, control_api_from: list[dict[str, Any]] | None = None
                    ) -> list[dict[str, Any]]:
    """The children created once per job: the manifest ConfigMap, the controller Service, for backend
    pathways the Pathways head's headless Service, and the job's NetworkPolicies when `control_api_from`
    (the peers allowed to the control API, `network_policies.parse_peers`) is not None."""
    out = [manifest_configmap(job), controller_service(job)]
    if job.spec.backend == "pathways":
        from elastic_jax.k8s_operator.backends.pathways import head_service

        out.append(head_service(job))
    # (each object its own, as the renderers' (`backends.cpu.fresh`): a caller's edit never reaches a constant)
    return copy.deepcopy(out + network_policies(job, control_api_from))


def render_children(job: ElasticTrainingJob, token: str, controller_attempt: int = 0,
                    job_uid: str = "", control_api_from: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Every child of a job: Secret, ConfigMap, Service(s), NetworkPolicies (`static_children`), controller
    Pod, one JobSet per slice.

    `job_uid` (the job's metadata.uid) goes to the controller with its namespace and name.

    Raises:
      UnsupportedBackend: `spec.backend` has no renderer (a permanent spec error).
    """
    renderer = renderer_for(job.spec.backend)
    return [
        token_secret(job, token),
        *static_children(job, control_api_from),
        renderer.controller_pod(job, controller_attempt, job_uid),
        *(renderer.worker_jobset(job, i) for i in range(job.spec.slices.total)),
    ]
