"""The loopback ports one cluster uses, all offsets from one base.

``E2E_PORT_BASE`` (default 16400) moves the whole block, so two clusters in two
folders can run side by side.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Ports:
    """Every TCP port the control plane listens on, all on 127.0.0.1."""

    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    jobset_webhook: int
    jobset_metrics: int
    jobset_health: int

    @property
    def address_octet(self) -> int:
        """Second octet of this cluster's loopback addresses (127.A.x.y), from the port base.

        Clusters on one machine already need different port bases; deriving the
        addresses from it keeps their pod IPs apart too (bases must differ in
        their hundreds, and not by a multiple of 25600).
        """
        return (self.etcd_client // 100) % 256

    @classmethod
    def from_base(cls, base: int) -> "Ports":
        """Ports at fixed offsets from ``base``.

        Raises:
            ValueError: the block would leave the unprivileged port range.
        """
        if not 1024 <= base <= 65000:
            raise ValueError(f"E2E_PORT_BASE={base} must be between 1024 and 65000")
        return cls(etcd_client=base, etcd_peer=base + 1, apiserver=base + 43,
                   controller_manager=base + 57, scheduler=base + 59,
                   jobset_webhook=base + 90, jobset_metrics=base + 91, jobset_health=base + 92)


def default_ports() -> Ports:
    """Ports from ``E2E_PORT_BASE``.

    Raises:
        ValueError: ``E2E_PORT_BASE`` is not an integer in range.
    """
    raw = os.environ.get("E2E_PORT_BASE", "16400")
    try:
        base = int(raw)
    except ValueError:
        raise ValueError(f"E2E_PORT_BASE={raw!r} is not an integer") from None
    return Ports.from_base(base)
