"""Nothing the operator copies from a controller's answer can make the API server refuse the job's status
write, and a refusal is never silent (hostile-tenant trial: a NaN loss froze the job's status for good)."""

from __future__ import annotations

import json
import math

import pydantic
import pytest

from elastic_jax.api.control import MAX_TEXT, ControllerStatus
from elastic_jax.api.job import INT64_MAX
from elastic_jax.api import status as st
from elastic_jax.k8s_operator import job_pass, operator_state, status_write
from elastic_jax.k8s_operator.job_state import JobState
from elastic_jax.k8s_operator.tracker import JobTracker
from tests.support.fake_kube import FakeKube

BASE = {"phase": "Running", "step": 3, "totalSteps": 10, "desiredSlices": 1, "minSlices": 1, "activeSlices": [0],
        "inactiveSlices": [], "slices": [], "pid": 7}


def _answer(**fields):
    """A status answer as the wire carries it (Python's json writes NaN/Infinity literals, as a hostile one may)."""
    return ControllerStatus.model_validate(json.loads(json.dumps({**BASE, **fields})))


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_a_non_finite_loss_is_not_reported(value):
    c = _answer(loss=value, initialLoss=value, tokensPerSecond=value, goodput=value,
                recoveryHistory=[{"cause": "slice_down", "slices": [0], "atStep": 1, "seconds": value}])
    assert (c.loss, c.initial_loss, c.tokens_per_second, c.goodput, c.recovery_history[0].seconds) == (None,) * 5


@pytest.mark.parametrize("field,value", [
    ("step", 2**64), ("step", INT64_MAX + 1), ("pid", -1), ("lastCommittedCheckpointStep", 2**70),
    ("activeSlices", [2**63]), ("recoveries", {"slice_down": 2**64}), ("stepsLost", -5),
    ("goodputSeconds", {"productive": math.inf}), ("goodputSeconds", {"productive": 1e300}),
    ("slices", [{"index": 0, "state": "Active", "generation": 2**64}]),
    ("activeSlices", list(range(5000))),
    ("resumedFrom", {"step": 1, "writer": {"namespace": "n" * 300, "name": "j", "uid": "u"}}),
])
def test_an_answer_out_of_the_bounds_is_refused_naming_the_field(field, value):
    with pytest.raises(pydantic.ValidationError) as e:
        _answer(**{field: value})
    assert field in str(e.value)


def test_free_text_is_cut():
    c = _answer(failureReason="x" * (MAX_TEXT * 10), resumedFrom={"step": 1, "fallbackReason": "y" * (MAX_TEXT + 1)})
    assert len(c.failure_reason) == MAX_TEXT and len(c.resumed_from.fallback_reason) == MAX_TEXT


def test_the_guard_drops_each_field_the_api_server_would_refuse_and_says_where():
    patch = {"phase": "Running", "loss": math.nan, "step": 2**64, "goodput": {"seconds": {"productive": math.inf}},
             "slices": [{"index": 0, "restarts": -(2**64)}], "conditions": [], "tokenSecret": b"x"}
    problems = status_write.guard(patch)
    assert patch == {"phase": "Running", "conditions": []}
    assert any(p.startswith("status.loss: nan") for p in problems)
    assert any("status.step: integer" in p for p in problems)
    assert any("status.goodput.seconds.productive" in p for p in problems)
    assert any("status.slices[0].restarts" in p for p in problems)
    assert any("status.tokenSecret: a bytes" in p for p in problems)
    json.dumps(patch, allow_nan=False)


def test_the_guard_keeps_the_status_under_its_size_bound_without_touching_the_operators_fields():
    patch = {"phase": "Running", "failureReason": "f" * 1000, "spareSlices": list(range(200_000))}
    problems = status_write.guard(patch)
    assert "spareSlices" not in patch and patch["failureReason"] and len(problems) == 1
    assert status_write.guard({"step": INT64_MAX, "loss": 1e308}) == []


class _Patch:
    def __init__(self, status):
        self.status = dict(status)


def _tracker(events):
    return JobState("ns", "j", "u", "", JobTracker("ns", "j", 1, 1),
                    ref={"metadata": {"name": "j", "namespace": "ns", "uid": "u"}})


def test_a_dropped_field_is_a_condition_and_one_warning_then_cleared(monkeypatch):
    events = []
    monkeypatch.setattr(job_pass, "event_sink", lambda ref: lambda *e: events.append(e))
    t = _tracker(events)
    status = {}
    for _ in range(2):  # the same fault on two passes: one Warning
        patch = _Patch({"phase": "Running", "step": 2**64})
        job_pass._guard_status(t, status, 1, patch)
        cond = [c for c in patch.status["conditions"] if c["type"] == st.COND_STATUS_WRITE_REFUSED][0]
        status = {"conditions": patch.status["conditions"]}
    assert "step" not in patch.status and cond["status"] == "True"
    assert cond["reason"] == st.REASON_STATUS_VALUES_DROPPED and "status.step" in cond["message"]
    assert [e[:2] for e in events] == [("Warning", st.REASON_STATUS_VALUES_DROPPED)]
    patch = _Patch({"step": 4})
    job_pass._guard_status(t, status, 1, patch)
    cond = [c for c in patch.status["conditions"] if c["type"] == st.COND_STATUS_WRITE_REFUSED][0]
    assert cond["status"] == "False" and patch.status["step"] == 4 and events[-1][:2] == ("Normal", "StatusWritten")


def _api_error(status: int, message: str):
    from kubernetes.client.rest import ApiException

    error = ApiException(status=status, reason="Unprocessable Entity")
    error.body = json.dumps({"kind": "Status", "message": message})
    return error


def test_a_status_write_the_api_server_refuses_anyway_is_caught_said_and_the_next_writes_restricted(monkeypatch):
    """The trial's silent death: a 4xx of a status write ended the job's timer (kopf applied the patch after the
    handler). The daemon writes the status itself (`job_pass.write_status`): a refusal is an outcome."""
    kube = FakeKube()

    def refusing(patch):
        raise _api_error(422, "status.step: Invalid value")

    kube.on_status_patch = refusing
    events = []
    monkeypatch.setattr(job_pass, "event_sink", lambda ref: lambda *e: events.append(e))
    state = operator_state.OperatorState(kube=kube, key=b"k" * 32)
    t = _tracker(events)
    state.jobs.add(t)
    job_pass.write_status(state, "ns", "j", {"status": {"step": 3}})  # (no exception)
    assert kube.status_patches == [{"status": {"step": 3}}]
    assert events[-1][:2] == ("Warning", st.REASON_STATUS_WRITE_REFUSED)
    assert "422" in events[-1][2] and "status.step: Invalid value" in events[-1][2]
    patch = _Patch({"phase": "Running", "step": 3, "loss": 0.5, "controllerPod": "p"})
    job_pass._guard_status(t, {}, 1, patch)  # the next pass: only the operator's own fields, and the condition
    assert set(patch.status) == {"phase", "controllerPod", "conditions"}
    cond = [c for c in patch.status["conditions"] if c["type"] == st.COND_STATUS_WRITE_REFUSED][0]
    assert cond["reason"] == st.REASON_STATUS_WRITE_REFUSED and "422" in cond["message"]
    assert "loss, step" in cond["message"]


@pytest.mark.parametrize("status", [500, 503, 429, None])
def test_a_status_write_without_an_answer_or_with_a_server_error_raises_for_the_next_pass(status):
    """Not the patch's fault: the daemon logs it and its next pass writes again; nothing is restricted."""
    from kubernetes.client.rest import ApiException

    kube = FakeKube()
    kube.on_status_patch = lambda patch: (_ for _ in ()).throw(ApiException(status=status, reason="x"))
    with pytest.raises(ApiException):
        status_write.write(kube, "ns", "j", {"status": {"step": 3}})


def test_a_status_write_of_a_gone_job_or_with_fields_the_crd_prunes_says_so():
    from kubernetes.client.rest import ApiException

    kube = FakeKube()
    kube.on_status_patch = lambda patch: None  # (Kube.patch_job_status: 404)
    assert status_write.write(kube, "ns", "j", {"status": {"step": 3}}) == status_write.Written(gone=True)
    kube.on_status_patch = lambda patch: {"status": {"step": 3}}  # an older CRD dropped `newField`
    assert status_write.write(kube, "ns", "j", {"status": {"step": 3, "newField": 1, "cleared": None}}).dropped == ("newField",)
    kube.on_status_patch = lambda patch: (_ for _ in ()).throw(ApiException(status=404, reason="x"))
    assert status_write.write(kube, "ns", "j", {"status": {"step": 3}}) == status_write.Written(gone=True)
