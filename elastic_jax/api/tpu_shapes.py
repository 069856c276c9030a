"""GKE TPU slice shapes: accelerator label + topology → hosts per slice, chips per host.

The table is pathways-utils' (AI-Hypercomputer/pathways-utils,
`pathwaysutils/experimental/shared_pathways_service/tpu_specs.py`
`get_tpu_config`, and `pathwaysutils/experimental/gke/jobset.py`
`MACHINE_TYPE_TO_*` maps): the GKE accelerator label, 4 chips per host
(the `*-4t` machine types), and the Pathways instance-type prefix the
resource manager's `--instance_type` takes. Hosts per slice are the
topology's chips divided by chips per host, as in `calculate_vms_per_slice`
there, which also refuses a topology whose chips do not divide evenly.

Single-host 8-chip machines (`ct5lp-hightpu-8t`, `ct6e-standard-8t`): on
v5e and v6e, GKE serves topology `2x4` with one 8-chip host, not two 4-chip
hosts (GKE TPU docs, "Plan TPUs in GKE": 2x4 is the single-host machine type
with 8 chips); pathways-utils' builder gives those machine types 8 chips per
VM and the `tpuv5e1t` / `tpuv6e1t` instance types (`MACHINE_TYPE_TO_TPU_VERSION_MAP`,
`chips_per_vm`). `TpuGeneration.single_host` holds that row.

The number of topology dimensions (2 for v5e/v6e, 3 for v4/v5p/tpu7x) is
from the GKE TPU documentation ("Plan TPUs in GKE", topology column); the
references do not check it, but a v5p `2x2` would otherwise reach GKE and
never schedule.

Pure (no Kubernetes client): the operator's pathways renderer, `elastic-jax validate` and the CRD's
CEL rules (`elastic_jax.api.crd`) all read this one table.
"""

from __future__ import annotations

import dataclasses
import math
import re

from elastic_jax.api.cluster import UnsupportedBackend

ACCELERATOR_FIELD = "spec.slices.accelerator"
TOPOLOGY_FIELD = "spec.slices.topology"

_TOPOLOGY = re.compile(r"^[1-9][0-9]*(x[1-9][0-9]*)+$")


@dataclasses.dataclass(frozen=True)
class TpuGeneration:
    """One row of the table: what GKE and Pathways call one TPU generation."""

    accelerator: str  # node label cloud.google.com/gke-tpu-accelerator
    instance_prefix: str  # Pathways --instance_type prefix, e.g. "tpuv5e"
    chips_per_host: int  # google.com/tpu of one host (machine type *-4t)
    topology_dims: int  # 2: AxB, 3: AxBxC
    # topology -> (chips on its one host, Pathways instance prefix): the single-host machine types
    # with more chips than `chips_per_host` (v5e/v6e 2x4 on *-8t machines).
    single_host: tuple[tuple[str, int, str], ...] = ()


# Keyed by the GKE accelerator label, the value users put in spec.slices.accelerator.
GENERATIONS: dict[str, TpuGeneration] = {g.accelerator: g for g in (
    TpuGeneration("tpu-v4-podslice", "tpuv4", 4, 3),
    TpuGeneration("tpu-v5-lite-podslice", "tpuv5e", 4, 2, single_host=(("2x4", 8, "tpuv5e1t"),)),  # ct5lp-hightpu-8t
    TpuGeneration("tpu-v5p-slice", "tpuv5", 4, 3),
    TpuGeneration("tpu-v6e-slice", "tpuv6e", 4, 2, single_host=(("2x4", 8, "tpuv6e1t"),)),  # ct6e-standard-8t
    TpuGeneration("tpu7x", "tpu7x", 4, 3),
)}


class SliceShapeError(UnsupportedBackend):
    """The accelerator/topology pair is not one this operator can render; `str()` names the field."""


@dataclasses.dataclass(frozen=True)
class SliceShape:
    """One TPU slice as the renderer needs it."""

    accelerator: str
    topology: str
    hosts: int  # worker pods (TPU VMs) per slice
    chips_per_host: int  # google.com/tpu limit of each worker pod
    instance_prefix: str = ""  # Pathways --instance_type prefix; "" = the generation's

    @property
    def chips(self) -> int:
        """TPU chips in the slice."""
        return self.hosts * self.chips_per_host

    @property
    def instance_type(self) -> str:
        """The resource manager's `--instance_type`, e.g. `tpuv5e:2x2`."""
        return f"{self.instance_prefix or GENERATIONS[self.accelerator].instance_prefix}:{self.topology}"


def slice_shape(accelerator: str | None, topology: str | None) -> SliceShape:
    """The shape of one slice of `accelerator` with `topology`.

    Args:
      accelerator: GKE accelerator label, e.g. `tpu-v5-lite-podslice`.
      topology: chips along each axis, e.g. `2x2` or `2x2x2`.

    Returns:
      The hosts per slice and chips per host (v5e/v6e `2x4`: one host with 8 chips).

    Raises:
      SliceShapeError: unknown accelerator (names spec.slices.accelerator and
        lists the known ones), or a malformed topology, a wrong number of
        dimensions, or chips not a multiple of the chips per host (names
        spec.slices.topology).
    """
    gen = GENERATIONS.get(accelerator or "")
    if gen is None:
        raise SliceShapeError(
            f"{ACCELERATOR_FIELD} {accelerator!r} is not a TPU accelerator this operator knows "
            f"(known: {', '.join(sorted(GENERATIONS))})"
        )
    topology = topology or ""
    if not _TOPOLOGY.fullmatch(topology):
        raise SliceShapeError(f"{TOPOLOGY_FIELD} {topology!r} must look like AxB or AxBxC (chips per axis)")
    dims = [int(d) for d in topology.split("x")]
    if len(dims) != gen.topology_dims:
        example = "x".join(["2"] * gen.topology_dims)
        raise SliceShapeError(
            f"{TOPOLOGY_FIELD} {topology!r} must have {gen.topology_dims} dimensions for {accelerator} (e.g. {example})"
        )
    chips = math.prod(dims)
    for single_topology, host_chips, prefix in gen.single_host:
        if topology == single_topology:  # one host holds every chip (an 8-chip machine type)
            return SliceShape(accelerator=gen.accelerator, topology=topology, hosts=1, chips_per_host=host_chips,
                              instance_prefix=prefix)
    if chips % gen.chips_per_host:
        # Fewer chips than one host are other machine types (e.g. ct5lp-hightpu-1t), which Pathways' table lacks.
        smaller = (f"; a slice smaller than one host (a 1-chip machine type such as ct5lp-hightpu-1t) has no "
                   f"Pathways instance type" if chips < gen.chips_per_host else "")
        raise SliceShapeError(
            f"{TOPOLOGY_FIELD} {topology!r} has {chips} chips, not a multiple of the {gen.chips_per_host} "
            f"chips per host of {accelerator}{smaller}"
        )
    return SliceShape(accelerator=gen.accelerator, topology=topology, hosts=chips // gen.chips_per_host,
                      chips_per_host=gen.chips_per_host)


def cel_rules() -> list[dict[str, str]]:
    """CEL rules for the CRD's spec: the API server refuses what `slice_shape` refuses for backend pathways.

    Generated from `GENERATIONS` (the one table), so `kubectl apply`, `elastic-jax validate --cluster` and
    the operator agree: a known accelerator, a topology of its number of dimensions, whole hosts.
    """
    known = ", ".join(f"'{a}'" for a in sorted(GENERATIONS))
    pathways = "self.backend != 'pathways' || !has(self.slices.accelerator) || !has(self.slices.topology)"
    rules = [
        {"rule": f"self.backend != 'pathways' || !has(self.slices.accelerator) || self.slices.accelerator in [{known}]",
         "message": f"{ACCELERATOR_FIELD} is not a TPU accelerator this operator knows (known: "
                    f"{', '.join(sorted(GENERATIONS))})",
         "fieldPath": ".slices.accelerator"},
        {"rule": (f"self.backend != 'pathways' || !has(self.slices.topology) || "
                  f"self.slices.topology.matches('{_TOPOLOGY.pattern}')"),
         "message": f"{TOPOLOGY_FIELD} must look like AxB or AxBxC (chips per axis)",
         "fieldPath": ".slices.topology"},
    ]
    for gen in sorted(GENERATIONS.values(), key=lambda g: g.accelerator):
        dims = " * ".join(f"int(self.slices.topology.split('x')[{i}])" for i in range(gen.topology_dims))
        example = "x".join(["2"] * gen.topology_dims)
        rules.append({
            "rule": (f"{pathways} || self.slices.accelerator != '{gen.accelerator}' || "
                     f"!self.slices.topology.matches('{_TOPOLOGY.pattern}') || "
                     f"(size(self.slices.topology.split('x')) == {gen.topology_dims} && "
                     f"({dims}) % {gen.chips_per_host} == 0)"),
            "message": (f"{TOPOLOGY_FIELD} for {gen.accelerator} must have {gen.topology_dims} dimensions "
                        f"(e.g. {example}) and a multiple of its {gen.chips_per_host} chips per host"),
            "fieldPath": ".slices.topology"})
    return rules
