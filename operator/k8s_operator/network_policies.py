"""A job's NetworkPolicies: who may reach its controller's control API and its workers' port (pure).

The operator creates them per job, in the job's namespace, owned by the job
like its other children (so they go with it), whenever the admin gave the
peers allowed to the control API (Helm `networkPolicy.enabled`, default on:
the operator's own pods plus `networkPolicy.controlApiFrom`; flag
`--control-api-from`). Without them the job's bearer token is the only
protection of both ports. What they cannot cover (pods on the host network:
Pathways TPU workers) is in docs/security.md.
"""

from __future__ import annotations

import ipaddress
import json
from typing import Any

from elastic_jax.api import labels
from elastic_jax.api.job import ElasticTrainingJob
from elastic_jax.k8s_operator import names

# The Pathways resource manager's ports on the controller pod (`backends.pathways.RM_PORT` and the next).
# Open to every peer: its TPU workers run on the host network, so they come from node addresses, which no
# pod or namespace selector matches.
PATHWAYS_RM_PORTS = (29001, 29002)

_PEER_KEYS = frozenset({"podSelector", "namespaceSelector", "ipBlock"})
_SELECTOR_KEYS = frozenset({"matchLabels", "matchExpressions"})


def parse_peers(text: str) -> list[dict[str, Any]] | None:
    """The NetworkPolicyPeers of `--control-api-from` (a JSON list); None for empty text (no policies).

    Checked here, at startup, so an admin's typo is one line there rather than every job failing on a
    refused child.

    Raises:
      ValueError: not JSON, not a non-empty list of objects, or a peer with an unknown key, no key,
        `ipBlock` with a selector, an `ipBlock` whose `cidr` is not a CIDR or whose `except` entries are not
        CIDRs strictly inside it (the API server's own rules), or a selector that is not an object of
        matchLabels/matchExpressions.
    """
    if not text.strip():
        return None
    try:
        peers = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"not JSON ({e.msg} at character {e.pos})") from None
    if not isinstance(peers, list) or not peers:
        raise ValueError("must be a non-empty JSON list of NetworkPolicyPeers (the operator's own pods at least: "
                         "it calls every controller's control API)")
    for i, peer in enumerate(peers):
        if not isinstance(peer, dict) or not peer:
            raise ValueError(f"item {i}: must be an object with podSelector, namespaceSelector or ipBlock")
        unknown = set(peer) - _PEER_KEYS
        if unknown:
            raise ValueError(f"item {i}: unknown key {sorted(unknown)[0]!r} (a NetworkPolicyPeer has "
                             "podSelector, namespaceSelector, ipBlock)")
        if "ipBlock" in peer and len(peer) > 1:
            raise ValueError(f"item {i}: ipBlock cannot be combined with a selector")
        if "ipBlock" in peer:
            _check_ip_block(peer["ipBlock"], f"item {i}: ipBlock")
        for key in ("podSelector", "namespaceSelector"):
            selector = peer.get(key)
            if selector is not None and (not isinstance(selector, dict) or set(selector) - _SELECTOR_KEYS):
                raise ValueError(f"item {i}: {key} must be an object with matchLabels and/or matchExpressions")
    return peers


def _check_ip_block(block: Any, where: str) -> None:
    """Raises ValueError naming `where` unless `block` is an IPBlock the API server accepts."""
    if not isinstance(block, dict) or not isinstance(block.get("cidr"), str) or set(block) - {"cidr", "except"}:
        raise ValueError(f"{where} must be an object with a cidr string and optionally an except list")
    cidr = _network(block["cidr"], f"{where}.cidr")
    excepts = block.get("except", [])
    if not isinstance(excepts, list):
        raise ValueError(f"{where}.except must be a list of CIDRs")
    for j, text in enumerate(excepts):
        inner = _network(text, f"{where}.except[{j}]")
        if inner.version != cidr.version or inner == cidr or not inner.subnet_of(cidr):  # type: ignore[arg-type]
            raise ValueError(f"{where}.except[{j}]: {text} must lie strictly inside {block['cidr']}")


def _network(text: Any, where: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    # Host bits may be set, as Go's net.ParseCIDR (which the API server uses) allows.
    if isinstance(text, str) and "/" in text:
        try:
            return ipaddress.ip_network(text, strict=False)
        except ValueError:
            pass
    raise ValueError(f"{where}: {text!r} is not a CIDR (e.g. 10.0.0.0/8)")


def controller_policy(job: ElasticTrainingJob, control_api_from: list[dict[str, Any]]) -> dict[str, Any]:
    """Ingress of this job's controller pods: TCP `names.CONTROLLER_PORT` from `control_api_from` only;
    for backend pathways also the resource manager's ports, from anyone (`PATHWAYS_RM_PORTS`).

    Selects by the job's name, UID and the controller role, so it never covers another job's pods (or an
    earlier job's of the same name). Kubelet probes come from the node and are not filtered by CNIs that
    enforce NetworkPolicy.
    """
    name = job.metadata.name
    ingress: list[dict[str, Any]] = [
        {"from": [dict(p) for p in control_api_from], "ports": [{"protocol": "TCP", "port": names.CONTROLLER_PORT}]}]
    if job.spec.backend == "pathways":
        ingress.append({"ports": [{"protocol": "TCP", "port": p} for p in PATHWAYS_RM_PORTS]})
    return _policy(job, names.controller_policy(name), labels.ROLE_CONTROLLER, ingress)


def worker_policy(job: ElasticTrainingJob) -> dict[str, Any]:
    """Ingress of this job's worker pods: TCP `names.WORKER_PORT` from this job's controller pods only."""
    controller = {"podSelector": {"matchLabels": _selector(job, labels.ROLE_CONTROLLER)}}
    ingress = [{"from": [controller], "ports": [{"protocol": "TCP", "port": names.WORKER_PORT}]}]
    return _policy(job, names.worker_policy(job.metadata.name), labels.ROLE_WORKER, ingress)


def network_policies(job: ElasticTrainingJob, control_api_from: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    """The job's NetworkPolicies; none when `control_api_from` is None (the admin turned them off).

    Backend pathways gets no worker policy: its workers use the host network, which NetworkPolicy does not
    cover (docs/security.md says what to use there).
    """
    if control_api_from is None:
        return []
    out = [controller_policy(job, control_api_from)]
    if job.spec.backend != "pathways":
        out.append(worker_policy(job))
    return out


def _selector(job: ElasticTrainingJob, role: str) -> dict[str, str]:
    return {**labels.job_selector(job.metadata.name, job.metadata.uid), labels.ROLE: role}


def _policy(job: ElasticTrainingJob, name: str, role: str, ingress: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": name, "labels": labels.job_selector(job.metadata.name, job.metadata.uid)},
        "spec": {"podSelector": {"matchLabels": _selector(job, role)}, "policyTypes": ["Ingress"],
                 "ingress": ingress},
    }
