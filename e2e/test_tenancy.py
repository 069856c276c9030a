"""Issue 9, what a tenant who may only create ElasticTrainingJobs can reach: on the local control plane, with
the operator as a least-privilege process and real controller and worker processes.

- A priority class, toleration or pull Secret the admin did not allow fails the job with a condition and
  an Event naming the field, and nothing is created.
- Two operators (two releases) watching one namespace: the job carries one operator finalizer, and once the
  claiming operator is gone (uninstalled), deleting the job still ends (the other operator releases it).
- Issue 31, RISK 8: a job in a denied namespace, or with a gs:// checkpoint outside the admin's prefixes,
  fails with a condition and an Event naming the setting, and nothing is created.

A quota refusing the worker pods (PodsNotStarting from the slice's own Job) is shown on kind under the chart's
RBAC: e2e/kind/test_operator_issue9.py.
The manifest ConfigMap edited after the job started (by someone who may edit ConfigMaps, not the job), which
the next controller incarnation refuses, failing the job with the reason: step 7 of e2e/test_status_truth.py,
whose job is already training there (session 27: this file started a job of its own for it).
"""

from __future__ import annotations

import json

import yaml

from e2e.helpers import wait_for
from e2e.operator_fixtures import (  # noqa: F401  (fixtures)
    OperatorProcess, ejob_crd, example_manifest, get_job, job_children, job_events, operator, operator_kubeconfig,
    wait_phase,
)
from elastic_jax.api import labels
from elastic_jax.k8s_operator import claims
from elastic_jax.local.processes import free_port

FINALIZER = labels.FINALIZER
CLAIM = claims.CLAIM_ANNOTATION


def _apply(cluster, namespace: str, manifest: dict) -> None:
    result = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest), check=False)
    assert result.returncode == 0, result.stderr


def _gone(cluster, namespace: str, name: str) -> bool:
    return cluster.kubectl("get", "ejob", name, "-n", namespace, check=False).returncode != 0


def test_a_job_stays_deletable_after_its_claiming_operator_is_uninstalled(cluster, namespace, operator,
                                                                          operator_kubeconfig, tmp_path):
    second = OperatorProcess(operator_kubeconfig, tmp_path / "second-operator.log", free_port(),
                             extra_args=("--identity", "host/second", "--namespace", namespace,
                                         "--node-lost-seconds", "0"))
    second.start()
    try:
        manifest = example_manifest()
        manifest["metadata"]["name"] = "claimed"
        # Suspended: claimed and finalized like any job, without starting pods on a shared machine.
        manifest["spec"]["suspend"] = True
        manifest["spec"]["checkpoint"]["uri"] = str(tmp_path / "ckpt")
        # The second operator claims it (set here so the test does not depend on which one is faster).
        manifest["metadata"]["annotations"] = {CLAIM: "host/second"}
        _apply(cluster, namespace, manifest)
        explain = lambda: json.dumps(get_job(cluster, namespace, "claimed")["metadata"], indent=1)[:3000]  # noqa: E731
        # Both operators have seen it: the first says it leaves the job alone.
        wait_for(lambda: [e for e in job_events(cluster, namespace, "claimed")
                          if e["reason"] == "ClaimedByAnotherOperator"],
                 timeout_s=120, what="the first operator's ClaimedByAnotherOperator Event", explain=explain)
        wait_phase(cluster, namespace, "claimed", ("Suspended",), timeout_s=120)
        meta = get_job(cluster, namespace, "claimed")["metadata"]
        assert meta["annotations"][CLAIM] == "host/second"
        assert [f for f in meta.get("finalizers") or [] if "elasticjax" in f] == [FINALIZER], meta.get("finalizers")

        second.stop()  # the claiming release is uninstalled: its operator is gone for good
        cluster.kubectl("delete", "ejob", "claimed", "-n", namespace, "--wait=false")
        wait_for(lambda: _gone(cluster, namespace, "claimed"), timeout_s=120,
                 what="the job deleted although its claiming operator is gone", explain=explain)
        assert operator.alive(), operator.log()[-3000:]
    finally:
        second.stop()


def test_pod_fields_the_admin_did_not_allow_fail_the_job_naming_the_field_and_create_nothing(
        cluster, namespace, operator, tmp_path):
    # The operator runs with the defaults: no priority class, no pull Secret, tolerations of google.com/tpu only.
    cases = {
        "pc": ({"priorityClassName": "system-node-critical"}, "spec.priorityClassName 'system-node-critical'"),
        "tol": ({"controller": {**example_manifest()["spec"]["controller"], "tolerations": [
            {"key": "node-role.kubernetes.io/control-plane", "operator": "Exists", "effect": "NoSchedule"}]}},
            "spec.controller.tolerations[0].key 'node-role.kubernetes.io/control-plane'"),
        "pull": ({"imagePullSecrets": [{"name": "regcred"}]},
                 f"spec.imagePullSecrets[0].name 'regcred' is not allowed in namespace {namespace}"),
    }
    for name, (spec, _) in cases.items():
        manifest = example_manifest()
        manifest["metadata"]["name"] = name
        manifest["spec"]["checkpoint"]["uri"] = str(tmp_path / name)
        manifest["spec"].update(spec)
        _apply(cluster, namespace, manifest)
    for name, (_, fragment) in cases.items():
        st = wait_phase(cluster, namespace, name, ("Failed",), timeout_s=120)["status"]
        (cond,) = [c for c in st["conditions"] if c["type"] == "Failed"]
        assert cond["reason"] == "InvalidSpec" and fragment in cond["message"], cond
        assert "podFields" in cond["message"], cond
        wait_for(lambda: [e for e in job_events(cluster, namespace, name)
                          if e["reason"] == "InvalidSpec" and fragment in e["message"]],
                 timeout_s=60, what=f"the InvalidSpec Event of {name}")
        assert job_children(cluster.api(), namespace, f"{name}-") == [], name


def _refused_by_an_operator_with(cluster, namespace: str, operator_kubeconfig, tmp_path, flags: tuple[str, ...],
                                 name: str, uri: str, fragments: tuple[str, ...]) -> None:
    """A job `name` (checkpoint `uri`) applied under an operator watching only `namespace` with `flags` fails
    before anything is created: condition InvalidSpec and a Warning Event, both holding every fragment."""
    op = OperatorProcess(operator_kubeconfig, tmp_path / f"{name}-operator.log", free_port(),
                         extra_args=("--namespace", namespace, "--node-lost-seconds", "0", *flags))
    op.start()
    try:
        op.wait_up()
        manifest = example_manifest()
        manifest["metadata"]["name"] = name
        manifest["spec"]["checkpoint"]["uri"] = uri
        _apply(cluster, namespace, manifest)
        st = wait_phase(cluster, namespace, name, ("Failed",), timeout_s=120)["status"]
        (cond,) = [c for c in st["conditions"] if c["type"] == "Failed"]
        assert cond["reason"] == "InvalidSpec", cond
        assert all(f in cond["message"] for f in fragments), cond
        wait_for(lambda: [e for e in job_events(cluster, namespace, name)
                          if e["reason"] == "InvalidSpec" and e["type"] == "Warning"
                          and all(f in e["message"] for f in fragments)],
                 timeout_s=60, what=f"the InvalidSpec Warning Event of {name}")
        assert job_children(cluster.api(), namespace, f"{name}-") == []
    finally:
        op.stop()


def test_a_job_in_a_denied_namespace_fails_naming_the_setting_and_creates_nothing(cluster, namespace,
                                                                                  operator_kubeconfig, tmp_path):
    """Issue 31, RISK 8: the operator may create pods and Secrets anywhere it watches; `--denied-namespaces`
    (Helm value `deniedNamespaces`, default the cluster's own namespaces) keeps it out. Here the test's
    namespace is denied, as kube-system is by default, so no other job of the cluster is touched."""
    _refused_by_an_operator_with(
        cluster, namespace, operator_kubeconfig, tmp_path, ("--denied-namespaces", f"kube-system,{namespace}"),
        "denied", str(tmp_path / "denied"),
        (f"metadata.namespace '{namespace}' is denied", "deniedNamespaces", "--denied-namespaces"))


def test_a_checkpoint_outside_the_admins_prefixes_fails_naming_the_field_and_creates_nothing(
        cluster, namespace, operator_kubeconfig, tmp_path):
    """Issue 31, RISK 8: `--checkpoint-prefixes` (Helm value `checkpointPrefixes`): a job of this namespace
    writing under a prefix that only textually starts with its own is refused before anything is created."""
    _refused_by_an_operator_with(
        cluster, namespace, operator_kubeconfig, tmp_path, ("--checkpoint-prefixes", "gs://ml-ckpt/{namespace}/"),
        "elsewhere", f"gs://ml-ckpt/{namespace}-evil/ck",
        (f"spec.checkpoint.uri 'gs://ml-ckpt/{namespace}-evil/ck' is outside every gs:// prefix",
         f"gs://ml-ckpt/{namespace}/", "checkpointPrefixes"))
