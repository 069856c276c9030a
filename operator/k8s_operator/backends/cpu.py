"""The cpu backend: a controller pod running `elastic-jax-controller`, one JAX CPU worker per slice.

Pods here bind their servers to their own pod IP (downward API
`status.podIP`): on the local control plane there is no network namespace,
and in a real cluster the pod IP is the pod's only address anyway.
"""

from __future__ import annotations

from typing import Any

from elastic_jax.api import labels
from elastic_jax.api.job import ElasticTrainingJob, EnvVar, Resources
from elastic_jax.k8s_operator import names

_POD_IP_ENV = {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}


def _env(extra: list[EnvVar]) -> list[dict[str, str]]:
    return [{"name": e.name, "value": e.value} for e in extra]


def _resources(r: Resources) -> dict[str, Any]:
    return {k: v for k, v in (("requests", r.requests), ("limits", r.limits)) if v}


def pod_labels(job: str, role: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """Labels of a child pod: the job, the role, and `extra`."""
    return {labels.JOB_NAME: job, labels.ROLE: role, **(extra or {})}


class CpuRenderer:
    """Renders the cpu backend's controller pod and worker JobSets."""

    def controller_pod(self, job: ElasticTrainingJob, attempt: int) -> dict[str, Any]:
        """The controller Pod of incarnation `attempt`.

        restartPolicy Never: the operator, not the kubelet, recreates it and
        counts that in status, so a restart is always visible.
        """
        name = job.metadata.name
        c = job.spec.controller
        return {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": names.controller_pod(name, attempt),
                "labels": pod_labels(name, labels.ROLE_CONTROLLER, {labels.CONTROLLER_ATTEMPT: str(attempt)}),
            },
            "spec": {
                "restartPolicy": "Never",
                # SIGTERM makes the controller write a checkpoint before exiting (suspend).
                "terminationGracePeriodSeconds": 60,
                "containers": [{
                    "name": "controller",
                    "image": c.image,
                    "env": [
                        _POD_IP_ENV,
                        {"name": "ELASTIC_JAX_HOST", "value": "$(POD_IP)"},
                        {"name": "ELASTIC_JAX_PORT", "value": str(names.CONTROLLER_PORT)},
                        {"name": "ELASTIC_JAX_MANIFEST", "value": f"{names.MANIFEST_DIR}/{labels.MANIFEST_KEY}"},
                        {"name": "ELASTIC_JAX_TOKEN_FILE", "value": f"{names.TOKEN_DIR}/{labels.TOKEN_KEY}"},
                        *_env(c.env),
                    ],
                    "ports": [{"name": "control", "containerPort": names.CONTROLLER_PORT}],
                    "readinessProbe": {"httpGet": {"path": "/readyz", "port": names.CONTROLLER_PORT},
                                       "periodSeconds": 1, "failureThreshold": 1},
                    "resources": _resources(c.resources),
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                    "volumeMounts": [
                        {"name": "manifest", "mountPath": names.MANIFEST_DIR, "readOnly": True},
                        {"name": "token", "mountPath": names.TOKEN_DIR, "readOnly": True},
                    ],
                }],
                "volumes": [
                    {"name": "manifest", "configMap": {"name": names.configmap(name)}},
                    {"name": "token", "secret": {"secretName": names.secret(name), "defaultMode": 0o400}},
                ],
            },
        }

    def worker_jobset(self, job: ElasticTrainingJob, index: int) -> dict[str, Any]:
        """The JobSet of slice `index`: one Job of `hostsPerSlice` worker pods.

        A failed or deleted worker fails its Job at once (backoffLimit 0) and
        the JobSet controller recreates that slice only (each slice has its own
        JobSet), up to `elasticity.maxRestartsPerSlice` times; then the JobSet
        fails and the operator fails the job with the reason.
        """
        name = job.metadata.name
        s = job.spec.slices
        w = job.spec.worker
        selector = pod_labels(name, labels.ROLE_WORKER, {labels.SLICE_INDEX: str(index)})
        return {
            "apiVersion": "jobset.x-k8s.io/v1alpha2",
            "kind": "JobSet",
            "metadata": {"name": names.slice_jobset(name, index), "labels": dict(selector)},
            "spec": {
                "failurePolicy": {"maxRestarts": job.spec.elasticity.max_restarts_per_slice},
                "replicatedJobs": [{
                    "name": names.WORKER_REPLICATED_JOB,
                    "replicas": 1,
                    "template": {
                        "metadata": {"labels": dict(selector)},
                        "spec": {
                            "parallelism": s.hosts_per_slice,
                            "completions": s.hosts_per_slice,
                            "completionMode": "Indexed",
                            "backoffLimit": 0,
                            "template": {
                                "metadata": {"labels": dict(selector)},
                                "spec": {
                                    "restartPolicy": "Never",
                                    "terminationGracePeriodSeconds": 5,
                                    "containers": [{
                                        "name": "worker",
                                        "image": w.image,
                                        "args": [
                                            "--host", "$(POD_IP)", "--port", str(names.WORKER_PORT),
                                            "--slice-index", str(index), "--host-devices", str(s.devices_per_host),
                                        ],
                                        "env": [_POD_IP_ENV, *_env(w.env)],
                                        "ports": [{"name": "grpc", "containerPort": names.WORKER_PORT}],
                                        "readinessProbe": {"tcpSocket": {"port": names.WORKER_PORT},
                                                           "periodSeconds": 1, "failureThreshold": 1},
                                        "resources": _resources(w.resources),
                                    }],
                                },
                            },
                        },
                    },
                }],
            },
        }
