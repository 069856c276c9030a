"""Two operators (two Helm releases) watching one namespace: the first claims a job, the other leaves it
alone and says so once (issue 9: both reconciled the same job and fought)."""

from __future__ import annotations

import kopf

from elastic_jax.k8s_operator import claims, job_pass, metrics, operator_state


from tests.unit.test_operator_handler_faults import _Kube, _Patch

SPEC = {"slices": {"count": 1}, "training": {"steps": 10, "globalBatchSize": 1}, "checkpoint": {"uri": "/data/ck"}}


def test_decide():
    assert claims.decide({}, "ns/a") == claims.Claim("claim", "")
    assert claims.decide(None, "ns/a").action == "claim"
    assert claims.decide({claims.CLAIM_ANNOTATION: "ns/a"}, "ns/a") == claims.Claim("ours", "ns/a")
    assert claims.decide({claims.CLAIM_ANNOTATION: "ns/b"}, "ns/a") == claims.Claim("other", "ns/b")


class _ClaimKube(_Kube):
    def __init__(self, wins=True):
        super().__init__()
        self.claims, self.wins = [], wins

    def claim(self, namespace, name, resource_version, annotation, identity):
        self.claims.append((name, resource_version, annotation, identity))
        return self.wins


def _pass(state, annotations, uid="u1", status=None):
    meta = {"name": "j", "namespace": "ns", "uid": uid, "generation": 1, "resourceVersion": "42",
            "annotations": annotations}
    body = {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob", "metadata": meta, "spec": SPEC}
    patch = _Patch()
    job_pass.reconcile_pass(body=body, spec=SPEC, status=status or {}, meta=meta, namespace="ns", name="j", patch=patch,
                           memo={"elasticjax": state}, job_pods={}, job_jobsets={})
    return patch.status


def test_a_job_another_operator_claimed_is_left_alone_and_said_once(monkeypatch):
    events = []
    monkeypatch.setattr(kopf, "event", lambda ref, type, reason, message: events.append((type, reason, message)))
    state = operator_state.OperatorState(kube=_ClaimKube(), key=b"k" * 32, identity="ops-b/second")
    for _ in range(3):
        assert _pass(state, {claims.CLAIM_ANNOTATION: "ops-a/first"}) == {}
    assert state.kube.created == [] and state.kube.deleted == [] and state.kube.claims == []
    assert [e[1] for e in events] == [claims.REASON_CLAIMED_ELSEWHERE]
    assert "ops-b/second leaves this job alone" in events[0][2] and "ops-a/first" in events[0][2]
    assert metrics.JOBS_CLAIMED_ELSEWHERE._value.get() == 1
    # handed over (annotation removed by the user): this operator claims it and reconciles
    _pass(state, {})
    assert state.kube.claims == [("j", "42", claims.CLAIM_ANNOTATION, "ops-b/second")]
    assert metrics.JOBS_CLAIMED_ELSEWHERE._value.get() == 0
    assert "j-controller-0" in state.kube.created


def test_an_unclaimed_job_is_claimed_with_its_resource_version_and_a_lost_race_does_nothing(monkeypatch):
    monkeypatch.setattr(kopf, "event", lambda *a, **k: None)
    loser = operator_state.OperatorState(kube=_ClaimKube(wins=False), key=b"k" * 32, identity="ops-b/second")
    assert _pass(loser, {}) == {}
    assert loser.kube.claims and loser.kube.created == []
    winner = operator_state.OperatorState(kube=_ClaimKube(wins=True), key=b"k" * 32, identity="ops-a/first")
    status = _pass(winner, {})
    assert winner.kube.created and status.get("phase") == "Pending"
    # once claimed, passes reconcile without claiming again
    winner.kube.claims.clear()
    _pass(winner, {claims.CLAIM_ANNOTATION: "ops-a/first"}, status=status)
    assert winner.kube.claims == []


def test_the_operator_demo_refuses_a_job_another_operator_claimed():
    """A new-user trial: `python -m e2e.operator_demo` beside a chart-installed operator printed the chart
    operator's work and exited 0. The demo's operator claims as its own identity; any other claim is an
    `error:` naming the other operator and the way out."""
    from e2e.operator_demo import DEMO_IDENTITY, claim_problem

    def job(owner):
        return {"metadata": {"name": "cpu-job", "annotations": {claims.CLAIM_ANNOTATION: owner} if owner else {}}}

    assert claim_problem(job(None)) is None and claim_problem(job(DEMO_IDENTITY)) is None
    problem = claim_problem(job("elastic-jax/ej"))
    assert "operator elastic-jax/ej" in problem and DEMO_IDENTITY in problem
    assert "helm uninstall" in problem and "watchNamespaces" in problem
    assert claims.decide(job(DEMO_IDENTITY)["metadata"]["annotations"], DEMO_IDENTITY).action == "ours"
