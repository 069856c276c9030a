"""Reading `ElasticTrainingJob` manifests with one-line errors that name the field."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from elastic_jax.api import nesting
from elastic_jax.api.job import (PROBLEM_SEPARATOR, ElasticTrainingJob, as_written_problem, located,
                                 partial_problems)


class ManifestError(ValueError):
    """A manifest is unreadable or invalid. `str()` is one line naming the field(s).

    Args:
      message: the one line (several problems joined with "; ").
      problems: each problem alone, every one prefixed with the source (`elastic-jax validate` prints
        one `error:` line each); default `[message]`.
      partial: the job as far as it validated (`job.partial_problems`: the fields that failed are absent),
        so later checks (`elastic-jax validate`'s TPU table, cluster rules, checkpoint folder) still run
        over the rest; None when the manifest could not be read or was no mapping.
      data: the manifest as validated (camelCase, nulls pruned), or None.
    """

    def __init__(self, message: str, problems: list[str] | None = None, *, partial: Any = None,
                 data: dict[str, Any] | None = None):
        super().__init__(message)
        self.problems = problems or [message]
        self.partial = partial
        self.data = data


# YAML aliases let a few hundred bytes stand for billions of nodes ("billion laughs"):
# PyYAML shares the aliased objects, so loading is cheap, but everything after it
# (JSON conversion, validation, the ConfigMap) expands them. A manifest needs few
# aliases, if any; these bounds refuse a bomb before anything expands it.
MAX_ALIASES = 100
# Nodes the aliases may add to the document once expanded (beyond its own nodes).
MAX_ALIAS_EXPANDED_NODES = 10_000


_BOOL_TAG, _INT_TAG, _FLOAT_TAG, _NULL_TAG, _STR_TAG, _MERGE_TAG = (
    f"tag:yaml.org,2002:{t}" for t in ("bool", "int", "float", "null", "str", "merge"))
# kubectl reads YAML with go-yaml v2 (sigs.k8s.io/yaml's YAMLToJSON), whose plain scalars differ from
# PyYAML's: `y`/`n` are booleans, `1e3` and `1.0e3` are floats (PyYAML: strings), `0o17` is an int,
# `1:30` is a string (PyYAML: sexagesimal 90), `=` is a string, and a float overflowing float64 is a
# string. The API server sees what kubectl sends, so manifests are read as go-yaml reads them
# (go.yaml.in/yaml/v2 resolve.go, mirrored here); dates stay strings, as kubectl sends them.
_GO_SCALARS = {
    **dict.fromkeys(("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON"), (_BOOL_TAG, True)),
    **dict.fromkeys(("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF"), (_BOOL_TAG, False)),
    **dict.fromkeys(("", "~", "null", "Null", "NULL"), (_NULL_TAG, None)),
    **dict.fromkeys((".nan", ".NaN", ".NAN"), (_FLOAT_TAG, float("nan"))),
    **dict.fromkeys((".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF"), (_FLOAT_TAG, float("inf"))),
    **dict.fromkeys(("-.inf", "-.Inf", "-.INF"), (_FLOAT_TAG, float("-inf"))),
    "<<": (_MERGE_TAG, "<<"),
}
_GO_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_GO_INT_DIGITS = {2: set("01"), 8: set("01234567"), 10: set("0123456789"), 16: set("0123456789abcdefABCDEF")}


def _go_int(plain: str) -> int | None:
    """Go's `strconv.ParseInt(plain, 0, 64)`, then `ParseUint(plain, 0, 64)`; None where both fail."""
    sign, body = (plain[0], plain[1:]) if plain[:1] in ("+", "-") else ("", plain)
    prefix = body[:2].lower()
    base, digits = {"0x": (16, body[2:]), "0o": (8, body[2:]), "0b": (2, body[2:])}.get(
        prefix, (8, body[1:]) if body[:1] == "0" and len(body) > 1 else (10, body))
    if not digits or not set(digits) <= _GO_INT_DIGITS[base]:
        return None
    value = int(digits, base) * (-1 if sign == "-" else 1)
    if -2**63 <= value < 2**63 or (not sign and value < 2**64):
        return value
    return None


def go_yaml_scalar(text: str) -> tuple[str, Any]:
    """The tag and value go-yaml v2 (kubectl's YAML reader) gives the plain (unquoted) scalar `text`.

    Returns:
      (tag, value): a bool, int, float, None, the merge key `<<`, or the string itself (`tag:yaml.org,2002:str`).
    """
    if text in _GO_SCALARS:
        return _GO_SCALARS[text]
    if text[:1] == ".":
        if _GO_FLOAT.fullmatch(text):
            return _FLOAT_TAG, float(text)
    elif text[:1] in "+-0123456789" and text:
        plain = text.replace("_", "")
        number = _go_int(plain)
        if number is not None:
            return _INT_TAG, number
        if _GO_FLOAT.fullmatch(plain) and math.isfinite(float(plain)):  # (ParseFloat fails on overflow)
            return _FLOAT_TAG, float(plain)
    return _STR_TAG, text


class _KubectlScalars:
    """A PyYAML loader mixin: plain scalars resolve as `go_yaml_scalar` says, so a manifest reads as kubectl
    reads it."""

    def resolve(self, kind, value, implicit):
        if kind is yaml.ScalarNode and implicit[0]:
            return go_yaml_scalar(value)[0]
        return super().resolve(kind, value, implicit)


class WrittenFloat(float):
    """A float read from a plain YAML scalar, remembering the scalar as written (`written`, e.g. `1e30`).

    YAML (kubectl's reader, `go_yaml_scalar`) reads `1e30`, and an integer beyond 2**64, as a float; an error
    about the value shows it as the user wrote it (`validation_problems`), not the float's digits
    (`1000000000000000019884624838656`, `1e+23` for `100000000000000000000000`). It is a float in every
    other way (its JSON is the float's).
    """

    written: str

    def __new__(cls, value: float, written: str) -> "WrittenFloat":
        number = super().__new__(cls, value)
        number.written = written
        return number


def _construct_go_scalar(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> Any:
    text = loader.construct_scalar(node)
    value = go_yaml_scalar(text)[1]
    return WrittenFloat(value, text) if type(value) is float and math.isfinite(value) else value


class KubectlSafeDumper(yaml.SafeDumper):
    """`yaml.SafeDumper` whose output reads back the same through kubectl, `load_manifest` and plain PyYAML:
    a string either reader would take for another type (`y`, `1e3`, `1:30`) is quoted."""

    def resolve(self, kind, value, implicit):
        tag = super().resolve(kind, value, implicit)
        if kind is yaml.ScalarNode and implicit[0] and tag == _STR_TAG:
            return go_yaml_scalar(value)[0]
        return tag


for _dumper in (KubectlSafeDumper, yaml.SafeDumper):  # (a manifest read here dumps like any float)
    _dumper.add_representer(WrittenFloat, yaml.representer.SafeRepresenter.represent_float)


def dump_yaml(data: Any) -> str:
    """`data` as YAML (keys in order) that kubectl and `load_manifest` read back unchanged."""
    return yaml.dump(data, Dumper=KubectlSafeDumper, sort_keys=False)


class NestedTooDeep(yaml.composer.ComposerError):
    """A YAML document nested past `nesting`'s bounds (`problem` says which field, in the model's words)."""


class _UniqueKeyLoader(_KubectlScalars, yaml.SafeLoader):
    """PyYAML's safe loader reading plain scalars as kubectl does (`go_yaml_scalar`), refusing a key repeated in one mapping (PyYAML keeps the last
    silently; kubectl refuses it, so `steps: 60` then `steps: 5` must not pass here), and
    refusing alias expansion beyond `MAX_ALIASES` / `MAX_ALIAS_EXPANDED_NODES`."""

    def __init__(self, stream):
        super().__init__(stream)
        self._aliases = 0
        # The keys (or list positions) from the document's root to the node being composed.
        self._path: list[Any] = []

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise yaml.composer.ComposerError(
                    None, None, f"more than {MAX_ALIASES} YAML aliases (refused: alias expansion bomb?)",
                    self.peek_event().start_mark)
        if parent is not None:
            self._path.append(index.value if isinstance(index, yaml.ScalarNode) else index)
        try:
            if self.check_event(yaml.SequenceStartEvent, yaml.MappingStartEvent):
                # PyYAML composes recursively (three frames a level): refuse past the bounds the manifest is
                # held to anyway (`nesting`), in its words, before Python's recursion limit ends it in a traceback.
                problem = _nesting_problem(self._path)
                if problem:
                    raise NestedTooDeep(None, None, problem, self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            if parent is not None:
                self._path.pop()

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


for _tag in (_BOOL_TAG, _INT_TAG, _FLOAT_TAG):
    _UniqueKeyLoader.add_constructor(_tag, _construct_go_scalar)


def _nesting_problem(path: list[Any]) -> str | None:
    """`nesting`'s refusal when a mapping or list starts at `path` (keys from the document's root): inside
    the trainer config past `nesting.MAX_CONFIG_DEPTH` levels, or anywhere past `nesting.MAX_MANIFEST_DEPTH`."""
    if path[:4] == _CONFIG_PATH and len(path) - 4 >= nesting.MAX_CONFIG_DEPTH:
        return nesting.too_deep_message(nesting.CONFIG_FIELD, nesting.MAX_CONFIG_DEPTH)
    if len(path) >= nesting.MAX_MANIFEST_DEPTH:
        return nesting.too_deep_message(str(path[0]), nesting.MAX_MANIFEST_DEPTH)
    return None


_CONFIG_PATH = ["spec", "controller", "trainer", "config"]


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


# What a field of each JSON type needs, for pydantic's type errors ("Input should be a valid integer" named
# neither the value nor what to write instead).
_TYPE_NEEDS = {"int_type": "an integer (a whole number, e.g. 10)", "float_type": "a number (e.g. 10 or 2.5)",
               "bool_type": "true or false", "string_type": "a string"}


def shown(value: Any) -> str:
    """`value` as a manifest spells it (`true`, `1.5`, `'10'`; a `WrittenFloat` as written), at most 60
    characters: the `(got ...)` of an error line."""
    text = (value.written if isinstance(value, WrittenFloat)
            else json.dumps(value) if isinstance(value, bool) or value is None else repr(value))
    return text if len(text) <= 60 else text[:57] + "..."


def _what(value: Any) -> str:
    """What kind of value `value` is, in a manifest's words."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        # (a free-form field, the trainer's config, keeps floats as read: `seqLen: 1e30` or 64.0)
        return "a float (YAML reads a number with a decimal point or an exponent, or an integer beyond 2**64, as one)"
    if isinstance(value, float):
        return "a fraction" if math.isfinite(value) else "a number"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "a mapping" if isinstance(value, dict) else "null"


_UNIT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*[a-zA-Z]+\s*$")  # 10s, 2.5 GiB, 30min

# pydantic's constraint errors, whose messages name the bound but not the value ("Input should be greater than
# or equal to 1"): the value is added, as `(got -2)`.
_CONSTRAINT_ERRORS = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal", "multiple_of",
                                "string_too_short", "string_too_long", "string_pattern_mismatch", "too_short",
                                "too_long", "literal_error", "enum"})


def _reads_as_scalar(text: str) -> bool:
    """Whether `text` without its quotes would be a number or a boolean in YAML (`'10'`, `'2.5'`, `'true'`)."""
    try:
        return not isinstance(yaml.safe_load(text), (str, type(None), list, dict))
    except yaml.YAMLError:
        return False


def type_problem(kind: str, value: Any) -> str | None:
    """The message of a pydantic type error `kind` (`int_type`, ...) over `value`: the value, what the field
    needs, what it got, and how to write it, e.g. `1.5: must be an integer (a whole number, e.g. 10), not a
    fraction`; None for another kind of error."""
    needs = _TYPE_NEEDS.get(kind)
    if needs is None:
        return None
    message = f"{shown(value)}: must be {needs}, not {_what(value)}"
    if isinstance(value, str) and kind != "string_type" and _UNIT.match(value):
        message += f" (no unit: write {_UNIT.match(value).group(1)})"  # `10s`: the field's name says the unit
    elif isinstance(value, str) and kind != "string_type" and _reads_as_scalar(value):
        message += " (quoted: write it without quotes)"
    elif kind == "string_type" and isinstance(value, bool):
        message += " (YAML reads an unquoted y, yes, on or true as a boolean: quote it)"
    elif kind == "string_type" and isinstance(value, (int, float)):
        message += " (quote it)"
    return message


def _as_written(written: Any, loc: tuple[Any, ...], value: Any) -> Any:
    """The value at `loc` (pydantic's error location) in `written` (the manifest as read, before whole-number
    floats became ints) when it is the number `value` as a `WrittenFloat`: so an error shows `1e30` as the user
    wrote it; else `value` (what pydantic got)."""
    node = written
    for key in loc:
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
            node = node[key]
        else:
            return value
    same = isinstance(value, (int, float)) and not isinstance(value, bool) and node == value
    return node if isinstance(node, WrittenFloat) and same else value


def validation_problems(error: ValidationError, prefix: str = "", written: Any = None) -> list[str]:
    """Every problem of a pydantic error, each `field.path: message` (camelCase paths), in its order.

    A model validator's several problems (one a line, `job.raise_all`) are one problem each. `written`: the
    data as read from YAML (`WrittenFloat`s in it), at the error's root: a number is shown as written there.
    """
    parts = []
    for item in error.errors():
        msg = item["msg"]
        if msg.startswith("Value error, "):
            msg = msg[len("Value error, "):]
        if item["type"] == "extra_forbidden":
            msg = "unknown field"
        value = _as_written(written, tuple(item["loc"]), item.get("input"))
        msg = type_problem(item["type"], value) or msg
        if item["type"] in _CONSTRAINT_ERRORS and isinstance(value, (int, float, str)):
            msg += f" (got {shown(value)})"
        for one in msg.split(PROBLEM_SEPARATOR):
            # Kubernetes' spelling of a path (spec.worker.tolerations[0].key); a model validator's message
            # already names its fields.
            parts.append(located((prefix.rstrip("."), *item["loc"]) if prefix and item["loc"] else item["loc"], one))
    return parts


# Free-form fields: kept exactly as written (the trainer reads them, and `1.0` there may mean a float).
_FREE_FORM_PATHS = {("spec", "controller", "trainer", "config")}


def _is_quantity(path: tuple[str, ...]) -> bool:
    """A value of `resources.requests` / `resources.limits`: int-or-string, where the API server refuses any
    JSON float (`2.0` too, from a client that sends JSON itself; kubectl sends YAML's `2.0` as `2`)."""
    return len(path) >= 3 and path[-3] == "resources" and path[-2] in ("requests", "limits")


def integral_floats_as_ints(node: Any, path: tuple[str, ...] = ()) -> Any:
    """`node` with every float that is a whole number (`10.0`, `1e3`) turned into an int, outside free-form fields.

    The API server does the same to an integer field (kubectl sends YAML's `10.0` or `1e3` as JSON `10`,
    `1000`; a JSON `10.0` passes `type: integer` as a whole number), so `steps: 10.0` is accepted by both,
    and `10.5` refused by both. A float field takes the int unchanged. A quantity (`cpu: 2.0`) stays a
    float, refused: the API server refuses a JSON float there, and a manifest must pass however it is sent.
    """
    if path in _FREE_FORM_PATHS:
        return node
    if isinstance(node, float) and node.is_integer() and not _is_quantity(path):
        return int(node)
    if isinstance(node, dict):
        return {k: integral_floats_as_ints(v, path + (str(k),)) for k, v in node.items()}
    if isinstance(node, list):
        return [integral_floats_as_ints(v, path) for v in node]
    return node


def prune_nulls(node: Any, path: tuple[str, ...] = ()) -> Any:
    """`node` without the null values of mapping keys, outside free-form fields.

    The API server drops such a null before validating (apiextensions' `PruneNonNullableNullsWithoutDefaults`,
    or replaces it by the field's default: the same value the model gives an absent field), so
    `trainer: null` or `image: null` is an absent field for both. A null list item stays (refused by both).
    """
    if path in _FREE_FORM_PATHS:
        return node
    if isinstance(node, dict):
        return {k: prune_nulls(v, path + (str(k),)) for k, v in node.items() if v is not None}
    if isinstance(node, list):
        return [prune_nulls(v, path) for v in node]
    return node


def _keep_written(parsed: Any, raw: Any) -> Any:
    """`parsed` (read back from JSON) with each float that `raw` (the same data as read from YAML) holds as a
    `WrittenFloat` at the same place, of the same value, replaced by it; everything else as in `parsed`."""
    if isinstance(parsed, float) and isinstance(raw, WrittenFloat) and raw == parsed:
        return raw
    if isinstance(parsed, dict) and isinstance(raw, dict):
        return {k: _keep_written(v, raw.get(k)) for k, v in parsed.items()}
    if isinstance(parsed, list) and isinstance(raw, list) and len(parsed) == len(raw):
        return [_keep_written(v, r) for v, r in zip(parsed, raw)]
    return parsed


def parse_manifest(data: Any, source: str = "manifest", *, as_written: bool = False) -> ElasticTrainingJob:
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
      as_written: `data` is a manifest as a user wrote it (`elastic-jax validate` / `run`), not one read
        back from the API server or the operator's ConfigMap (every default filled in): also apply the
        CRD's rules on what was written (`job.as_written_problems`).

    Raises:
      ManifestError: not a mapping, or invalid; the message names the field.
    """
    where = f"{source}: " if source else ""
    if not isinstance(data, dict):
        raise ManifestError(f"{where}expected a YAML mapping with apiVersion, kind, metadata, spec")
    # Before anything recursive (null pruning, json.dumps, pydantic's JSON parser) walks it.
    problem = nesting.manifest_problem(data)
    if problem:
        raise ManifestError(where + problem, data=None)
    written = prune_nulls(data)
    data = integral_floats_as_ints(written)
    problems: list[str] = []
    job = partial = None
    try:
        job = ElasticTrainingJob.model_validate_json(json.dumps(data, default=str), strict=True)
    except ValidationError as e:
        problems = validation_problems(e, written=written)
        # The rules of every section that failed did not run (pydantic runs a model's rules once all its
        # fields validated); the API server runs them beside the field errors.
        partial, beside = partial_problems(data)
        problems += [p for p in beside if p not in problems]
    if job is not None and job.spec.controller.trainer is not None:
        # The free-form config as read (its floats keep their text), not as it came back from JSON: the trainer's
        # own errors then show a number as written (`seqLen: 1e30`, not `1e+30`).
        raw = ((written.get("spec") or {}).get("controller") or {}).get("trainer") or {}
        job.spec.controller.trainer.config = _keep_written(job.spec.controller.trainer.config, raw.get("config"))
    problem = as_written_problem(data) if as_written else None
    if problem:
        # The CRD's rule on what was written covers the model's own rule of the same words (a trainer beside a
        # command): one line, not the same line twice (a new user's trial).
        problems = [p for p in problems if not problem.startswith(p)] + [problem]
    if problems:
        raise ManifestError(where + "; ".join(problems), [where + p for p in problems],
                            partial=partial or job, data=data) from None
    return job


MAX_MANIFEST_BYTES = 3 * 1024 * 1024
"""The largest manifest file read (bytes): the API server's default request body limit (kube-apiserver
`--max-request-bytes`' default, 3 MiB), so nothing larger could be applied to a cluster either. Read up to
this and no further: `/dev/zero` or a 2 GB file ended in a `MemoryError` traceback (a new user's trial)."""


def load_manifest(path: str | Path, *, as_written: bool = False) -> ElasticTrainingJob:
    """Reads and validates one `ElasticTrainingJob` YAML file (`as_written`: see `parse_manifest`).

    Raises:
      ManifestError: missing file, larger than `MAX_MANIFEST_BYTES`, not UTF-8, malformed YAML, more than one
        document, or invalid spec.
    """
    p = Path(path)
    try:
        with open(p, "rb") as f:
            raw = f.read(MAX_MANIFEST_BYTES + 1)
    except OSError as e:
        raise ManifestError(f"{path}: cannot read manifest: {e.strerror}") from None
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ManifestError(f"{path}: larger than {MAX_MANIFEST_BYTES // (1024 * 1024)} MiB, the most a manifest may "
                            "be (the API server's request limit): not read") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ManifestError(f"{path}: not a text file (expected UTF-8 YAML)") from None
    try:
        docs = [d for d in yaml.load_all(text, Loader=_UniqueKeyLoader) if d is not None]
    except NestedTooDeep as e:
        raise ManifestError(f"{path}: {e.problem} (line {e.problem_mark.line + 1})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ManifestError(f"{path}: malformed YAML{where}: {getattr(e, 'problem', e)}") from None
    if len(docs) != 1:
        raise ManifestError(f"{path}: expected exactly one YAML document, found {len(docs)}")
    return parse_manifest(docs[0], str(path), as_written=as_written)


def controller_manifest(job: ElasticTrainingJob) -> dict[str, Any]:
    """The manifest the operator hands the controller in its ConfigMap (camelCase; status and server fields
    dropped): what `load_manifest` reads back there, and what the ConfigMap's size limit counts."""
    return {
        "apiVersion": job.api_version,
        "kind": job.kind,
        "metadata": {"name": job.metadata.name, **({"namespace": job.metadata.namespace} if job.metadata.namespace else {})},
        "spec": job.spec.to_manifest(),
    }
