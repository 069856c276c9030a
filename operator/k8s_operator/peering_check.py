"""Refuses a fixed peering priority that a live peer already holds (issue 31 item 14, kopf#247).

kopf pauses *every* operator on a peering object when two live ones have the same priority, and none serves
a job until one goes: jobs wait `Pending` with no Event. `--priority auto` (the default) cannot collide; a
fixed `--priority` can (two releases, or a Deployment scaled to 2, given the same number). The operator
reads the peering object before kopf starts and exits with the reason instead of joining a frozen pair. Two
that start within the same moment both pass that check; so while it runs, an operator with a fixed priority
reads the object again every `WATCH_INTERVAL_S`, and of two that collide the one whose identity sorts last
steps aside (exits 2 saying why; kopf removes its entry on the way out) and the other resumes: exactly one
active, whatever the timing.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable
from typing import Any

KOPF_GROUP, KOPF_VERSION = "kopf.dev", "v1"
DEFAULT_LIFETIME_S = 60  # kopf's `Peer` default when an entry names none
WATCH_INTERVAL_S = 10.0
"""How often a running operator with a fixed priority reads its peering object for an equal peer (seconds)."""


def steps_aside(own_identity: str, peers: list[str]) -> bool:
    """Whether this operator leaves for one of `peers` (live, same priority): it does when one sorts before it.

    One rule both sides apply, so of any set of colliding operators exactly the first by identity stays.
    """
    return any(peer < own_identity for peer in peers)


def same_priority_peers(status: dict[str, Any] | None, priority: int, own_identity: str | None,
                        now: datetime.datetime) -> list[str]:
    """The identities in a kopf peering object's `status` that are alive at `now` and hold `priority`.

    Args:
      status: the object's `.status`: `{identity: {"priority": int, "lifetime": seconds, "lastseen": ISO 8601}}`
        as kopf writes it (entries it cannot read are skipped: kopf itself would count them dead or ignore them).
      priority: this process's priority.
      own_identity: this process's kopf identity when it is fixed (`POD_ID`: a restarted container finds its
        own last entry), else None.
      now: an aware datetime (UTC).

    Returns:
      Sorted identities; empty when none collides.
    """
    found = []
    for identity, entry in (status or {}).items():
        if identity == own_identity or not isinstance(entry, dict):
            continue
        try:
            seen = datetime.datetime.fromisoformat(str(entry["lastseen"]))
            lifetime = datetime.timedelta(seconds=int(entry.get("lifetime", DEFAULT_LIFETIME_S)))
            theirs = int(entry.get("priority", 0))
        except (KeyError, TypeError, ValueError):
            continue
        if seen.tzinfo is None:
            seen = seen.replace(tzinfo=datetime.UTC)
        if theirs == priority and seen + lifetime > now:
            found.append(str(identity))
    return sorted(found)


def peering_objects(custom: Any, name: str, namespaces: Iterable[str]) -> list[tuple[str, dict[str, Any]]]:
    """The peering objects an operator with these `--namespace`s uses: (where, object) for each that exists.

    Args:
      custom: a `kubernetes.client.CustomObjectsApi`.
      name: `--peering`.
      namespaces: `--namespace` values; empty: the cluster-wide `ClusterKopfPeering`.

    Raises:
      kubernetes.client.ApiException: a read failed with anything but 404.
    """
    from kubernetes.client import ApiException

    found = []
    for namespace in list(namespaces) or [None]:
        try:
            if namespace is None:
                obj = custom.get_cluster_custom_object(KOPF_GROUP, KOPF_VERSION, "clusterkopfpeerings", name)
            else:
                obj = custom.get_namespaced_custom_object(KOPF_GROUP, KOPF_VERSION, namespace, "kopfpeerings", name)
        except ApiException as e:
            if e.status == 404:
                continue
            raise
        found.append((f"KopfPeering {namespace}/{name}" if namespace else f"ClusterKopfPeering {name}", obj))
    return found
