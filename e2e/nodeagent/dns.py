"""Cluster DNS for headless Services, as entries of each pod's /etc/hosts.

There is no CoreDNS here (and no Service routing at all), but a pod may
reach another pod through a headless Service's name, as the Pathways workers
reach the resource manager (``<job>-pathways-head.<ns>.svc``). CoreDNS answers
such a name with the addresses of the Service's EndpointSlices (with
``publishNotReadyAddresses`` the endpoint controller marks not-ready pods
ready for that purpose); so does this, through the pod's hosts file, which the
pod worker rewrites in place while the pod runs (a name resolves anew at each
lookup, as a DNS answer would).
"""

from __future__ import annotations

import time

from e2e.nodeagent.kubeapi import ApiError, KubeApi

REFRESH_S = 2.0  # how stale a namespace's names may be (a DNS TTL)
HEADLESS_LABEL = "service.kubernetes.io/headless"  # the EndpointSlice controller sets it
SERVICE_NAME_LABEL = "kubernetes.io/service-name"


class HeadlessNames:
    """Headless Service names of a namespace and their ready addresses, cached for `REFRESH_S`.

    Args:
      api: the node's API client.
    """

    def __init__(self, api: KubeApi):
        self.api = api
        self.cache: dict[str, tuple[float, dict[str, list[str]]]] = {}

    def records(self, namespace: str) -> dict[str, list[str]]:
        """`<service>.<namespace>.svc` -> addresses (sorted), for every headless Service with endpoints.

        An API error keeps the last answer (a DNS server keeps serving what it has).
        """
        now = time.monotonic()
        cached = self.cache.get(namespace)
        if cached is not None and now - cached[0] < REFRESH_S:
            return cached[1]
        try:
            slices = self.api.get(f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices",
                                  labelSelector=HEADLESS_LABEL)["items"]
        except (ApiError, OSError):
            return cached[1] if cached else {}
        out: dict[str, set[str]] = {}
        for s in slices:
            service = (s["metadata"].get("labels") or {}).get(SERVICE_NAME_LABEL)
            if not service:
                continue
            for endpoint in s.get("endpoints") or []:
                if (endpoint.get("conditions") or {}).get("ready") is False:
                    continue
                out.setdefault(f"{service}.{namespace}.svc", set()).update(endpoint.get("addresses") or [])
        records = {name: sorted(addresses) for name, addresses in out.items()}
        self.cache[namespace] = (now, records)
        return records


def hosts_lines(records: dict[str, list[str]]) -> str:
    """/etc/hosts lines for `records`: each address with the short and the `cluster.local` name."""
    return "".join(f"{address}\t{name} {name}.cluster.local\n"
                   for name, addresses in sorted(records.items()) for address in addresses)
