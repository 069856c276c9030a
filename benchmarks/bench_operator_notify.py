"""Operator benchmark: worker pod failure → controller notified, over 20 failures on the local cluster.

Runs `examples/01-cpu-job.yaml` (with a step count that outlasts the run)
under the operator with its least-privilege identity, then 20 times: SIGKILL
the worker process of one slice (alternating), and poll the controller's
`GET /v1/status` every 5 ms until that slice shows the operator's `Down`
report (its generation changes: the controller's own failure detection
keeps the old generation). Reported per failure:

- `kill_to_notified_s`: SIGKILL → the controller applied the operator's Down
  (node agent notices the exit, posts pod status, the API server's watch
  reaches the operator, the operator reports over HTTP);
- `seen_to_notified_s`: the operator's own part, from the pod event it acted
  on to the controller's acknowledgement (the `notify_seconds` field of its
  JSON log lines; the same value feeds its
  `elasticjax_operator_failure_notify_seconds` histogram).

Measured here (2 cores, shared): kill → notified median 0.20 s, p95 0.32 s;
seen → notified median 0.008 s.

Then it waits for the slice to be Ready again before the next failure.
Target: median kill → notified < 1 s.

Usage (a cluster started with `python -m e2e.harness up`, same E2E_* env):
  .venv/bin/python benchmarks/bench_operator_notify.py [--failures 20]

Prints a table, then one line of JSON (`BENCH {...}`) for scripts.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from e2e.harness.cluster import LocalCluster  # noqa: E402
from e2e.helpers import is_ready, pods, wait_for  # noqa: E402
from e2e.operator_fixtures import (  # noqa: E402
    CRD, OperatorProcess, _free_port, clear_checkpoints, example_manifest, get_job, operator_rbac_objects,
)
from elastic_jax.api.client import ControlClient  # noqa: E402

JOB = "cpu-job"


def _kubeconfig(cluster: LocalCluster, workdir: Path) -> Path:
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    cluster.kubectl("wait", "--for=condition=Established", "crd/elastictrainingjobs.elasticjax.dev", "--timeout=60s")
    cluster.kubectl("apply", "-f", "-", input=operator_rbac_objects())
    token = cluster.kubectl("create", "token", "elastic-jax-operator", "-n", "elastic-jax-system").stdout.strip()
    path = workdir / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "op",
        "clusters": [{"name": "c", "cluster": {"server": cluster.server, "certificate-authority": str(cluster.state / "pki" / "ca.crt")}}],
        "users": [{"name": "op", "user": {"token": token}}],
        "contexts": [{"name": "op", "context": {"cluster": "c", "user": "op"}}]}))
    return path


def _worker(cluster, ns, index):
    live = [p for p in pods(cluster, ns, f"elasticjax.dev/job-name={JOB},elasticjax.dev/slice-index={index}")
            if p["status"].get("phase") == "Running" and is_ready(p) and not p["metadata"].get("deletionTimestamp")]
    return live[0] if live else None


def _seen_to_notified(op: OperatorProcess) -> list[float]:
    out = []
    for rec in op.log_records():
        if "notify_seconds" in rec and rec.get("notify_seconds") is not None:
            out.append(float(rec["notify_seconds"]))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--failures", type=int, default=20)
    args = parser.parse_args(argv)
    cluster = LocalCluster()
    if not cluster.is_running():
        print("no local cluster running: start one with `python -m e2e.harness up`", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="bench-operator-"))
    ns = f"bench-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", ns)
    op = OperatorProcess(_kubeconfig(cluster, workdir), workdir / "operator.log", _free_port())
    op.start()
    try:
        manifest = example_manifest()
        clear_checkpoints(manifest)
        manifest["spec"]["training"]["steps"] = 1_000_000
        manifest["spec"]["elasticity"].update(maxRestarts=1000, maxRestartsPerSlice=1000)
        wait_for(lambda: cluster.kubectl("get", "serviceaccount", "default", "-n", ns, check=False).returncode == 0,
                 timeout_s=30, what="default ServiceAccount")
        cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(manifest))
        wait_for(lambda: (get_job(cluster, ns, JOB).get("status") or {}).get("activeSlices") == 2, timeout_s=240,
                 what="job training on both slices", explain=op.log)
        secret = cluster.api().get(f"/api/v1/namespaces/{ns}/secrets/{JOB}-token")
        token = base64.b64decode(secret["data"]["token"]).decode()
        ctrl = pods(cluster, ns, f"elasticjax.dev/job-name={JOB},elasticjax.dev/role=controller")[0]
        client = ControlClient(f"http://{ctrl['status']['podIP']}:8080", token, timeout_s=1.0)
        results = []
        for n in range(args.failures):
            index = n % 2
            victim = wait_for(lambda: _worker(cluster, ns, index), timeout_s=120, what=f"slice {index} ready")
            wait_for(lambda: any(s.state == "Active" for s in client.status().slices if s.index == index),
                     timeout_s=120, what=f"slice {index} active")
            before = next(s.generation for s in client.status().slices if s.index == index)
            pid = cluster.container_pid(ns, victim["metadata"]["name"], "worker")
            t0 = time.monotonic()
            os.kill(pid, signal.SIGKILL)
            while True:
                view = next(s for s in client.status().slices if s.index == index)
                if view.generation != before and view.state == "Down":
                    break
                if time.monotonic() - t0 > 30:
                    raise TimeoutError(f"failure {n}: controller not told within 30 s")
                time.sleep(0.005)
            results.append(time.monotonic() - t0)
            print(f"failure {n + 1:2d}: slice {index} kill -> controller notified {results[-1] * 1000:7.1f} ms", flush=True)
        client.close()
        seen = _seen_to_notified(op)
        q = statistics.quantiles(results, n=20)
        report = {
            "failures": len(results),
            "kill_to_notified_median_s": round(statistics.median(results), 4),
            "kill_to_notified_p95_s": round(q[18], 4),
            "kill_to_notified_max_s": round(max(results), 4),
            "seen_to_notified_median_s": round(statistics.median(seen), 4) if seen else None,
            "seen_to_notified_p95_s": round(statistics.quantiles(seen, n=20)[18], 4) if len(seen) > 1 else None,
            "target_median_s": 1.0,
        }
        print(f"\nkill -> notified: median {report['kill_to_notified_median_s'] * 1000:.0f} ms, "
              f"p95 {report['kill_to_notified_p95_s'] * 1000:.0f} ms over {len(results)} failures")
        print("BENCH " + json.dumps(report))
        return 0 if report["kill_to_notified_median_s"] < 1.0 else 1
    finally:
        op.stop()
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)


if __name__ == "__main__":
    sys.exit(main())
