"""Thin, idempotent Kubernetes API calls for the operator (create-if-absent, delete-if-present).

Kept out of the handlers so the decisions (`reconcile`, `slices`) stay pure
and the handlers stay short.
"""

from __future__ import annotations

import base64
import logging
from typing import Any

from kubernetes import client, config
from kubernetes.client.rest import ApiException

from elastic_jax.api import job as job_api
from elastic_jax.api import labels

_logger = logging.getLogger(__name__)

JOBSET_GROUP, JOBSET_VERSION, JOBSET_PLURAL = "jobset.x-k8s.io", "v1alpha2", "jobsets"


class Kube:
    """The operator's API client (in-cluster config, else the kubeconfig)."""

    def __init__(self, api_client: client.ApiClient | None = None):
        if api_client is None:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            api_client = client.ApiClient()
        self.api = api_client
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)

    def create(self, namespace: str, body: dict[str, Any]) -> bool:
        """Creates a child; returns False when it already exists.

        Raises:
          ApiException: any other API error.
        """
        kind = body["kind"]
        try:
            if kind == "Pod":
                self.core.create_namespaced_pod(namespace, body)
            elif kind == "Secret":
                self.core.create_namespaced_secret(namespace, body)
            elif kind == "ConfigMap":
                self.core.create_namespaced_config_map(namespace, body)
            elif kind == "Service":
                self.core.create_namespaced_service(namespace, body)
            elif kind == "JobSet":
                self.custom.create_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, body)
            else:
                raise ValueError(f"unexpected child kind {kind}")
        except ApiException as e:
            if e.status == 409:
                return False
            raise
        _logger.info("created %s %s/%s", kind, namespace, body["metadata"]["name"])
        return True

    def delete_pod(self, namespace: str, name: str, grace_s: int | None = None) -> None:
        """Deletes a pod (absent is fine)."""
        try:
            self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=grace_s)
        except ApiException as e:
            if e.status != 404:
                raise

    def delete_jobset(self, namespace: str, name: str) -> None:
        """Deletes a JobSet and, in the background, its Jobs and pods (absent is fine)."""
        try:
            self.custom.delete_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, name,
                                                        propagation_policy="Background")
        except ApiException as e:
            if e.status != 404:
                raise

    def read_token(self, namespace: str, secret: str) -> str | None:
        """The control-API token from the job's Secret, or None when the Secret is absent."""
        try:
            s = self.core.read_namespaced_secret(secret, namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        value = (s.data or {}).get(labels.TOKEN_KEY)
        return base64.b64decode(value).decode() if value else None

    def read_manifest(self, namespace: str, configmap: str) -> str | None:
        """The manifest text the controller was started with, or None when the ConfigMap is absent."""
        try:
            cm = self.core.read_namespaced_config_map(configmap, namespace)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return (cm.data or {}).get(labels.MANIFEST_KEY)

    def delete_job(self, namespace: str, name: str) -> None:
        """Deletes the ElasticTrainingJob itself (TTL after finished)."""
        try:
            self.custom.delete_namespaced_custom_object(job_api.GROUP, job_api.VERSION, namespace, job_api.PLURAL, name,
                                                        propagation_policy="Background")
        except ApiException as e:
            if e.status != 404:
                raise
