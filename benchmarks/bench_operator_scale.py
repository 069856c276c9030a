"""Operator at scale: many jobs on the local control plane, serve-only controllers, kwok workers (issue 12 item 4).

Setup (`e2e/kwok/fleet.py`): the CRD, a FlowSchema that counts the operator's
requests at the API server, fake nodes that kwok (sigs.k8s.io/kwok, built by
`e2e/build_kwok.sh`) manages, the operator as a host process with its
least-privilege ServiceAccount. Each job's controller pod runs on the node
agent as `elastic-jax-controller --serve-only` (the product's control API and
slice set, no training loop) at its own pod IP; its worker pods are kwok's.

`--backend pathways --hosts 4`: each job's controller pod is its Pathways head
(the resource-manager and proxy sidecars are the node agent's stand-ins for
Google's images, the controller container `--serve-only`) on a node agent's CPU
node added for them (`fleet.HEAD_POOL`); each slice is a v5e 4x4 JobSet of 4
worker pods on a kwok TPU node pool of its own (GKE's labels, `google.com/tpu`
capacity and taint, one node per host: jobs x slices pools of `--hosts` nodes,
plus `--spare-pools`), placed by the real scheduler with the JobSet webhook's
exclusive placement. A failure is an eviction (under restartPolicy OnFailure a
killed container restarts in place); the Job replaces the pod in its pool.
kwok renews each node's lease every quarter of its duration, which is the
cluster's node-monitor grace (`E2E_NODE_MONITOR_GRACE_S`, 8 s by default: 800
writes a second for 1600 nodes); start the cluster with a longer one for
that many nodes (the usage below).

Phases:
1. `--jobs-small` jobs (default 10) are applied and run on all slices; the
   operator's requests are counted over `--window` seconds (steady state).
2. The rest up to `--jobs` (default 50); counted again over `--window`.
3. (a) one at a time, `--failures` worker pods (a different job each time)
   get a SIGKILLed container's status (phase Failed, exit 137, as a kubelet
   posts it): time from that status write to the controller applying the
   operator's `Down` (its own log line's timestamp, ms precision; nobody polls
   the controllers, so the measurement adds no load).
4. (b) burst: one worker of every job failed at once (50 status writes from 50
   threads); the same time per job, from its own write.
5. Everything recovers (the JobSet controller recreates each failed slice,
   kwok makes the new pod Ready, the operator reports it).

Reported: notify p50/p95/max for (a) and (b), the operator's own part
(`notify_seconds` in its log: pod event -> controller acknowledged), the
operator's CPU seconds and peak RSS (from /proc, per phase), operator requests
per job per minute at 10 and at 50 healthy jobs, and the load average beside
each. Prints a table, then `BENCH {json}`.

Usage (a local cluster with the default layout, `python -m e2e.harness up`, same E2E_* env):
  e2e/build_kwok.sh
  .venv/bin/python benchmarks/bench_operator_scale.py [--jobs 50 --slices 8 --failures 20 --window 60]
  # 50 x 8 x 4 = 1600 pathways worker pods on 1608 kwok TPU nodes (leases renewed every 150 s, ~11
  # writes/s; at 120 s, 54/s, one kwok v0.8.0 process with its default 4 lease workers managed ~23/s
  # at load 5-16 and ~200 nodes went NotReady). The phases fail pods, not nodes, so the long grace
  # changes nothing measured; it only stretches how long a lost node would take to be called lost:
  E2E_NODE_MONITOR_GRACE_S=600 .venv/bin/python -m e2e.harness up
  E2E_NODE_MONITOR_GRACE_S=600 .venv/bin/python benchmarks/bench_operator_scale.py --backend pathways --hosts 4

Targets: burst notify p95 < 1 s; operator requests per job per minute flat
between 10 and 50 healthy jobs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from e2e.harness import controlplane  # noqa: E402
from e2e.harness.cluster import LocalCluster  # noqa: E402
from e2e.helpers import create_namespace, wait_for  # noqa: E402
from e2e.kwok import KwokProcess  # noqa: E402
from e2e.kwok import fleet  # noqa: E402
from e2e.operator_fixtures import OperatorProcess, write_operator_kubeconfig  # noqa: E402
from elastic_jax.local.processes import free_port  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _proc_usage(pid: int) -> tuple[float, int]:
    """(CPU seconds user+system, peak RSS bytes) of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu_s = (int(fields[11]) + int(fields[12])) / CLK_TCK
    hwm = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            hwm = int(line.split()[1]) * 1024
    return cpu_s, hwm


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _quantiles(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    ordered = sorted(values)
    p95 = ordered[min(len(ordered) - 1, int(round(0.95 * (len(ordered) - 1))))]
    return {"n": len(values), "p50_s": round(statistics.median(values), 4), "p95_s": round(p95, 4),
            "max_s": round(max(values), 4)}


def _seen_to_notified(op: OperatorProcess, since_line: int) -> list[float]:
    out = []
    for rec in op.log_records()[since_line:]:
        if rec.get("notify_seconds") is not None:
            out.append(float(rec["notify_seconds"]))
    return out


def _wait_running(cluster, ns, names, slices, op, timeout_s):
    wait_for(lambda: fleet.all_running(cluster, ns, names, slices), timeout_s=timeout_s, interval_s=1.0,
             what=f"{len(names)} jobs active on {slices} slices",
             explain=lambda: json.dumps({n: {k: s.get(k) for k in ("phase", "activeSlices")}
                                         for n, s in fleet.job_statuses(cluster, ns).items()
                                         if s.get("activeSlices") != slices})[:3000] + "\n" + op.log()[-3000:])


def _steady(cluster, op, n_jobs: int, window_s: float, settle_s: float = 0.0) -> dict:
    """Operator requests and CPU over `window_s` with `n_jobs` healthy jobs, after `settle_s` seconds."""
    time.sleep(settle_s)
    r0, (c0, _), t0 = fleet.operator_requests(cluster), _proc_usage(op.proc.pid), time.monotonic()
    time.sleep(window_s)
    r1, (c1, rss), t1 = fleet.operator_requests(cluster), _proc_usage(op.proc.pid), time.monotonic()
    minutes = (t1 - t0) / 60
    return {"jobs": n_jobs, "window_s": round(t1 - t0, 1), "operator_requests": int(r1 - r0),
            "requests_per_job_per_min": round((r1 - r0) / n_jobs / minutes, 2),
            "operator_cpu_s_per_min": round((c1 - c0) / minutes, 2), "operator_rss_mib": round(rss / 2**20, 1),
            "settle_s": settle_s, "loadavg": _load()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=50)
    parser.add_argument("--jobs-small", type=int, default=10, help="healthy jobs in the first steady-state count")
    parser.add_argument("--slices", type=int, default=8)
    parser.add_argument("--backend", choices=("cpu", "pathways"), default="cpu")
    parser.add_argument("--hosts", type=int, default=1,
                        help="hosts per slice (cpu: 1; pathways: 1, 4 or 8, a v5e topology of that many 4-chip hosts)")
    parser.add_argument("--spare-pools", type=int, default=2, help="pathways: kwok TPU node pools beyond jobs x slices")
    parser.add_argument("--failures", type=int, default=20, help="one-at-a-time failures, phase (a)")
    parser.add_argument("--window", type=float, default=60.0, help="seconds of each steady-state count")
    parser.add_argument("--settle", type=float, default=0.0,
                        help="seconds to wait once all jobs run, before each steady-state count (the quiet "
                             "resync backs off from 30 s to 240 s over its first 210 s)")
    parser.add_argument("--kwok-nodes", type=int, default=4)
    args = parser.parse_args(argv)
    pathways = args.backend == "pathways"
    if not pathways and args.hosts != 1:
        parser.error("--hosts: the cpu backend runs 1 host per slice; use --backend pathways")
    if pathways:
        try:
            fleet.tpu_topology(args.hosts)
        except ValueError as e:
            parser.error(str(e))
    cluster = LocalCluster()
    if not cluster.is_running():
        print("no local cluster running: start one with `python -m e2e.harness up`", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="bench-operator-scale-"))
    ns = f"scale-{uuid.uuid4().hex[:6]}"
    grace_s = controlplane.node_monitor_grace_s()
    kwok_nodes = 0 if pathways else args.kwok_nodes
    fleet.install(cluster, kwok_nodes)
    tpu_nodes: list[str] = []
    head = None
    if pathways:
        head = fleet.add_head_node(cluster)  # first: its agent registers faster beside no kwok nodes yet
        started = time.monotonic()
        tpu_nodes = fleet.install_tpu_pools(cluster, args.jobs * args.slices + args.spare_pools, args.hosts)
        print(f"{len(tpu_nodes)} kwok TPU nodes created in {time.monotonic() - started:.1f} s; leases every "
              f"{grace_s / 4:g} s ({len(tpu_nodes) * 4 / grace_s:.0f} writes/s)", flush=True)
    kwok = KwokProcess(cluster.kubeconfig, workdir / "kwok.log", free_port(), node_lease_s=grace_s)
    kwok.start()
    op = OperatorProcess(write_operator_kubeconfig(cluster, workdir), workdir / "operator.log", free_port())
    report: dict = {"backend": args.backend, "jobs": args.jobs, "slices": args.slices, "hosts_per_slice": args.hosts,
                    "worker_pods": args.jobs * args.slices * args.hosts, "kwok_nodes": kwok_nodes + len(tpu_nodes),
                    "node_lease_s": grace_s, "workdir": str(workdir), "loadavg_start": _load()}
    try:
        if pathways:
            wait_for(lambda: fleet.tpu_nodes_ready(cluster, tpu_nodes), timeout_s=600, interval_s=2.0,
                     what="kwok TPU nodes Ready", explain=kwok.log)
        else:
            wait_for(lambda: fleet.kwok_nodes_ready(cluster, args.kwok_nodes),
                     timeout_s=60, what="kwok nodes Ready", explain=kwok.log)
        create_namespace(cluster, ns)
        op.start()
        names = [f"job-{i:03d}" for i in range(args.jobs)]
        small, rest = names[:args.jobs_small], names[args.jobs_small:]
        started = time.monotonic()
        fleet.apply_jobs(cluster, ns, small, args.slices, args.hosts, args.backend)
        _wait_running(cluster, ns, small, args.slices, op, timeout_s=600)
        report["start_small_s"] = round(time.monotonic() - started, 1)
        print(f"{len(small)} jobs running after {report['start_small_s']} s (load {_load()})", flush=True)
        report["steady_small"] = _steady(cluster, op, len(small), args.window, args.settle)
        print("steady", report["steady_small"], flush=True)
        started = time.monotonic()
        if rest:
            fleet.apply_jobs(cluster, ns, rest, args.slices, args.hosts, args.backend)
        _wait_running(cluster, ns, names, args.slices, op, timeout_s=1200)
        report["start_rest_s"] = round(time.monotonic() - started, 1)
        print(f"{len(names)} jobs running after {report['start_rest_s']} s more (load {_load()})", flush=True)
        report["steady_full"] = _steady(cluster, op, len(names), args.window, args.settle)
        print("steady", report["steady_full"], flush=True)

        # (a) one failure at a time, all other jobs healthy
        cpu0, _ = _proc_usage(op.proc.pid)
        log_mark = len(op.log_records())
        single: list[float] = []
        for n in range(args.failures):
            job = names[n % len(names)]
            index = n % args.slices
            by_job = fleet.pods_by_job(cluster, ns)
            victim = wait_for(lambda: fleet.running_worker(fleet.pods_by_job(cluster, ns)[job]["workers"], index),
                              timeout_s=120, what=f"{job} slice {index} worker running")
            ctrl = by_job[job]["controller"][0]
            sent = fleet.fail_pod(cluster, ns, victim)
            applied = fleet.wait_down_applied(cluster, ns, ctrl, index, sent)
            single.append(applied - sent)
            print(f"(a) failure {n + 1:2d}: {job} slice {index}: status written -> controller has Down "
                  f"{single[-1] * 1000:7.1f} ms", flush=True)
        report["single"] = {**_quantiles(single), "seen_to_notified": _quantiles(_seen_to_notified(op, log_mark)),
                            "loadavg": _load()}
        _wait_running(cluster, ns, names, args.slices, op, timeout_s=600)

        # (b) burst: one worker of every job at once
        index = args.slices - 1

        def burst_victims():
            # (a job whose slice `index` was replaced in (a) can report all slices active before the
            # list of pods shows the new worker Running: wait for every victim, not for status alone)
            pods = fleet.pods_by_job(cluster, ns)
            found = {job: fleet.running_worker(pods[job]["workers"], index) for job in names}
            return (pods, found) if all(v is not None for v in found.values()) else None

        by_job, victims = wait_for(burst_victims, timeout_s=300, what=f"a running worker of slice {index} in every job")
        log_mark = len(op.log_records())
        cpu_b0, _ = _proc_usage(op.proc.pid)
        burst_start = time.time()
        sent_times = fleet.fail_pods(cluster, ns, [victims[j] for j in names])
        burst: list[float] = []
        from_start: list[float] = []
        for job, sent in zip(names, sent_times):
            applied = fleet.wait_down_applied(cluster, ns, by_job[job]["controller"][0], index, sent, timeout_s=120)
            burst.append(applied - sent)
            from_start.append(applied - burst_start)
        report["burst"] = {**_quantiles(burst), "from_burst_start": _quantiles(from_start),
                           "seen_to_notified": _quantiles(_seen_to_notified(op, log_mark)), "loadavg": _load()}
        print("burst", report["burst"], flush=True)
        started = time.monotonic()
        _wait_running(cluster, ns, names, args.slices, op, timeout_s=900)
        report["burst_recovered_s"] = round(time.monotonic() - started, 1)
        cpu1, rss = _proc_usage(op.proc.pid)
        report["operator"] = {"cpu_s_failures": round(cpu1 - cpu0, 1), "cpu_s_burst_and_recovery": round(cpu1 - cpu_b0, 1),
                              "cpu_s_total": round(cpu1, 1), "peak_rss_mib": round(rss / 2**20, 1)}
        report["loadavg_end"] = _load()
        print(f"\n{'measure':<44} {'result':>30}")
        s, f = report["steady_small"], report["steady_full"]
        rows = [
            ("(a) single failure -> Down, p50 / p95", f"{report['single']['p50_s']:.3f} / {report['single']['p95_s']:.3f} s"),
            ("(b) burst of %d -> Down, p50 / p95" % len(names), f"{report['burst']['p50_s']:.3f} / {report['burst']['p95_s']:.3f} s"),
            (f"requests/job/min at {s['jobs']} / {f['jobs']} jobs",
             f"{s['requests_per_job_per_min']} / {f['requests_per_job_per_min']}"),
            (f"operator CPU s/min at steady state ({s['jobs']} / {f['jobs']})",
             f"{s['operator_cpu_s_per_min']} / {f['operator_cpu_s_per_min']}"),
            ("operator peak RSS", f"{report['operator']['peak_rss_mib']} MiB"),
        ]
        for k, v in rows:
            print(f"{k:<44} {v:>30}")
        print("BENCH " + json.dumps(report))
        return 0 if report["burst"]["p95_s"] < 1.0 else 1
    finally:
        op.stop()
        kwok.stop()
        cluster.kubectl("delete", "namespace", ns, "--wait=false", check=False)
        if head is not None:
            cluster.remove_node(head)  # its agent and the heads' processes, by PID
        if pathways:
            fleet.remove_tpu_nodes(cluster)
        print(f"logs: {workdir}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
