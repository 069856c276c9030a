"""Rules a job must meet to run on a cluster, once for the CRD (CEL) and for Python (`problems`).

A manifest that `elastic-jax run` accepts may still not run on a cluster: a
relative `spec.checkpoint.uri` (the controller pod has no working directory of
the user's), a folder the operator mounts itself or that is part of the image,
Pathways without `gs://`. The API server refuses these at `kubectl apply` with
the CEL rules below (`CEL_RULES`, put into the CRD by `elastic_jax.api.crd`),
`elastic-jax validate --cluster` and the operator refuse the same manifests
with the same messages (`problems`): each rule is one regular expression or
comparison written once and evaluated by both (RE2 for CEL's `matches`,
Python's `re`: the patterns use only the syntax they share).

`IMMUTABLE_EXCEPT` names the spec fields that may change on an existing job;
`immutability_rules` makes every other field a CEL transition rule
(`self == oldSelf`) naming it.

`UnsupportedBackend` is the error of a job the operator cannot run (its
renderers, `elastic_jax.api.backend_rules`, `elastic_jax.api.tpu_shapes`);
`local_checkpoint_loss` is what a local checkpoint folder costs a suspended job.
"""

from __future__ import annotations

import re
from typing import Any

from elastic_jax import contract
from elastic_jax.api import checkpoints
from elastic_jax.api.job import ElasticTrainingJob


class UnsupportedBackend(ValueError):
    """The operator cannot render this job on a cluster (its backend, or a rule of it); `str()` names the field."""

# Folders the operator mounts in the controller pod (its manifest, its token, the writable scratch).
MANIFEST_DIR = contract.MANIFEST_DIR
TOKEN_DIR = contract.TOKEN_DIR
# The one writable directory of a child pod (an emptyDir; the root file system is
# read-only): HOME, TMPDIR and XDG_CACHE_HOME point here. A subfolder of /tmp, not
# /tmp itself, so a runtime without per-pod root file systems (the local e2e node
# agent) hides nothing of the host's /tmp.
SCRATCH_DIR = contract.SCRATCH_DIR
# ... and the images' working directory, where the program is (an emptyDir there would hide it: a new-user trial).
RESERVED_DIRS = (MANIFEST_DIR, TOKEN_DIR, SCRATCH_DIR, contract.IMAGE_WORKDIR)
# Top-level folders of the controller image (Debian, the venv in /opt) that an emptyDir must not cover.
IMAGE_SYSTEM_DIRS = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32", "/opt",
                     "/proc", "/run", "/sbin", "/sys", "/usr", "/var")

URI = "spec.checkpoint.uri"
# A normalized absolute folder: "/" then segments, no empty, "." or ".." segment (so no
# normalization is needed to compare it with the folders above), an optional trailing "/".
ABSOLUTE_FOLDER = r"^(/[^/]+)+/?$"
DOT_SEGMENT = r"(^|/)\.\.?(/|$)"


def _under_or_equal(folder: str) -> str:
    """Regex of a path equal to `folder` or inside it (trailing "/" allowed)."""
    return re.escape(folder).replace("\\-", "-") + "(/.*)?$"


def _ancestors(folder: str) -> list[str]:
    """The proper ancestors of `folder` other than "/" (e.g. /tmp for /tmp/elastic-jax-scratch)."""
    parts = folder.strip("/").split("/")
    return ["/" + "/".join(parts[:i]) for i in range(1, len(parts))]


def _overlap_pattern(folder: str) -> str:
    """Regex of a path that overlaps `folder`: equal, inside it, or one of its ancestors."""
    options = [_under_or_equal(folder)] + [re.escape(a).replace("\\-", "-") + "/?$" for a in _ancestors(folder)]
    return "^(" + "|".join(f"({o.removesuffix('$')})" for o in options) + ")$"


SYSTEM_PATTERN = "^(" + "|".join(re.escape(d).replace("\\-", "-") for d in IMAGE_SYSTEM_DIRS) + ")(/.*)?$"

# (CEL rule on spec, message, Python check of spec dict returning True when fine). The CEL
# rule and the Python check read the same pattern constants. A local path a rule of the uri's own table
# refuses (`checkpoints.URI_RULES`: `/`, `~`, `..`, white space) is that rule's to report, in its own
# words: the local rules below hold for it, so `validate --cluster` and the API server say it once.
FORM_REFUSED = checkpoints.local_form_refused_pattern()
_REMOTE = f"self.checkpoint.uri.contains('://') || self.checkpoint.uri.matches({{form}})"


def _cel_str(s: str) -> str:
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


_REMOTE = _REMOTE.format(form=_cel_str(FORM_REFUSED))


def _local(spec: dict[str, Any]) -> bool:
    """A local path the uri's own table does not already refuse: the cluster's local rules read it."""
    uri = str((spec.get("checkpoint") or {}).get("uri", ""))
    return "://" not in uri and not checkpoints.local_form_refused(uri)


def _uri(spec: dict[str, Any]) -> str:
    return str((spec.get("checkpoint") or {}).get("uri", ""))


RULES: list[tuple[str, str, Any]] = [
    (f"{_REMOTE} || (self.checkpoint.uri.matches({_cel_str(ABSOLUTE_FOLDER)}) && "
     f"!self.checkpoint.uri.matches({_cel_str(DOT_SEGMENT)}))",
     f"{URI}: a local path must be an absolute folder other than / without '.', '..' or empty segments "
     "(the controller pod mounts an emptyDir there), or gs://bucket/prefix",
     lambda s: not _local(s) or (bool(re.search(ABSOLUTE_FOLDER, _uri(s))) and not re.search(DOT_SEGMENT, _uri(s)))),
    *[(f"{_REMOTE} || !self.checkpoint.uri.matches({_cel_str(_overlap_pattern(d))})",
       f"{URI}: a local path must not overlap {d}, which "
       + ("is the image's working directory (its program)" if d == contract.IMAGE_WORKDIR
          else "the operator mounts in the controller pod") + "; "
       "choose another folder such as /checkpoints",
       (lambda d: lambda s: not _local(s) or not re.search(_overlap_pattern(d), _uri(s)))(d))
      for d in RESERVED_DIRS],
    (f"{_REMOTE} || !self.checkpoint.uri.matches({_cel_str(SYSTEM_PATTERN)})",
     f"{URI}: a local path must not be inside {', '.join(IMAGE_SYSTEM_DIRS)}: part of the controller image "
     "(an emptyDir there would hide it); choose a folder such as /checkpoints or /data/...",
     lambda s: not _local(s) or not re.search(SYSTEM_PATTERN, _uri(s))),
    ("self.backend != 'pathways' || self.checkpoint.uri.startsWith('gs://')",
     f"{URI} must be gs://bucket/prefix for backend pathways (pods on different nodes share it, and Pathways "
     "keeps its GCS scratch under it)",
     lambda s: s.get("backend", "cpu") != "pathways" or _uri(s).startswith("gs://")),
]

# Each at spec.checkpoint.uri (`fieldPath`): without it the API server reports a rule on spec at `spec`.
CEL_RULES = [{"rule": rule, "message": message, "fieldPath": ".checkpoint.uri"} for rule, message, _ in RULES]


def problems(spec: dict[str, Any]) -> list[str]:
    """The messages of the cluster rules `spec` (camelCase dict, as in the manifest) breaks; [] when none.

    The same rules the CRD's CEL applies at `kubectl apply` (`CEL_RULES`).
    """
    return [message for _, message, ok in RULES if not ok(spec)]


def check_job(job: ElasticTrainingJob) -> None:
    """The job meets the uri's own rules (`checkpoints.uri_problems`) and the cluster's
    (`problems`: both the CRD's CEL rules, so only a job
    created under an older CRD gets here with a bad one), e.g. a local `spec.checkpoint.uri` is an absolute
    folder the controller pod can mount an emptyDir at.

    Raises:
      UnsupportedBackend: the first rule broken (its message names the field).
    """
    # (the uri's own table first: the cluster's local rules leave what it refuses to it, as the CRD does)
    found = checkpoints.uri_problems(job.spec.checkpoint.uri) + problems(job.spec.to_manifest())
    if found:
        raise UnsupportedBackend(found[0])


def checkpoints_go_with_pod(job: ElasticTrainingJob) -> bool:
    """Whether `job`'s checkpoints live in its controller pod: a local `spec.checkpoint.uri` is an emptyDir of
    the pod (the operator's `backends.cpu.checkpoint_volume`) and goes with it, on a suspend as on a loss;
    shared storage (`gs://`) outlives it."""
    return "://" not in job.spec.checkpoint.uri


def local_checkpoint_loss(job: ElasticTrainingJob) -> str | None:
    """Why a new controller pod of `job` cannot see the last one's checkpoints, or None when it can
    (`checkpoints_go_with_pod`): the words of the operator's SuspendDropsCheckpoints / ResumedFromStepZero
    Events and of `elastic-jax validate`'s suspend warning."""
    if not checkpoints_go_with_pod(job):
        return None
    return (f"spec.checkpoint.uri {job.spec.checkpoint.uri} is local to the controller pod (an emptyDir), so its "
            "checkpoints go with the pod (use gs:// to keep them across a suspend)")


# -- immutability ----------------------------------------------------------------------

# Spec fields the operator applies to an existing job; every other field is fixed at creation
# (the running controller and the children were made from it).
IMMUTABLE_EXCEPT = ("suspend", "ttlSecondsAfterFinished")


def _transition_rule(field: str, present_always: bool) -> str:
    if present_always:
        return f"self.{field} == oldSelf.{field}"
    return (f"has(self.{field}) == has(oldSelf.{field}) && "
            f"(!has(self.{field}) || self.{field} == oldSelf.{field})")


def add_immutability_rules(node: dict[str, Any], path: str = "spec", skip: tuple[str, ...] = IMMUTABLE_EXCEPT) -> None:
    """Adds CEL transition rules to a structural schema `node` (in place): each field under it is immutable.

    Leaves (and free-form maps and lists) get `self.f == oldSelf.f` on their parent
    object with a message naming `path.f`; a field that may be absent compares
    presence too, so adding or removing it is refused like changing it. Nested
    objects get their own rules (evaluated when the object exists before and
    after) plus a presence rule on the parent when they are optional.
    """
    required = set(node.get("required") or [])
    rules = []
    for field, sub in (node.get("properties") or {}).items():
        if field in skip:
            continue
        always = field in required or "default" in sub
        if sub.get("type") == "object" and sub.get("properties"):
            add_immutability_rules(sub, f"{path}.{field}", ())
            if not always:
                rules.append({"rule": f"has(self.{field}) == has(oldSelf.{field})",
                              "message": f"{path}.{field} is immutable: it cannot be added or removed on an "
                                         "existing job (delete and re-create the job)",
                              "fieldPath": f".{field}"})
            continue
        rules.append({"rule": _transition_rule(field, always),
                      "message": f"{path}.{field} is immutable: the running job was created with it "
                                 f"(only {', '.join('spec.' + f for f in IMMUTABLE_EXCEPT)} can change; "
                                 "delete and re-create the job to change it)",
                      "fieldPath": f".{field}"})
    if rules:
        node["x-kubernetes-validations"] = list(node.get("x-kubernetes-validations") or []) + rules
