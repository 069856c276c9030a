"""Nodes that stopped being Ready → the job's pods to give up on (pure; issue 9 item 5).

A node that dies without the out-of-service taint (power loss, a kernel
hang, a network partition: what a real failure looks like first) keeps its
pods in the API: the node controller marks the node `Ready=Unknown` after
its `node-monitor-grace-period`, the pods' Ready condition False, and taints
the node `unreachable` (so nothing new is scheduled there), but the pods stay
`Running` until the default 300 s NoExecute toleration, then `Terminating`
forever: only the dead kubelet could confirm their end. A Job (so the slice's
JobSet) does not replace a pod that has not ended, so the slice stays Down.

The operator therefore does what the out-of-service taint's pod garbage
collection would do, for its own jobs only: once a node has been not Ready
(`Ready=False` or `Unknown`) for longer than the operator's bound
(`--node-lost-seconds`, default :data:`DEFAULT_NODE_LOST_SECONDS`), every
not-yet-finished pod of the job bound to that node is deleted with grace 0,
so the slice's Job fails and its JobSet creates a replacement on a healthy
node, and a controller pod there is replaced (counted) and resumes from its
checkpoint. A node that is Ready again before the bound is never acted on.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any, Iterable, Mapping

from elastic_jax.k8s_operator.slices import PodView

# Seconds a node must have been not Ready (since the node controller set Ready to False/Unknown)
# before the operator force-deletes the job's pods on it. docs/failure-handling.md says why 30.
DEFAULT_NODE_LOST_SECONDS = 30


@dataclasses.dataclass(frozen=True)
class NodeView:
    """The fields of a Node the operator needs: its Ready condition.

    Attributes:
      name: the node.
      ready: the Ready condition's status, "True", "False" or "Unknown" ("Unknown" when absent).
      since: the condition's lastTransitionTime (RFC 3339, "" when absent).
      reason, message: the condition's (e.g. NodeStatusUnknown, "Kubelet stopped posting node status.").
    """

    name: str
    ready: str
    since: str = ""
    reason: str = ""
    message: str = ""


def node_view(body: Mapping[str, Any]) -> NodeView:
    """Extracts a `NodeView` from a Node object (a dict as the API returns it)."""
    name = (body.get("metadata") or {}).get("name", "")
    for c in (body.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return NodeView(name=name, ready=str(c.get("status") or "Unknown"), since=c.get("lastTransitionTime") or "",
                            reason=c.get("reason") or "", message=(c.get("message") or "").strip()[:300])
    return NodeView(name=name, ready="Unknown")


@dataclasses.dataclass(frozen=True)
class NodeLoss:
    """A node not Ready for longer than the bound.

    Attributes:
      node: its name.
      seconds: how long it has been not Ready (s).
      why: its Ready condition, for messages: `Ready=Unknown (NodeStatusUnknown: Kubelet stopped posting node status.)`.
    """

    node: str
    seconds: float
    why: str


def _parse(t: str) -> dt.datetime | None:
    try:
        return dt.datetime.strptime(t, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
    except (TypeError, ValueError):
        return None


def lost_nodes(nodes: Iterable[NodeView], now: str, bound_s: float) -> dict[str, NodeLoss]:
    """The nodes whose Ready condition has not been True for more than `bound_s` seconds, by name.

    Args:
      nodes: the nodes to judge (Ready ones are ignored).
      now: RFC 3339 time of this pass (the operator's clock, second precision).
      bound_s: seconds after the condition's lastTransitionTime; 0 (or less) turns node-loss handling off.

    Returns:
      {node name: NodeLoss}. A node without a readable transition time is never
      lost: how long it has been down cannot be told, and acting early is the
      one mistake that cannot be undone.
    """
    if bound_s <= 0:
        return {}
    current = _parse(now)
    out: dict[str, NodeLoss] = {}
    for n in nodes:
        since = _parse(n.since)
        if n.ready == "True" or since is None or current is None:
            continue
        seconds = (current - since).total_seconds()
        if seconds > bound_s:
            detail = f"{n.reason}: {n.message}" if n.reason and n.message else (n.reason or n.message)
            out[n.name] = NodeLoss(n.name, seconds, f"Ready={n.ready}" + (f" ({detail})" if detail else ""))
    return out


@dataclasses.dataclass(frozen=True)
class NodeLostPod:
    """One of the job's pods on a lost node: to be deleted with grace 0.

    Attributes:
      pod, uid: the pod.
      slice_index: its slice (-1: the controller).
      loss: the node's loss.
    """

    pod: str
    uid: str
    slice_index: int
    loss: NodeLoss

    @property
    def role(self) -> str:
        return "controller" if self.slice_index < 0 else f"slice {self.slice_index} worker"

    def message(self, bound_s: float) -> str:
        """The Event and condition text: which node, for how long, which pod, what follows."""
        then = ("a new controller pod replaces it (the ControllerRestarted Event says what it resumes from)" if self.slice_index < 0
                else "its JobSet replaces it on a healthy node")
        return (f"node {self.loss.node} not Ready for {self.loss.seconds:.0f} s (over the operator's "
                f"--node-lost-seconds={bound_s:g}): {self.loss.why}; force-deleting {self.role} pod {self.pod} "
                f"(grace 0), {then}")


def pods_on_lost_nodes(pods: Iterable[PodView], lost: Mapping[str, NodeLoss]) -> list[NodeLostPod]:
    """The pods (of one job) bound to a lost node that the cluster will not end by itself.

    Finished pods hold nothing and are left alone; a pod already force-deleted
    (grace 0, waiting only for its finalizers) needs nothing more. A pod being
    deleted *with* a grace period is included: on a dead node that grace never
    ends (the kubelet must confirm it).

    Args:
      pods: the job's pods (from its index: other jobs' pods are never passed).
      lost: from `lost_nodes`.
    """
    out = []
    for p in sorted(pods, key=lambda p: (p.slice_index, p.host_index, p.name)):
        if not p.node or p.node not in lost or p.terminal or (p.deleting and p.deletion_grace_s == 0):
            continue
        out.append(NodeLostPod(pod=p.name, uid=p.uid, slice_index=p.slice_index, loss=lost[p.node]))
    return out
