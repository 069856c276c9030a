"""``python -m e2e.nodeagent --name NODE ...``: run one node agent until SIGTERM."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from e2e.nodeagent.agent import Agent, marker_env, pods_dir
from e2e.nodeagent.dns import HeadlessNames
from e2e.nodeagent.kubeapi import KubeApi
from e2e.nodeagent.node import NodeHeartbeat
from e2e.nodeagent.podworker import NodeContext


def _json(kind: type):
    def parse(raw: str):
        value = json.loads(raw)
        if not isinstance(value, kind):
            raise argparse.ArgumentTypeError(f"expected a JSON {kind.__name__}, got {raw!r}")
        return value
    return parse


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m e2e.nodeagent", description=__doc__)
    p.add_argument("--name", required=True, help="Node name")
    p.add_argument("--host-ip", required=True, help="the node's InternalIP, 127.X.Y.1; pods get 127.X.Y.2-254")
    p.add_argument("--api-host", default="127.0.0.1")
    p.add_argument("--api-port", type=int, required=True)
    p.add_argument("--pki-dir", type=Path, required=True, help="folder with ca.crt, admin.crt, admin.key")
    p.add_argument("--state-dir", type=Path, required=True, help="this node's folder (pods, logs)")
    p.add_argument("--created-mountpoints", type=Path, required=True,
                   help="file listing host paths created as mount points (removed at cluster teardown)")
    p.add_argument("--labels", type=_json(dict), default={})
    p.add_argument("--taints", type=_json(list), default=[])
    p.add_argument("--capacity", type=_json(dict), default={"cpu": "8", "memory": "32Gi", "pods": "110"})
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stdout,
                        format=f"%(asctime)s {args.name} %(levelname)s %(message)s")
    api = KubeApi(args.api_host, args.api_port, args.pki_dir)
    ctx = NodeContext(api=api, node_name=args.name, host_ip=args.host_ip, api_host=args.api_host,
                      api_port=args.api_port, pods_dir=pods_dir(args.state_dir),
                      path_prefix=str(Path(sys.executable).parent),
                      created_mountpoints=args.created_mountpoints, marker_env=marker_env(),
                      dns=HeadlessNames(api))
    heartbeat = NodeHeartbeat(api, args.name, args.labels, args.taints, args.capacity, args.host_ip)
    Agent(heartbeat, ctx).run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
