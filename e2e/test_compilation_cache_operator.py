"""spec.compilationCache on the local control plane: a replaced worker pod loads its step program from the cache.

The cluster admin's part as `e2e/chaos.py` does it: a hostPath PersistentVolume on a folder of the test's, a
claim bound to it in the job's namespace, the claim allowed to the operator. The job (two cpu slices) trains;
its first workers compile and fill the cache; slice 0's worker process is SIGKILLed, the JobSet controller
replaces the pod, and the new worker's JAX log (`JAX_LOG_COMPILES=1` makes JAX log cache hits) names a
persistent cache hit for an entry that was in the folder before the replacement started: the executable was
read, not compiled. Real processes throughout; nothing is timed.

The test ends at that hit. That a job whose replaced worker shares the cache claim trains on to Succeeded with
no step lost and the no-failure loss is test_chaos_cluster.py's elastic arm (its workers share a claim too).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import uuid

import pytest
import yaml

from e2e.chaos import CACHE_CLAIM, cache_claim, chaos_nodes, delete_cache_volume, job_manifest
from e2e.helpers import create_namespace, is_ready, pods, wait_for
from e2e.operator_fixtures import OperatorProcess, ejob_crd, operator_kubeconfig  # noqa: F401
from elastic_jax.api import labels
from elastic_jax.local.processes import free_port

pytestmark = pytest.mark.timeout(900)

STEPS = 40
# What JAX logs (at WARNING with jax_log_compiles) when it loads an executable from the persistent cache.
HIT = re.compile(r"Persistent compilation cache hit for '[^']+' with key '([^']+)'")


def _worker(cluster, ns: str, name: str, index: int) -> dict | None:
    """The Running, Ready worker pod of slice `index`, if any."""
    for p in pods(cluster, ns, f"{labels.JOB_NAME}={name},{labels.ROLE}={labels.ROLE_WORKER},"
                               f"{labels.SLICE_INDEX}={index}"):
        if (p.get("status") or {}).get("phase") == "Running" and is_ready(p) and not p["metadata"].get(
                "deletionTimestamp"):
            return p
    return None


def _log(cluster, ns: str, pod: dict) -> str:
    with contextlib.suppress(FileNotFoundError):
        return cluster.container_log(ns, pod["metadata"]["name"], "worker", pod["metadata"]["uid"])
    return ""


def test_a_replaced_worker_pod_loads_its_step_program_from_the_shared_cache(cluster, ejob_crd,  # noqa: F811
                                                                            operator_kubeconfig, tmp_path):  # noqa: F811
    cache_dir = tmp_path / "xla-cache"
    name = "ccache"
    with chaos_nodes(cluster):
        ns = create_namespace(cluster, f"ccache-{uuid.uuid4().hex[:6]}")
        op = OperatorProcess(operator_kubeconfig, tmp_path / "operator.log", free_port())
        try:
            op.extra_args.append(f"--allowed-compilation-cache-claims={cache_claim(cluster, ns, cache_dir)}")
            op.start()
            op.wait_up()
            manifest = job_manifest(name, STEPS, tmp_path / "ckpt", 50, CACHE_CLAIM,
                                    worker_env=[{"name": "JAX_LOG_COMPILES", "value": "1"}])
            # Pause and resume (minSlices = count): the job waits for the replacement, which loads its
            # program before it joins. With replica resize a quiet machine trained all 40 steps on slice 1
            # before the replacement ran a step (CI: no hit within 600 s, the job long Succeeded).
            manifest["spec"]["slices"]["minSlices"] = 2
            cluster.kubectl("apply", "-n", ns, "-f", "-", input=yaml.safe_dump(manifest))

            def training() -> bool:
                job = cluster.api().get(f"/apis/elasticjax.dev/v1alpha1/namespaces/{ns}/elastictrainingjobs/{name}")
                return int((job.get("status") or {}).get("step") or 0) >= 3

            wait_for(training, timeout_s=600, what="job past step 3", explain=op.log)
            first = _worker(cluster, ns, name, 0)
            assert first is not None
            # The first workers compiled and wrote their executables into the claim's folder.
            before = {p.name.removesuffix("-cache") for p in cache_dir.iterdir() if p.name.endswith("-cache")}
            assert before, sorted(os.listdir(cache_dir))
            assert not HIT.findall(_log(cluster, ns, first)), "the first worker found a cache it could not have"
            os.kill(cluster.container_pid(ns, first["metadata"]["name"], "worker", first["metadata"]["uid"]),
                    signal.SIGKILL)

            def replaced_hits() -> list[str] | None:
                p = _worker(cluster, ns, name, 0)
                if p is None or p["metadata"]["uid"] == first["metadata"]["uid"]:
                    return None
                return HIT.findall(_log(cluster, ns, p)) or None

            hits = wait_for(replaced_hits, timeout_s=600, what="the replaced worker's persistent cache hit",
                            explain=op.log)
            assert set(hits) & before, (hits, sorted(before))
        finally:
            cluster.kubectl("delete", "namespace", ns, "--wait=true", "--timeout=180s", check=False, timeout_s=200)
            op.stop()
            delete_cache_volume(cluster, ns)
