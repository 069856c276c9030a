"""The digest tying a controller pod to its job's spec (elastic_jax/api/manifest_digest.py) and the operator's
side of it: the pod's env, status.manifestSha256, and the ConfigMap read back only with that digest."""

from __future__ import annotations

import kopf
import pytest
import yaml

from elastic_jax.api import labels as lbl
from elastic_jax.api.manifest import load_manifest, parse_manifest
from elastic_jax.api.manifest_digest import DIGEST_ENV, ManifestDigestMismatch, check_digest, manifest_digest
from elastic_jax.k8s_operator import backends, children, job_pass, operator_state
from elastic_jax.k8s_operator.backends import renderer_for
from tests.unit.test_operator_pathways import pathways_job
from tests.support.fake_kube import FakeKube


def _cpu_job(**spec):
    base = {"slices": {"count": 2}, "training": {"steps": 10, "globalBatchSize": 2},
            "checkpoint": {"uri": "gs://test-bucket/p"}, **spec}
    return parse_manifest({"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob",
                           "metadata": {"name": "j", "namespace": "ns", "uid": "u1"}, "spec": base})


def _as_the_controller_reads_it(job, tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(children.manifest_configmap(job)["data"][lbl.MANIFEST_KEY])
    return load_manifest(str(path))


@pytest.mark.parametrize("make", [_cpu_job, lambda: backends.resolve(pathways_job())], ids=["cpu", "pathways"])
def test_the_controller_computes_the_operators_digest_from_the_configmap(make, tmp_path):
    job = make()
    pod = renderer_for(job.spec.backend).controller_pod(job, 0, "u1")
    env = {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}
    assert env[DIGEST_ENV] == manifest_digest(job)
    check_digest(_as_the_controller_reads_it(job, tmp_path), env[DIGEST_ENV], "job.yaml")


def test_suspend_and_ttl_may_change_anything_else_changes_the_digest():
    job = _cpu_job()
    assert manifest_digest(_cpu_job(suspend=True, ttlSecondsAfterFinished=5)) == manifest_digest(job)
    for changed in (_cpu_job(training={"steps": 11, "globalBatchSize": 2}),
                    _cpu_job(controller={"trainer": {"entryPoint": "evil:make"}}),
                    _cpu_job(checkpoint={"uri": "gs://other/p"})):
        assert manifest_digest(changed) != manifest_digest(job)


def test_a_changed_manifest_is_refused_naming_the_configmap_and_no_digest_means_a_local_run(tmp_path):
    job = _cpu_job()
    with pytest.raises(ManifestDigestMismatch, match="manifest ConfigMap was changed after the job was created"):
        check_digest(_cpu_job(controller={"trainer": {"entryPoint": "evil:make"}}), manifest_digest(job), "m.yaml")
    check_digest(job, None, "m.yaml")  # elastic-jax run sets none
    check_digest(job, "", "m.yaml")


class _Patch:
    def __init__(self):
        self.status: dict = {}


def _reconcile(state, status):
    spec = {"slices": {"count": 1}, "training": {"steps": 10, "globalBatchSize": 1}, "checkpoint": {"uri": "gs://test-bucket/p"}}
    meta = {"name": "j", "namespace": "ns", "uid": "u1", "generation": 1}
    body = {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": meta, "spec": spec}
    patch = _Patch()
    job_pass.reconcile_pass(body=body, spec=spec, status=status, meta=meta, namespace="ns", name="j", patch=patch,
                           memo={"elasticjax": state}, job_pods={}, job_jobsets={})
    return {**status, **patch.status}


def _controller_env(kube):
    (pod,) = [b for b in kube.created_bodies if b["kind"] == "Pod"]
    return {e["name"]: e.get("value") for e in pod["spec"]["containers"][0]["env"]}


def test_the_operator_records_the_digest_of_the_configmap_it_writes(monkeypatch):
    monkeypatch.setattr(kopf, "event", lambda *a, **k: None)
    state = operator_state.OperatorState(kube=FakeKube(), key=b"k" * 32)
    status = _reconcile(state, {"phase": "Pending"})
    (cm,) = [b for b in state.kube.created_bodies if b["kind"] == "ConfigMap"]
    written = parse_manifest(yaml.safe_load(cm["data"][lbl.MANIFEST_KEY]), "configmap")
    assert status["manifestSha256"] == manifest_digest(written) == _controller_env(state.kube)[DIGEST_ENV]


def test_after_an_operator_restart_a_changed_configmap_is_not_read_back(monkeypatch):
    """The operator renders pods from the ConfigMap after its restart: a copy someone edited (another
    entry point, another image) must not become the spec; the live one is used, whose digest the
    controller then finds the mounted copy does not have (and refuses it)."""
    monkeypatch.setattr(kopf, "event", lambda *a, **k: None)
    first = operator_state.OperatorState(kube=FakeKube(), key=b"k" * 32)
    status = _reconcile(first, {"phase": "Pending"})
    (cm,) = [b for b in first.kube.created_bodies if b["kind"] == "ConfigMap"]
    tampered = yaml.safe_load(cm["data"][lbl.MANIFEST_KEY])
    tampered["spec"]["controller"]["image"] = "evil.example/controller:1"
    tampered["spec"]["controller"]["trainer"] = {"entryPoint": "evil:make"}
    restarted = operator_state.OperatorState(kube=FakeKube(manifest_text=yaml.safe_dump(tampered)), key=b"k" * 32)
    _reconcile(restarted, {k: v for k, v in status.items() if k != "controllerPod"})
    (pod,) = [b for b in restarted.kube.created_bodies if b["kind"] == "Pod"]
    assert pod["spec"]["containers"][0]["image"] != "evil.example/controller:1"
    assert _controller_env(restarted.kube)[DIGEST_ENV] == status["manifestSha256"]
    # The genuine copy is still read back (the spec the job started with).
    genuine = operator_state.OperatorState(kube=FakeKube(manifest_text=cm["data"][lbl.MANIFEST_KEY]), key=b"k" * 32)
    job = job_pass._applied_job(genuine, ("ns", "j"), _cpu_job(), "u1", status["manifestSha256"])
    assert manifest_digest(job) == status["manifestSha256"]


class _LiveStatus(dict):
    """kopf's live body view, as a daemon sees it: the create handler's status write arrives mid-pass."""


def test_a_status_that_changes_mid_pass_does_not_unset_the_token_secret_record(monkeypatch):
    """The chaos benchmark's full-restart arm: the job-created handler's status write (the CRD's defaults:
    tokenSecret "", step 0, ...) reached the daemon's live body while its first pass ran; the pass built its
    status from the empty status it read first and unset every field the live body then held, the
    tokenSecret it had just recorded among them. After a restart the operator took the job's own Secret for
    someone else's (TokenSecretConflict) and started nothing."""
    monkeypatch.setattr(kopf, "event", lambda *a, **k: None)
    status = _LiveStatus()
    kube = FakeKube()
    create = kube.create

    def create_and_see_the_write(namespace, body):
        if body["kind"] == "Secret":  # the watch event lands now
            status.update({"tokenSecret": "", "step": 0, "activeSlices": 0, "failureReason": "", "manifestSha256": ""})
        return create(namespace, body)

    kube.create = create_and_see_the_write
    written = _reconcile(operator_state.OperatorState(kube=kube, key=b"k" * 32), status)
    assert written["tokenSecret"] == "j-token", written
    assert written.get("manifestSha256"), written


def test_a_lost_token_secret_record_is_written_again_by_the_operator_that_created_the_secret(monkeypatch):
    """A status without the record (lost as above, before the fix) gets it back from the operator that knows
    it created the Secret, before any restart needs it."""
    monkeypatch.setattr(kopf, "event", lambda *a, **k: None)
    state = operator_state.OperatorState(kube=FakeKube(), key=b"k" * 32)
    status = _reconcile(state, {"phase": "Pending"})
    assert status["tokenSecret"] == "j-token"
    again = _reconcile(state, {**status, "tokenSecret": ""})
    assert again["tokenSecret"] == "j-token", again
