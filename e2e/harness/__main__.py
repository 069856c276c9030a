"""``python -m e2e.harness up|down|status|build``: run the local cluster by hand.

``up`` builds if needed, starts the cluster (or keeps a running one) and
prints the kubeconfig path; ``down`` stops every process by the PIDs recorded
in the cluster folder and checks that none is left.
"""

from __future__ import annotations

import argparse
import sys

from e2e.harness import sessionlock
from e2e.harness.build import ensure_built
from e2e.harness.cluster import LocalCluster


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m e2e.harness", description=__doc__)
    p.add_argument("command", choices=["up", "down", "status", "build"])
    args = p.parse_args(argv)
    if args.command == "build":
        print(f"built in {ensure_built():.1f}s")
        return 0
    cluster = LocalCluster()
    if args.command in ("up", "down"):
        # Never start or stop underneath a running test session on this folder.
        sessionlock.acquire(cluster.state, on_wait=print)
    if args.command == "up":
        if not cluster.is_running():
            cluster.start()
        cluster.mark_manual()
        print(f"export KUBECONFIG={cluster.kubeconfig}")
        print(f"export PATH={cluster.bin}:$PATH")
    elif args.command == "down":
        cluster.stop()
        print("stopped")
    else:
        running = cluster.is_running()
        print("running" if running else "not running")
        return 0 if running else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
