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


# YAML aliases let a few hundred bytes stand for billions of nodes ("billion laughs"):
# PyYAML shares the aliased objects, so loading is cheap, but everything after it
# (JSON conversion, validation, the ConfigMap) expands them. A manifest needs few
# aliases, if any; these bounds refuse a bomb before anything expands it.
MAX_ALIASES = 100
# Nodes the aliases may add to the document once expanded (beyond its own nodes).
MAX_ALIAS_EXPANDED_NODES = 10_000


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key repeated in one mapping (PyYAML keeps the last
    silently; kubectl refuses it, so `steps: 60` then `steps: 5` must not pass here), and
    refusing alias expansion beyond `MAX_ALIASES` / `MAX_ALIAS_EXPANDED_NODES`."""

    def __init__(self, stream):
        super().__init__(stream)
        self._aliases = 0

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise yaml.composer.ComposerError(
                    None, None, f"more than {MAX_ALIASES} YAML aliases (refused: alias expansion bomb?)",
                    self.peek_event().start_mark)
        return super().compose_node(parent, index)

    def construct_document(self, node):
        _check_expansion(node)
        return super().construct_document(node)

    def construct_mapping(self, node, deep=False):
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} appears twice in one mapping", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _check_expansion(root: yaml.Node) -> None:
    """Refuses a document whose aliases, expanded, add more than `MAX_ALIAS_EXPANDED_NODES` nodes.

    Counts the tree as a consumer sees it (every alias re-counts its target's
    subtree), memoized per node so the count itself stays linear in the
    composed graph; a recursive alias is refused too.

    Raises:
      yaml.composer.ComposerError: too many expanded nodes, or a recursive alias.
    """
    sizes: dict[int, int] = {}
    distinct: set[int] = set()
    visiting: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in visiting:
            raise yaml.composer.ComposerError(None, None, "recursive YAML alias (refused)", node.start_mark)
        visiting.add(key)
        distinct.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            total += sum(size(child) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        visiting.discard(key)
        sizes[key] = total
        if total - len(distinct) > MAX_ALIAS_EXPANDED_NODES:
            raise yaml.composer.ComposerError(
                None, None, f"YAML aliases expand to more than {MAX_ALIAS_EXPANDED_NODES} extra nodes "
                "(refused: alias expansion bomb?)", node.start_mark)
        return total

    size(root)


def safe_load_bounded(text: str) -> Any:
    """`yaml.safe_load` with the manifest loader's bounds (duplicate keys, alias expansion).

    Raises:
      yaml.YAMLError: malformed YAML, a repeated key, or too much alias expansion.
    """
    return yaml.load(text, Loader=_UniqueKeyLoader)


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
        # Kubernetes' spelling of a path: list indexes in brackets (spec.worker.tolerations[0].key).
        loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in item["loc"]).lstrip(".")
        msg = item["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        if item["type"] == "extra_forbidden":
            msg = "unknown field"
        # A model validator's message already names its fields.
        parts.append(f"{prefix}{loc}: {msg}" if loc and not msg.startswith(("spec.", "metadata.", "backend ")) else msg)
    return "; ".join(parts)


# Free-form fields: kept exactly as written (the trainer reads them, and `1.0` there may mean a float).
_FREE_FORM_PATHS = {("spec", "controller", "trainer", "config")}


def integral_floats_as_ints(node: Any, path: tuple[str, ...] = ()) -> Any:
    """`node` with every float that is a whole number (`10.0`, `1e3`) turned into an int, outside free-form fields.

    The API server does the same to an integer field (kubectl sends YAML's `10.0` as JSON `10`; a JSON
    `10.0` passes `type: integer` as a whole number), so `steps: 10.0` is accepted by both, and `10.5`
    refused by both. A float field takes the int unchanged.
    """
    if path in _FREE_FORM_PATHS:
        return node
    if isinstance(node, float) and node.is_integer():
        return int(node)
    if isinstance(node, dict):
        return {k: integral_floats_as_ints(v, path + (str(k),)) for k, v in node.items()}
    if isinstance(node, list):
        return [integral_floats_as_ints(v, path) for v in node]
    return node


def parse_manifest(data: Any, source: str = "manifest") -> ElasticTrainingJob:
    """Validates an already-parsed manifest with the API server's type rules.

    Validation is pydantic's strict JSON mode on the manifest as JSON, which is
    what the API server sees after kubectl converts the YAML (YAML timestamps
    become strings): `steps: "10"` or `suspend: "yes"` is refused here exactly
    as the CRD's `type: integer` / `type: boolean` refuses it there, never
    coerced. A whole-number float (`steps: 10.0`) is taken as the integer, as
    the API server takes it (`integral_floats_as_ints`).

    Args:
      data: the parsed manifest.
      source: where it came from (a file name), the first word of an error; "" for none (the
        operator: its messages go on the job itself, and every field path already starts with spec.).

    Raises:
      ManifestError: not a mapping, or invalid; the message names the field.
    """
    where = f"{source}: " if source else ""
    if not isinstance(data, dict):
        raise ManifestError(f"{where}expected a YAML mapping with apiVersion, kind, metadata, spec")
    try:
        return ElasticTrainingJob.model_validate_json(json.dumps(integral_floats_as_ints(data), default=str),
                                                      strict=True)
    except ValidationError as e:
        raise ManifestError(f"{where}{format_validation_error(e)}") from None


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
