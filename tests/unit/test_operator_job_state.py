"""One state object per job (`job_state`): made, replaced by a new UID, forgotten on delete; and the effects
that used to be inline (token Secret, ConfigMap and Services, the controller report, the finish)."""

from __future__ import annotations

import types

from elastic_jax.k8s_operator import effects
from elastic_jax.k8s_operator.effects import (Applier, CreateStatic, CreateTokenSecret, EventLog, MarkFinished,
                                              ReportSlices)
from elastic_jax.k8s_operator.job_state import JobState, Jobs
from elastic_jax.k8s_operator.tracker import JobTracker

KEY = ("ns", "j")


def _tracker():
    return JobTracker("ns", "j", 1, 1)


def test_a_job_has_one_state_until_a_new_uid_takes_its_name_and_the_old_one_is_closed():
    jobs = Jobs()
    first = jobs.open(KEY, "u1", "t1", _tracker)
    assert jobs.open(KEY, "u1", "t1", _tracker) is first and jobs.get(KEY) is first
    second = jobs.open(KEY, "u2", "t2", _tracker)
    assert second is not first and second.tracker is not first.tracker and second.applied is None
    assert first.tracker.deleting and not second.tracker.deleting
    assert jobs.earlier(KEY, "u2") and not jobs.earlier(KEY, "u1")  # u1 went: news for u2 only


def test_forgetting_a_job_closes_it_and_never_drops_a_newer_job_of_its_name():
    jobs = Jobs()
    js = jobs.open(KEY, "u2", "", _tracker)
    jobs.forget(KEY, "u1")  # a late delete event of the earlier job
    assert jobs.get(KEY) is js and not js.tracker.deleting
    jobs.forget(KEY, "u2")
    assert KEY not in jobs and js.tracker.deleting and list(jobs) == []


def test_setup_effects_render_only_what_is_still_to_create():
    js = JobState("ns", "j", "u", "", _tracker())
    rendered = []

    def static():
        rendered.append("static")
        return [{"kind": "ConfigMap", "metadata": {"name": "j-manifest"}}, {"kind": "Service", "metadata": {"name": "j"}}]

    secret, children = effects.setup_effects(js, "", lambda: {"kind": "Secret", "metadata": {"name": "j-token"}},
                                             static)
    assert [type(e) for e in secret] == [CreateTokenSecret] and [type(e) for e in children] == [CreateStatic] * 2
    js.static_created.add(("ConfigMap", "j-manifest"))
    secret, children = effects.setup_effects(js, "j-token", lambda: 1 / 0, static)  # recorded: no Secret rendered
    assert secret == [] and [c.body["kind"] for c in children] == ["Service"]
    js.static_complete = True
    assert effects.setup_effects(js, "j-token", lambda: 1 / 0, lambda: 1 / 0) == ([], [])
    assert rendered == ["static", "static"]


def test_the_applier_records_the_secret_and_static_children_reports_and_finishes():
    created = []
    kube = types.SimpleNamespace(create=lambda ns, body: created.append(body["metadata"]["name"]) or True)
    js = JobState("ns", "j", "u", "", _tracker())
    reports = []
    js.tracker.report = lambda events, retries=1: reports.append(retries)  # type: ignore[method-assign]
    patch = types.SimpleNamespace(status={})
    out = Applier(kube, js, EventLog(lambda *e: None), patch).apply([
        CreateTokenSecret({"kind": "Secret", "metadata": {"name": "j-token"}}),
        CreateStatic({"kind": "Service", "metadata": {"name": "j"}}), ReportSlices(retries=3), MarkFinished()])
    assert created == ["j-token", "j"] and out.created == created and out.refusal is None
    assert js.token_secret_ours and patch.status == {"tokenSecret": "j-token"}
    assert js.static_created == {("Service", "j")} and reports == [3] and js.tracker.finished


def test_a_taken_token_secret_name_is_an_observation_not_a_check():
    kube = types.SimpleNamespace(create=lambda ns, body: False)  # 409; the operator may not read Secrets
    js = JobState("ns", "j", "u", "", _tracker())
    patch = types.SimpleNamespace(status={})
    out = Applier(kube, js, EventLog(lambda *e: None), patch).apply(
        [CreateTokenSecret({"kind": "Secret", "metadata": {"name": "j-token"}})])
    assert out.secret_taken == "j-token" and not js.token_secret_ours and patch.status == {}
