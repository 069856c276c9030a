"""gs:// locations under the admin's allowed prefixes only (issue 31, RISK 8;
operator/k8s_operator/checkpoint_prefixes.py): prefix tricks, the flag, and the operator's create handler failing
a job outside them with a condition and an Event naming the field and the prefixes."""

from __future__ import annotations

import pytest

from elastic_jax.k8s_operator import checkpoint_prefixes, job_pass
from elastic_jax.k8s_operator.admin_policies import AdminPolicies
from elastic_jax.k8s_operator.checkpoint_prefixes import CheckpointPrefixes, CheckpointPrefixRefused, parse_templates
from tests.support.operator_refusal import refused_at_create
from tests.unit.test_pod_fields import _body, _job

PER_NAMESPACE = CheckpointPrefixes(("gs://ml-ckpt/{namespace}/", "gs://{namespace}-scratch"))


@pytest.mark.parametrize(("uri", "allowed"), [
    ("gs://ml-ckpt/ns-a/run1", True),
    ("gs://ml-ckpt/ns-a", True),                       # the prefix itself
    ("gs://ml-ckpt/ns-a/", True),
    ("gs://ml-ckpt/ns-a/deep/er/run", True),
    ("gs://ns-a-scratch/x", True),                     # a bucket of the namespace's own
    ("gs://ml-ckpt/ns-b/run1", False),                 # another tenant's
    ("gs://ml-ckpt/ns-a-evil/run1", False),            # a text prefix, not a path prefix
    ("gs://ml-ckpt/ns-ab", False),
    ("gs://ml-ckpt/run1", False),
    ("gs://ml-ckpt-other/ns-a/run1", False),           # another bucket
    ("gs://ns-a-scratch-b/x", False),
    ("gs://ns-b-scratch/x", False),
    ("gs://ml-ckpt/NS-A/run1", False),                 # object paths compare exactly
    ("/data/ck", True),                                # a local path: the pod's own volume
])
def test_a_location_is_allowed_only_under_a_whole_prefix_of_its_namespace(uri, allowed):
    job = _job("ns-a", checkpoint={"uri": uri})
    if allowed:
        PER_NAMESPACE.check(job, "ns-a")
        return
    with pytest.raises(CheckpointPrefixRefused) as info:
        PER_NAMESPACE.check(job, "ns-a")
    message = str(info.value)
    assert message.startswith(f"spec.checkpoint.uri {uri!r} is outside every gs:// prefix allowed in namespace ns-a: "
                              "gs://ml-ckpt/ns-a/, gs://ns-a-scratch ("), message
    assert "checkpointPrefixes" in message and "--checkpoint-prefixes" in message and "\n" not in message


@pytest.mark.parametrize("uri", ["gs://ml-ckpt/ns-a/%2E%2E/ns-b", "gs://ml-ckpt/ns-a/%2Fx"])
def test_escapes_are_refused_where_prefixes_are_set(uri):
    with pytest.raises(CheckpointPrefixRefused, match=r"spec\.checkpoint\.uri .*'%' is not accepted"):
        PER_NAMESPACE.check(_job("ns-a", checkpoint={"uri": uri}), "ns-a")


@pytest.mark.parametrize("uri", ["gs://ml-ckpt/ns-a/../ns-b", "gs://ml-ckpt//ns-a/x", "gs://ml-ckpt/./ns-a/x"])
def test_dot_and_empty_segments_never_pass(uri):
    """The model refuses `..` and `//` itself (`checkpoints.URI_RULES`); the prefix rule does not rely on it."""
    assert checkpoint_prefixes.segments(uri) is None


def test_the_compilation_cache_uri_is_held_to_the_same_prefixes():
    job = _job("ns-a", backend="pathways", slices={"count": 1, "accelerator": "tpu-v5-lite-podslice", "topology": "2x2"},
               checkpoint={"uri": "gs://ml-ckpt/ns-a/ck"}, compilationCache={"uri": "gs://ml-ckpt/ns-b/xla"})
    with pytest.raises(CheckpointPrefixRefused, match=r"^spec\.compilationCache\.uri 'gs://ml-ckpt/ns-b/xla' is outside"):
        PER_NAMESPACE.check(job, "ns-a")


def test_no_prefixes_no_restriction():
    CheckpointPrefixes().check(_job("ns-a", checkpoint={"uri": "gs://anyone/anything"}), "ns-a")


# (the typos of a new-user trial: `gs:/bucket`, `gcs://`, an upper-case or dash-led bucket, a `./` segment)
TEMPLATE_TYPOS = ["gs:/bucket", "gcs://bucket/x", "gs://Bucket/x", "gs://-b/x", "gs://b./x", "gs://b/./x",
                  "gs://b/x/..", "gs:///x"]


@pytest.mark.parametrize("text", ["s3://b/x", "gs://b//x", "gs://b/../x", "gs://", "gs://b/%7Bnamespace%7D", "/local",
                                  *TEMPLATE_TYPOS])
def test_a_bad_template_stops_the_operator_naming_it(text, capsys):
    with pytest.raises(ValueError, match="is not gs://bucket"):
        parse_templates(text)
    from elastic_jax.k8s_operator import main
    with pytest.raises(SystemExit) as info:
        main.main(["--checkpoint-prefixes", text, "--metrics-port", "0"])
    assert info.value.code == 2 and "--checkpoint-prefixes" in capsys.readouterr().err


def test_a_bad_template_is_refused_in_the_words_of_the_charts_schema():
    with pytest.raises(ValueError) as info:
        parse_templates("gs://ml-ckpt/{namespace}/, gs:/bucket")
    assert str(info.value) == f"'gs:/bucket' is not {checkpoint_prefixes.TEMPLATE_RULE}"
    assert parse_templates("gs://ml-ckpt/{namespace}/ gs://{namespace}-ckpt/ gs://b_1.x/.cache/..v") == (
        "gs://ml-ckpt/{namespace}/", "gs://{namespace}-ckpt/", "gs://b_1.x/.cache/..v")


def test_the_flag_sets_the_policy():
    assert checkpoint_prefixes.from_flags("gs://a/{namespace}/, gs://b").templates == ("gs://a/{namespace}/", "gs://b")
    assert checkpoint_prefixes.from_flags("") == CheckpointPrefixes()


def test_the_operator_fails_a_job_outside_its_prefixes_with_a_condition_and_an_event(monkeypatch):
    policies = AdminPolicies(checkpoint_prefixes=PER_NAMESPACE)
    body = _body("ns-a", checkpoint={"uri": "gs://ml-ckpt/ns-a-evil/ck"})
    body["metadata"]["uid"] = "u-ck"
    status, cond, events = refused_at_create(monkeypatch, body, "checkpointPrefixes", policies)
    assert status["phase"] == "Failed" and cond["reason"] == "InvalidSpec"
    assert "spec.checkpoint.uri 'gs://ml-ckpt/ns-a-evil/ck' is outside" in cond["message"]
    assert "gs://ml-ckpt/ns-a/" in cond["message"]
    assert events == [("Warning", "InvalidSpec", cond["message"])]
    # inside: accepted
    assert job_pass.parse_job(_body("ns-a", checkpoint={"uri": "gs://ml-ckpt/ns-a/ck"}),
                              policies).metadata.name == "pf-job"
