"""Structured logs: one JSON object per line, for Kubernetes log pipelines.

Every process of a job (controller, worker) logs with `JsonFormatter`. A
record's `extra=` fields become top-level keys, so an event reads

    {"ts": 1764410000.123, "level": "info", "logger": "elastic_jax.controller",
     "msg": "step 100 loss 2.1040", "event": "step", "step": 100, "loss": 2.104, ...}

and a log query can filter on `event`/`step` without parsing `msg`.
"""

from __future__ import annotations

import json
import logging

# Attributes every LogRecord has; anything else on a record came from `extra=`.
_RECORD_FIELDS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line: ts (Unix seconds), level, logger, msg, the
    `static_fields`, then any `extra=` fields; `exc` holds a traceback when there is one.

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
            **self.static_fields,
        }
        entry.update({k: v for k, v in vars(record).items() if k not in _RECORD_FIELDS})
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


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
