"""The node agent's stand-in for CoreDNS: headless Service names from the pods they select (e2e/nodeagent/dns.py).

The API is a scripted stub here (this is the agent's own logic); e2e/standin/test_pod_runtime.py resolves a name
through real Services and pods."""

from __future__ import annotations

from e2e.nodeagent import dns
from e2e.nodeagent.kubeapi import ApiError


class _Api:
    def __init__(self, services, pods):
        self.services, self.pods, self.calls = services, pods, []

    def get(self, path, **query):
        self.calls.append(path)
        if isinstance(self.services, Exception):
            raise self.services
        return {"items": self.services if path.endswith("/services") else self.pods}


def _svc(name, selector, headless=True, not_ready=False):
    return {"metadata": {"name": name}, "spec": {"clusterIP": "None" if headless else "10.0.0.1",
                                                  "selector": selector, "publishNotReadyAddresses": not_ready}}


def _pod(ip, labels, ready=True, phase="Running", deleting=False):
    meta = {"labels": labels, **({"deletionTimestamp": "t"} if deleting else {})}
    return {"metadata": meta, "status": {"podIP": ip, "phase": phase,
                                         "conditions": [{"type": "Ready", "status": str(ready)}]}}


def test_headless_names_follow_the_endpoint_rules():
    api = _Api([_svc("head", {"app": "head"}, not_ready=True), _svc("web", {"app": "web"}),
                _svc("vip", {"app": "web"}, headless=False)],
               [_pod("127.0.10.5", {"app": "head"}, ready=False), _pod("127.0.10.6", {"app": "head"}, phase="Failed"),
                _pod("127.0.10.7", {"app": "web"}), _pod("127.0.10.8", {"app": "web"}, ready=False),
                _pod("127.0.10.9", {"app": "web"}, deleting=True), _pod("127.0.10.10", {"app": "other"})])
    records = dns.HeadlessNames(api).records("ns")
    assert records == {"head.ns.svc": ["127.0.10.5"], "web.ns.svc": ["127.0.10.7"]}
    assert dns.hosts_lines(records) == ("127.0.10.5\thead.ns.svc head.ns.svc.cluster.local\n"
                                        "127.0.10.7\tweb.ns.svc web.ns.svc.cluster.local\n")


def test_answers_are_cached_and_kept_when_the_api_fails(monkeypatch):
    api = _Api([_svc("head", {"app": "head"})], [_pod("127.0.10.5", {"app": "head"})])
    names = dns.HeadlessNames(api)
    clock = [100.0]
    monkeypatch.setattr(dns.time, "monotonic", lambda: clock[0])
    first = names.records("ns")
    assert first and names.records("ns") == first and len(api.calls) == 2
    clock[0] += dns.REFRESH_S
    api.services = ApiError("GET", "/api/v1", 500, {"message": "down"})
    assert names.records("ns") == first and len(api.calls) == 3


def test_an_answer_slower_than_the_refresh_is_fresh_when_it_comes(monkeypatch):
    # A list that takes longer than REFRESH_S must not leave the cache stale at once: the agent's loop
    # would list the namespace again for every pod it syncs (seen with 1600 pods in one namespace).
    clock = [100.0]

    class _SlowApi(_Api):
        def get(self, path, **query):
            clock[0] += dns.REFRESH_S  # each request takes a whole refresh period
            return super().get(path, **query)

    api = _SlowApi([_svc("head", {"app": "head"})], [_pod("127.0.10.5", {"app": "head"})])
    names = dns.HeadlessNames(api)
    monkeypatch.setattr(dns.time, "monotonic", lambda: clock[0])
    first = names.records("ns")
    assert first == {"head.ns.svc": ["127.0.10.5"]} and len(api.calls) == 2
    assert names.records("ns") == first and len(api.calls) == 2  # served from the cache, not listed again
