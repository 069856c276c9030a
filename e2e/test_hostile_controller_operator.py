"""A hostile controller under the operator, on the real API server (hostile-tenant trial, issue 9).

A controller status with NaN/Infinity used to make the operator's status patch fail (the API server's
JSON has no NaN) and kopf's timer for that job die: the status froze and a controller loss was never
handled. Here the status is written (step 5, no loss), and the controller pod deleted afterwards is
replaced: the timer still runs. A status with an integer above int64 is refused as an answer: the
job says so (condition `ControllerAnswersRefused`, a Warning Event).
"""

from __future__ import annotations

import json

import yaml

from e2e.helpers import wait_for
from e2e.operator_fixtures import (  # noqa: F401  (fixtures)
    REPO_ROOT, ejob_crd, example_manifest, get_job, job_events, operator, operator_kubeconfig,
)

EXAMPLE = REPO_ROOT / "examples" / "04-own-loop.yaml"
HOSTILE = REPO_ROOT / "e2e" / "hostile_controller.py"


def _apply(cluster, namespace: str, name: str, mode: str) -> None:
    manifest = example_manifest(EXAMPLE)
    manifest["metadata"]["name"] = name
    spec = manifest["spec"]
    spec["slices"] = {"count": 1, "minSlices": 1}
    spec["controller"]["command"] = ["python", str(HOSTILE), mode]
    spec["checkpoint"]["uri"] = f"/tmp/elastic-jax/e2e-hostile/{namespace}/{name}"
    result = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest), check=False)
    assert result.returncode == 0, result.stderr


def test_a_nan_status_is_written_and_the_jobs_timer_keeps_handling_controller_loss(cluster, namespace, operator):
    name = "hostile-nan"
    _apply(cluster, namespace, name, "nan")

    def status() -> dict:
        return get_job(cluster, namespace, name).get("status") or {}

    def explain() -> str:
        return json.dumps(status(), indent=1)[:3000] + "\n" + operator.log()[-3000:]

    s = wait_for(lambda: (lambda s: s if s.get("step") == 5 else None)(status()), timeout_s=300,
                 what="the hostile controller's step written to status", interval_s=0.5, explain=explain)
    assert "loss" not in s and "initialLoss" not in s and "lastRecoverySeconds" not in s, s
    first = s["controllerPod"]
    cluster.kubectl("delete", "pod", "-n", namespace, first, "--grace-period=0", "--force", check=False)
    s = wait_for(lambda: (lambda s: s if int(s.get("controllerRestarts") or 0) >= 1 else None)(status()),
                 timeout_s=300, what="the deleted controller pod replaced (the job's timer still runs)",
                 interval_s=0.5, explain=explain)
    assert s["controllerPod"] != first
    assert operator.alive()


def test_an_int64_overflow_status_is_a_condition_and_a_warning(cluster, namespace, operator):
    name = "hostile-int"
    _apply(cluster, namespace, name, "int64")

    def refused():
        s = get_job(cluster, namespace, name).get("status") or {}
        cond = next((c for c in s.get("conditions", []) if c["type"] == "ControllerAnswersRefused"), None)
        return s if cond is not None and cond["status"] == "True" else None

    s = wait_for(refused, timeout_s=300, what="condition ControllerAnswersRefused", interval_s=0.5,
                 explain=lambda: operator.log()[-3000:])
    cond = next(c for c in s["conditions"] if c["type"] == "ControllerAnswersRefused")
    assert cond["reason"] == "ControllerAnswerInvalid" and "step" in cond["message"], cond
    assert "step" not in s or s["step"] < 2**63, s
    warnings = [e for e in job_events(cluster, namespace, name) if e.get("reason") == "ControllerAnswerInvalid"]
    assert warnings and warnings[0].get("type") == "Warning", warnings


def test_a_status_write_the_api_server_refuses_beyond_the_guard_is_an_outcome_not_an_exception(
        cluster, namespace, ejob_crd, operator_kubeconfig):
    """The operator's own status write (`status_write.write`, as the job's daemon calls it), as the operator's
    ServiceAccount, on the real API server: a value the CRD's schema refuses and the guard does not know (a
    phase outside the enum) comes back as the API server's 422 naming the field, not an exception that would
    end the daemon; a good write goes through; a deleted job's write is `gone`."""
    from kubernetes import config as kube_config

    from elastic_jax.k8s_operator import status_write
    from elastic_jax.k8s_operator.kube import Kube

    name = "status-refused"
    manifest = example_manifest(EXAMPLE)
    manifest["metadata"]["name"] = name
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest))
    kube = Kube(kube_config.new_client_from_config(config_file=str(operator_kubeconfig)))
    refused = status_write.write(kube, namespace, name, {"status": {"phase": "NotAPhase", "step": 3}})
    assert "(422)" in refused.refused and "status.phase" in refused.refused, refused
    assert "step" not in (get_job(cluster, namespace, name).get("status") or {})  # nothing half-written
    assert status_write.write(kube, namespace, name, {"status": {"phase": "Pending", "step": 3}}) == \
        status_write.Written()
    assert get_job(cluster, namespace, name)["status"]["step"] == 3
    cluster.kubectl("delete", "ejob", "-n", namespace, name, "--wait=true")
    assert status_write.write(kube, namespace, name, {"status": {"step": 4}}).gone
