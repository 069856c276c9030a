"""How deep a manifest nests, measured without recursion, and the bounds the product holds it to.

A free-form field (`spec.controller.trainer.config`) takes any JSON. The API server accepts nesting up to
10000 levels (Go's `encoding/json` scanner, `maxNestingDepth`, which `sigs.k8s.io/json` keeps), far past
what Python's recursive readers and writers (`json.dumps`, PyYAML's composer, pydantic's JSON parser,
`copy.deepcopy`) take at the default recursion limit of 1000 frames. A trainer config needs a handful of
levels; anything deeper is refused by the model, `elastic-jax validate` and the operator, in the same words,
before any recursive code sees it.
"""

from __future__ import annotations

from typing import Any

# Levels a trainer config may nest (a mapping or list inside another counts one more): far more than any
# real config (a few levels), far less than what Python's recursive readers survive (~300 for PyYAML).
MAX_CONFIG_DEPTH = 64
# Levels a whole manifest may nest: its own schema needs about ten, plus a config's MAX_CONFIG_DEPTH.
MAX_MANIFEST_DEPTH = 100
# The API server's own bound on a JSON body's nesting (Go encoding/json `maxNestingDepth`, kept by
# sigs.k8s.io/json, which the API server decodes request bodies with): no object it stores nests deeper.
API_SERVER_MAX_DEPTH = 10_000


def too_deep(value: Any, limit: int) -> bool:
    """True when `value` nests more than `limit` levels of mappings and lists (a scalar: 0, `{}` or `[]`: 1,
    `{"a": [1]}`: 2). Iterative, so safe on any depth Python can hold; stops at the first level past it."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        node, level = stack.pop()
        if isinstance(node, dict):
            children = node.values()
        elif isinstance(node, (list, tuple)):
            children = node
        else:
            continue
        if level + 1 > limit:
            return True
        stack.extend((child, level + 1) for child in children)
    return False


CONFIG_FIELD = "spec.controller.trainer.config"


def too_deep_message(field: str, limit: int) -> str:
    """The one refusal, in one set of words: `<field> nests deeper than <limit> levels`."""
    return f"{field} nests deeper than {limit} levels"


def config_problem(config: Any, field: str = CONFIG_FIELD) -> str | None:
    """The one-line refusal of a trainer config nested past `MAX_CONFIG_DEPTH`, or None.

    Args:
      config: the config's value (any JSON value).
      field: its path, as the message names it.
    """
    if too_deep(config, MAX_CONFIG_DEPTH):
        return too_deep_message(field, MAX_CONFIG_DEPTH)
    return None


def manifest_problem(manifest: Any) -> str | None:
    """The one-line refusal of a manifest nested too deep, or None: the config's own words
    (`config_problem`) when that is where it nests, else the top-level field past `MAX_MANIFEST_DEPTH`.

    Args:
      manifest: a parsed manifest (a mapping).
    """
    spec = manifest.get("spec") if isinstance(manifest, dict) else None
    controller = spec.get("controller") if isinstance(spec, dict) else None
    trainer = controller.get("trainer") if isinstance(controller, dict) else None
    if isinstance(trainer, dict) and "config" in trainer:
        problem = config_problem(trainer["config"])
        if problem:
            return problem
    for key, value in manifest.items():
        if too_deep(value, MAX_MANIFEST_DEPTH - 1):
            return too_deep_message(str(key), MAX_MANIFEST_DEPTH)
    return None
