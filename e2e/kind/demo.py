"""The kind demo that ``e2e/kind/run.sh --air-gapped`` runs: the product as a user installs it, and a crash.

Steps: the three images (built here on the offline base), the kind cluster
(node image built here; reused when one of that name is up), the chart with
the operator image built here, ``examples/01-cpu-job.yaml`` in a namespace
that enforces PodSecurity ``restricted``, then a worker **process** SIGKILLed
inside its container (from its node, by PID, as the OOM killer or a crash
would), and the checks: the slice is replaced, the controller pod keeps its
UID and restartCount, status shows the recovery, the job Succeeds.

The pieces are functions the pytest tier uses too (``e2e/kind/test_product.py``).

Command line (root; starts its own Docker engine unless ``DOCKER_HOST`` answers)::

    python -m e2e.kind.demo [--keep] [--steps N]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
import uuid
from pathlib import Path

import yaml

from e2e import helpers
from e2e.kind import cluster as kind
from e2e.kind import engine as engine_mod
from e2e.kind import images

REPO_ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = REPO_ROOT / "examples" / "01-cpu-job.yaml"
SYSTEM_NS = "elastic-jax-system"
RELEASE = "elastic-jax"
JOB = "cpu-job"


def wait_for(check, timeout_s: float, what: str, explain=lambda: "", interval_s: float = 1.0):
    """:func:`e2e.helpers.wait_for` with positional arguments and a 1 s poll (kubectl calls are slow).

    Raises:
        TimeoutError: not within ``timeout_s``; names ``what`` and adds ``explain()``.
    """
    return helpers.wait_for(check, timeout_s=timeout_s, what=what, explain=explain, interval_s=interval_s)


def get(cluster: kind.KindCluster, *args: str) -> dict:
    """``kubectl get ARGS -o json`` as a dict."""
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def pods(cluster: kind.KindCluster, namespace: str, selector: str) -> list[dict]:
    """Pods matching ``selector``, oldest first."""
    items = get(cluster, "-n", namespace, "pods", "-l", selector)["items"]
    return sorted(items, key=lambda p: p["metadata"]["creationTimestamp"])


def is_ready(pod: dict) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in pod["status"].get("conditions", []))


def live_worker(cluster: kind.KindCluster, namespace: str, job: str, index: int) -> dict | None:
    """The running, ready, not-deleting worker pod of slice ``index``, if any."""
    live = [p for p in pods(cluster, namespace, f"elasticjax.dev/job-name={job},elasticjax.dev/slice-index={index}")
            if p["status"].get("phase") == "Running" and is_ready(p) and not p["metadata"].get("deletionTimestamp")]
    return live[0] if live else None


def container_pid(cluster: kind.KindCluster, pod: dict, container: str) -> int:
    """PID, in its node's PID namespace, of ``container``'s main process (from containerd via crictl).

    Raises:
        KeyError: the container has no running status.
        RuntimeError: crictl failed on the node.
    """
    status = next(c for c in pod["status"]["containerStatuses"] if c["name"] == container)
    container_id = status["containerID"].split("://", 1)[1]
    proc = cluster.engine.docker("exec", pod["spec"]["nodeName"], "crictl", "inspect", container_id,
                                 check=False, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"crictl inspect {container_id} on {pod['spec']['nodeName']}: {proc.stderr.decode()}")
    return int(json.loads(proc.stdout)["info"]["pid"])


def kill_container_process(cluster: kind.KindCluster, pod: dict, container: str, signal: str = "KILL") -> int:
    """Send ``signal`` to the container's main process from its node (a crash, the OOM killer); return its PID."""
    pid = container_pid(cluster, pod, container)
    cluster.engine.docker("exec", pod["spec"]["nodeName"], "kill", f"-{signal}", str(pid), timeout=60)
    return pid


def install_chart(cluster: kind.KindCluster, built: list[str], log=print) -> None:
    """Load the images into every node and install the chart with the operator image built here."""
    from elastic_jax.api.images import OPERATOR_IMAGE
    t0 = time.monotonic()
    # Only the workers run product pods (the control-plane node is tainted): a third less to copy.
    cluster.load_images(built, nodes=cluster.workers())
    repository, tag = OPERATOR_IMAGE.rsplit(":", 1)
    cluster.helm("upgrade", "--install", RELEASE, str(REPO_ROOT / "helm" / "elastic-jax"),
                 "-n", SYSTEM_NS, "--create-namespace", "--set", f"image.repository={repository}",
                 "--set", f"image.tag={tag}", "--set", "image.pullPolicy=Never",
                 "--wait", "--timeout", "300s", timeout_s=420)
    log(f"demo: images loaded and chart installed in {time.monotonic() - t0:.0f}s")


def restricted_namespace(cluster: kind.KindCluster, prefix: str = "demo", profile: str = "restricted") -> str:
    """A new namespace enforcing PodSecurity ``profile`` (default ``restricted``); its name."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("label", "namespace", name, f"pod-security.kubernetes.io/enforce={profile}",
                    "pod-security.kubernetes.io/enforce-version=latest")
    return name


def explain(cluster: kind.KindCluster, namespace: str):
    """A callable giving the job's state, pods, Events and the operator's last log lines (for failures)."""
    def text() -> str:
        parts = [cluster.kubectl("get", "-n", namespace, "ejob,jobsets,pods", "-o", "wide", check=False).stdout,
                 cluster.kubectl("get", "-n", namespace, "events", "--sort-by=.lastTimestamp",
                                 check=False).stdout[-4000:],
                 cluster.kubectl("get", "-n", namespace, "ejob", "-o", "jsonpath={.items[*].status}",
                                 check=False).stdout[:4000],
                 cluster.kubectl("logs", "-n", SYSTEM_NS, f"deploy/{RELEASE}", "--tail=40",
                                 check=False).stdout[-5000:]]
        return "\n".join(parts)
    return text


def run_example(cluster: kind.KindCluster, namespace: str, steps: int | None = None, log=print,
                timeout_s: float = 900) -> dict:
    """Apply the example, SIGKILL slice 0's worker process once training runs, wait for the end; check it.

    Returns:
      The finished job's status.

    Raises:
        AssertionError: a promise broken (job not Succeeded, controller replaced or restarted, no recovery).
        TimeoutError: a stage did not happen in time (the state is in the message).
    """
    manifest = yaml.safe_load(EXAMPLE.read_text())
    if steps:
        manifest["spec"]["training"]["steps"] = steps
    why = explain(cluster, namespace)
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest))
    log(f"demo: applied {EXAMPLE.name} in namespace {namespace} (enforces PodSecurity restricted)")
    job = lambda: get(cluster, "-n", namespace, "ejob", JOB)  # noqa: E731
    wait_for(lambda: (job().get("status") or {}).get("step", 0) >= 20, timeout_s, "training reached step 20", why)
    (controller,) = pods(cluster, namespace, f"elasticjax.dev/job-name={JOB},elasticjax.dev/role=controller")
    ctrl_uid = controller["metadata"]["uid"]
    ctrl_restarts = controller["status"]["containerStatuses"][0]["restartCount"]
    victim = wait_for(lambda: live_worker(cluster, namespace, JOB, 0), 120, "a ready worker of slice 0", why)
    pid = kill_container_process(cluster, victim, "worker")
    log(f"demo: SIGKILLed the worker process (pid {pid} on {victim['spec']['nodeName']}) of "
        f"{victim['metadata']['name']} at step {(job().get('status') or {}).get('step')}")
    wait_for(lambda: (w := live_worker(cluster, namespace, JOB, 0)) and w["metadata"]["uid"] != victim["metadata"]["uid"],
             300, "a replacement worker for slice 0", why)
    log("demo: slice 0 replaced")
    done = wait_for(lambda: (j := job()).get("status", {}).get("phase") in ("Succeeded", "Failed") and j,
                    timeout_s, "the job to finish", why)
    status = done["status"]
    assert status["phase"] == "Succeeded", f"job ended {status['phase']}: {status.get('failureReason')}\n{why()}"
    (after,) = pods(cluster, namespace, f"elasticjax.dev/job-name={JOB},elasticjax.dev/role=controller")
    assert after["metadata"]["uid"] == ctrl_uid, f"controller pod replaced: {ctrl_uid} -> {after['metadata']['uid']}"
    restarts = after["status"]["containerStatuses"][0]["restartCount"]
    assert restarts == ctrl_restarts, f"controller restartCount {ctrl_restarts} -> {restarts}"
    assert status.get("recoveries", 0) >= 1, f"no recovery in status: {status}"
    assert status.get("sliceReplacements", 0) >= 1, f"no slice replacement in status: {status}"
    log(f"OK: job Succeeded at step {status.get('step')}, controller pod {ctrl_uid} restartCount {restarts}, "
        f"recoveries {status.get('recoveries')}, slice replacements {status.get('sliceReplacements')}")
    return status


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m e2e.kind.demo", description=__doc__.split("\n")[0])
    parser.add_argument("--keep", action="store_true", help="leave the cluster (and the engine) running")
    parser.add_argument("--steps", type=int, default=None, help="override spec.training.steps of the example")
    parser.add_argument("--cluster", default=os.environ.get("KIND_CLUSTER_NAME", kind.DEFAULT_NAME))
    args = parser.parse_args(argv)
    log = lambda m: print(f"[{time.strftime('%H:%M:%S')}] {m}", file=sys.stderr, flush=True)  # noqa: E731
    # SIGTERM (`kill`, a CI's timeout) ends the demo through its `finally` as Ctrl-C does: the default action
    # ended the process there and left the engine, the kind nodes and the bridge behind (a new user's trial).
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))

    own_engine = None
    if os.environ.get("DOCKER_HOST"):
        engine = engine_mod.Engine(pid=0, run_dir=Path(os.environ["DOCKER_HOST"].removeprefix("unix://")).parent,
                                   data_root=Path("/"))
    else:
        reason = engine_mod.why_unavailable()
        if reason:
            log(f"FAIL: {reason}")
            return 2
        engine = own_engine = engine_mod.start(log=log)
    created = False
    cluster = None
    try:
        t0 = time.monotonic()
        built = [b.name for b in images.build_project_images(engine, log=log)]
        log(f"demo: images ready in {time.monotonic() - t0:.0f}s")
        cluster = kind.attach(engine, args.cluster, log=log)
        if cluster:
            log(f"demo: reusing kind cluster {args.cluster}")
        else:
            cluster = kind.create(engine, args.cluster, log=log, preload=built)  # into the workers meanwhile
            created = True
        install_chart(cluster, built, log)
        namespace = restricted_namespace(cluster)
        run_example(cluster, namespace, steps=args.steps, log=log)
        if not created:
            cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
        return 0
    except (AssertionError, TimeoutError, kind.KindError) as e:
        log(f"FAIL: {e}")
        return 1
    finally:
        if created and cluster and not args.keep:
            cluster.delete(log=log)
        elif cluster and args.keep:
            # (kubectl and helm are this clone's build: a new user's `kubectl` found no cluster at all)
            log(f"demo: cluster kept: export KUBECONFIG={cluster.kubeconfig} PATH={kind.bin_dir()}:$PATH")
        if own_engine and not args.keep:
            engine_mod.stop(own_engine, log=log)
        elif own_engine:
            # Recorded where `python -m e2e.kind.engine stop` (and `e2e.kind.cluster delete`) find it.
            recorded = not engine_mod.STATE_FILE.exists()
            if recorded:
                engine_mod.STATE_FILE.parent.mkdir(parents=True, exist_ok=True)
                engine_mod.STATE_FILE.write_text(own_engine.to_json())
            stop_how = (f"{sys.executable} -m e2e.kind.cluster delete {args.cluster} && "
                        f"{sys.executable} -m e2e.kind.engine stop" if recorded else
                        f"DOCKER_HOST={own_engine.host} {kind.bin_dir() / 'kind'} delete cluster --name "
                        f"{args.cluster} && kill {own_engine.pid}")
            log(f"demo: engine kept (dockerd PID {own_engine.pid}): export DOCKER_HOST={own_engine.host}; "
                f"when done: {stop_how}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
