"""The rules of a job on a cluster: one definition (`elastic_jax.api.cluster`) behind the CRD's CEL,
`elastic-jax validate --cluster` and the operator; the spec fields fixed at creation are CEL transition rules."""

from __future__ import annotations

import copy

import pytest
import yaml
from typer.testing import CliRunner

from elastic_jax.api import cluster
from elastic_jax.api.crd import build_crd
from elastic_jax.cli import app

EXAMPLE = yaml.safe_load(open("examples/01-cpu-job.yaml"))


def _spec_schema() -> dict:
    return build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def _validate(tmp_path, spec_edit, *flags):
    manifest = copy.deepcopy(EXAMPLE)
    spec_edit(manifest["spec"])
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(manifest))
    return CliRunner().invoke(app, ["validate", *flags, str(path)])


# (uri, the message part both `validate --cluster` and the CRD's CEL name)
BAD_URIS = [
    ("runs/ck", "must be an absolute folder"),
    ("/data/./x", "must be an absolute folder"),
    ("/data//x", "must be an absolute folder"),
    ("/etc/elastic-jax/token", "must not overlap /etc/elastic-jax/token"),
    ("/tmp/elastic-jax-scratch/ck", "must not overlap /tmp/elastic-jax-scratch"),
    ("/usr/local/ck", "must not be inside"),
]


@pytest.mark.parametrize("uri, message", BAD_URIS)
def test_validate_cluster_refuses_what_the_crd_refuses(tmp_path, uri, message):
    result = _validate(tmp_path, lambda s: s["checkpoint"].update(uri=uri), "--cluster")
    assert result.exit_code == 2, result.output
    # one line naming the file, as every other line of `validate` does (they lacked it with --cluster)
    assert f"error: {tmp_path / 'job.yaml'}: spec.checkpoint.uri" in result.output and message in result.output, result.output
    assert "Traceback" not in result.output
    # the same text is a CEL rule's message in the CRD
    messages = [r["message"] for r in _spec_schema()["x-kubernetes-validations"]]
    assert any(message in m for m in messages), messages


# (uri, the one line's words) the uri's own table refuses: the cluster's broader rules leave them to it
FORM_REFUSED = [("/", "the file system's root"), ("//", "the file system's root"), ("~", "the home folder itself"),
                ("~root/x", "'~user'"), ("..", "a '..' segment"), ("/data/../etc/x", "a '..' segment"),
                ("/etc/../data", "a '..' segment"), (" /data/ck", "leading or trailing white space"),
                ("/data/ck\t", "leading or trailing white space")]


@pytest.mark.parametrize("uri, words", FORM_REFUSED)
def test_validate_cluster_says_a_uri_error_once(tmp_path, uri, words):
    """Issue 11: `/`, `~`, `..` got the table's specific line and then the cluster's generic local-path line
    for the same fault; now one line, and the CRD's CEL says the same (the cluster rules hold for them)."""
    result = _validate(tmp_path, lambda s: s["checkpoint"].update(uri=uri), "--cluster")
    errors = [ln for ln in result.output.splitlines() if ln.startswith("error: ")]
    assert result.exit_code == 2 and len(errors) == 1 and words in errors[0], result.output
    assert cluster.problems({"backend": "cpu", "checkpoint": {"uri": uri}}) == []


def _cel_holds(rule: str, uri: str) -> bool:
    """A cluster rule's CEL over `uri` (terms `self.checkpoint.uri.contains/matches/startsWith('...')`, `||`,
    `&&`, `!`) for backend cpu,
    read back from its text and evaluated with Python's `re`."""
    import re

    def literal(text: str) -> str:
        return text.replace("\\'", "'").replace("\\\\", "\\")
    expr = re.sub(r"(!?)self\.checkpoint\.uri\.(contains|matches|startsWith)\('((?:[^'\\]|\\.)*)'\)",
                  lambda m: f" {'not ' if m[1] else ''}_{m[2]}({literal(m[3])!r}) ", rule)
    expr = expr.replace("self.backend != 'pathways'", " True ")  # (the specs below are backend cpu)
    expr = expr.replace("||", " or ").replace("&&", " and ")
    return eval(expr, {"_contains": lambda s: s in uri, "_matches": lambda p: bool(re.search(p, uri)),
                       "_startsWith": uri.startswith})


@pytest.mark.parametrize("uri", [u for u, _ in FORM_REFUSED] + [u for u, _ in BAD_URIS] + ["/data/ck", "gs://x/y"])
def test_the_cluster_cel_rules_say_what_cluster_problems_says(uri):
    spec = {"backend": "cpu", "checkpoint": {"uri": uri}}
    by_cel = [r["message"] for r in cluster.CEL_RULES if not _cel_holds(r["rule"], uri)]
    assert by_cel == cluster.problems(spec)


def test_validate_without_cluster_keeps_the_local_rules(tmp_path):
    """`elastic-jax run` takes a relative checkpoint folder: plain validate still does."""
    result = _validate(tmp_path, lambda s: s["checkpoint"].update(uri="runs/ck"))
    assert result.exit_code == 0, result.output


def test_validate_cluster_accepts_the_cluster_example_and_gs(tmp_path):
    assert _validate(tmp_path, lambda s: None, "--cluster").exit_code == 0
    assert _validate(tmp_path, lambda s: s["checkpoint"].update(uri="gs://test-bucket/p"), "--cluster").exit_code == 0


def test_validate_cluster_refuses_pathways_without_gs_and_an_unknown_tpu(tmp_path):
    def pathways(uri, accelerator="tpu-v5-lite-podslice"):
        def edit(s):
            s.update(backend="pathways")
            s["slices"].update(accelerator=accelerator, topology="2x2")
            s["checkpoint"].update(uri=uri)
        return edit
    result = _validate(tmp_path, pathways("/data/ck"), "--cluster")
    assert result.exit_code == 2 and "must be gs://bucket/prefix for backend pathways" in result.output, result.output
    result = _validate(tmp_path, pathways("gs://test-bucket/p", "tpu-v9-imaginary"), "--cluster")
    assert result.exit_code == 2 and "spec.slices.accelerator" in result.output, result.output


def test_global_batch_below_slices_is_a_cel_rule_too():
    rules = [r["rule"] for r in _spec_schema()["x-kubernetes-validations"]]
    assert "self.training.globalBatchSize >= self.slices.count" in rules


def _rules_by_path(node, path="spec", out=None):
    out = {} if out is None else out
    for r in node.get("x-kubernetes-validations") or []:
        if "oldSelf" in r["rule"]:
            out[path + r.get("fieldPath", "")] = r
    for name, sub in (node.get("properties") or {}).items():
        _rules_by_path(sub, f"{path}.{name}", out)
    return out


def test_fields_the_operator_cannot_change_are_transition_rules_naming_them():
    rules = _rules_by_path(_spec_schema())
    for path in ("spec.slices.count", "spec.slices.minSlices", "spec.training.steps", "spec.checkpoint.uri",
                 "spec.backend", "spec.controller.image", "spec.controller.trainer.config", "spec.worker.env",
                 "spec.elasticity.maxRestarts", "spec.controller.resources.limits"):
        assert path in rules, sorted(rules)
        assert rules[path]["message"].startswith(f"{path} is immutable"), rules[path]
    # what the operator applies to a running job stays editable
    for path in ("spec.suspend", "spec.ttlSecondsAfterFinished"):
        assert path not in rules
    # an optional field compares presence too: adding minSlices later is a change
    assert "has(self.minSlices) == has(oldSelf.minSlices)" in rules["spec.slices.minSlices"]["rule"]
    # an optional object's addition/removal is refused on its parent
    assert rules["spec.controller"]["rule"] == "has(self.controller) == has(oldSelf.controller)"


def test_every_immutable_leaf_the_operator_rejects_is_covered():
    """The operator's `changed_fields` refuses every spec field but suspend/TTL: each leaf of the schema
    has a transition rule (on itself or an enclosing rule), so none is accepted then refused."""
    rules = _rules_by_path(_spec_schema())

    def leaves(node, path):
        props = node.get("properties") or {}
        if node.get("type") == "object" and props:
            for name, sub in props.items():
                if path == "spec" and name in cluster.IMMUTABLE_EXCEPT:
                    continue
                yield from leaves(sub, f"{path}.{name}")
        else:
            yield path
    missing = [p for p in leaves(_spec_schema(), "spec") if p not in rules]
    assert missing == []


def test_validate_prints_the_resources_the_operator_applies(tmp_path):
    """`requests: {}` in the spec is 250m / 512Mi on the cluster: `validate` prints what the renderer gives the
    pods (the same `Resources.effective`), not the empty map; what the user set is kept."""
    from elastic_jax.api.manifest import parse_manifest
    from elastic_jax.k8s_operator.backends.cpu import CpuRenderer

    def edit(spec):
        spec["controller"].pop("resources", None)
        spec["worker"] = {"resources": {"requests": {"cpu": "1"}, "limits": {"memory": "2Gi"}}}

    result = _validate(tmp_path, edit)
    assert result.exit_code == 0, result.output
    printed = yaml.safe_load(result.output)
    job = parse_manifest(printed)
    pod = CpuRenderer().controller_pod(job, 0)
    jobset = CpuRenderer().worker_jobset(job, 0)
    worker_pod = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert printed["spec"]["controller"]["resources"] == pod["spec"]["containers"][0]["resources"] == {
        "requests": {"cpu": "250m", "memory": "512Mi"}}
    assert printed["spec"]["worker"]["resources"] == worker_pod["containers"][0]["resources"] == {
        "requests": {"cpu": "1"}, "limits": {"memory": "2Gi"}}  # (memory: its limit is its request)
