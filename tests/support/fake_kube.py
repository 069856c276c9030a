"""One in-memory stand-in for the operator's `Kube` (the API server's side of the kopf shell), for unit tests
of the handlers' own logic.

Creates succeed unless the name is `taken`; ownership is read as the real `Kube.owners` / `Kube.owned_by`
read it: a taken name has the ownerReferences given for it, a child this fake created has those of its
body (`kopf.adopt` put them there), anything else is absent. A test that needs another answer subclasses
it (a refusing create, planted Events).
"""

from __future__ import annotations

from typing import Any


class FakeKube:
    """The operator's `Kube`, in memory.

    Args:
      taken: name -> ownerReferences (a list of {"uid": ...}; None: present, owner unknown) of objects that
        exist already and were not created by this fake: creating one returns False (409).
      manifest_text: what `read_manifest` returns (the job's ConfigMap copy of its spec), None: absent.
      owns_unknown: `owned_by` of a name neither taken nor created: False (absent, as the API server
        answers); True for a test whose index holds children it never created through this fake.

    Attributes:
      created: names created, in order; created_bodies: their bodies; deleted: names deleted (pods, JobSets).
      status_patches: the status patches written (`patch_job_status`), in order; `on_status_patch`, when set,
        is called with each (from the daemon's executor thread) and its return value is the stored job (or
        it raises, as the API server refuses).
    """

    def __init__(self, taken: dict[str, Any] | None = None, manifest_text: str | None = None,
                 owns_unknown: bool = True):
        self.taken = dict(taken or {})
        self.manifest_text = manifest_text
        self.owns_unknown = owns_unknown
        self.created: list[str] = []
        self.created_bodies: list[dict[str, Any]] = []
        self.deleted: list[str] = []
        self.status_patches: list[dict[str, Any]] = []
        self.on_status_patch: Any = None

    def claim(self, namespace: str, name: str, resource_version: str, annotation: str, identity: str) -> bool:
        return True

    def create(self, namespace: str, body: dict[str, Any]) -> bool:
        if body["metadata"]["name"] in self.taken:
            return False
        self.created.append(body["metadata"]["name"])
        self.created_bodies.append(body)
        return True

    def owners(self, namespace: str, kind: str, name: str) -> list[dict[str, str]] | None:
        if name in self.taken:
            return self.taken[name]
        for body in reversed(self.created_bodies):
            if body["metadata"]["name"] == name:
                return list(body["metadata"].get("ownerReferences") or [])
        return None

    def owned_by(self, namespace: str, kind: str, name: str, owner_uid: str) -> bool:
        refs = self.owners(namespace, kind, name)
        if refs is None and name not in self.taken:
            return self.owns_unknown
        return any(r.get("uid") == owner_uid for r in refs or [])

    def delete_pod(self, namespace: str, name: str, grace_s: int | None = None) -> None:
        self.deleted.append(name)

    def delete_jobset(self, namespace: str, name: str) -> None:
        self.deleted.append(name)

    def delete_job(self, namespace: str, name: str) -> None:
        pass

    def patch_job_status(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any] | None:
        self.status_patches.append(patch)
        if self.on_status_patch is not None:
            return self.on_status_patch(patch)
        return {"metadata": {"namespace": namespace, "name": name}, "status": dict(patch.get("status") or {})}

    def read_manifest(self, namespace: str, configmap: str, owner_uid: str) -> str | None:
        return self.manifest_text

    def job_uid_if_owned(self, namespace: str, name: str, jobset_uid: str) -> str | None:
        return None

    def warning_events(self, namespace: str, kind: str, name: str, uid: str = "") -> list[dict[str, Any]]:
        return []
