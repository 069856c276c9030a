"""Issue 31 FAIL 1: no object a tenant can create may stop the operator or starve other namespaces' jobs.

On the local control plane: jobs whose `spec.controller.trainer.config` nests 1000 levels and as deep as the
real API server accepts (10000 levels in all: sigs.k8s.io/json's `maxNestingDepth`, shown here by the
refusal one level deeper) are created in one namespace; a normal job in another namespace is reconciled; the
same operator process runs throughout; each deep job fails `InvalidSpec` with a condition, a Warning Event
and a log line naming the field. Before the fix kopf's watch decoder hit Python's recursion limit on the
first deep job and the operator process exited.
"""

from __future__ import annotations

import contextlib
import sys

import pytest
import yaml

from e2e.helpers import create_namespace, wait_for
from e2e.nodeagent.kubeapi import ApiError
from e2e.operator_fixtures import (  # noqa: F401  (fixtures)
    ejob_crd, example_manifest, job_events, operator, operator_kubeconfig, wait_phase,
)

WORDS = "spec.controller.trainer.config nests deeper than 64 levels"
JOBS = "/apis/elasticjax.dev/v1alpha1/namespaces/{}/elastictrainingjobs"
# Levels above the config in a job's JSON body: the object, spec, controller, trainer.
ABOVE_CONFIG = 4
API_SERVER_MAX_DEPTH = 10_000


@contextlib.contextmanager
def _deep_json_allowed():
    """This test's own client encodes and decodes the deep bodies (json recurses a frame or two a level)."""
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(max(before, 50_000))
    try:
        yield
    finally:
        sys.setrecursionlimit(before)


def _deep_job(name: str, body_levels: int, tmp_path) -> dict:
    """The CPU example named `name`, its trainer config nested so that the whole JSON body has `body_levels`."""
    manifest = example_manifest()
    manifest["metadata"]["name"] = name
    manifest["spec"]["checkpoint"]["uri"] = str(tmp_path / name)
    value: object = []
    for _ in range(body_levels - ABOVE_CONFIG - 2):  # the config mapping and the innermost list are two
        value = [value]
    manifest["spec"]["controller"]["trainer"]["config"] = {"x": value}
    return manifest


def _status(cluster, namespace: str, name: str) -> dict:
    """The job's status through `-o jsonpath` (kubectl's own decoder, not this process's)."""
    out = cluster.kubectl("get", "ejob", name, "-n", namespace, "-o", "jsonpath={.status}", check=False)
    return yaml.safe_load(out.stdout) if out.returncode == 0 and out.stdout.strip() else {}


def test_deep_jobs_fail_alone_and_the_operator_keeps_serving_every_namespace(cluster, namespace, operator,
                                                                             tmp_path):
    other = create_namespace(cluster, f"{namespace}-b")
    pid = operator.proc.pid
    api = cluster.api()
    try:
        with _deep_json_allowed():
            with pytest.raises(ApiError, match="exceeded max depth|nest"):  # where the API server's bound is
                api.request("POST", JOBS.format(namespace), _deep_job("too-deep", API_SERVER_MAX_DEPTH + 1, tmp_path))
            for name, levels in (("deep-1000", 1000 + ABOVE_CONFIG), ("deep-max", API_SERVER_MAX_DEPTH)):
                api.request("POST", JOBS.format(namespace), _deep_job(name, levels, tmp_path))

        normal = example_manifest()
        normal["metadata"]["name"] = "normal"
        normal["spec"]["suspend"] = True  # reconciled, without pods on a shared machine
        normal["spec"]["checkpoint"]["uri"] = str(tmp_path / "normal")
        api.request("POST", JOBS.format(other), normal)
        wait_phase(cluster, other, "normal", ("Suspended",), timeout_s=180, explain=operator.log)

        for name in ("deep-1000", "deep-max"):
            st = wait_for(lambda: (lambda s: s if s.get("phase") == "Failed" else None)(_status(cluster, namespace, name)),
                          timeout_s=180, what=f"{name} Failed", explain=lambda: operator.log()[-4000:])
            (cond,) = [c for c in st["conditions"] if c["type"] == "Failed"]
            assert cond["reason"] == "InvalidSpec" and WORDS in cond["message"], cond
            wait_for(lambda: [e for e in job_events(cluster, namespace, name)
                              if e["type"] == "Warning" and e["reason"] == "InvalidSpec" and WORDS in e["message"]],
                     timeout_s=60, what=f"the InvalidSpec Event of {name}")
            # (waited for: the line may reach the operator's log after the Event is stored)
            wait_for(lambda: [r for r in operator.log_records() if r.get("job") == name and WORDS in r.get("msg", "")],
                     timeout_s=60, what=f"the operator's log line naming {name}")
        assert operator.alive() and operator.proc.pid == pid, operator.log()[-4000:]
    finally:
        cluster.kubectl("delete", "namespace", other, "--wait=false", check=False)
