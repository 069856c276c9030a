"""Generates the `ElasticTrainingJob` CustomResourceDefinition from the pydantic models.

`crds/elastictrainingjobs.yaml` is an output of this module, never edited by
hand; `tests/unit/test_crd.py` fails when it is stale. Regenerate with:

    python -m elastic_jax.api.crd          # write crds/elastictrainingjobs.yaml
    python -m elastic_jax.api.crd --check  # exit 1 when the file is stale

Pydantic emits JSON Schema (draft 2020-12); Kubernetes wants a *structural*
OpenAPI v3.0 schema: no `$ref`, a plain type instead of `anyOf [.., null]`,
boolean `exclusiveMinimum`, no `additionalProperties` beside `properties`, and
`x-kubernetes-preserve-unknown-fields` for free-form maps. `to_structural`
does that translation; CEL rules come from the models' `json_schema_extra`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import yaml

from elastic_jax.api import backend_rules, cluster, generated_file, tpu_shapes
from elastic_jax.api import job as job_api
from elastic_jax.api.status import ElasticTrainingJobStatus

CRD_PATH = Path(__file__).resolve().parents[2] / "crds" / f"{job_api.PLURAL}.yaml"
HELM_CRD_PATH = CRD_PATH.parents[1] / "helm" / "elastic-jax" / "crds" / CRD_PATH.name
# The job-name rule, as `job.name_problem` applies it in `elastic-jax validate`. A CRD
# may constrain metadata.name only (maxLength here bounds the CEL cost too); the CEL
# rules on the root give the API server's refusal a message that says why.
MAX_NAME_LENGTH = job_api.MAX_NAME_LENGTH
NAME_RULES = [
    {"rule": f"self.metadata.name.matches('{job_api.NAME_PATTERN}')",
     "message": "metadata.name must be a DNS-1035 label: lowercase letters, digits and '-', starting with a "
                "letter (the job's Service is named after it)", "fieldPath": ".metadata.name"},
    {"rule": f"size(self.metadata.name) <= {MAX_NAME_LENGTH}",
     "message": f"metadata.name must be at most {MAX_NAME_LENGTH} characters, so the job's worker pod names "
                "(<name>-slice-<i>-worker-0-<host>-<random>) stay within 63", "fieldPath": ".metadata.name"},
]

_DROP = {"title"}

PRINTER_COLUMNS = [
    {"name": "Phase", "type": "string", "jsonPath": ".status.phase",
     "description": ElasticTrainingJobStatus.model_fields["phase"].description},
    {"name": "Step", "type": "integer", "jsonPath": ".status.step", "description": "Optimizer steps completed."},
    {"name": "Active", "type": "integer", "jsonPath": ".status.activeSlices", "description": "Slices training now."},
    {"name": "Desired", "type": "integer", "jsonPath": ".spec.slices.count", "description": "spec.slices.count."},
    {"name": "Restarts", "type": "integer", "jsonPath": ".status.controllerRestarts",
     "description": "Controller pod recreations (worker failures never count here)."},
    {"name": "Goodput", "type": "string", "jsonPath": ".status.goodput.percent",
     "description": "(productive + reduced x active/desired) seconds / seconds booked, over every controller pod."},
    {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    # -o wide: where the time went (seconds; status.goodput.seconds has every category)
    {"name": "Productive", "type": "number", "jsonPath": ".status.goodput.seconds.productive", "priority": 1,
     "description": "Seconds training on every desired slice."},
    {"name": "Reduced", "type": "number", "jsonPath": ".status.goodput.seconds.reduced", "priority": 1,
     "description": "Seconds training on fewer slices than desired."},
    {"name": "Recovering", "type": "number", "jsonPath": ".status.goodput.seconds.recovering", "priority": 1,
     "description": "Seconds from failures to the next completed step, and steps lost."},
    {"name": "Waiting", "type": "number", "jsonPath": ".status.goodput.seconds.waiting", "priority": 1,
     "description": "Seconds paused for lack of slices."},
    {"name": "Lost", "type": "integer", "jsonPath": ".status.stepsLost", "priority": 1,
     "description": "Training steps done and then thrown away (a controller resumed from an earlier step)."},
    # (a count: a list column prints "[]" for none; status.spareSlices names them)
    {"name": "Spares", "type": "integer", "jsonPath": ".status.spareCount", "priority": 1,
     "description": "Hot spare slices now (status.spareSlices names them)."},
]


def _resolve(node: Any, defs: dict[str, Any]) -> Any:
    """Inlines `$ref`s (our models have no recursion)."""
    if isinstance(node, dict):
        if "$ref" in node:
            target = defs[node["$ref"].rsplit("/", 1)[-1]]
            merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
            return _resolve(merged, defs)
        return {k: _resolve(v, defs) for k, v in node.items() if k != "$defs"}
    if isinstance(node, list):
        return [_resolve(v, defs) for v in node]
    return node


def to_structural(node: dict[str, Any]) -> dict[str, Any]:
    """Translates one resolved JSON-Schema node into a Kubernetes structural schema node.

    Raises:
      ValueError: a construct with no structural equivalent (e.g. a union of two real types).
    """
    node = {k: v for k, v in node.items() if k not in _DROP}
    if "anyOf" in node:
        options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
        if len(options) != 1:
            raise ValueError(f"cannot express union {options} in a structural schema")
        # Optional fields are left out rather than set to null, so no `nullable`.
        node = {**to_structural(options[0]), **node}
        if node.get("default", 0) is None:
            del node["default"]
        return node
    if "exclusiveMinimum" in node and not isinstance(node["exclusiveMinimum"], bool):
        node["minimum"] = node.pop("exclusiveMinimum")
        node["exclusiveMinimum"] = True
    if node.get("type") == "object":
        props = node.get("properties")
        extra = node.pop("additionalProperties", None)
        if props is not None:
            node["properties"] = {k: to_structural(v) for k, v in props.items()}
        elif extra is True or extra is None or extra == {}:
            # Free-form map (e.g. trainer config): the server keeps whatever the user wrote.
            node["x-kubernetes-preserve-unknown-fields"] = True
        elif isinstance(extra, dict):
            node["additionalProperties"] = to_structural(extra)
    if node.get("type") == "array" and "items" in node:
        node["items"] = to_structural(node["items"])
    return node


def model_schema(model: type) -> dict[str, Any]:
    """The structural openAPIV3Schema of one pydantic model (camelCase names)."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return to_structural(_resolve(raw, raw.get("$defs", {})))


def build_crd() -> dict[str, Any]:
    """The whole CRD object, ready to `kubectl apply`."""
    spec_schema = model_schema(job_api.ElasticTrainingJobSpec)
    # What only a cluster needs (e.g. an absolute checkpoint folder), and the fields fixed at creation.
    spec_schema["x-kubernetes-validations"] = (spec_schema.get("x-kubernetes-validations", []) + cluster.CEL_RULES
                                               + tpu_shapes.cel_rules() + backend_rules.node_selector_cel_rules())
    cluster.add_immutability_rules(spec_schema)
    status_schema = model_schema(ElasticTrainingJobStatus)
    status_schema.pop("required", None)  # the operator fills status gradually
    root = {
        "type": "object",
        "description": "An elastic multi-slice JAX training job: one controller pod and one worker JobSet per slice.",
        "required": ["spec"],
        "x-kubernetes-validations": NAME_RULES,
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object", "properties": {"name": {"type": "string", "maxLength": MAX_NAME_LENGTH}}},
            "spec": spec_schema,
            "status": status_schema,
        },
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{job_api.PLURAL}.{job_api.GROUP}"},
        "spec": {
            "group": job_api.GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": job_api.KIND,
                "plural": job_api.PLURAL,
                "singular": job_api.SINGULAR,
                "shortNames": list(job_api.SHORT_NAMES),
                "listKind": f"{job_api.KIND}List",
                "categories": ["all", "elasticjax"],
            },
            "versions": [{
                "name": job_api.VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": PRINTER_COLUMNS,
                "schema": {"openAPIV3Schema": root},
            }],
        },
    }


def render() -> str:
    """The CRD as YAML text, with a do-not-edit header."""
    header = "# Generated by `python -m elastic_jax.api.crd` from elastic_jax/api/job.py and status.py. Do not edit.\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=120)


def main(argv: list[str] | None = None) -> int:
    """Writes (or with --check, verifies) `crds/elastictrainingjobs.yaml` and the Helm chart's copy; returns the exit code."""
    code, written = generated_file.main(argv, prog="python -m elastic_jax.api.crd", description="Generate the CRD YAML.",
                                        default_output=CRD_PATH, render=render)
    if written == CRD_PATH:
        # The Helm chart ships the same file (charts cannot reach outside their folder).
        HELM_CRD_PATH.write_text(CRD_PATH.read_text())
    return code


if __name__ == "__main__":
    sys.exit(main())
