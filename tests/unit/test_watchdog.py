"""The controller's no-progress watchdog (issue 9 item 3): phases watched, the bound, the probe that acts on it."""

from __future__ import annotations

import pytest

from elastic_jax.api.manifest import ManifestError, parse_manifest
from elastic_jax.controller.watchdog import ProgressWatchdog
from elastic_jax.k8s_operator.backends import renderer_for


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def _dog(timeout_s=100.0):
    clock = Clock()
    return ProgressWatchdog(timeout_s, clock), clock


def test_running_without_a_step_for_longer_than_the_bound_is_stalled():
    dog, clock = _dog()
    assert dog.check("Running", 5) is None
    clock.t = 100
    assert dog.check("Running", 5) is None  # at the bound: not yet
    clock.t = 101
    reason = dog.check("Running", 5)
    assert "no training step completed for 101 s" in reason and "progressTimeoutSeconds=100" in reason
    assert "after step 5" in reason


def test_each_completed_step_restarts_the_clock():
    dog, clock = _dog()
    for step in range(1, 20):
        clock.t += 90
        assert dog.check("Running", step) is None


def test_a_restore_to_an_older_step_is_progress_too():
    dog, clock = _dog()
    dog.check("Recovering", 50)
    clock.t = 150
    assert dog.check("Recovering", 40) is None


@pytest.mark.parametrize("phase", ["Starting", "WaitingForSlices", "Succeeded", "Failed", "Stopped", "Interrupted"])
def test_unwatched_phases_never_stall_and_restart_the_clock(phase):
    dog, clock = _dog()
    dog.check("Running", 3)
    clock.t = 1000
    assert dog.check(phase, 3) is None
    clock.t = 1050  # training again: measured from the end of the wait, not from step 3
    assert dog.check("Running", 3) is None
    clock.t = 1101
    assert dog.check("Running", 3) is not None


def test_recovering_is_watched_and_an_elastic_event_restarts_the_clock():
    dog, clock = _dog()
    dog.check("Running", 7)
    clock.t = 90
    dog.restart()  # a slice was lost: the recovery may restore a checkpoint
    clock.t = 180
    assert dog.check("Recovering", 7) is None
    clock.t = 191
    assert dog.check("Recovering", 7) is not None


def test_zero_disables():
    dog, clock = _dog(0)
    clock.t = 1e9
    assert dog.check("Running", 1) is None


def _job(**elasticity):
    return parse_manifest({"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob",
                           "metadata": {"name": "demo"},
                           "spec": {"slices": {"count": 2}, "training": {"steps": 10, "globalBatchSize": 4},
                                    "checkpoint": {"uri": "/tmp/ck"}, "elasticity": elasticity}})


def test_default_bound_exceeds_every_step_deadline():
    e = _job().spec.elasticity
    assert e.progress_timeout_seconds > max(e.step_deadline_seconds, e.first_step_deadline_seconds)


def test_a_bound_shorter_than_a_step_deadline_is_refused():
    with pytest.raises(ManifestError, match="progressTimeoutSeconds"):
        _job(progressTimeoutSeconds=60, firstStepDeadlineSeconds=120)
    assert _job(progressTimeoutSeconds=0).spec.elasticity.progress_timeout_seconds == 0


@pytest.mark.parametrize("backend", ["cpu", "pathways"])
def test_controller_pod_has_a_liveness_probe_on_healthz(backend):
    job = _job()
    if backend == "pathways":
        job = job.model_copy(update={"spec": job.spec.model_copy(update={
            "backend": "pathways",
            "checkpoint": job.spec.checkpoint.model_copy(update={"uri": "gs://test-bucket/ck"}),
            "training": job.spec.training.model_copy(update={"global_batch_size": 8}),
            "slices": job.spec.slices.model_copy(update={"accelerator": "tpu-v5-lite-podslice", "topology": "2x2"})})})
    c = renderer_for(backend).controller_pod(job, 0)["spec"]["containers"][0]
    probe = c["livenessProbe"]
    assert probe["httpGet"]["path"] == "/healthz"
    # the kubelet kills within a few probe periods of the bound
    assert probe["periodSeconds"] * probe["failureThreshold"] <= 60
    # ... but only once the controller listens: a slow start (JAX import on a loaded node) is no hang
    startup = c["startupProbe"]
    assert startup["httpGet"] == probe["httpGet"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600


def test_no_liveness_probe_when_the_watchdog_is_off():
    c = renderer_for("cpu").controller_pod(_job(progressTimeoutSeconds=0), 0)["spec"]["containers"][0]
    assert "livenessProbe" not in c and "startupProbe" not in c
