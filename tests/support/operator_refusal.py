"""The operator's create handler on a job it refuses, with kopf's Event poster recorded (unit tests)."""

from __future__ import annotations

from typing import Any

import pytest

from elastic_jax.k8s_operator import handlers, operator_state
from elastic_jax.k8s_operator.admin_policies import AdminPolicies


class _Patch:
    """kopf's patch object as the handler uses it: `status` only."""

    def __init__(self) -> None:
        self.status: dict[str, Any] = {}


def refused_at_create(monkeypatch, body: dict[str, Any], match: str,
                      policies: AdminPolicies | None = None) -> tuple[dict[str, Any], dict[str, Any], list]:
    """Runs `handlers.job_created` on `body`, which must be refused (kopf.PermanentError matching `match`), by an
    operator with the admin's `policies` (None: the defaults).

    Returns:
      (the status patch, its `Failed` condition, the Events posted as (type, reason, message)).
    """
    events: list[tuple[str, str, str]] = []
    monkeypatch.setattr(handlers.kopf, "event",
                        lambda ref, type, reason, message: events.append((type, reason, message)))
    patch = _Patch()
    with pytest.raises(handlers.kopf.PermanentError, match=match):
        handlers.job_created(body=body, spec=body["spec"], status={}, meta={"generation": 1}, patch=patch,
                             memo={"elasticjax": operator_state.OperatorState(key=b"k" * 32, policies=policies)})
    (cond,) = [c for c in patch.status["conditions"] if c["type"] == "Failed"]
    return patch.status, cond, events
