"""The operator's injected clock (`k8s_operator.clock`, issue 30 item 2): what it reads, and that the one clock of
an `OperatorState` reaches each job's `JobState` and `JobTracker`, so a test moves time instead of sleeping."""

from __future__ import annotations

import datetime as dt

import pytest

from elastic_jax.k8s_operator import job_pass, operator_state
from elastic_jax.k8s_operator.clock import SYSTEM, rfc3339
from tests.support.fake_clock import FakeClock
from elastic_jax.k8s_operator.conditions import now_rfc3339
from elastic_jax.k8s_operator.job_state import CONSISTENCY_TIMEOUT_S, EARLIER_SECRET_WAIT_S, Jobs
from elastic_jax.k8s_operator.tracker import JobTracker
from tests.support.fake_kube import FakeKube


def test_the_system_clock_is_monotonic_and_utc():
    first = SYSTEM.monotonic()
    assert SYSTEM.monotonic() >= first
    now = SYSTEM.now()
    assert now.tzinfo is not None and now.utcoffset() == dt.timedelta(0)


def test_a_fake_clock_moves_both_readings_only_forward_and_only_when_told():
    clock = FakeClock(monotonic=5.0, now=dt.datetime(2030, 1, 1, 23, 59, 59))  # (naive: read as UTC)
    assert clock.monotonic() == 5.0 and now_rfc3339(clock) == "2030-01-01T23:59:59Z"
    clock.advance(1.5)
    assert clock.monotonic() == 6.5 and now_rfc3339(clock) == "2030-01-02T00:00:00Z"
    with pytest.raises(ValueError, match="forward only"):
        clock.advance(-1)
    assert rfc3339(dt.datetime(2030, 1, 1, 1, tzinfo=dt.timezone(dt.timedelta(hours=1)))) == "2030-01-01T00:00:00Z"


def test_a_name_just_deleted_is_an_earlier_job_until_the_wait_passes_on_the_registrys_clock():
    clock = FakeClock()
    jobs = Jobs(clock)
    jobs.open(("ns", "j"), "u1", "", lambda: JobTracker("ns", "j", 1, 1, clock=clock))
    jobs.forget(("ns", "j"), "u1")
    assert jobs.earlier(("ns", "j"), "u2")
    clock.advance(EARLIER_SECRET_WAIT_S)
    assert not jobs.earlier(("ns", "j"), "u2")


def test_a_pass_gives_the_job_the_operators_clock_and_its_consistency_wait_ends_on_it(monkeypatch):
    monkeypatch.setattr(job_pass.kopf, "event", lambda *a, **k: None)
    clock = FakeClock()
    state = operator_state.OperatorState(kube=FakeKube(), key=b"k" * 32, clock=clock)
    spec = {"slices": {"count": 1}, "training": {"steps": 10, "globalBatchSize": 1}, "checkpoint": {"uri": "/ck"}}
    meta = {"name": "j", "namespace": "ns", "uid": "u1", "generation": 1, "resourceVersion": "7"}
    body = {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": meta, "spec": spec}

    class Patch:
        def __init__(self):
            self.status = {}

    patch = Patch()
    job_pass.reconcile_pass(body=body, spec=spec, status={}, meta=meta, namespace="ns", name="j", patch=patch,
                            memo={"elasticjax": state}, job_pods={}, job_jobsets={})
    js = state.jobs.get(("ns", "j"))
    assert js.clock is clock and js.tracker.clock is clock
    assert patch.status, "the first pass writes status"
    # Its own status write is not back from the watch: the same resourceVersion waits, on the job's clock.
    assert js.body_behind("7", clock.monotonic())
    clock.advance(CONSISTENCY_TIMEOUT_S)
    assert not js.body_behind("7", clock.monotonic())
    # Every time the pass wrote is the clock's.
    times = {c["lastTransitionTime"] for c in patch.status.get("conditions", [])}
    assert times <= {"2030-01-01T00:00:00Z"} and times, patch.status
