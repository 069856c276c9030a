"""The kind cluster's bridge /24: never one the host already routes (another engine's cluster's bridge)."""

from __future__ import annotations

import ipaddress

from e2e.kind import cluster

# /proc/net/route as Linux writes it: a default route, the host's eth0 /24, another engine's kind bridge.
_TABLE = """Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
eth0\t00000000\t010200C0\t0003\t0\t0\t0\t00000000\t0\t0\t0
eth0\t000200C0\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
br-e29132acc46b\t00291EAC\t00000000\t0001\t0\t0\t0\t00FFFFFF\t0\t0\t0
"""


def test_the_host_routes_are_read_without_the_default_route():
    assert cluster.host_routes(_TABLE) == [ipaddress.ip_network("192.0.2.0/24"), ipaddress.ip_network("172.30.41.0/24")]


def test_a_second_cluster_of_the_same_name_skips_the_first_ones_routed_subnet():
    """A new user's trial (session 24): a second `run.sh` beside CI's cluster `elastic-jax` (each in its own Docker
    engine, which sees only its own networks) took the same 172.30.41.0/24 and the host's route went to the
    first bridge: the second cluster's API server answered EOF."""
    free = cluster.candidate_subnets("elastic-jax", [])
    assert free[0] == "172.30.41.0/24" and len(free) == 16  # (what both engines chose before)
    routed = cluster.host_routes(_TABLE)
    assert cluster.candidate_subnets("elastic-jax", routed) == free[1:]
    # a route covering every candidate leaves none (the caller's error then says so)
    assert cluster.candidate_subnets("elastic-jax", [ipaddress.ip_network("172.30.0.0/16")]) == []
