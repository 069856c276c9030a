"""The simulated GKE node layout: one CPU pool and three single-host TPU v5e pools.

Each node is labelled the way GKE labels it (node pool, TPU accelerator and
topology, machine type, zone), TPU nodes carry GKE's
``google.com/tpu=present:NoSchedule`` taint and ``google.com/tpu`` capacity, so
the real scheduler (with the API server's ExtendedResourceToleration admission)
places CPU pods on the CPU pool and TPU pods on TPU pools only. Every pool has
two nodes, so a pod of a failed node can be rescheduled inside its pool.
"""

from __future__ import annotations

from dataclasses import dataclass, field

REGION = "us-west4"
ZONE = "us-west4-a"
NODEPOOL_LABEL = "cloud.google.com/gke-nodepool"
TPU_ACCELERATOR_LABEL = "cloud.google.com/gke-tpu-accelerator"
TPU_TOPOLOGY_LABEL = "cloud.google.com/gke-tpu-topology"
TPU_RESOURCE = "google.com/tpu"


@dataclass(frozen=True)
class NodeSpec:
    """One simulated node."""

    name: str
    pool: str
    host_ip: str
    labels: dict[str, str] = field(default_factory=dict)
    taints: list[dict] = field(default_factory=list)
    capacity: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class PoolSpec:
    """A node pool: ``nodes`` identical nodes."""

    name: str
    nodes: int
    machine_type: str
    cpu: str
    memory: str
    tpu_accelerator: str | None = None
    tpu_topology: str | None = None
    tpu_chips: int = 0


DEFAULT_POOLS = (
    PoolSpec("cpu-pool", 2, "e2-standard-8", cpu="8", memory="32Gi"),
    PoolSpec("tpu-pool-a", 2, "ct5lp-hightpu-4t", cpu="24", memory="48Gi",
             tpu_accelerator="tpu-v5-lite-podslice", tpu_topology="2x2", tpu_chips=4),
    PoolSpec("tpu-pool-b", 2, "ct5lp-hightpu-4t", cpu="24", memory="48Gi",
             tpu_accelerator="tpu-v5-lite-podslice", tpu_topology="2x2", tpu_chips=4),
    PoolSpec("tpu-pool-c", 2, "ct5lp-hightpu-4t", cpu="24", memory="48Gi",
             tpu_accelerator="tpu-v5-lite-podslice", tpu_topology="2x2", tpu_chips=4),
)


# Nodes a test adds while the cluster runs (a node pool that appears) number from here, clear of the layout's.
EXTRA_NODE_INDEX = 100


def nodes(pools: tuple[PoolSpec, ...] = DEFAULT_POOLS, *, address_octet: int = 0,
          first_index: int = 0) -> list[NodeSpec]:
    """The nodes of ``pools``; node k (0-based overall) gets InternalIP 127.A.(10+first_index+k).1.

    Args:
        pools: the node pools.
        address_octet: A, the second octet; clusters running side by side on one
            machine need different values, or their pods' addresses collide.
        first_index: the first node's k (`EXTRA_NODE_INDEX` for nodes added to a running cluster).

    Raises:
        ValueError: more nodes than the address plan allows, a pool with no
            nodes, or ``address_octet`` outside 0-255.
    """
    if not 0 <= address_octet <= 255:
        raise ValueError(f"address_octet {address_octet} is not in 0-255")
    out: list[NodeSpec] = []
    for pool in pools:
        if pool.nodes < 1:
            raise ValueError(f"pool {pool.name} has no nodes")
        for i in range(pool.nodes):
            k = first_index + len(out)
            if k > 200:
                raise ValueError("at most 201 nodes (one 127.A.X.0/24 each)")
            labels = {
                NODEPOOL_LABEL: pool.name,
                "node.kubernetes.io/instance-type": pool.machine_type,
                "topology.kubernetes.io/region": REGION,
                "topology.kubernetes.io/zone": ZONE,
            }
            capacity = {"cpu": pool.cpu, "memory": pool.memory, "pods": "110", "ephemeral-storage": "100Gi"}
            taints = []
            if pool.tpu_chips:
                labels[TPU_ACCELERATOR_LABEL] = pool.tpu_accelerator or ""
                labels[TPU_TOPOLOGY_LABEL] = pool.tpu_topology or ""
                capacity[TPU_RESOURCE] = str(pool.tpu_chips)
                taints.append({"key": TPU_RESOURCE, "value": "present", "effect": "NoSchedule"})
            out.append(NodeSpec(name=f"{pool.name}-{i}", pool=pool.name, host_ip=f"127.{address_octet}.{10 + k}.1",
                                labels=labels, taints=taints, capacity=capacity))
    return out
