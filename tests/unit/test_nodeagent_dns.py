"""The node agent's stand-in for CoreDNS: headless Service names from EndpointSlices (e2e/nodeagent/dns.py).

The API is a scripted stub here (this is the agent's own logic); e2e/test_pod_runtime.py resolves a name
through a real EndpointSlice controller."""

from __future__ import annotations

from e2e.nodeagent import dns
from e2e.nodeagent.kubeapi import ApiError


class _Api:
    def __init__(self, items):
        self.items, self.calls = items, []

    def get(self, path, **query):
        self.calls.append((path, query))
        if isinstance(self.items, Exception):
            raise self.items
        return {"items": self.items}


def _slice(service, *endpoints):
    return {"metadata": {"labels": {dns.SERVICE_NAME_LABEL: service, dns.HEADLESS_LABEL: ""}},
            "endpoints": [{"addresses": [ip], "conditions": {"ready": ready}} for ip, ready in endpoints]}


def test_headless_names_list_ready_addresses_of_headless_slices_only():
    api = _Api([_slice("head", ("127.0.10.5", True), ("127.0.10.6", False)), _slice("other", ("127.0.11.2", None))])
    records = dns.HeadlessNames(api).records("ns")
    assert records == {"head.ns.svc": ["127.0.10.5"], "other.ns.svc": ["127.0.11.2"]}
    assert api.calls == [("/apis/discovery.k8s.io/v1/namespaces/ns/endpointslices",
                          {"labelSelector": dns.HEADLESS_LABEL})]
    assert dns.hosts_lines(records) == ("127.0.10.5\thead.ns.svc head.ns.svc.cluster.local\n"
                                        "127.0.11.2\tother.ns.svc other.ns.svc.cluster.local\n")


def test_answers_are_cached_and_kept_when_the_api_fails(monkeypatch):
    api = _Api([_slice("head", ("127.0.10.5", True))])
    names = dns.HeadlessNames(api)
    clock = [100.0]
    monkeypatch.setattr(dns.time, "monotonic", lambda: clock[0])
    first = names.records("ns")
    assert names.records("ns") == first and len(api.calls) == 1
    clock[0] += dns.REFRESH_S
    api.items = ApiError("GET", "/apis/discovery.k8s.io/v1", 500, {"message": "down"})
    assert names.records("ns") == first and len(api.calls) == 2
