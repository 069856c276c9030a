"""The manifest ConfigMap trust boundary with the real controller process: a manifest changed after the
operator rendered the controller pod is refused with exit 2 and one line, which the operator turns into
the job's Failed reason (elastic_jax/api/manifest_digest.py; docs/security.md)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from elastic_jax import contract
from elastic_jax.api.manifest import parse_manifest
from elastic_jax.api.manifest_digest import DIGEST_ENV, manifest_digest
from elastic_jax.exit_codes import ControllerExit
from elastic_jax.k8s_operator import children
from elastic_jax.k8s_operator.reconcile import Observed, decide
from elastic_jax.k8s_operator.slices import pod_view
from elastic_jax.api import labels as lbl
from tests.support.runs import ROOT, job_manifest

CONTROLLER = str(Path(sys.executable).parent / "elastic-jax-controller")


def _run_controller(tmp_path: Path, manifest_text: str, digest: str) -> tuple[subprocess.CompletedProcess, str]:
    """The controller as the operator starts it in a pod: the ConfigMap's text as a file, the digest in its env."""
    path = tmp_path / "job.yaml"
    path.write_text(manifest_text)
    termination = tmp_path / "termination-log"
    termination.write_text("")
    env = {**os.environ, "PYTHONPATH": str(ROOT), DIGEST_ENV: digest, contract.ENV_TOKEN: "t" * 32,
           contract.ENV_TERMINATION_MESSAGE_PATH: str(termination), contract.ENV_LOG_FORMAT: "text"}
    proc = subprocess.run([CONTROLLER, "--manifest", str(path), "--host", "127.0.0.1", "--port", "0"],
                          capture_output=True, text=True, timeout=180, cwd=tmp_path, env=env)
    return proc, termination.read_text()


def _configmap_text(job) -> str:
    return children.manifest_configmap(job)["data"][lbl.MANIFEST_KEY]


def test_a_manifest_configmap_changed_after_the_job_was_created_is_refused_and_fails_the_job(tmp_path):
    data = job_manifest("digest", tmp_path)
    data["metadata"].update(namespace="ml", uid="u1")
    job = parse_manifest(data)
    digest = manifest_digest(job)
    # Someone who may edit ConfigMaps (not the job) changes what trains: here the steps and the trainer config.
    tampered = yaml.safe_load(_configmap_text(job))
    tampered["spec"]["training"]["steps"] = 77
    tampered["spec"]["controller"]["trainer"]["config"]["learning_rate"] = 1.0
    proc, termination = _run_controller(tmp_path, yaml.safe_dump(tampered), digest)
    assert proc.returncode == ControllerExit.BAD_INPUT, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "is not the spec the operator started this controller for" in errors[0]
    assert "manifest ConfigMap was changed after the job was created" in errors[0]
    assert termination.strip() == errors[0]
    assert not (tmp_path / "ckpt").exists(), "nothing may run from a refused manifest"

    # The operator's existing failure path: that exit and termination line fail the job naming the reason.
    pod = pod_view({"metadata": {"name": "digest-controller-0", "uid": "c0", "labels": {
        lbl.ROLE: lbl.ROLE_CONTROLLER, lbl.JOB_NAME: "digest", lbl.CONTROLLER_ATTEMPT: "0"}},
        "status": {"phase": "Failed", "containerStatuses": [{"name": "controller", "state": {"terminated": {
            "exitCode": int(proc.returncode), "reason": "Error", "message": termination}}}]}})
    plan = decide(job, Observed({"phase": "Running", "controllerPod": pod.name}, [pod], {}, None, [], "2026-01-01T00:00:00Z"))
    assert plan.finish is not None and plan.finish[0] == "Failed", plan
    assert "the controller refused its input" in plan.finish[1] and "manifest ConfigMap was changed" in plan.finish[1]


def test_the_untouched_configmap_passes_the_check(tmp_path):
    # The same job, the ConfigMap's own text: the digest matches, so the controller goes on to its next
    # check (here a trainer entry point that does not exist, refused with its own line).
    data = job_manifest("digest", tmp_path)
    data["metadata"].update(namespace="ml", uid="u1")
    data["spec"]["controller"]["trainer"]["entryPoint"] = "no_such_module:make"
    job = parse_manifest(data)
    proc, _ = _run_controller(tmp_path, _configmap_text(job), manifest_digest(job))
    assert proc.returncode == ControllerExit.BAD_INPUT, proc.stderr
    assert "no_such_module" in proc.stderr and "is not the spec" not in proc.stderr, proc.stderr
