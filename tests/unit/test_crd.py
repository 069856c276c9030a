"""The CRD is generated from the pydantic models, structural, and never stale."""

from __future__ import annotations

import yaml

from elastic_jax.api import crd, pod_rules
from elastic_jax.api.job import ElasticTrainingJobSpec


def _walk(node, path="$"):
    if isinstance(node, dict):
        yield path, node
        for k, v in node.items():
            yield from _walk(v, f"{path}.{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _walk(v, f"{path}[{i}]")


def test_checked_in_crd_matches_the_models():
    # Fails when someone edits job.py/status.py without `python -m elastic_jax.api.crd`.
    assert crd.CRD_PATH.read_text() == crd.render(), "crds/ is stale: run python -m elastic_jax.api.crd"
    assert crd.main(["--check"]) == 0


def test_check_flag_reports_a_stale_file(tmp_path, capsys):
    stale = tmp_path / "crd.yaml"
    stale.write_text("old")
    assert crd.main(["--check", "--output", str(stale)]) == 1
    assert "stale" in capsys.readouterr().err


def test_schema_is_structural():
    schema = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        assert "$ref" not in node and "anyOf" not in node and "title" not in node, path
        if "properties" in node:
            assert node.get("type") == "object", path
            assert "additionalProperties" not in node, path
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True, path


def test_schema_has_types_enums_bounds_defaults_and_cel():
    spec = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    props = spec["properties"]
    assert props["backend"]["enum"] == ["cpu", "pathways"] and props["backend"]["default"] == "cpu"
    assert props["slices"]["properties"]["count"] == {**props["slices"]["properties"]["count"], "minimum": 1, "maximum": 64}
    assert set(spec["required"]) == {"slices", "training", "checkpoint"}
    assert props["controller"]["properties"]["trainer"]["properties"]["config"]["x-kubernetes-preserve-unknown-fields"]
    assert props["controller"]["properties"]["trainer"]["properties"]["entryPoint"]["pattern"].startswith("^")
    deadline = props["elasticity"]["properties"]["stepDeadlineSeconds"]
    assert deadline["minimum"] == 0 and deadline["exclusiveMinimum"] is True
    rules = [r["rule"] for r in spec["x-kubernetes-validations"]]
    assert "self.backend == oldSelf.backend" in rules
    assert "minSlices <= self.count" in props["slices"]["x-kubernetes-validations"][0]["rule"]


def test_names_printer_columns_and_status_subresource():
    body = crd.build_crd()
    assert body["metadata"]["name"] == "elastictrainingjobs.elasticjax.dev"
    assert body["spec"]["names"]["shortNames"] == ["ejob"]
    version = body["spec"]["versions"][0]
    assert version["name"] == "v1alpha1" and version["subresources"] == {"status": {}}
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == ["Phase", "Step", "Active", "Desired", "Restarts", "Goodput", "Age",
                       "Productive", "Reduced", "Recovering", "Waiting", "Lost", "Spares"]
    # the default view stays short: the breakdown only with -o wide
    assert {c["name"] for c in version["additionalPrinterColumns"] if c.get("priority") == 1} == {
        "Productive", "Reduced", "Recovering", "Waiting", "Lost", "Spares"}
    # -o wide shows a count (0 for none), never a JSON list ("[]"), for the spares
    spares = next(c for c in version["additionalPrinterColumns"] if c["name"] == "Spares")
    assert spares["type"] == "integer" and spares["jsonPath"] == ".status.spareCount"
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert status["phase"]["enum"] == ["Pending", "Running", "Degraded", "Recovering", "Suspending", "Suspended",
                                        "Succeeded", "Failed"]
    assert {"conditions", "slices", "controllerRestarts", "lastCheckpointStep", "failureReason", "goodput",
            "spareSlices"} <= set(status)
    assert set(status["goodput"]["properties"]["seconds"]["properties"]) == {
        "productive", "reduced", "recovering", "waiting", "checkpointing", "restoring", "starting", "stalled"}


def test_every_spec_field_is_described():
    schema = crd.model_schema(ElasticTrainingJobSpec)
    for path, node in _walk(schema):
        for name, prop in (node.get("properties") or {}).items():
            assert prop.get("description"), f"{path}.{name} has no description"


def test_rendered_yaml_round_trips():
    assert yaml.safe_load(crd.render()) == crd.build_crd()


def test_crd_enforces_the_job_name_rule_of_validate():
    import re

    from elastic_jax.api import job as job_api

    root = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert root["properties"]["metadata"]["properties"]["name"]["maxLength"] == job_api.MAX_NAME_LENGTH
    rules = {r["rule"] for r in root["x-kubernetes-validations"]}
    assert f"self.metadata.name.matches('{job_api.NAME_PATTERN}')" in rules
    assert f"size(self.metadata.name) <= {job_api.MAX_NAME_LENGTH}" in rules
    # The CEL regex (RE2, `$` = end of text) and validate's fullmatch agree on these.
    cel = re.compile(job_api.NAME_PATTERN.replace("$", r"\Z"))
    for name in ("1job", "job\n", "Job", "ok-1", "a"):
        assert bool(cel.match(name)) == (job_api.name_problem(name) is None or len(name) > job_api.MAX_NAME_LENGTH)


def test_pod_fields_are_in_the_crd_with_descriptions():
    # kubectl explain ejob.spec.<field> shows these; the API server checks the shapes the model checks.
    props = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    fields = {
        "imagePullSecrets": props["imagePullSecrets"], "priorityClassName": props["priorityClassName"],
        **{f"controller.{k}": props["controller"]["properties"][k]
           for k in ("nodeSelector", "tolerations", "serviceAccountName", "automountServiceAccountToken", "resources")},
        **{f"worker.{k}": props["worker"]["properties"][k] for k in ("nodeSelector", "tolerations", "resources")},
    }
    for name, schema in fields.items():
        assert len(schema.get("description", "")) > 20, name
    assert props["imagePullSecrets"]["items"]["properties"]["name"]["pattern"].startswith("^[a-z0-9]")
    assert props["imagePullSecrets"]["items"]["required"] == ["name"]
    tol = props["worker"]["properties"]["tolerations"]["items"]["properties"]
    assert tol["operator"]["enum"] == ["Exists", "Equal"]
    assert tol["effect"]["enum"] == ["NoSchedule", "PreferNoSchedule", "NoExecute"]
    # label values as the API server checks them in a Pod; keys by CEL (a CRD cannot pattern map keys)
    assert props["controller"]["properties"]["nodeSelector"]["additionalProperties"]["pattern"] == \
        pod_rules.LABEL_VALUE_PATTERN
    assert tol["key"]["pattern"] == pod_rules.QUALIFIED_NAME_PATTERN


def _rules_with_nodes(node, path=""):
    """(path of the schema node, the node, one rule) for every CEL rule of the CRD's schema."""
    for rule in node.get("x-kubernetes-validations", []):
        yield path, node, rule
    for key, child in (node.get("properties") or {}).items():
        yield from _rules_with_nodes(child, f"{path}.{key}")
    if "items" in node:
        yield from _rules_with_nodes(node["items"], f"{path}[]")


def test_every_cel_rule_on_an_object_names_the_field_it_refuses():
    """Without `fieldPath` the API server reports a rule of an object at the object (`spec`, or `<nil>` at the
    root): each rule of an object with fields names its field, one that exists in the schema. (A rule on a map
    is reported at the map.)"""
    root = crd.build_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    unnamed, dangling = [], []
    for path, node, rule in _rules_with_nodes(root):
        if "properties" not in node:
            continue
        field = rule.get("fieldPath")
        if field is None:
            unnamed.append((path or "<root>", rule["message"]))
            continue
        target = node
        for key in field.lstrip(".").split("."):
            target = (target.get("properties") or {}).get(key)
            if target is None:
                dangling.append((path, field))
                break
    assert not unnamed and not dangling, (unnamed, dangling)
    by_message = {r["message"]: (p, r) for p, _, r in _rules_with_nodes(root)}
    # the three the new-user trial saw reported at `spec` or `<nil>`
    for prefix, where, field in [("spec.checkpoint.uri: a local path must be an absolute", ".spec", ".checkpoint.uri"),
                                 ("spec.training.globalBatchSize must be", ".spec", ".training.globalBatchSize"),
                                 ("metadata.name must be a DNS-1035", "", ".metadata.name")]:
        found = [(p, r) for m, (p, r) in by_message.items() if m.startswith(prefix)]
        assert found and all(p == where and r["fieldPath"] == field for p, r in found), (prefix, found)
