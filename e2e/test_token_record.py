"""The operator's record of a job's token Secret survives controller restarts, so a restarted operator uses it.

The operator never reads Secrets: a job's token Secret is trusted as its own only while the job's status
(which tenants cannot write) names it (`status.tokenSecret`). The chaos benchmark's full-restart arm found a
job stuck for good: after its controller pod had been recreated a few times, the operator was restarted,
found `status.tokenSecret` empty, took the job's own Secret for someone else's (condition `CreateFailed`,
reason `TokenSecretConflict`) and started nothing again. The cause was a race in the job's first pass (the
pass read kopf's live body twice; `tests/unit/test_manifest_digest.py` reproduces it deterministically);
here, on the local control plane, the record is followed through what the arm did: the controller process
SIGKILLed twice (each time the operator recreates the pod), `status.tokenSecret` read after each, then the
operator SIGKILLed and started again: the job must train on with its own Secret.
"""

from __future__ import annotations

import json

from elastic_jax.api import labels

from e2e.helpers import pods, wait_for
from e2e.operator_fixtures import (  # noqa: F401  (fixtures)
    ejob_crd, get_job, operator, operator_kubeconfig, start_training_job,
)


def _controller(cluster, namespace: str, name: str) -> dict | None:
    running = [p for p in pods(cluster, namespace, f"{labels.JOB_NAME}={name},{labels.ROLE}={labels.ROLE_CONTROLLER}")
               if (p.get("status") or {}).get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]
    return max(running, key=lambda p: p["metadata"]["creationTimestamp"], default=None)


def test_the_token_secret_record_survives_controller_restarts_and_an_operator_restart(cluster, namespace, operator):
    manifest, status, explain, running = start_training_job(cluster, namespace, operator, "e2e-token-record")
    name = manifest["metadata"]["name"]
    secret = f"{name}-token"
    assert running.get("tokenSecret") == secret, running

    for k in (1, 2):
        pod = _controller(cluster, namespace, name)
        assert pod is not None, explain()
        assert cluster.kill_container(namespace, pod["metadata"]["name"], "controller", pod["metadata"]["uid"])
        # the replacement pod trains (a local checkpoint uri: it starts again from step 0)
        wait_for(lambda: (lambda s: s if int(s.get("controllerRestarts") or 0) >= k and s.get("phase") == "Running"
                          and int(s.get("step") or 0) >= 1 else None)(status()),
                 timeout_s=300, what=f"controller restart {k} training", interval_s=0.5, explain=explain)
        assert status().get("tokenSecret") == secret, (k, explain())

    operator.kill()
    operator.start()
    operator.wait_up()
    before = int(status().get("step") or 0)
    wait_for(lambda: (lambda s: s if s.get("phase") == "Running" and int(s.get("step") or 0) > before else None)(
        status()), timeout_s=300, what="training on after the operator restart", interval_s=0.5, explain=explain)
    conds = {c["type"]: c for c in status().get("conditions") or []}
    assert conds.get("CreateFailed", {}).get("status") != "True", json.dumps(conds.get("CreateFailed"))
    assert status().get("tokenSecret") == secret, explain()
    assert get_job(cluster, namespace, name)["status"]["controllerRestarts"] == 2
