"""`python -m e2e.operator_demo`: the recovery transcript of docs/observability.md, from a real run.

On the local control plane (`python -m e2e.harness up` first), with the
operator as a least-privilege process: `kubectl apply -f
examples/01-cpu-job.yaml` in the `default` namespace, SIGKILL of slice 0's
worker process once training runs, then `kubectl get ejob` and the job's
Events after the recovery and at the end. Prints each command and its
output. Holds the cluster folder's session lock throughout, so no test
session's operator (which watches every namespace) runs beside this one;
stops the operator by PID and deletes the job before returning.

Another operator the lock cannot see (a chart installed with `helm install`
that watches `default`) may claim the job first, and the transcript would be
its work: the demo's operator has its own identity, and a job claimed by any
other stops the demo with an `error:` line naming that operator (exit 2).
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from e2e.harness import sessionlock
from e2e.harness.cluster import LocalCluster
from e2e.harness.paths import REPO_ROOT
from e2e.helpers import is_ready, pods, wait_for
from e2e.operator_fixtures import (
    CRD, EXAMPLE, OperatorProcess, clear_checkpoints, example_manifest, get_job, write_operator_kubeconfig,
)
from elastic_jax.k8s_operator import claims
from elastic_jax.local.processes import free_port

NS, JOB = "default", "cpu-job"
# The demo operator's claim on the job (`claims.CLAIM_ANNOTATION`); a chart's operator claims as <ns>/<release>.
DEMO_IDENTITY = "e2e/operator-demo"


def claim_problem(job: dict, me: str = DEMO_IDENTITY) -> str | None:
    """Why the transcript would not show this demo's operator at work: the job (an ElasticTrainingJob object)
    is claimed by another operator. None when it is unclaimed yet or claimed by `me`."""
    owner = ((job.get("metadata") or {}).get("annotations") or {}).get(claims.CLAIM_ANNOTATION, "")
    if not owner or owner == me:
        return None
    return (f"job {NS}/{JOB} is reconciled by operator {owner}, not this demo's ({me}): another elastic-jax "
            f"operator (a chart installed with helm?) watches namespace {NS}, and the transcript would show its "
            f"work. Uninstall it (helm uninstall <release>) or leave {NS} out of its watchNamespaces, then run "
            "the demo again")


def _show(cluster: LocalCluster, *args: str) -> None:
    print(f"$ kubectl {' '.join(args)}")
    print(cluster.kubectl(*args).stdout.rstrip(), flush=True)
    print()


def _operator_kubeconfig(cluster: LocalCluster, folder: Path) -> Path:
    """As the e2e fixture does: a token of the operator's ServiceAccount, bound to the chart's rules."""
    return write_operator_kubeconfig(cluster, folder, duration="1h")


def _status(cluster: LocalCluster) -> dict:
    return get_job(cluster, NS, JOB).get("status") or {}


def _claimed_job(cluster: LocalCluster) -> dict | None:
    """The job once an operator has claimed it (`claims.CLAIM_ANNOTATION`), else None."""
    job = get_job(cluster, NS, JOB)
    return job if claims.CLAIM_ANNOTATION in (job["metadata"].get("annotations") or {}) else None


def main() -> int:
    cluster = LocalCluster()
    if not cluster.is_running():
        print("the local cluster is not running: python -m e2e.harness up", file=sys.stderr)
        return 1
    lock = sessionlock.acquire(cluster.state, on_wait=print)
    folder = Path(tempfile.mkdtemp(prefix="operator-demo-"))
    op = None
    try:
        cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
        cluster.kubectl("wait", "--for=condition=Established", "crd/elastictrainingjobs.elasticjax.dev")
        op = OperatorProcess(_operator_kubeconfig(cluster, folder), folder / "operator.log", free_port(),
                             extra_args=("--identity", DEMO_IDENTITY))
        op.start()
        clear_checkpoints(example_manifest())
        os.chdir(REPO_ROOT)  # so the transcript shows the path as a user types it
        _show(cluster, "apply", "-n", NS, "-f", str(EXAMPLE.relative_to(REPO_ROOT)))
        claimed = wait_for(lambda: _claimed_job(cluster), timeout_s=120, what="the job claimed by an operator",
                           explain=op.log)
        problem = claim_problem(claimed)
        if problem:
            print(f"error: {problem}", file=sys.stderr)
            return 2
        wait_for(lambda: _status(cluster).get("step", 0) >= 20, timeout_s=180, what="training started",
                 explain=op.log)
        victim = next(p for p in pods(cluster, NS, f"elasticjax.dev/job-name={JOB},elasticjax.dev/slice-index=0")
                      if p["status"].get("phase") == "Running" and is_ready(p))
        name = victim["metadata"]["name"]
        print(f"# SIGKILL the worker process of pod {name}\n", flush=True)
        os.kill(cluster.container_pid(NS, name, "worker", victim["metadata"]["uid"]), signal.SIGKILL)

        def recovered():
            st = _status(cluster)
            return (st.get("activeSlices") == 2 and st.get("sliceReplacements", 0) >= 1
                    and st.get("phase") == "Running") or st.get("phase") in ("Succeeded", "Failed")
        wait_for(recovered, timeout_s=120, what="slice 0 replaced and back in training", explain=op.log)
        _show(cluster, "get", "ejob", "-n", NS)
        wait_for(lambda: _status(cluster).get("phase") in ("Succeeded", "Failed"), timeout_s=300,
                 what="job finished", explain=op.log)
        _show(cluster, "get", "ejob", "-n", NS)
        _show(cluster, "get", "pods", "-n", NS, "-l", f"elasticjax.dev/job-name={JOB}")
        _show(cluster, "get", "events", "-n", NS, "--field-selector", f"involvedObject.name={JOB}",
              "--sort-by=.metadata.creationTimestamp")
        describe = cluster.kubectl("describe", "ejob", JOB, "-n", NS).stdout
        print(f"$ kubectl describe ejob {JOB}   # the Events part\n{describe[describe.rfind('Events:'):].rstrip()}")
        return 0 if _status(cluster).get("phase") == "Succeeded" else 1
    finally:
        if op is not None:
            op.stop()
        cluster.kubectl("delete", "ejob", JOB, "-n", NS, "--ignore-not-found", "--wait=false", check=False)
        os.close(lock)
        shutil.rmtree(folder, ignore_errors=True)  # it holds a ServiceAccount token


if __name__ == "__main__":
    sys.exit(main())
