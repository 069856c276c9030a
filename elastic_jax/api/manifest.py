"""Reading `ElasticTrainingJob` manifests with one-line errors that name the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from elastic_jax.api.job import ElasticTrainingJob


class ManifestError(ValueError):
    """A manifest is unreadable or invalid. `str()` is one line naming the field."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key repeated in one mapping (PyYAML keeps the last
    silently; kubectl refuses it, so `steps: 60` then `steps: 5` must not pass here)."""

    def construct_mapping(self, node, deep=False):
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice in one mapping", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def format_validation_error(error: ValidationError, prefix: str = "") -> str:
    """Turns a pydantic error into `field.path: message; ...` (camelCase paths).

    Args:
      error: the pydantic error.
      prefix: prepended to every path (e.g. "spec.").

    Returns:
      One line; several problems are joined with "; ".
    """
    parts = []
    for item in error.errors():
        loc = ".".join(str(p) for p in item["loc"])
        msg = item["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        if item["type"] == "extra_forbidden":
            msg = "unknown field"
        # A model validator's message already names its fields.
        parts.append(f"{prefix}{loc}: {msg}" if loc and not msg.startswith(("spec.", "metadata.", "backend ")) else msg)
    return "; ".join(parts)


def parse_manifest(data: Any, source: str = "manifest") -> ElasticTrainingJob:
    """Validates an already-parsed manifest with the API server's type rules.

    Validation is pydantic's strict JSON mode on the manifest as JSON, which is
    what the API server sees after kubectl converts the YAML (YAML timestamps
    become strings): `steps: "10"` or `suspend: "yes"` is refused here exactly
    as the CRD's `type: integer` / `type: boolean` refuses it there, never
    coerced.

    Raises:
      ManifestError: not a mapping, or invalid; the message names the field.
    """
    if not isinstance(data, dict):
        raise ManifestError(f"{source}: expected a YAML mapping with apiVersion, kind, metadata, spec")
    try:
        return ElasticTrainingJob.model_validate_json(json.dumps(data, default=str), strict=True)
    except ValidationError as e:
        raise ManifestError(f"{source}: {format_validation_error(e)}") from None


def load_manifest(path: str | Path) -> ElasticTrainingJob:
    """Reads and validates one `ElasticTrainingJob` YAML file.

    Raises:
      ManifestError: missing file, malformed YAML, more than one document, or invalid spec.
    """
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ManifestError(f"{path}: cannot read manifest: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ManifestError(f"{path}: not a text file (expected UTF-8 YAML)") from None
    try:
        docs = [d for d in yaml.load_all(text, Loader=_UniqueKeyLoader) if d is not None]
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ManifestError(f"{path}: malformed YAML{where}: {getattr(e, 'problem', e)}") from None
    if len(docs) != 1:
        raise ManifestError(f"{path}: expected exactly one YAML document, found {len(docs)}")
    return parse_manifest(docs[0], str(path))


def dump_model(model: BaseModel) -> str:
    """The camelCase YAML of a model (for passing a spec to a child process)."""
    return yaml.safe_dump(model.model_dump(mode="json", by_alias=True, exclude_none=True), sort_keys=False)
