"""Structured logs: one JSON object per line, one schema for every process of the product.

The operator, the controller and the workers all log with `JsonFormatter`, so
a log query uses the same keys whichever process wrote the line:

    {"ts": 1764410000.123, "level": "info", "logger": "elastic_jax.controller",
     "msg": "step 100 loss 2.1040", "namespace": "demo", "job": "cpu-job",
     "event": "step", "step": 100, "loss": 2.104, ...}

- `ts`: Unix seconds (float, ms precision); `level`: debug/info/warning/error/critical;
  `logger`: the Python logger's name; `msg`: the formatted message.
- `namespace`, `job`: the ElasticTrainingJob the line is about, when known (the
  controller binds them once it read its manifest, `bind`; the operator's lines
  get them from kopf's object reference, or from `extra={"job": ...}`).
- `object`: `Kind/name` of another object kopf logged about (a Pod, a Node).
- any `extra=` fields, top-level; `exc` holds a traceback when there is one.

A query can filter on `job`/`event`/`step` without parsing `msg`.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from elastic_jax import contract

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_RECORD_FIELDS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}
# kopf's per-object logger puts these on its records (`kopf._core.actions.loggers.ObjectLogger`):
# `k8s_ref` becomes job/namespace (or object); the others are kopf's plumbing, not log content.
_KOPF_FIELDS = frozenset({"k8s_ref", "k8s_skip", "settings"})
# The kind whose name is the `job` field (kopf's object reference of an ElasticTrainingJob).
JOB_KIND = contract.KIND
# The keys every line has, in this order (the schema's fixed part).
BASE_KEYS = ("ts", "level", "logger", "msg")

# Fields `bind` added to every line of this process (e.g. the controller's job).
_BOUND: dict[str, object] = {}

FORMATS = ("json", "text")
"""`--log-format` (env ELASTIC_JAX_LOG_FORMAT) of every process: `json` (one `JsonFormatter`
object per line, the default) or `text` (one human line per record)."""
_ALIASES = {"plain": "text"}  # the operator's flag said `plain` before the formats were one list


def log_format(value: str) -> str:
    """argparse `type` of `--log-format`: one of :data:`FORMATS` (`plain` is read as `text`).

    A `type` rather than `choices`: argparse applies it to a string default too,
    so a bad ELASTIC_JAX_LOG_FORMAT is a usage error, not a silent fallback.

    Raises:
      argparse.ArgumentTypeError: any other value, naming the accepted ones.
    """
    import argparse

    value = _ALIASES.get(value, value)
    if value not in FORMATS:
        raise argparse.ArgumentTypeError(f"{value!r}: must be one of {', '.join(FORMATS)}")
    return value


def bind(**fields: object) -> None:
    """Adds `fields` to every line this process logs from now on (a None value removes the key).

    The controller binds `namespace` and `job` once it read its manifest.
    """
    for key, value in fields.items():
        if value is None:
            _BOUND.pop(key, None)
        else:
            _BOUND[key] = value


def _object_fields(ref: Any) -> dict[str, object]:
    """kopf's object reference as schema fields: namespace + job for a job, object "Kind/name" otherwise."""
    if not isinstance(ref, dict):
        return {}
    out: dict[str, object] = {}
    if ref.get("namespace"):
        out["namespace"] = ref["namespace"]
    if ref.get("kind") == JOB_KIND:
        out["job"] = ref.get("name")
    elif ref.get("name"):
        out["object"] = f"{ref.get('kind') or '?'}/{ref['name']}"
    return out


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line of the schema above: ts, level, logger, msg, the bound
    and `static_fields`, kopf's object as namespace/job, then any `extra=` fields.

    Args:
      static_fields: keys added to every line (e.g. the worker's slice index and PID).
    """

    def __init__(self, static_fields: dict[str, object] | None = None):
        super().__init__()
        self.static_fields = dict(static_fields or {})

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
            **_BOUND,
            **self.static_fields,
        }
        extra = vars(record)
        entry.update(_object_fields(extra.get("k8s_ref")))
        entry.update({k: v for k, v in extra.items() if k not in _RECORD_FIELDS and k not in _KOPF_FIELDS})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """Formats a record as one human line: UTC time, level, logger, `[namespace/job]` when known, message.

    `--log-format text` of every process; the same fields as `JsonFormatter`, fewer of them
    (`extra=` fields other than the job's are left out).
    """

    def __init__(self) -> None:
        super().__init__(fmt="%(asctime)s.%(msecs)03dZ %(levelname)-7s %(name)s%(job_ref)s: %(message)s",
                         datefmt="%Y-%m-%dT%H:%M:%S")
        self.converter = __import__("time").gmtime

    def format(self, record: logging.LogRecord) -> str:
        fields = {**_BOUND, **_object_fields(getattr(record, "k8s_ref", None))}
        job = fields.get("job") or getattr(record, "job", None)
        namespace = fields.get("namespace") or getattr(record, "namespace", None)
        other = fields.get("object")
        record.job_ref = (f" [{namespace}/{job}]" if namespace and job else f" [{job}]" if job
                          else f" [{other}]" if other else "")
        return super().format(record)


class TimerSuccessFilter(logging.Filter):
    """Drops kopf's "Timer '...' succeeded." line (the operator's 1 s reconcile timer wrote one per job
    per second, half of its log) and the "Handler '<name>' succeeded." lines of the handlers named in
    `quiet_handlers` (the operator's wake-ups: one per watch event). Failures and every other line pass.

    Args:
      quiet_handlers: kopf handler ids whose successes are dropped.
    """

    def __init__(self, quiet_handlers: tuple[str, ...] = ()):
        super().__init__()
        self._quiet = frozenset(f"Handler '{name}' succeeded." for name in quiet_handlers)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not ((message.startswith("Timer '") and message.endswith("' succeeded.")) or message in self._quiet)


def read_events(text: str) -> list[dict]:
    """The lines of a JSON log (as `JsonFormatter` writes it) that carry an `event` field, in order.

    Lines that are not JSON objects (a library printing to stderr) are skipped.
    """
    out = []
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and "event" in entry:
            out.append(entry)
    return out
