"""Thin, idempotent Kubernetes API calls for the operator (create-if-absent, delete-if-present).

Kept out of the handlers so the decisions (`reconcile`, `slices`) stay pure
and the handlers stay short.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Callable, TypeVar

from kubernetes import config
# Imported here, with the handlers, before kopf runs: `kubernetes.client` imports an API class and its
# hundreds of model modules on first attribute use, which was the operator's first reconcile pass (5-7 s
# on a loaded 2-core machine). A SIGTERM during that pass waited for it (kopf lets a sync handler
# finish), so a restarted operator took over 10 s to stop.
from kubernetes.client import ApiClient, BatchV1Api, CoreV1Api, CustomObjectsApi, NetworkingV1Api
from kubernetes.client.rest import ApiException

from elastic_jax import contract
from elastic_jax.api import job as job_api
from elastic_jax.api import labels

_logger = logging.getLogger(__name__)

JOBSET_GROUP, JOBSET_VERSION, JOBSET_PLURAL = contract.JOBSET_GROUP, contract.JOBSET_VERSION, contract.JOBSET_PLURAL

REQUEST_TIMEOUT_S = 10.0
"""Every API call of `Kube` gives up after this long without an answer (seconds; urllib3's connect and
read timeouts, so per attempt: the client retries a read that timed out up to 3 times). A hung API server
then fails the call (urllib3 `TimeoutError`/`MaxRetryError`) and the reconcile pass tries again, instead of
holding that pass, and with it the operator's exit, until the connection breaks."""


class ChildRefused(Exception):
    """The API server refused to create a child: a 4xx other than 409 (admission, validation, RBAC), or a
    5xx/429 (e.g. a JobSet webhook that is down).

    The job gets a condition and an Event naming the refusal
    (`status_builder.create_failure`) instead of a silent Pending; the
    reconcile tries again on its next pass (every second), which helps only
    for a 5xx/429.

    Attributes:
      kind, name: the child.
      status: the HTTP status (403, 422, ...).
      message: the API server's own message (its Status object's `message`).
    """

    def __init__(self, kind: str, name: str, status: int, message: str):
        super().__init__(f"{kind} {name}: {status} {message}")
        self.kind, self.name, self.status, self.message = kind, name, status, message


T = TypeVar("T")


def unless_absent(call: Callable[[], T]) -> T | None:
    """`call()`, or None when the object it reads or deletes does not exist (404): a delete of something
    gone is done, a read of it finds nothing. Any other refusal raises (`ApiException`)."""
    try:
        return call()
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def _owner_uids(metadata: Any) -> set[str]:
    """UIDs in an object's ownerReferences (a kubernetes-client V1ObjectMeta)."""
    return {ref.uid for ref in (getattr(metadata, "owner_references", None) or [])}


def api_message(error: ApiException) -> str:
    """The API server's message of a failed call (the Status body's `message`, else the reason)."""
    try:
        body = json.loads(error.body or "")
    except (TypeError, ValueError):
        body = None
    if isinstance(body, dict) and body.get("message"):
        return str(body["message"])
    return str(error.reason or error.status)


class Kube:
    """The operator's API client (in-cluster config, else the kubeconfig).

    Args:
      api_client: the client to use (default: in-cluster config, else the kubeconfig).
      request_timeout_s: each call's `_request_timeout` (seconds); default `REQUEST_TIMEOUT_S`.
    """

    _timeout: dict[str, float] = {"_request_timeout": REQUEST_TIMEOUT_S}  # the keyword every call passes

    def __init__(self, api_client: ApiClient | None = None, request_timeout_s: float = REQUEST_TIMEOUT_S):
        if api_client is None:
            try:
                config.load_incluster_config()
            except config.ConfigException:
                config.load_kube_config()
            api_client = ApiClient()
        self.api = api_client
        self.core = CoreV1Api(api_client)
        self.custom = CustomObjectsApi(api_client)
        self.batch = BatchV1Api(api_client)
        self.networking = NetworkingV1Api(api_client)
        self._timeout = {"_request_timeout": request_timeout_s}

    def create(self, namespace: str, body: dict[str, Any]) -> bool:
        """Creates a child; returns False when it already exists.

        Raises:
          ChildRefused: a 4xx other than 409 (admission said no, the object is
            invalid, RBAC), or a 5xx/429 (the server or a webhook failed).
          ApiException: no HTTP answer (connection).
        """
        kind = body["kind"]
        try:
            if kind == "Pod":
                self.core.create_namespaced_pod(namespace, body, **self._timeout)
            elif kind == "Secret":
                self.core.create_namespaced_secret(namespace, body, **self._timeout)
            elif kind == "ConfigMap":
                self.core.create_namespaced_config_map(namespace, body, **self._timeout)
            elif kind == "Service":
                self.core.create_namespaced_service(namespace, body, **self._timeout)
            elif kind == "NetworkPolicy":
                self.networking.create_namespaced_network_policy(namespace, body, **self._timeout)
            elif kind == contract.JOBSET_KIND:
                self.custom.create_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, body,
                                                           **self._timeout)
            else:
                raise ValueError(f"unexpected child kind {kind}")
        except ApiException as e:
            if e.status == 409:
                return False
            if e.status is not None and e.status >= 400:
                raise ChildRefused(kind, body["metadata"]["name"], e.status, api_message(e)) from None
            raise
        _logger.info("created %s %s/%s", kind, namespace, body["metadata"]["name"])
        return True

    def delete_pod(self, namespace: str, name: str, grace_s: int | None = None) -> None:
        """Deletes a pod (absent is fine)."""
        unless_absent(lambda: self.core.delete_namespaced_pod(name, namespace, grace_period_seconds=grace_s,
                                                              **self._timeout))

    def delete_jobset(self, namespace: str, name: str) -> None:
        """Deletes a JobSet and, in the background, its Jobs and pods (absent is fine)."""
        unless_absent(lambda: self.custom.delete_namespaced_custom_object(
            JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, name, propagation_policy="Background",
            **self._timeout))

    def read_manifest(self, namespace: str, configmap: str, owner_uid: str) -> str | None:
        """The manifest text the controller was started with; None when the ConfigMap is absent or
        not owned by the job `owner_uid` (a ConfigMap someone else made under that name is never read)."""
        cm = unless_absent(lambda: self.core.read_namespaced_config_map(configmap, namespace, **self._timeout))
        if cm is None or owner_uid not in _owner_uids(cm.metadata):
            return None
        return (cm.data or {}).get(labels.MANIFEST_KEY)

    def owners(self, namespace: str, kind: str, name: str) -> list[dict[str, str]] | None:
        """The ownerReferences ({apiVersion, kind, name, uid}) of the existing ConfigMap, Service, Pod,
        NetworkPolicy or JobSet `name`; None when it is absent. Secrets are never read (the operator may only create them).

        Raises:
          ValueError: another kind.
          ApiException: the read failed (not 404).
        """
        if kind == contract.JOBSET_KIND:
            obj = unless_absent(lambda: self.custom.get_namespaced_custom_object(
                JOBSET_GROUP, JOBSET_VERSION, namespace, JOBSET_PLURAL, name, **self._timeout))
            if obj is None:
                return None
            refs = (obj.get("metadata") or {}).get("ownerReferences") or []
            return [{k: str(r.get(k) or "") for k in ("apiVersion", "kind", "name", "uid")} for r in refs]
        api, method = {"ConfigMap": ("core", "read_namespaced_config_map"),
                       "Service": ("core", "read_namespaced_service"),
                       "Pod": ("core", "read_namespaced_pod"),
                       "NetworkPolicy": ("networking", "read_namespaced_network_policy")}.get(kind, (None, None))
        if method is None:
            raise ValueError(f"unexpected kind {kind}")
        obj = unless_absent(lambda: getattr(getattr(self, api), method)(name, namespace, **self._timeout))
        if obj is None:
            return None
        return [{"apiVersion": r.api_version or "", "kind": r.kind or "", "name": r.name or "", "uid": r.uid or ""}
                for r in (getattr(obj.metadata, "owner_references", None) or [])]

    def owned_by(self, namespace: str, kind: str, name: str, owner_uid: str) -> bool:
        """Whether the existing ConfigMap, Service, Pod, NetworkPolicy or JobSet `name` has an ownerReference to
        `owner_uid` (False when absent).

        Raises:
          ValueError: another kind.
          ApiException: the read failed (not 404).
        """
        return any(r["uid"] == owner_uid for r in self.owners(namespace, kind, name) or [])

    def job_uid_if_owned(self, namespace: str, name: str, jobset_uid: str) -> str | None:
        """The UID of batch Job `name` when its ownerReferences hold `jobset_uid` (a JobSet's own Job); else None.

        A Job of that name that is not the JobSet's (planted, or left by someone else) is not the
        job's news: its Events could tell a tenant about another user's pods.

        Raises:
          ApiException: the read failed (not 404), e.g. 403 with an older chart's RBAC.
        """
        job = unless_absent(lambda: self.batch.read_namespaced_job(name, namespace, **self._timeout))
        return job.metadata.uid if job is not None and jobset_uid and jobset_uid in _owner_uids(job.metadata) else None

    def warning_events(self, namespace: str, kind: str, name: str, uid: str = "") -> list[dict[str, Any]]:
        """The Warning Events on object `kind`/`name` (core v1 Events, field selectors: no full list).

        Args:
          uid: the object's UID; when given, only its Events (not those of another object that had
            the name, or has it in a foreign JobSet's place).

        Returns:
          [{"reason", "message", "last"}]: last is the RFC 3339 time of its last occurrence.

        Raises:
          ApiException: the list failed (e.g. 403 with an older chart's RBAC: the caller gives up quietly).
        """
        selector = f"involvedObject.kind={kind},involvedObject.name={name},type=Warning"
        if uid:
            selector += f",involvedObject.uid={uid}"
        items = self.core.list_namespaced_event(namespace, field_selector=selector, limit=50, **self._timeout).items or []
        out = []
        for e in items:
            when = e.last_timestamp or e.event_time or e.first_timestamp
            out.append({"reason": e.reason or "", "message": e.message or "",
                        "last": when.strftime("%Y-%m-%dT%H:%M:%SZ") if when else ""})
        return out

    def claim(self, namespace: str, name: str, resource_version: str, annotation: str, identity: str) -> bool:
        """Sets the job's claim annotation to `identity` if the job is still at `resource_version`.

        Returns:
          True when written; False when the job changed meanwhile (409: another operator may
          have claimed it; the next pass reads the annotation again) or is gone (404).

        Raises:
          ApiException: any other failure.
        """
        body = {"metadata": {"resourceVersion": resource_version, "annotations": {annotation: identity}}}
        try:
            self.custom.patch_namespaced_custom_object(job_api.GROUP, job_api.VERSION, namespace, job_api.PLURAL,
                                                       name, body, **self._timeout)
        except ApiException as e:
            if e.status in (404, 409):
                return False
            raise
        return True

    def patch_job_status(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any] | None:
        """Merge-patches the job's `status` subresource with `patch` (`{"status": {...}}`, camelCase).

        Returns:
          The job as the API server stored it; None when the job is gone (404).

        Raises:
          ApiException: any other failure (a 4xx: the API server refused the patch; a 5xx; no answer).
        """
        return unless_absent(lambda: self.custom.patch_namespaced_custom_object_status(
            job_api.GROUP, job_api.VERSION, namespace, job_api.PLURAL, name, patch, **self._timeout))

    def delete_job(self, namespace: str, name: str) -> None:
        """Deletes the ElasticTrainingJob itself (TTL after finished)."""
        unless_absent(lambda: self.custom.delete_namespaced_custom_object(
            job_api.GROUP, job_api.VERSION, namespace, job_api.PLURAL, name, propagation_policy="Background",
            **self._timeout))
