"""Cluster DNS for headless Services, as entries of each pod's /etc/hosts.

There is no CoreDNS here (and no Service routing at all), but a pod may
reach another pod through a headless Service's name, as the Pathways workers
reach the resource manager (``<job>-pathways-head.<ns>.svc``). CoreDNS answers
such a name with the addresses of the Service's EndpointSlices; here the
EndpointSlices stay empty (the API server refuses loopback endpoint addresses,
and every pod IP here is one), so the agent applies the EndpointSlice
controller's rule itself: the pods the Service selects that have an IP, are
not finished, and are Ready (any such pod with ``publishNotReadyAddresses``).
The pod worker writes the names into the pod's hosts file and rewrites it in
place while the pod runs (a name resolves anew at each lookup, as a DNS
answer would).
"""

from __future__ import annotations

import time

from e2e.nodeagent.kubeapi import ApiError, KubeApi

REFRESH_S = 2.0  # how stale a namespace's names may be (a DNS TTL)


def _ready(pod: dict) -> bool:
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _selects(selector: dict[str, str], pod: dict) -> bool:
    labels = pod["metadata"].get("labels") or {}
    return all(labels.get(k) == v for k, v in selector.items())


class HeadlessNames:
    """Headless Service names of a namespace and their pods' addresses, cached for `REFRESH_S`.

    Args:
      api: the node's API client.
    """

    def __init__(self, api: KubeApi):
        self.api = api
        self.cache: dict[str, tuple[float, dict[str, list[str]]]] = {}

    def records(self, namespace: str) -> dict[str, list[str]]:
        """`<service>.<namespace>.svc` -> addresses (sorted), for every headless Service with a selector.

        An API error keeps the last answer (a DNS server keeps serving what it has).
        """
        now = time.monotonic()
        cached = self.cache.get(namespace)
        if cached is not None and now - cached[0] < REFRESH_S:
            return cached[1]
        try:
            services = [s for s in self.api.get(f"/api/v1/namespaces/{namespace}/services")["items"]
                        if (s.get("spec") or {}).get("clusterIP") == "None" and (s.get("spec") or {}).get("selector")]
            pods = self.api.get(f"/api/v1/namespaces/{namespace}/pods")["items"] if services else []
        except (ApiError, OSError):
            return cached[1] if cached else {}
        records: dict[str, list[str]] = {}
        for svc in services:
            spec = svc["spec"]
            addresses = sorted({
                p["status"]["podIP"] for p in pods
                if _selects(spec["selector"], p) and (p.get("status") or {}).get("podIP")
                and p["status"].get("phase") not in ("Succeeded", "Failed")
                and (spec.get("publishNotReadyAddresses") or (_ready(p) and not p["metadata"].get("deletionTimestamp")))
            })
            if addresses:
                records[f"{svc['metadata']['name']}.{namespace}.svc"] = addresses
        # Stamped when the answer came, not when it was asked for: a namespace of 1600 pods took longer
        # than REFRESH_S to list under load, and a stamp from before the list left it stale at once, so
        # the agent's one loop listed it again for every pod on the node and stopped starting containers
        # (benchmarks/bench_operator_scale.py, 50 Pathways heads on one node).
        self.cache[namespace] = (time.monotonic(), records)
        return records


def hosts_lines(records: dict[str, list[str]]) -> str:
    """/etc/hosts lines for `records`: each address with the short and the `cluster.local` name."""
    return "".join(f"{address}\t{name} {name}.cluster.local\n"
                   for name, addresses in sorted(records.items()) for address in addresses)
