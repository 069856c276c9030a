"""Where a job may keep `gs://` data: the admin's allowed prefixes per namespace (pure).

A job's pods read and write `spec.checkpoint.uri` (and a `gs://`
`spec.compilationCache.uri`, whose executables the pods run) with their own
Google credentials. Two tenants whose pods share a Google service account (or
whose accounts may both write one bucket) are then separated by nothing but the
path each writes in its spec: a tenant could resume from, overwrite or delete
another's checkpoints, or plant executables in its compilation cache. The
admin's `checkpointPrefixes` (Helm value; operator flag `--checkpoint-prefixes`,
env `ELASTIC_JAX_CHECKPOINT_PREFIXES`) lists templates such as
`gs://ml-ckpt/{namespace}/` or `gs://{namespace}-ckpt/`; a job's `gs://`
locations must each lie under one of them, `{namespace}` being the job's
namespace. Empty (the default): no
restriction, and only IAM separates tenants (docs/security.md). A local path is
the pod's own volume and is not restricted.

Locations are compared by path segments, never as text: `gs://b/ns-a-evil/` is
not under `gs://b/ns-a/`. A `.`, `..` or empty segment, or a `%` (an escape a
client library might decode into one), is refused outright when prefixes are
set: no normalization here can promise to agree with every reader's.
"""

from __future__ import annotations

import dataclasses
import re

from elastic_jax.api.job import COMPILATION_CACHE_URI_FIELD, ElasticTrainingJob
from elastic_jax.api.checkpoints import URI_FIELD

NAMESPACE_PLACEHOLDER = "{namespace}"
# One template of the setting, as a regular expression both Python (`parse_templates`, fullmatch) and the chart's
# values.schema.json (Go RE2: no lookaround, so "not `.` or `..`" is spelled out) apply, so `helm install` refuses
# what the operator would refuse at start: `gs://`, a bucket of lowercase letters, digits, `-`, `_`, `.` (and the
# placeholder's braces) starting and ending with a letter, digit or brace, then path segments that are not empty,
# `.` or `..` and hold no `%`, whitespace or `,` (the flag's separator). `gs:/bucket`, `gcs://b`, `gs://b//x`,
# `gs://B/x` fail it. tests/unit/test_helm_chart.py checks the schema carries this very pattern.
_SEGMENT = r"([^/%\s,.][^/%\s,]*|\.[^/%\s,.][^/%\s,]*|\.\.[^/%\s,]+)"
TEMPLATE_PATTERN = r"^gs://[a-z0-9{]([a-z0-9_.{}-]*[a-z0-9}])?(/" + _SEGMENT + r")*/?$"
TEMPLATE_RULE = ("gs://bucket[/prefix]: a bucket of lowercase letters, digits, '-', '_', '.', then path segments "
                 "that are not empty, '.' or '..' and hold no '%', whitespace or ',' (e.g. "
                 "gs://ml-ckpt/{namespace}/)")
_SETTING = "operator setting checkpointPrefixes (Helm value checkpointPrefixes, operator flag --checkpoint-prefixes)"


class CheckpointPrefixRefused(ValueError):
    """A job's `gs://` location lies outside every prefix the admin allows for its namespace; `str()` names the
    field, the prefixes and the setting."""


def segments(uri: str) -> tuple[str, ...] | None:
    """`gs://bucket/a/b/` as ("bucket", "a", "b") (one trailing `/` ignored); None when it is not a `gs://` uri
    of plain segments (no empty, `.` or `..` segment, no `%`)."""
    if not uri.startswith("gs://") or "%" in uri:
        return None
    parts = uri[len("gs://"):].removesuffix("/").split("/")
    if any(p in ("", ".", "..") for p in parts):
        return None
    return tuple(parts)


def parse_templates(text: str | None) -> tuple[str, ...]:
    """The flag's comma- or whitespace-separated templates, each checked.

    Raises:
      ValueError: a template that does not match `TEMPLATE_PATTERN` (the chart's schema applies the same), or
        is not `gs://bucket[/path]` of plain segments (`segments`), naming it and `TEMPLATE_RULE`.
    """
    templates = tuple(dict.fromkeys((text or "").replace(",", " ").split()))
    for t in templates:
        if not re.fullmatch(TEMPLATE_PATTERN[1:-1], t) or segments(t.replace(NAMESPACE_PLACEHOLDER, "ns")) is None:
            raise ValueError(f"{t!r} is not {TEMPLATE_RULE}")
    return templates


@dataclasses.dataclass(frozen=True)
class CheckpointPrefixes:
    """The admin's allowed `gs://` prefixes.

    Attributes:
      templates: `gs://bucket[/prefix]` strings, `{namespace}` replaced by the job's namespace; empty: any location.
    """

    templates: tuple[str, ...] = ()

    def allowed(self, namespace: str) -> tuple[str, ...]:
        """The prefixes a job of `namespace` may use (the templates filled in)."""
        return tuple(t.replace(NAMESPACE_PLACEHOLDER, namespace) for t in self.templates)

    def check(self, job: ElasticTrainingJob, namespace: str) -> None:
        """Refuses a `gs://` checkpoint or compilation-cache location of `job` outside every allowed prefix.

        Args:
          job: the spec to check.
          namespace: the job object's namespace, from the API server.

        Raises:
          CheckpointPrefixRefused: naming the field, the location, the allowed prefixes and the setting.
        """
        if not self.templates:
            return
        cache = job.spec.compilation_cache
        for field, uri in ((URI_FIELD, job.spec.checkpoint.uri),
                           (COMPILATION_CACHE_URI_FIELD, cache.uri if cache is not None else None)):
            if uri is None or not uri.startswith("gs://"):
                continue  # a local path is the pod's own volume
            prefixes = self.allowed(namespace)
            parts = segments(uri)
            if parts is None:
                raise CheckpointPrefixRefused(
                    f"{field} {uri!r}: an empty, '.' or '..' path segment or a '%' is not accepted where the "
                    f"admin restricts gs:// prefixes ({_SETTING}): write the plain path under one of "
                    f"{', '.join(prefixes)}")
            if not any(parts[:len(p)] == p for p in map(segments, prefixes) if p is not None):
                raise CheckpointPrefixRefused(
                    f"{field} {uri!r} is outside every gs:// prefix allowed in namespace {namespace}: "
                    f"{', '.join(prefixes)} ({_SETTING})")


def from_flags(text: str | None) -> CheckpointPrefixes:
    """The prefixes of the flag's text (blank: no restriction), for `admin_policies.AdminPolicies`.

    Raises:
      ValueError: a bad template (`parse_templates`).
    """
    return CheckpointPrefixes(parse_templates(text))
