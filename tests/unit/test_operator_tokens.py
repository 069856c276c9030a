"""Job tokens: derived, never read; only a Secret the operator created is mounted; refusals are conditions."""

from __future__ import annotations

import json

import pytest
from kubernetes.client.rest import ApiException

from elastic_jax.api import status as st
from elastic_jax.api.manifest import parse_manifest
from elastic_jax.k8s_operator import effects, handlers, job_pass, operator_state, tokens
from elastic_jax.k8s_operator.kube import ChildRefused, Kube, api_message
from elastic_jax.k8s_operator.status_builder import create_failure, with_create_failure
from elastic_jax.k8s_operator.tracker import JobTracker

KEY = b"k" * 32
UID = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"


def _job():
    return parse_manifest({"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob",
                           "metadata": {"name": "victim", "namespace": "ns"},
                           "spec": {"slices": {"count": 1}, "training": {"steps": 1, "globalBatchSize": 1},
                                    "checkpoint": {"uri": "/tmp/ck"}}})


def _body(uid=UID):
    return {"apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob",
            "metadata": {"name": "victim", "namespace": "ns", "uid": uid}}


class _Patch:
    def __init__(self):
        self.status: dict = {}


class _Kube:
    """Records creates; answers 409 for names in `existing` (the API server's AlreadyExists)."""

    def claim(self, namespace, name, resource_version, annotation, identity):
        return True

    def job_uid_if_owned(self, namespace, name, jobset_uid):
        return None

    def warning_events(self, namespace, kind, name, uid=""):
        return []

    def __init__(self, existing=()):
        self.existing = set(existing)
        self.created: list[dict] = []

    def create(self, namespace, body):
        if body["metadata"]["name"] in self.existing:
            return False
        self.existing.add(body["metadata"]["name"])
        self.created.append(body)
        return True

    def owners(self, namespace, kind, name):
        return None  # no ConfigMap of an earlier job of this name


def _setup(state, status=None, uid=UID):
    """One pass's `job_pass._setup` for job `victim` (UID `uid`): (what it observed, the job's state, the patch)."""
    body, patch = _body(uid), _Patch()
    js = state.jobs.open(("ns", "victim"), uid, "", lambda: JobTracker("ns", "victim", 1, 1))
    applier = effects.Applier(state.kube, js, effects.EventLog(lambda *e: None), patch)
    return job_pass._setup(state, ("ns", "victim"), _job(), js, body, status or {}, applier), js, patch


def test_token_is_derived_from_the_key_and_the_job_uid():
    token = tokens.derive_token(KEY, UID)
    assert token == tokens.derive_token(KEY, UID) and len(token) == 43
    assert token != tokens.derive_token(KEY, "another-uid") != tokens.derive_token(b"x" * 32, UID)
    with pytest.raises(ValueError):
        tokens.derive_token(KEY, "")


def test_key_file_must_hold_enough_bytes(tmp_path):
    short = tmp_path / "short"
    short.write_bytes(b"abc")
    with pytest.raises(tokens.OperatorKeyError, match="at least 32"):
        tokens.load_key(str(short))
    with pytest.raises(tokens.OperatorKeyError):
        tokens.load_key(str(tmp_path / "missing"))
    good = tmp_path / "key"
    good.write_bytes(b"z" * 48 + b"\n")
    assert tokens.load_key(str(good)) == b"z" * 48


def test_operator_creates_the_secret_owned_by_the_job_and_records_it():
    state = operator_state.OperatorState(kube=_Kube(), key=KEY)
    out, js, patch = _setup(state)
    secret = next(c for c in state.kube.created if c["kind"] == "Secret")
    assert secret["metadata"]["name"] == "victim-token"
    (owner,) = secret["metadata"]["ownerReferences"]
    assert owner["uid"] == UID and owner["controller"] is True
    assert patch.status["tokenSecret"] == "victim-token"
    assert js.tracker.token == tokens.derive_token(KEY, UID) and js.token_secret_ours and out.refusal is None


def test_a_foreign_secret_with_the_jobs_name_is_never_used():
    # Issue 9, item 15: a Secret `victim-token` the user cannot read already exists.
    state = operator_state.OperatorState(kube=_Kube(existing={"victim-token"}), key=KEY)
    out, js, patch = _setup(state)
    assert out.refusal[0] == st.REASON_TOKEN_SECRET_CONFLICT and "victim-token" in out.refusal[1]
    assert js.tracker.token is None and "tokenSecret" not in patch.status
    assert state.kube.created == []  # nothing half-done: no ConfigMap, no Service either


def test_the_operators_own_secret_is_used_after_a_restart():
    # After an operator restart the create is a 409, and the job's status (which
    # tenants cannot write) says the operator created it for this job.
    state = operator_state.OperatorState(kube=_Kube(existing={"victim-token"}), key=KEY)
    out, js, _ = _setup(state, {"tokenSecret": "victim-token"})
    assert js.tracker.token == tokens.derive_token(KEY, UID) and out.refusal is None
    assert not [c for c in state.kube.created if c["kind"] == "Secret"]


def test_refused_creates_become_a_condition_with_the_api_servers_message_and_one_event():
    message = ('pods "victim-controller-0" is forbidden: violates PodSecurity "restricted:latest": '
               "allowPrivilegeEscalation != false")
    error = ApiException(status=403, reason="Forbidden")
    error.body = json.dumps({"kind": "Status", "message": message, "reason": "Forbidden", "code": 403})
    assert api_message(error) == message
    failure = create_failure("Pod", "victim-controller-0", 403, api_message(error))
    assert failure[0] == "Forbidden" and message in failure[1]
    conditions, event_due = with_create_failure([], failure, 1, "now")
    (cond,) = conditions
    assert (cond.type, cond.status, cond.reason) == (st.COND_CREATE_FAILED, "True", "Forbidden")
    assert event_due
    # The same refusal on the next pass: no second Event.
    assert with_create_failure(conditions, failure, 1, "later")[1] is False
    # Fixed: the condition goes False, and no Event.
    cleared, due = with_create_failure(conditions, None, 1, "later")
    assert cleared[0].status == "False" and not due
    assert with_create_failure([], None, 1, "now") == ([], False)


def test_kube_create_turns_4xx_into_child_refused():
    class _Core:
        def create_namespaced_pod(self, namespace, body, _request_timeout):
            error = ApiException(status=422, reason="Unprocessable Entity")
            error.body = json.dumps({"message": "Pod \"x\" is invalid: spec.containers: Required value"})
            raise error

    kube = Kube.__new__(Kube)
    kube.core = _Core()
    with pytest.raises(ChildRefused) as e:
        kube.create("ns", {"kind": "Pod", "metadata": {"name": "x"}})
    assert e.value.status == 422 and "Required value" in e.value.message


@pytest.mark.parametrize("status, reason", [(500, "ServerError"), (503, "ServiceUnavailable"), (429, "TooManyRequests")])
def test_kube_create_turns_5xx_and_429_into_a_named_refusal_not_a_silent_pending(status, reason):
    """A JobSet webhook that is down answers 500: the job must get CreateFailed naming it (a new-user trial on
    kind saw Pending with no condition and a raw exception in the log, retried after 60 s)."""
    class _Custom:
        def create_namespaced_custom_object(self, group, version, namespace, plural, body, _request_timeout):
            error = ApiException(status=status, reason="x")
            error.body = json.dumps({"message": 'Internal error occurred: failed calling webhook "mjobset.kb.io"'})
            raise error

    kube = Kube.__new__(Kube)
    kube.custom = _Custom()
    with pytest.raises(ChildRefused) as e:
        kube.create("ns", {"kind": "JobSet", "metadata": {"name": "j-slice-0"}})
    assert e.value.status == status and "mjobset.kb.io" in e.value.message
    assert create_failure("JobSet", "j-slice-0", e.value.status, e.value.message)[0] == reason


def test_static_children_are_rendered_once_per_job_uid_not_every_pass(monkeypatch):
    """The 1 s pass used to render the ConfigMap (a YAML dump of the manifest) and Services of every job
    just to find them done: ~15% of the operator's steady-state CPU (py-spy, 10 healthy jobs)."""
    from elastic_jax.k8s_operator import children

    rendered: list[str] = []
    real = children.static_children

    def counting(job, control_api_from=None):
        rendered.append(job.metadata.name)
        return real(job, control_api_from)

    monkeypatch.setattr(children, "static_children", counting)
    state = operator_state.OperatorState(kube=_Kube(), key=KEY)
    for _ in range(3):
        _setup(state, {"tokenSecret": "victim-token"})
    assert rendered == ["victim"]
    assert sorted(c["kind"] for c in state.kube.created) == ["ConfigMap", "Service"]
    # the job deleted: forgotten; one created again under the same name (new UID) gets its children again
    handlers.job_deleted(namespace="ns", name="victim", uid=UID, memo={"elasticjax": state})
    assert ("ns", "victim") not in state.jobs
    state.kube.existing.clear()
    _setup(state, {"tokenSecret": "victim-token"}, uid="another-uid")
    assert rendered == ["victim", "victim"] and len(state.kube.created) == 4


def test_a_refused_static_child_is_retried_on_the_next_pass():
    class _Refusing(_Kube):
        refuse = True

        def create(self, namespace, body):
            if self.refuse and body["kind"] == "Service":
                raise ChildRefused("Service", body["metadata"]["name"], 403, "quota")
            return super().create(namespace, body)

    state = operator_state.OperatorState(kube=_Refusing(), key=KEY)
    out, js, _ = _setup(state, {"tokenSecret": "victim-token"})
    assert out.refusal[0] == "Forbidden" and "quota" in out.refusal[1] and not js.static_complete
    state.kube.refuse = False
    out, js, _ = _setup(state, {"tokenSecret": "victim-token"})
    assert out.refusal is None and sorted(c["kind"] for c in state.kube.created) == ["ConfigMap", "Service"]
    assert js.static_complete


def test_a_foreign_configmap_holding_the_jobs_name_blocks_the_job_and_is_never_used():
    """A ConfigMap planted under the job's name would choose its code and image: a conflict, named."""
    class _Planted(_Kube):
        def owned_by(self, namespace, kind, name, uid):
            return False

        def owners(self, namespace, kind, name):
            return [{"kind": "Deployment", "name": "x", "uid": "someone"}] if kind == "ConfigMap" else None

    state = operator_state.OperatorState(kube=_Planted(existing={"victim-manifest"}), key=KEY)
    out, js, _ = _setup(state, {"tokenSecret": "victim-token"})
    assert out.refusal[0] == st.REASON_CHILD_CONFLICT and "victim-manifest" in out.refusal[1]
    assert not js.static_complete
