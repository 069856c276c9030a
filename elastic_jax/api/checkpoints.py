"""What a usable `spec.checkpoint.uri` is, and whether a job may resume from what it holds.

One set of checks, shared by everything that looks at a checkpoint location:
the manifest model (`uri_problem`: the URI's form), `elastic-jax run` and
`elastic-jax validate --trainer` before any process starts (`preflight`), and
the controller (`check_location`, `writer_problem`, `beyond_steps_problem`), so the
CLI refuses exactly what the controller would refuse, only earlier.

This module needs no JAX or Orbax: it reads Orbax's on-disk layout of a local
checkpoint directory (a committed step is a directory named by its number; its
`_CHECKPOINT_METADATA` JSON holds the writer identity under `custom_metadata`)
with the standard library. `gs://` locations are probed with
google-cloud-storage (the controller extra), imported only when needed.
"""

from __future__ import annotations

import json
import os
import re
import stat
import uuid
from pathlib import Path
from typing import Any, Callable, Literal, NamedTuple

from elastic_jax.api import identity
from elastic_jax.api.identity import JobIdentity

URI_FIELD = "spec.checkpoint.uri"
# The file Orbax's CheckpointManager writes into every step directory it saves.
STEP_METADATA_FILE = "_CHECKPOINT_METADATA"
# The file Orbax writes last into a step it commits (`orbax.checkpoint._src.path.atomicity_types.COMMIT_SUCCESS_FILE`;
# tests/unit/test_checkpoints.py checks that they agree): on GCS the commit itself, on local disk written just
# before the rename that commits the step.
COMMIT_SUCCESS_FILE = "commit_success.txt"
# The items the Checkpointer (`elastic_jax.controller.checkpointing`, also behind `Runtime.save`) saves in every
# step, each Orbax's folder `<step>/<item>`: the train state and the data loader's record.
STATE_ITEM = "state"
DATA_ITEM = "data"
STEP_ITEMS = (STATE_ITEM, DATA_ITEM)
# The reachability probe must answer in seconds: a wrong bucket name is a bad
# spec, reported at start-up, not something to retry for minutes.
DEFAULT_PROBE_TIMEOUT_S = 10.0


class CheckpointUriError(ValueError):
    """The checkpoint location cannot be used.

    The message is one line and names the field, e.g.
    `spec.checkpoint.uri: 'gs://no-such-bucket/ckpt': bucket 'no-such-bucket' does not exist`.
    """


class CheckpointMismatchError(ValueError):
    """The checkpoints at `spec.checkpoint.uri` are not this job's: a step beyond
    `spec.training.steps`, or a state that does not fit the trainer's. The
    message is one line naming the field and the step."""


class CheckpointForeignError(CheckpointMismatchError):
    """The checkpoint to resume from was written by another job (or by an unknown one) and
    `spec.checkpoint.resumeFrom` is `SameJob`. The message is one line naming the field,
    the step and the writer."""


class CheckpointUncommittedError(CheckpointUriError):
    """The checkpoint location holds step directories that were never committed (no `commit_success.txt`: a copy
    that left Orbax's commit markers out, or another job's save cut short). They are neither a step to resume
    from nor space to save over, so the job is refused (bad input: exit 2) until they are committed, moved or
    deleted. The message is one line naming `spec.checkpoint.uri` and the steps."""


class CheckpointDataChangeError(CheckpointMismatchError):
    """The step to resume from was trained with another `spec.training.globalBatchSize` or `spec.training.seed`
    (what shapes the data order and what a step means to the optimizer) and `spec.checkpoint.allowDataChange`
    is not set. The message is one line naming each changed field with both values."""


class CheckpointUnreadableError(CheckpointMismatchError):
    """No committed step at `spec.checkpoint.uri` can be read back (truncated or missing data files, unreadable
    metadata, NaN/inf in the state), while none of them was refused as not fitting the trainer's state. A
    `CheckpointMismatchError`, so it ends the job like one (controller exit FAILED: unusable checkpoints). The
    message is one line naming the field, each step tried and why it could not be restored."""


# An object's repr inside an error message (`<bound method ... of TensorStore({...})>`, `<object at 0x..>`):
# dropped from reasons shown to users; nested ones are removed from the inside out.
_REPR = re.compile(r"<[^<>]*>")


def short_reason(error: BaseException, limit: int = 160) -> str:
    """Why `error` happened, for a user: `Type: first line of the message`, without object reprs, at most
    `limit` characters (longer ones end in "...").

    TensorStore's read errors embed reprs of bound methods and whole specs in their text; they say nothing a
    user can act on, and made a fallback reason hundreds of characters of junk.
    """
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    text = lines[0] if lines else ""
    for _ in range(5):
        stripped = _REPR.sub("", text)
        if stripped == text:
            break
        text = stripped
    text = re.sub(r"<[^<>]*$", "", text)  # a repr the message itself cut short ("<bound method ...")
    text = re.sub(r"\s*See full TensorStore details:?\s*$", "", text)  # (pointed at the repr just removed)
    text = " ".join(re.sub(r"\(\s*\)|\[\s*\]", "", text).split()).rstrip(" :;,")
    line = f"{type(error).__name__}: {text}" if text else type(error).__name__
    return line if len(line) <= limit else line[: limit - 3].rstrip() + "..."


def _one_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return " ".join(text.split())


def uri_error(uri: str, reason: str) -> CheckpointUriError:
    """A `CheckpointUriError` reading `spec.checkpoint.uri: '<uri>': <reason>`."""
    return CheckpointUriError(f"{URI_FIELD}: {uri!r}: {reason}")


class UriRule(NamedTuple):
    """One rule of a `spec.checkpoint.uri`'s form, read by Python (`uri_problems`) and by the CRD's CEL
    (`cel_rules`): for the uris of `scope` (`URI_SCOPES`), the uri must match `pattern` (`required`) or
    must not (not `required`). The patterns use only the syntax RE2 (CEL's `matches`) and Python's `re`
    share, and no repetition in them can match one text two ways, so Python's `re` does not backtrack
    exponentially on a 4096-character uri."""

    scope: str
    pattern: str
    required: bool
    message: str


_BUCKET = r"^gs://[^/]"  # a gs:// uri with a bucket name (an empty one is the scheme check's)
_DOTTED_BUCKET = r"^gs://[^/]*\."
# scope -> (Python test: the rule applies to this uri, CEL over `self.uri`: it does not; None: every uri)
URI_SCOPES: dict[str, tuple[Callable[[str], bool], str | None]] = {
    "any": (lambda uri: True, None),
    "local": (lambda uri: "://" not in uri, "self.uri.contains('://')"),
    "bucket": (lambda uri: bool(re.search(_BUCKET, uri)), f"!self.uri.matches('{_BUCKET}')"),
    "dotted bucket": (lambda uri: bool(re.search(_DOTTED_BUCKET, uri)),
                      "!self.uri.matches('" + _DOTTED_BUCKET.replace("\\", "\\\\") + "')"),
}


def _rows(scope: str, *rows: tuple[str, bool, str]) -> tuple[UriRule, ...]:
    """`UriRule`s of one `scope`, each from `(pattern, required, message)`."""
    return tuple(UriRule(scope, pattern, required, message) for pattern, required, message in rows)


def _bucket(name: str) -> str:
    """The pattern of a gs:// uri whose bucket name is all of `name` (a pattern, up to the first '/')."""
    return rf"^gs://{name}(/|$)"


_WHITE = r"[ \t\n\r\f\v]"
# What names no folder of a job's own, or no bucket GCS can hold (Google's "Bucket naming guidelines").
URI_RULES: tuple[UriRule, ...] = (
    *_rows("any",
           (rf"^{_WHITE}|{_WHITE}$", False,
            "leading or trailing white space (a quoted YAML string keeps it): remove it"),
           # (a tab or newline at either end is the white-space rule's: this one says a fault once too)
           (r"[\x00-\x08\x0e-\x1f\x7f]|[^\t-\r][\t-\r]+[^\t-\r]", False,
            "a control character (a newline, a tab, ...): remove it"),
           (r"(^|/)\.\.(/|$)", False,
            "a '..' segment (the folder it names depends on what the path passes through): write the folder itself")),
    *_rows("local",
           (r"^(/\.?)+$", False, "the file system's root: name a folder of the job's own, e.g. /checkpoints/JOB"),
           (r"^~(/\.?)*$", False,
            "the home folder itself: name a folder of the job's own in it, e.g. ~/checkpoints/JOB"),
           (r"^~[^/]", False,
            "'~user' (another user's home folder) is not supported: write ~/folder or an absolute path")),
    *_rows("bucket",
           (_bucket(r"[a-z0-9._-]+"), True,
            "a GCS bucket name holds only lowercase letters, digits, '-', '_' and '.'"),
           # (refuses the other characters a name may hold at its ends; any other is the rule above's, once)
           (r"^gs://([-_.]|[^/]*[-_.](/|$))", False, "a GCS bucket name starts and ends with a letter or a digit"),
           (_bucket(r"([^/.]{3,63}|[^/]*\.[^/]*)"), True,
            "a GCS bucket name is 3-63 characters long (up to 222 when it holds dots)")),
    *_rows("dotted bucket",
           (_bucket(r"[^/]{3,222}"), True, "a GCS bucket name with dots is 3-222 characters long"),
           # (a dot at an end is the end rule's)
           (_bucket(r"\.?[^/.]{1,63}(\.[^/.]{1,63})*\.?"), True,
            "each dot-separated part of a GCS bucket name is 1-63 characters long")),
    *_rows("bucket",
           (_bucket(r"[0-9]{1,3}(\.[0-9]{1,3}){3}"), False, "a GCS bucket name must not be an IP address"),
           (r"^gs://goog", False, "a GCS bucket name must not begin with 'goog'"),
           (r"^gs://[^/]*g[o0][o0]gle", False,
            "a GCS bucket name must not contain 'google' or a close misspelling such as 'g00gle'"),
           # (each segment is `[^/]+`, so the first '//' after the bucket ends the match one way only)
           (r"^gs://[^/]+(/[^/]+)*//", False,
            "an empty path segment ('//' after the bucket name): write one '/' between folders")),
)
# The rules that read a gs:// uri only: the ones `spec.compilationCache.uri` (gs:// only) takes as well.
GCS_SCOPES = ("any", "bucket", "dotted bucket")
# The rules that read a local path.
LOCAL_SCOPES = ("any", "local")


def cel_string(text: str) -> str:
    """`text` as a CEL single-quoted string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def cel_rules(field: str = URI_FIELD, scopes: tuple[str, ...] | None = None, optional: bool = False,
              unless: str | None = None) -> list[dict[str, str]]:
    """`URI_RULES` as CEL rules on the object holding the uri (the CRD's `x-kubernetes-validations`), each
    naming `field` (`fieldPath` `.uri`) with the words `uri_problems` uses.

    Args:
      field: the uri's path in messages, e.g. `spec.checkpoint.uri`.
      scopes: only the rules of these scopes (None: all).
      optional: the uri may be absent (each rule holds when it is).
      unless: a CEL condition under which every rule holds (another rule's refusal says it all).
    """
    rules = []
    for rule in URI_RULES:
        if scopes is not None and rule.scope not in scopes:
            continue
        test = f"self.uri.matches({cel_string(rule.pattern)})"
        test = test if rule.required else f"!{test}"
        exempt = URI_SCOPES[rule.scope][1]
        if exempt is not None:
            test = f"{exempt} || {test}"
        if unless is not None:
            test = f"{unless} || {test}"
        if optional:
            test = f"!has(self.uri) || {test}"
        rules.append({"rule": test, "message": f"{field}: {rule.message}", "fieldPath": ".uri"})
    return rules


def form_problems(uri: str, field: str = URI_FIELD, scopes: tuple[str, ...] | None = None) -> list[str]:
    """The `URI_RULES` (of `scopes`; None: all) that `uri` breaks, each `<field>: '<uri>': <message>`."""
    return [f"{field}: {uri!r}: {rule.message}" for rule in URI_RULES
            if (scopes is None or rule.scope in scopes)
            and URI_SCOPES[rule.scope][0](uri) and bool(re.search(rule.pattern, uri)) != rule.required]


def local_form_refused(uri: str) -> bool:
    """True when a rule of `URI_RULES` that reads local paths (scopes `any` and `local`) refuses `uri`: its
    own line says what is wrong, so a broader rule (`cluster`'s absolute-folder rule) need not say it again."""
    return bool(form_problems(uri, scopes=LOCAL_SCOPES))


def local_form_refused_pattern() -> str:
    """One pattern that matches a local path exactly when `local_form_refused` is True for it (the patterns
    of those rules, all refusals, joined): for CEL, which has no `local_form_refused`."""
    rules = [r for r in URI_RULES if r.scope in LOCAL_SCOPES]
    assert not any(r.required for r in rules), "a required local rule cannot be joined into one refusal pattern"
    return "|".join(f"({r.pattern})" for r in rules)


def uri_problems(uri: str) -> list[str]:
    """Why `uri` is not a checkpoint location elastic-jax supports (its form only; nothing is read); [] if none.

    Supported: a local path (absolute, relative to the working directory, or
    `~/...`) naming a folder of the job's own, or `gs://bucket[/prefix]` with a
    bucket name GCS accepts. Any other scheme (`s3://`, `file://`, `http://`) is
    refused: `file://` too, since a local path says the same and every part of
    elastic-jax (locks, `--fresh`, the operator) treats a URI with a scheme as
    remote. Refused too (`URI_RULES`, which the CRD's CEL applies as well): white
    space at either end, a control character, a `..` segment, the root `/`, the
    home folder `~` itself, `~user`, a bucket name outside Google's bucket
    naming guidelines (e.g. `gs://b`: too short), and an empty path segment
    after the bucket (`gs://bucket//ck`).

    Returns:
      One line per problem, each naming `spec.checkpoint.uri` and the uri.
    """
    if not uri:
        return [f"{URI_FIELD}: must not be empty"]
    found = []
    if uri.startswith("gs://") and not uri.removeprefix("gs://").partition("/")[0]:
        found.append(f"{URI_FIELD}: {uri!r}: no bucket name (use gs://bucket/prefix)")
    elif uri.startswith("file://"):
        found.append(f"{URI_FIELD}: {uri!r}: file:// is not supported; write the local path itself "
                     f"({uri.removeprefix('file://') or '/'!r})")
    elif "://" in uri and not uri.startswith("gs://"):
        found.append(f"{URI_FIELD}: {uri!r}: unsupported scheme (use a local path or gs://bucket/prefix)")
    return found + form_problems(uri)


def uri_problem(uri: str) -> str | None:
    """The first of `uri_problems(uri)`, or None when the form is supported."""
    return next(iter(uri_problems(uri)), None)


def is_local(uri: str) -> bool:
    """True for a local path (no scheme)."""
    return "://" not in uri


def local_path(uri: str) -> Path:
    """The absolute local path of a local `uri` (`~` expanded)."""
    return Path(os.path.abspath(os.path.expanduser(uri)))


def _probe_write(directory: Path) -> None:
    """Writes, then removes, a probe file in `directory` (what a save needs: create and delete entries)."""
    probe = directory / f".elastic-jax-probe-{uuid.uuid4().hex}"
    probe.write_text("probe")
    probe.unlink()


def _check_local(uri: str, create: bool) -> Path:
    """See `check_location`; local paths."""
    path = local_path(uri)
    try:
        exists, is_dir = path.exists(), path.is_dir()
    except OSError as e:  # (a name too long for the file system, a component that denies search)
        raise uri_error(uri, f"cannot be used ({e.strerror or _one_line(e)})") from None
    if exists and not is_dir:
        raise uri_error(uri, "is a file, not a directory (checkpoints need a directory of their own)")
    if not exists:
        # The nearest existing ancestor must be a directory in which the rest can be created.
        ancestor = path.parent
        while not ancestor.exists() and ancestor != ancestor.parent:
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            raise uri_error(uri, f"cannot be created: {str(ancestor)!r} is a file, not a directory")
        try:
            _probe_write(ancestor)
        except OSError as e:
            raise uri_error(uri, f"cannot be created: directory {str(ancestor)!r} is not writable "
                                 f"({e.strerror or _one_line(e)})") from None
        if not create:
            return path
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise uri_error(uri, f"cannot be created ({e.strerror or _one_line(e)})") from None
    try:
        _probe_write(path)
    except OSError as e:
        raise uri_error(uri, f"directory is not writable ({e.strerror or _one_line(e)})") from None
    return path


def _check_gcs(uri: str, timeout_s: float) -> None:
    """Checks that the bucket exists and that an object can be written under the prefix.

    Uses google-cloud-storage with `retry=None` and a short timeout, so a
    missing bucket or an unreachable endpoint fails in about `timeout_s`.
    """
    try:
        from google.api_core import exceptions as gexc
        from google.auth import exceptions as auth_exc
        from google.cloud import storage
    except ImportError as e:
        raise uri_error(uri, f"checking gs:// needs the controller extra (pip install 'elastic-jax[controller]'): {e}") from None

    bucket_name, _, prefix = uri.removeprefix("gs://").partition("/")
    try:
        client = storage.Client()
        bucket = client.get_bucket(bucket_name, timeout=timeout_s, retry=None)
        blob = bucket.blob(f"{prefix.rstrip('/')}/.elastic-jax-probe-{uuid.uuid4().hex}".lstrip("/"))
        blob.upload_from_string(b"probe", timeout=timeout_s, retry=None)
        blob.delete(timeout=timeout_s, retry=None)
    except gexc.NotFound:
        raise uri_error(uri, f"bucket {bucket_name!r} does not exist") from None
    except gexc.Forbidden as e:
        raise uri_error(uri, f"no write permission on bucket {bucket_name!r} ({_one_line(e)})") from None
    except auth_exc.DefaultCredentialsError as e:
        raise uri_error(uri, f"no Google Cloud credentials ({_one_line(e)})") from None
    except Exception as e:  # connection refused, DNS, timeout, 5xx: all "unreachable"
        raise uri_error(uri, f"GCS unreachable ({type(e).__name__}: {_one_line(e)})") from None


def check_location(uri: str, *, create: bool, timeout_s: float = DEFAULT_PROBE_TIMEOUT_S) -> str:
    """Checks that checkpoints can be written at `uri`; returns the location to open.

    A local path must be a directory (or creatable: its nearest existing
    ancestor a writable directory) in which a probe file can be written and
    removed. A `gs://` URI needs an existing bucket and write permission (a
    probe object is written and deleted; no retries, about `timeout_s`
    seconds per request).

    Args:
      uri: `spec.checkpoint.uri`.
      create: create a missing local directory (the controller); False checks
        that it could be created and leaves the file system as it was
        (`elastic-jax validate --trainer`, the CLI before starting processes).
      timeout_s: per-request timeout of the `gs://` probe.

    Returns:
      The absolute local path as a string, or the `gs://` URI without a trailing slash.

    Raises:
      CheckpointUriError: the location is unusable; one line naming
        `spec.checkpoint.uri` and what is wrong (a file, not writable, no such
        bucket, unsupported scheme, ...).
    """
    problem = uri_problem(uri)
    if problem:
        raise CheckpointUriError(problem)
    if uri.startswith("gs://"):
        _check_gcs(uri, timeout_s)
        return uri.rstrip("/")
    return str(_check_local(uri, create))


# -- what a local checkpoint directory holds ------------------------------------------------


def is_orbax_step_dir(path: Path) -> bool:
    """True for a directory named by a step number that holds Orbax's step metadata file."""
    return path.name.isdigit() and path.is_dir() and (path / STEP_METADATA_FILE).is_file()


def committed_local_steps(root: Path) -> list[int]:
    """The committed steps in a local checkpoint directory, ascending, as Orbax lists them.

    On local disk Orbax commits a step by renaming `<step>.orbax-checkpoint-tmp-*`
    to `<step>`: every directory named by a number counts (the controller's
    `Checkpointer.committed_steps` sees the same).
    """
    try:
        return sorted(int(p.name) for p in root.iterdir() if p.name.isdigit() and p.is_dir())
    except OSError:
        return []


def _step_metadata(step_dir) -> dict | None:
    """A step's `_CHECKPOINT_METADATA` as a dict; None when it is missing or not a JSON object."""
    try:
        meta = json.loads((step_dir / STEP_METADATA_FILE).read_text())
    except (OSError, ValueError):
        return None
    return meta if isinstance(meta, dict) else None


def uncommitted_steps(root, me: JobIdentity | None) -> list[int]:
    """The step directories under checkpoint directory `root` that exist but were never committed, ascending.

    A step is committed when it holds `commit_success.txt`: Orbax writes it last, on GCS (where it is the
    commit) and on local disk (just before the rename from `<step>.orbax-checkpoint-tmp-*`). Orbax itself lists
    a local step directory as committed by its name alone and skips an uncommitted GCS one, then saves over
    it: both made a copy that left the markers out look like a finished step, or like nothing.

    On GCS, a step this job's own save left uncommitted (its metadata names `me`'s uid, or it has no step
    metadata yet: a controller killed mid-save; the chaos cluster test's restart arm failed the job on one) is
    not listed: Orbax skips it when restoring and saves that step again. On local disk there is no
    such step (a save writes `<step>.orbax-checkpoint-tmp-*` and renames it at its commit, never listed here),
    and Orbax would restore a step folder without the marker as committed: so there a copy of this job's own
    step that left the marker out is listed like any other (a new user's trial resumed from one).

    Args:
      root: the checkpoint directory, a `pathlib.Path` or an `etils.epath.Path` (gs://).
      me: this job; None: no step is excused as this job's own.

    Returns:
      The step numbers, ascending; [] when `root` does not exist or cannot be listed.
    """
    try:
        entries = [p for p in root.iterdir() if p.name.isdigit() and p.is_dir()]
    except OSError:
        return []
    found = []
    for step_dir in entries:
        if (step_dir / COMMIT_SUCCESS_FILE).exists():
            continue
        meta = _step_metadata(step_dir)
        writer = identity.from_metadata((meta or {}).get("custom_metadata"))
        # On GCS a save cut short before its step metadata was written has none (each object appears whole);
        # a copy brings the metadata along. Both that and this job's own cut-short save are Orbax's to redo.
        # Orbax writes the step metadata before the writer's custom metadata lands, so a save cut short can name
        # no writer either: only a step naming another writer is surely a copy.
        if str(root).startswith("gs://") and (writer is None or (me is not None and writer.uid == me.uid)):
            continue
        found.append(int(step_dir.name))
    return sorted(found)


# The most step numbers one message names.
_MAX_NAMED = 5


def uncommitted_problem(steps: list[int], uri: str) -> str | None:
    """The one-line refusal for `uncommitted_steps`' answer `steps` at `uri`; None when there are none."""
    if not steps:
        return None
    more = len(steps) - _MAX_NAMED
    shown = ", ".join(map(str, steps[:_MAX_NAMED])) + (f" and {more} more" if more > 0 else "")
    # (the safe advice first: a trial's folder of photos had a `2024/`, and "delete them" told them to delete it)
    return (f"{URI_FIELD} {uri!r}: folder(s) named like checkpoint step(s) {shown} were never committed (no "
            f"{COMMIT_SUCCESS_FILE}, which Orbax writes last: a copy that left it out, another job's save cut short, or not a checkpoint "
            "at all); they can neither be resumed from nor saved over: give this job its own directory, or, if "
            "they are checkpoints, copy them again with their commit markers")


def check_committed(root, uri: str, me: JobIdentity | None) -> None:
    """Refuses a checkpoint directory that holds uncommitted steps (`uncommitted_steps`).

    Raises:
      CheckpointUncommittedError: one line naming `spec.checkpoint.uri` and the steps.
    """
    problem = uncommitted_problem(uncommitted_steps(root, me), uri)
    if problem:
        raise CheckpointUncommittedError(problem)


# What the built-in training loop saves with each step (its `data` item's `data`) that decides the data order
# and what one step means to the optimizer, and the spec field each comes from.
DATA_FIELDS = (("global_batch_size", "spec.training.globalBatchSize"), ("seed", "spec.training.seed"))
ALLOW_DATA_CHANGE_FIELD = "spec.checkpoint.allowDataChange"
# Orbax's JsonCheckpointHandler file in an item folder (`<step>/data/metadata`).
_JSON_ITEM_FILE = "metadata"


def run_data(global_batch_size: int, seed: int) -> dict[str, int]:
    """What the built-in loop saves beside each step for `DATA_FIELDS` (`spec.training` values)."""
    return {"global_batch_size": global_batch_size, "seed": seed}


def data_changes(saved: Any, now: Any) -> list[tuple[str, Any, Any]]:
    """`(field, checkpoint's value, spec's value)` for each of `DATA_FIELDS` that both `saved` (what the
    step recorded) and `now` (`run_data` of this spec) hold and that differ; [] when none (or `saved` is not a
    dict: a step of the user's own loop records what it likes)."""
    if not isinstance(saved, dict) or not isinstance(now, dict):
        return []
    return [(field, saved[key], now[key]) for key, field in DATA_FIELDS
            if key in saved and key in now and saved[key] != now[key]]


def describe_changes(changes: list[tuple[str, Any, Any]], step: int) -> str:
    """`spec.training.seed 1 (checkpoint step 100 was trained with 0), ...` for `data_changes`' answer."""
    return ", ".join(f"{field} {new} (checkpoint step {step} was trained with {old})" for field, old, new in changes)


def data_change_problem(saved: Any, now: Any, step: int, uri: str, allow: bool) -> str | None:
    """Why resuming checkpoint `step` (which recorded `saved`) with a spec whose `run_data` is `now` is refused:
    one line naming each changed field and both values, and the way out; None when nothing changed or `allow`
    (`spec.checkpoint.allowDataChange`)."""
    changes = data_changes(saved, now)
    if allow or not changes:
        return None
    return (f"{describe_changes(changes, step)} at {URI_FIELD} {uri!r}: resuming would change the data order and "
            f"what a step means to the optimizer; set the field(s) back, or set {ALLOW_DATA_CHANGE_FIELD}: true "
            "to resume with the change")


def read_step_data(step_dir: Path) -> Any:
    """The loop's data record saved with a local step (`<step>/data/metadata`'s `data`); None if unreadable."""
    try:
        record = json.loads((step_dir / DATA_ITEM / _JSON_ITEM_FILE).read_text())
    except (OSError, ValueError):
        return None
    return record.get("data") if isinstance(record, dict) else None


def read_step_writer(step_dir: Path) -> tuple[bool, JobIdentity | None]:
    """The writer stored in a local step's Orbax metadata.

    Returns:
      `(readable, writer)`: readable False when the metadata file is missing or
      not JSON (a corrupt step: the controller would skip it); writer None
      when the step was saved without an identity.
    """
    try:
        meta = json.loads((step_dir / STEP_METADATA_FILE).read_text())
    except (OSError, ValueError):
        return False, None
    if not isinstance(meta, dict):
        return False, None
    return True, identity.from_metadata(meta.get("custom_metadata"))


def step_writer(step_dir: Path) -> JobIdentity | None:
    """The writer in a committed step's Orbax step metadata; None if absent or unreadable."""
    return read_step_writer(step_dir)[1]


# -- may this job take these checkpoints? -------------------------------------------------------


def writer_problem(step: int, writer: JobIdentity | None, me: JobIdentity | None,
                   resume_from: Literal["SameJob", "Any"], uri: str) -> str | None:
    """Why this job may not resume from committed `step` written by `writer`, or None when it may.

    A step saved without a writer identity (by an older elastic-jax) counts as
    another job's: it cannot be shown to be this job's.

    Args:
      step: the committed step.
      writer: who wrote it (None: no identity saved).
      me: this job (None: the job saves no identity; nothing to compare).
      resume_from: `spec.checkpoint.resumeFrom`.
      uri: `spec.checkpoint.uri`, for the message.

    Returns:
      One line naming `spec.checkpoint.uri`, the step, the writer and
      `spec.checkpoint.resumeFrom`, or None.
    """
    if resume_from == "Any" or me is None:
        return None
    where = f"{URI_FIELD} {uri!r}"
    if writer is None:
        return (f"{where}: checkpoint step {step} has no writer identity (saved by an older elastic-jax), so it "
                f"cannot be shown to be this job's ({me.describe()}); set spec.checkpoint.resumeFrom: Any to "
                "resume from it, or give this job its own directory")
    if writer.uid != me.uid and writer.namespace == me.namespace == identity.LOCAL_NAMESPACE \
            and writer.name == me.name:
        # (a local UID is of the name and the absolute checkpoint path: the same name here is the same job
        # written through another path, a symbolic link or a moved folder; a new user's trial read it as a bug)
        return (f"{where}: checkpoint step {step} was written by a job of this name through another checkpoint "
                f"path ({writer.describe()}, not {me.describe()}): `elastic-jax run` tells jobs apart by name and "
                "absolute checkpoint path, and a symbolic link or a moved folder is another path; use the path "
                "it was written under, or set spec.checkpoint.resumeFrom: Any to resume from it")
    if writer.uid != me.uid:
        return (f"{where}: checkpoint step {step} was written by another job, {writer.describe()}, not this job "
                f"{me.describe()}; set spec.checkpoint.resumeFrom: Any to resume from it, or give this job its "
                "own directory")
    return None


def beyond_steps_problem(latest: int | None, total_steps: int, uri: str) -> str | None:
    """Why a newest committed step `latest` cannot be resumed by a job of `total_steps` steps, or None.

    A step beyond `spec.training.steps` is never resumed (also with
    `resumeFrom: Any`): the run would "succeed" without training.
    """
    if latest is None or latest <= total_steps:
        return None
    return (f"{URI_FIELD} {uri!r} holds checkpoint step {latest}, beyond spec.training.steps ({total_steps}): "
            "raise spec.training.steps to continue training from it, or, if those steps are not this job's, give "
            "this job its own directory")


def check_resume(uri: str, total_steps: int, me: JobIdentity | None,
                 resume_from: Literal["SameJob", "Any"], data: dict | None = None,
                 allow_data_change: bool = False) -> None:
    """Refuses what the controller would refuse before restoring from the local checkpoint directory `uri`.

    Judged from the files alone: the newest committed step must not be beyond
    `total_steps`, and the newest step whose metadata is readable (the one
    the controller tries first; it skips unreadable ones) must have been
    written by this job unless `resume_from` is `Any`. Whether the state fits
    the trainer is left to the controller (that needs the trainer). A `gs://`
    URI, or a directory that does not exist yet, passes (the controller
    checks `gs://` through Orbax).

    Args:
      uri: `spec.checkpoint.uri`.
      total_steps: `spec.training.steps`.
      me: this job's identity (None: no identity to compare).
      resume_from: `spec.checkpoint.resumeFrom`.
      data: `run_data` of this spec (the built-in loop); None: not checked (the user's own loop).
      allow_data_change: `spec.checkpoint.allowDataChange`.

    Raises:
      CheckpointUncommittedError: the directory holds steps that were never committed (`uncommitted_steps`).
      CheckpointMismatchError: a committed step is beyond `total_steps`.
      CheckpointForeignError: the step to resume from is another job's (or of no known job).
      CheckpointDataChangeError: that step was trained with another global batch size or seed.
    """
    if not is_local(uri):
        return
    root = local_path(uri)
    try:
        if not root.is_dir():
            return
    except OSError as e:  # (a name too long for the file system, a component that denies search)
        raise CheckpointMismatchError(str(uri_error(uri, f"cannot be used ({e.strerror or _one_line(e)})"))) from None
    check_committed(root, uri, me)
    steps = committed_local_steps(root)
    if not steps:
        return
    problem = beyond_steps_problem(steps[-1], total_steps, uri)
    if problem:
        raise CheckpointMismatchError(problem)
    for step in reversed(steps):
        readable, writer = read_step_writer(root / str(step))
        if readable:
            problem = writer_problem(step, writer, me, resume_from, uri)
            if problem:
                raise CheckpointForeignError(problem)
            if data is not None:
                problem = data_change_problem(read_step_data(root / str(step)), data, step, uri, allow_data_change)
                if problem:
                    raise CheckpointDataChangeError(problem)
            return


# Orbax's name for a save in progress of a step (`orbax.checkpoint.step.TMP_DIR_STEP_PATTERN` with no step
# prefix, as `Checkpointer` saves: `<step>.orbax-checkpoint-tmp-<timestamp>`, or without the timestamp in
# newer Orbax; tests/integration/test_fresh_plan.py checks it against Orbax's own listing).
_ORBAX_TMP_STEP = re.compile(r"(\d+)\.orbax-checkpoint-tmp(-\d+)?")


# What Orbax writes at the top of a step folder of this job besides the item folders (`STEP_ITEMS`): its step
# metadata and commit marker (files), and an item folder's temporary while it is saved
# (`<item>.orbax-checkpoint-tmp[-<timestamp>]`, `<item>.partial_save.orbax-checkpoint-tmp...`).
_ORBAX_STEP_FILES = (STEP_METADATA_FILE, COMMIT_SUCCESS_FILE)
_ORBAX_ITEM_TMP = re.compile(
    rf"({'|'.join(map(re.escape, STEP_ITEMS))})(\.partial_save)?\.orbax-checkpoint-tmp(-\d+)?")


# What Orbax (0.12, OCDBT) writes inside an item folder (`state/`, `data/`, and their temporaries), by path
# relative to it: the tree's metadata and sharding, the JSON item's `metadata`, the commit marker, the OCDBT
# manifest and data files (`d/<hex>`), one `ocdbt.process_<n>/` per process with its own manifest and data
# files, and `array_metadatas/process_<n>`. tests/integration/test_fresh_plan.py checks it against real saves.
_ORBAX_ITEM_FILES = re.compile(
    r"_METADATA|_sharding|_CHECKPOINT_METADATA|commit_success\.txt|metadata|manifest\.ocdbt|d/[0-9a-f]+"
    r"|array_metadatas/process_\d+|ocdbt\.process_\d+/(manifest\.ocdbt|d/[0-9a-f]+)")
_ORBAX_ITEM_DIRS = re.compile(r"d|array_metadatas|ocdbt\.process_\d+|ocdbt\.process_\d+/d")


def _unexpected_in_item(item_dir: Path) -> str | None:
    """The first path (relative to `item_dir`, by name) inside an item folder that Orbax does not write there
    (`_ORBAX_ITEM_FILES`, `_ORBAX_ITEM_DIRS`; a link never), or None. "(cannot be listed: ...)" likewise."""
    stack = [item_dir]
    while stack:
        folder = stack.pop()
        try:
            entries = sorted(folder.iterdir(), key=lambda p: p.name)
        except OSError as e:
            return f"(cannot be listed: {e.strerror or _one_line(e)})"
        for entry in entries:
            rel = entry.relative_to(item_dir).as_posix()
            if entry.is_symlink():
                return rel
            if entry.is_dir() and _ORBAX_ITEM_DIRS.fullmatch(rel):
                stack.append(entry)
            elif not (entry.is_file() and _ORBAX_ITEM_FILES.fullmatch(rel)):
                return rel
    return None


def unexpected_step_entry(step_dir: Path) -> str | None:
    """The first entry (by name) at the top of local step folder `step_dir` that Orbax does not write there for
    this job, or None when every entry is Orbax's.

    Orbax's are: a folder named by one of `STEP_ITEMS` or an item's temporary (`_ORBAX_ITEM_TMP`) holding only
    what Orbax writes in an item (`_unexpected_in_item`: a user's `state/notes.txt` was deleted with the step),
    and the files `_CHECKPOINT_METADATA` and `commit_success.txt`; a link is never Orbax's.

    Returns:
      The entry's name (`thesis.tex`, or its path inside an item: `state/notes.txt`), "(cannot be listed:
      <why>)" when a folder cannot be listed, or None.
    """
    try:
        entries = sorted(step_dir.iterdir(), key=lambda p: p.name)
    except OSError as e:
        return f"(cannot be listed: {e.strerror or _one_line(e)})"
    for entry in entries:
        if entry.is_symlink():
            return entry.name
        if entry.name in STEP_ITEMS or _ORBAX_ITEM_TMP.fullmatch(entry.name):
            if not entry.is_dir():
                return entry.name
            inside = _unexpected_in_item(entry)
            if inside is not None:
                return inside if inside.startswith("(") else f"{entry.name}/{inside}"
        elif entry.name not in _ORBAX_STEP_FILES or not entry.is_file():
            return entry.name
    return None


class FreshPlan(NamedTuple):
    """What `--fresh` does to a local checkpoint directory.

    Attributes:
      delete: entry names to delete, sorted: this job's Orbax steps and Orbax's temporaries of its saves.
      keep: every other entry, sorted (a user's files or folders, whatever their names), left alone.
    """

    delete: list[str]
    keep: list[str]

    def kept_line(self) -> str:
        """One line naming what was kept ("" when nothing was)."""
        if not self.keep:
            return ""
        shown = ", ".join(self.keep[:5]) + (f", ... ({len(self.keep)} in all)" if len(self.keep) > 5 else "")
        return f"kept {len(self.keep)} {'entry that is' if len(self.keep) == 1 else 'entries that are'} not this job's checkpoints: {shown}"


def fresh_plan(uri: str, me: JobIdentity | None, allow_foreign: bool) -> FreshPlan:
    """What `--fresh` would delete from the local checkpoint directory `uri`, and what it keeps.

    A name is not proof. Deleted are only Orbax's own entries of this job: a step directory as Orbax
    names and commits it (the name is the step number and it holds Orbax's step metadata file) whose
    metadata names this job as its writer, and a temporary of a save in progress
    (`<step>.orbax-checkpoint-tmp[-<timestamp>]`, a directory) whose step metadata names this job, or that
    has none and sits beside this job's own steps (a save cut short). Everything else is kept (a user's
    `metadata/`, `2024/`, `notes.orbax-checkpoint-tmp/`) and listed in `keep`, except a folder or link named by a number (Orbax lists
    it as a step): that refuses the lot. A step another job wrote
    (or no known job) refuses the lot, unless `allow_foreign` (`spec.checkpoint.resumeFrom: Any`): kept,
    it would be resumed from. A step whose metadata does not read (corrupt) is deleted with this job's own
    steps, and refuses when no step is this job's. A step folder (or temporary) to be deleted must hold only
    what Orbax writes in a step (`unexpected_step_entry`: this job's item folders, its step metadata, commit
    marker and temporaries); any other entry (a user's `5/thesis.tex`) refuses the lot. So does a directory
    to be emptied that is not writable (read-only, immutable).

    Args:
      uri: `spec.checkpoint.uri`.
      me: this job's identity; None skips the ownership check (every step and temporary is this job's).
      allow_foreign: steps other jobs wrote may be deleted too.

    Returns:
      The plan (both lists empty when the directory does not exist).

    Raises:
      CheckpointUriError: `uri` is not a local path, is not a directory, holds another job's steps (the
        message names some), only unreadable steps, a folder or link named like a step that is not an Orbax
        step (Orbax would list it), a step folder to delete that holds an entry Orbax does not write there
        (the message names the folder and the entry), or cannot be emptied.
    """
    if not is_local(uri):
        raise uri_error(uri, "--fresh clears local checkpoint directories only")
    root = local_path(uri)
    if not root.exists():
        return FreshPlan([], [])
    if not root.is_dir():
        raise uri_error(uri, "is a file, not a directory (checkpoints need a directory of their own)")
    owned = lambda w: me is None or allow_foreign or (w is not None and w.uid == me.uid)  # noqa: E731
    mine, corrupt, unsigned, keep, others = [], [], [], [], {}
    for path in sorted(root.iterdir(), key=lambda p: p.name):
        name = path.name
        if path.is_symlink():  # (a link is never Orbax's; deleting through it would reach outside)
            keep.append(name)
        elif is_orbax_step_dir(path):
            readable, writer = read_step_writer(path)
            if not readable:
                corrupt.append(name)
            elif owned(writer):
                mine.append(name)
            else:
                others[name] = writer
        elif _ORBAX_TMP_STEP.fullmatch(name) and path.is_dir():
            readable, writer = read_step_writer(path)
            if readable and owned(writer):
                mine.append(name)
            elif readable:
                keep.append(name)  # another job's save in progress: not ours to delete
            else:
                unsigned.append(name)
        else:
            keep.append(name)
    # A kept folder named by a number is one Orbax lists as a step (`orbax.checkpoint.step.checkpoint_steps`):
    # the fresh run would trip on it (or restore it), so nothing is deleted.
    stepnamed = [n for n in keep if n.isdigit()]
    if stepnamed:
        raise uri_error(uri, f"--fresh deletes checkpoints only, and {', '.join(stepnamed[:5])} "
                             f"{'is' if len(stepnamed) == 1 else 'are'} named like a checkpoint step but "
                             f"{'is' if len(stepnamed) == 1 else 'are'} not one of this directory's Orbax steps "
                             "(no step metadata, or a link); move it out, or give the job a checkpoint directory "
                             "of its own; nothing was deleted")
    if others:
        step, by = next(iter(sorted(others.items(), key=lambda kv: int(kv[0]))))
        who = by.describe() if by else "a job that saved no writer identity"
        raise uri_error(uri, f"--fresh deletes this job's checkpoints only, and step {step} "
                             f"({len(others)} step(s) in all) was written by {who}, not {me.describe()}; "
                             "give the job a checkpoint directory of its own, or set "
                             "spec.checkpoint.resumeFrom: Any to treat them as this job's")
    if corrupt and not mine and me is not None and not allow_foreign:
        # (a step whose metadata does not read cannot be shown to be this job's; beside this job's own
        # steps it is one of them, a save cut short: --fresh deletes it with them)
        raise uri_error(uri, f"--fresh deletes this job's checkpoints only, and step(s) {', '.join(corrupt[:5])} "
                             "have unreadable metadata and no step here is this job's; delete them by hand, "
                             "or set spec.checkpoint.resumeFrom: Any to treat them as this job's")
    # A temporary without step metadata is a save cut short; beside this job's steps it is this job's (Orbax's
    # next manager would clean it anyway), alone it is kept.
    if mine or me is None or allow_foreign:
        mine += corrupt + unsigned
    else:
        keep += unsigned
    ours = sorted(mine)
    # A step folder is deleted whole, so all in it must be Orbax's: a user's file planted in one (`5/thesis.tex`
    # beside a garbage `_CHECKPOINT_METADATA`) is not this job's to delete, and nothing is.
    for name in ours:
        entry = unexpected_step_entry(root / name)
        if entry is not None and entry.startswith("(cannot be listed"):
            raise uri_error(uri, f"--fresh cannot delete step folder {name}: it {entry[1:-1]}; nothing was deleted")
        if entry is not None:
            raise uri_error(uri, f"--fresh deletes Orbax's checkpoint files only, and step folder {name} holds "
                                 f"{entry}, which Orbax does not write in a step; move it out of {name}, or give the "
                                 "job a checkpoint directory of its own; nothing was deleted")
    # Every directory to be emptied must be writable, or a read-only/immutable one would stop the
    # deletion half-way through a step (its metadata gone, its arrays left).
    for directory in ([root] if ours else []) + [Path(d) for n in ours for d, _, _ in os.walk(root / n)]:
        if not os.access(directory, os.W_OK | os.X_OK):
            raise uri_error(uri, f"--fresh cannot delete the checkpoints: {str(directory)!r} is not writable; "
                                 "nothing was deleted")
    return FreshPlan(ours, sorted(keep))


def clear_local_checkpoints(uri: str, writer: JobIdentity | None = None, allow_foreign: bool = False) -> FreshPlan:
    """Deletes this job's checkpoints in a local checkpoint directory (`--fresh`), and nothing else.

    What is deleted is `fresh_plan`'s answer (this job's Orbax steps and the temporaries of its saves;
    everything else is kept and listed; another job's step, or a directory that is not writable, refuses
    the lot, so a read-only or immutable directory never loses half a step). The directory itself stays (a
    launcher may hold a lock on it).

    Args:
      uri: `spec.checkpoint.uri`.
      writer: this job's identity; None skips the ownership check.
      allow_foreign: delete steps other jobs wrote too.

    Returns:
      The plan carried out: `delete` was deleted, `keep` left alone.

    Raises:
      CheckpointUriError: `uri` is not a local directory, holds another job's steps, or cannot be emptied
        (the message names `spec.checkpoint.uri` and why).

    Here, not beside Orbax in the controller, so `elastic-jax run --fresh` in library mode deletes before the
    user's program starts without importing JAX.
    """
    import shutil

    plan = fresh_plan(uri, writer, allow_foreign)
    root = local_path(uri)
    for name in plan.delete:
        try:
            shutil.rmtree(root / name)
        except OSError as e:
            raise uri_error(uri, f"--fresh could not delete {name} ({e.strerror or _one_line(e)})") from None
    return plan


def finished_at(uri: str, total_steps: int) -> tuple[int, JobIdentity | None] | None:
    """`(step, writer)` when the local checkpoint directory `uri` already holds the job's last step, committed
    and with readable step metadata; None otherwise (a `gs://` URI, no directory, an unfinished last step, or
    one whose metadata does not read). Call after `check_resume`, which refuses another job's steps and
    steps beyond `total_steps`.

    Only the step's metadata is read here (no JAX, no Orbax): its array data can still be truncated or
    missing. Before calling a job finished, `elastic-jax run` also reads the step's data
    (`elastic_jax.controller.checkpointing.step_read_problem`); a step that does not read is treated as the
    controller treats any corrupt newest step (fall back to the newest one that restores, with a warning).
    """
    if not is_local(uri):
        return None
    root = local_path(uri)
    if not root.is_dir() or total_steps not in committed_local_steps(root):
        return None
    readable, writer = read_step_writer(root / str(total_steps))
    return (total_steps, writer) if readable else None


def _check_gcs_committed(uri: str, me: JobIdentity | None) -> None:
    """`check_committed` for a reachable `gs://` location, listed through etils (the controller extra); skipped
    without it (the controller checks again through the same function when it starts)."""
    try:
        from etils import epath
    except ImportError:
        return
    try:
        check_committed(epath.Path(uri), uri, me)
    except CheckpointUncommittedError:
        raise
    except Exception:  # noqa: BLE001 - listing failed after the probe passed: the controller will say why
        return


def world_writable_problem(root: Path, uri: str) -> str | None:
    """Why a local checkpoint folder `root` (`spec.checkpoint.uri` `uri`) that any user may write in is refused
    by `elastic-jax run` and `validate --trainer`, or None (also when it does not exist yet).

    Any user could plant a step this job resumes from (its writer identity is only metadata), or folders that
    `--fresh` deletes. `--workdir` was refused for this, the checkpoint folder was not (a new user's trial).
    Only for the CLI: a pod's `emptyDir` is mode 0777 and only the pod's containers can reach it.
    """
    try:
        st = os.stat(root)
    except OSError:  # (missing: created 0700-style by the run; unreadable: check_location said why)
        return None
    if not stat.S_ISDIR(st.st_mode) or not st.st_mode & 0o002:
        return None
    return (f"{URI_FIELD} {uri!r}: the folder is writable by every user (mode {stat.S_IMODE(st.st_mode):04o}): "
            "another user could plant a checkpoint this job resumes from, or folders --fresh deletes; chmod o-w "
            "it, or use a folder of your own")


def preflight(uri: str, total_steps: int, me: JobIdentity, resume_from: Literal["SameJob", "Any"], *,
              fresh: bool, check_gcs: bool = True, timeout_s: float = DEFAULT_PROBE_TIMEOUT_S,
              data: dict | None = None, allow_data_change: bool = False) -> None:
    """Everything about the checkpoint location that can be refused before a process starts.

    `elastic-jax run` (before the controller starts) and `elastic-jax validate
    --trainer` call this one function, so they refuse the same things; the
    controller applies the same checks again when it starts (the location
    can change in between). Nothing is created or deleted (probe files aside).

    Checks: the URI's form (`uri_problem`); the location (`check_location`
    with `create=False`: a file, a directory that is not writable, a missing
    bucket); steps there that were never committed (`uncommitted_steps`; for gs:// when etils is
    installed); then, for a local path, a folder every user may write in (`world_writable_problem`), with
    `fresh` what `--fresh` would refuse
    (`fresh_plan`), else what resuming would refuse (`check_resume`:
    another job's steps, a step beyond `total_steps`).

    Args:
      uri: `spec.checkpoint.uri`.
      total_steps: `spec.training.steps`.
      me: the identity the run will save with (`identity.local_identity` for `elastic-jax run`).
      resume_from: `spec.checkpoint.resumeFrom`.
      fresh: the run starts with `--fresh`.
      check_gcs: probe a `gs://` location (False leaves it to the controller).
      timeout_s: per-request timeout of the `gs://` probe.
      data, allow_data_change: as `check_resume`'s (the data record the step to resume from must match).

    Raises:
      CheckpointUriError: the location is unusable, or `--fresh` would refuse it.
      CheckpointUncommittedError: the location (local or gs://) holds steps that were never committed.
      CheckpointForeignError: the checkpoint to resume from is another job's.
      CheckpointMismatchError: a committed step is beyond `total_steps`.
    """
    if uri.startswith("gs://") and not check_gcs:
        problem = uri_problem(uri)
        if problem:
            raise CheckpointUriError(problem)
        return
    check_location(uri, create=False, timeout_s=timeout_s)
    if not is_local(uri):
        _check_gcs_committed(uri, me)
        return
    problem = world_writable_problem(local_path(uri), uri)
    if problem:
        raise CheckpointUriError(problem)
    if fresh:
        fresh_plan(uri, me, allow_foreign=resume_from == "Any")
        return
    check_resume(uri, total_steps, me, resume_from, data, allow_data_change)
