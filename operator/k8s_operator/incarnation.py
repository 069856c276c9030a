"""Which pods and JobSets belong to this incarnation of a job (pure).

A job deleted and applied again under the same name is a new object (a new
metadata.uid) while the old one's pods may still be terminating for their
grace period. Every child the operator creates, and every Job and pod the
JobSet and Job controllers create from its templates, carries the job's UID
(`labels.JOB_UID`); the operator's indexes are keyed by (namespace, job name,
job UID) and each job reads only its own key, so nothing of an old
incarnation is counted, told to the controller or deleted as the new one's.

Children without the label were made by an operator version before it
(a job created before an upgrade): they count for a job only when created
at or after the job itself, which an earlier incarnation's children never are.
"""

from __future__ import annotations

from typing import Any, Mapping

from elastic_jax.api import job as job_api
from elastic_jax.api import labels as lbl


def index_key(namespace: str, labels: Mapping[str, str]) -> tuple[str, str, str]:
    """The index key of a child: (namespace, job name, job UID or "" for an unlabeled child of an older operator)."""
    return namespace, labels[lbl.JOB_NAME], labels.get(lbl.JOB_UID, "")


def own(index: Mapping[Any, Any] | None, namespace: str, name: str, uid: str, job_created: str) -> list:
    """The views of job (namespace, name, uid)'s children in a kopf index keyed by `index_key`.

    Args:
      index: the kopf index (key -> store of views with a `created` RFC 3339 field).
      job_created: the job's metadata.creationTimestamp (RFC 3339; "" takes no unlabeled child).
    """
    index = index or {}
    out = list(index.get((namespace, name, uid), []))
    if job_created:
        out += [v for v in index.get((namespace, name, ""), []) if (v.created or "") >= job_created]
    return out


def of_live_jobsets(pods: list, jobsets: list) -> list:
    """`pods` less the worker pods an earlier JobSet of the same name left (created before the slice's live JobSet).

    A resume (or a Pathways head restart) creates a slice's JobSet again under its old name while the old
    one's pods may still be terminating, with the same slice index and restart attempt. Counted as the
    new JobSet's, their end read as that slice going Down: a SliceDown Warning and a replacement after a
    quick suspend toggle. Their end is the deleted JobSet's, on purpose.

    Args:
      pods: `PodView`s (any role; only workers are filtered).
      jobsets: the job's `JobSetView`s (RFC 3339 `created`); a slice with none live keeps all its pods.
    """
    born = {js.slice_index: js.created for js in jobsets if not js.deleting and js.created}
    return [p for p in pods if p.role != lbl.ROLE_WORKER or not p.created or p.slice_index not in born
            or p.created >= born[p.slice_index]]


def belongs(labels: Mapping[str, str], uid: str) -> bool:
    """A pod's labels say it is this job incarnation's (or an unlabeled child: the index read decides)."""
    return labels.get(lbl.JOB_UID, uid) == uid


def holder(owner_refs: list[Mapping[str, Any]] | None, name: str, uid: str) -> str:
    """Who holds a child name that job (name, uid) found taken (its create answered 409).

    Args:
      owner_refs: the existing object's ownerReferences (apiVersion, kind, name, uid); None: it is gone.
      name, uid: the job.

    Returns:
      "ours": owned by this job (an operator restart, or our own create whose answer was lost).
      "earlier": owned by an earlier ElasticTrainingJob of this name (deleted: one name is one
        object, so the garbage collector is removing it), or gone since the 409: wait, no conflict.
      "foreign": anything else (no owner, another job, another kind): not ours to use or delete.
    """
    if owner_refs is None:
        return "earlier"
    if any(ref.get("uid") == uid for ref in owner_refs):
        return "ours"
    if any(ref.get("kind") == job_api.KIND and ref.get("name") == name
           and str(ref.get("apiVersion") or "").split("/")[0] == job_api.GROUP for ref in owner_refs):
        return "earlier"
    return "foreign"


def held_by_earlier(index: Mapping[Any, Any] | None, namespace: str, name: str, uid: str, child: str) -> bool:
    """An index (`index_key`) holds a child named `child` of an earlier job (namespace, name, another UID)."""
    return any(k[:2] == (namespace, name) and k[2] not in ("", uid) and any(v.name == child for v in views)
               for k, views in (index or {}).items())
