"""`spec.checkpoint.uri` names a folder of the job's own or a bucket GCS can hold (issue 11, session 14's
new-user trials): one table (`checkpoints.URI_RULES`) behind the model, so `elastic-jax validate` without
`--cluster`, `elastic-jax run` and the operator refuse the same uris, and behind the CRD's CEL rules (their
messages are the same words; `tests/support/bad_manifests.py` sends such manifests through a real API server
in `e2e/test_bad_manifests.py`)."""

from __future__ import annotations

import re

import pytest
import yaml
from typer.testing import CliRunner

from elastic_jax.api import checkpoints, crd
from elastic_jax.api.manifest import ManifestError, parse_manifest
from elastic_jax.cli import app
from tests.support.bad_manifests import cpu_job, pathways_job

# (uri, the words of its refusal; `validate` prints them after `spec.checkpoint.uri: '<uri>': `)
REFUSED = [
    ("/", "the file system's root"),
    ("//", "the file system's root"),
    ("/./", "the file system's root"),
    ("~", "the home folder itself"),
    ("~/", "the home folder itself"),
    ("~root", "'~user' (another user's home folder) is not supported"),
    ("~root/ckpt", "'~user' (another user's home folder) is not supported"),
    ("/tmp/../etc", "a '..' segment"),
    ("..", "a '..' segment"),
    ("runs/../../ckpt", "a '..' segment"),
    ("gs://test-bucket/a/../b", "a '..' segment"),
    (" /data/ck", "leading or trailing white space"),
    ("/data/ck ", "leading or trailing white space"),
    ("gs://test-bucket/ck\n", "leading or trailing white space"),
    ("/data/c\tk", "a control character"),
    ("gs://b", "a GCS bucket name is 3-63 characters long"),
    ("gs://ab/ck", "a GCS bucket name is 3-63 characters long"),
    ("gs://" + "a" * 64, "a GCS bucket name is 3-63 characters long"),
    ("gs://" + ".".join(["a" * 63] * 4) + "/ck", "a GCS bucket name with dots is 3-222 characters long"),
    ("gs://" + "a" * 64 + ".com", "each dot-separated part of a GCS bucket name is 1-63 characters long"),
    ("gs://a..b/ck", "each dot-separated part of a GCS bucket name is 1-63 characters long"),
    ("gs://UPPER_bad/ck", "a GCS bucket name holds only lowercase letters, digits, '-', '_' and '.'"),
    ("gs://my bucket/ck", "a GCS bucket name holds only lowercase letters"),
    ("gs://-bucket/ck", "a GCS bucket name starts and ends with a letter or a digit"),
    ("gs://bucket_/ck", "a GCS bucket name starts and ends with a letter or a digit"),
    ("gs://192.168.5.4/ck", "a GCS bucket name must not be an IP address"),
    ("gs://goog-ckpt/ck", "a GCS bucket name must not begin with 'goog'"),
    ("gs://my-google-ckpt", "a GCS bucket name must not contain 'google' or a close misspelling"),
    ("gs://my-g00gle-ckpt", "a GCS bucket name must not contain 'google' or a close misspelling"),
    # an empty path segment after the bucket (issue 11: `gs://b//x` passed)
    ("gs://test-bucket//x", "an empty path segment ('//' after the bucket name)"),
    ("gs://test-bucket/a//b", "an empty path segment"),
    ("gs://test-bucket/a/b//", "an empty path segment"),
]

ACCEPTED = ["/data/ck", "/data/ck/", "relative/ck", "./ck", "~/ck", "/data/a..b", "/data/.hidden",
            "gs://test-bucket", "gs://test-bucket/", "gs://abc/ck", "gs://a.b", "gs://my_bucket.example.com/ck",
            "gs://" + "a" * 63 + "/ck", "gs://1.2.3/ck", "gs://test-bucket/a b/ck",
            "gs://test-bucket/a/b/"]


def _job(uri: str) -> dict:
    job = cpu_job()
    job["spec"]["checkpoint"] = {"uri": uri}
    return job


def _cache_job(uri: str) -> dict:
    job = pathways_job()
    job["spec"]["compilationCache"] = {"uri": uri}
    return job


CACHE_FIELD = "spec.compilationCache.uri"
# spec.compilationCache.uri takes the table's gs:// rules (issue 11: it had only `gs://bucket[/prefix]`)
GCS_REFUSED = [(u, w) for u, w in REFUSED if u.startswith("gs://")]
JOB_OF = {"spec.checkpoint.uri": _job, CACHE_FIELD: _cache_job}
FIELD_CASES = [("spec.checkpoint.uri", u, w) for u, w in REFUSED] + [(CACHE_FIELD, u, w) for u, w in GCS_REFUSED]


@pytest.mark.parametrize("field, uri, words", FIELD_CASES, ids=[f"{f[5:9]}-{u!r:.36}" for f, u, _ in FIELD_CASES])
def test_the_model_refuses_a_uri_that_names_no_folder_or_bucket_of_its_own(field, uri, words):
    with pytest.raises(ManifestError) as e:
        parse_manifest(JOB_OF[field](uri))
    assert f"{field}: {uri!r}: {words}" in str(e.value), e.value.problems
    other = next(f for f in JOB_OF if f != field)
    assert other not in str(e.value)  # each message names its own field


@pytest.mark.parametrize("uri", ACCEPTED)
def test_the_model_accepts_folders_and_buckets_of_their_own(uri):
    assert parse_manifest(_job(uri)).spec.checkpoint.uri == uri


@pytest.mark.parametrize("uri, words", REFUSED[:3] + REFUSED[4:6] + REFUSED[7:8] + REFUSED[11:13] + REFUSED[15:16]
                         + REFUSED[21:22] + REFUSED[26:27])
def test_validate_without_cluster_refuses_them_one_line_each_naming_the_field(tmp_path, uri, words):
    """What session 14's trials found accepted: `/`, `~`, `..`, white space at an end, `gs://b`, `UPPER_bad`,
    `goog...`; plain `validate` (the rules of `elastic-jax run`) refuses each now, no traceback."""
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(_job(uri)))
    result = CliRunner().invoke(app, ["validate", str(path)])
    assert result.exit_code == 2, result.output
    errors = [ln for ln in result.output.splitlines() if ln.startswith("error: ")]
    assert errors and all(ln.startswith(f"error: {path}: spec.checkpoint.uri: {uri!r}: ") for ln in errors), errors
    assert any(words in ln for ln in errors), errors
    assert "Traceback" not in result.output


def test_validate_refuses_gs_b_double_slash_x_for_both_faults(tmp_path):
    """`gs://b//x` (the issue's sample): the short bucket name and the empty segment, each once."""
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(_job("gs://b//x")))
    result = CliRunner().invoke(app, ["validate", str(path)])
    errors = [ln for ln in result.output.splitlines() if ln.startswith("error: ")]
    assert result.exit_code == 2 and len(errors) == 2, result.output
    assert "3-63 characters" in errors[0] and "an empty path segment" in errors[1], errors


@pytest.mark.parametrize("uri", ["gs://UPPER_bad/ck", "gs://ab.", "gs://.abc", "gs://-abc", "/data/ck\t", "gs://abc/x\n",
                                 "/", "~", "/a/../b", "gs://a..b"])
def test_a_uri_with_one_fault_gets_one_line(uri):
    """Issue 11: one fault was said twice (an uppercase bucket name: "lowercase letters" and "starts and ends
    with a letter or a digit"; a trailing tab: white space and a control character)."""
    assert len(checkpoints.uri_problems(uri)) == 1, checkpoints.uri_problems(uri)


def test_run_refuses_them_before_anything_starts(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(_job("gs://b/ck")))
    result = CliRunner().invoke(app, ["run", str(path), "--workdir", str(tmp_path / "run")])
    assert result.exit_code == 2 and "a GCS bucket name is 3-63 characters long" in result.output, result.output
    assert not (tmp_path / "run").exists()


def _uri_cel_rules() -> list[dict]:
    spec = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return spec["properties"]["checkpoint"]["x-kubernetes-validations"]


def test_every_rule_is_a_cel_rule_of_the_crd_with_the_same_words():
    rules = _uri_cel_rules()
    for rule in checkpoints.URI_RULES:
        cel = [r for r in rules if r["message"] == f"spec.checkpoint.uri: {rule.message}"]
        assert len(cel) == 1 and cel[0]["fieldPath"] == ".uri", rule
        assert cel[0]["rule"] in {c["rule"] for c in checkpoints.cel_rules()}


def _cel_matches(rule: str, uri: str) -> bool:
    """The generated CEL rules as Python evaluates them: they are `A || B` over `self.uri.contains('...')` and
    `self.uri.matches('...')` terms, each maybe negated; this reads the terms back from the CEL text (the
    literal unescaped as CEL does) to show the CEL says what `uri_problems` says."""
    def term(text: str) -> bool:
        negated = text.startswith("!")
        text = text.removeprefix("!")
        kind, literal = re.fullmatch(r"self\.uri\.(contains|matches)\('(.*)'\)", text).groups()
        literal = literal.replace("\\'", "'").replace("\\\\", "\\")
        value = literal in uri if kind == "contains" else bool(re.search(literal, uri))
        return value != negated
    return any(term(t) for t in rule.split(" || "))


@pytest.mark.parametrize("uri", [u for u, _ in REFUSED] + ACCEPTED)
def test_the_cel_rules_refuse_what_the_model_refuses(uri):
    refused_by_cel = {r["message"] for r in checkpoints.cel_rules() if not _cel_matches(r["rule"], uri)}
    refused_by_python = {p.replace(f"spec.checkpoint.uri: {uri!r}: ", "spec.checkpoint.uri: ")
                         for p in checkpoints.uri_problems(uri)}
    assert refused_by_cel == refused_by_python


def test_no_rule_backtracks_on_a_long_uri():
    """Python's `re` backtracks; every uri of the longest allowed length is judged at once."""
    import time

    for uri in ("/" * 4095 + "x", "/." * 2047 + "x", "~" + "/." * 2047 + "x", "gs://" + "a." * 2045 + "-",
                "gs://" + "a" * 4091, "gs://abc" + "/a" * 2043 + "/"):
        started = time.monotonic()
        checkpoints.uri_problems(uri)
        assert time.monotonic() - started < 0.5, uri[:20]


# -- spec.compilationCache.uri: the same table's gs:// rules ------------------------------------------------


@pytest.mark.parametrize("uri", [u for u in ACCEPTED if u.startswith("gs://")])
def test_the_compilation_cache_uri_accepts_the_buckets_checkpoint_uri_accepts(uri):
    assert parse_manifest(_cache_job(uri)).spec.compilation_cache.uri == uri


def test_a_compilation_cache_uri_that_is_not_gs_is_refused_once():
    """The gs:// form is the pattern's rule; the table's rules stay silent then (one line, not two)."""
    for uri in ("/var/cache/x", " gs://test-bucket/x", "gs:///x", "s3://test-bucket/x"):
        with pytest.raises(ManifestError) as e:
            parse_manifest(_cache_job(uri))
        assert e.value.problems == [f"manifest: {CACHE_FIELD}: {uri!r}: must be gs://bucket[/prefix]"], uri


def _cache_cel_rules() -> list[dict]:
    spec = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return [r for r in spec["properties"]["compilationCache"]["x-kubernetes-validations"]
            if "oldSelf" not in r["rule"]]  # (the immutability rules are `cluster`'s)


@pytest.mark.parametrize("uri", [u for u, _ in GCS_REFUSED] + [u for u in ACCEPTED if u.startswith("gs://")])
def test_the_crds_compilation_cache_cel_refuses_what_the_model_refuses(uri):
    rules = _cache_cel_rules()
    assert all(r["fieldPath"] == ".uri" and r["rule"].startswith("!has(self.uri) || ") for r in rules)
    refused_by_cel = {r["message"] for r in rules
                      if not _cel_matches(r["rule"].removeprefix("!has(self.uri) || "), uri)}
    refused_by_python = {p.replace(f"{CACHE_FIELD}: {uri!r}: ", f"{CACHE_FIELD}: ")
                         for p in checkpoints.form_problems(uri, CACHE_FIELD, checkpoints.GCS_SCOPES)}
    assert refused_by_cel == refused_by_python
    assert all(m.startswith(f"{CACHE_FIELD}: ") for m in refused_by_cel)
