"""The job's status write: nothing in it may make the API server refuse it, and a refusal is never silent.

The operator copies parts of a controller's answer into the job's status; a
controller runs a tenant's program. The API server refuses a whole status
patch for one bad value (NaN or Infinity is not JSON; an integer outside
int64 is not an integer of the schema), and a refused patch raised out of
kopf's timer ended that job's timer task for good: its status froze and a
later controller loss was never handled (the hostile-tenant trial).

Two layers:
- `guard`: before the patch is written, any top-level status field holding
  a value the API server would refuse is dropped from it (the models already
  bound what a controller can send: `elastic_jax.api.control`); the handler
  turns what was dropped into the `StatusWriteRefused` condition and a
  Warning Event.
- `write`: the daemon writes each pass's status itself (`Kube.patch_job_status`,
  a merge patch of the status subresource), not through kopf's patch step: a
  status patch the API server refuses anyway (a rule this guard does not
  know) is an outcome, never an exception, so the daemon keeps running; the
  caller posts a Warning Event, and the job's next passes write only the
  operator's own fields plus the condition for `REFUSED_HOLD_S`, then try
  the whole status again. (Before, the operator wrapped a private kopf
  function to catch it: issue 30.)
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

from kubernetes.client.rest import ApiException

from elastic_jax.api.job import INT64_MAX
from elastic_jax.k8s_operator.kube import api_message

_logger = logging.getLogger(__name__)

# Bytes of status JSON the operator writes at most (etcd's object limit is 1.5 MiB; spec and metadata share it).
MAX_STATUS_BYTES = 512 * 1024
# Seconds a job's status writes stay restricted to `OPERATOR_FIELDS` after the API server refused one.
REFUSED_HOLD_S = 60.0
# Status fields the operator computes from its own observations (never from a controller's answer):
# what a restricted write still writes.
OPERATOR_FIELDS = frozenset({
    "phase", "observedGeneration", "conditions", "desiredSlices", "slices", "totalSteps", "controllerPod",
    "controllerAttempt",
    "controllerRestarts", "sliceReplacements", "tokenSecret", "manifestSha256", "counterBase", "startTime",
    "completionTime", "failureReason",
})


def unwritable(value: Any, path: str) -> list[str]:
    """Where `value` holds something the API server refuses in JSON: `path[.key|[i]]: why` per place.

    Refused: NaN and +-Infinity, integers outside [-INT64_MAX, INT64_MAX] (`job.INT64_MAX`), and
    anything `json` cannot encode (bytes, objects).
    """
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return []
    if isinstance(value, int):
        return [] if -INT64_MAX <= value <= INT64_MAX else [f"{path}: integer {value} outside int64"]
    if isinstance(value, float):
        return [] if math.isfinite(value) else [f"{path}: {value} is not a JSON number"]
    if isinstance(value, dict):
        return [p for k, v in value.items() for p in unwritable(v, f"{path}.{k}")]
    if isinstance(value, (list, tuple)):
        return [p for i, v in enumerate(value) for p in unwritable(v, f"{path}[{i}]")]
    return [f"{path}: a {type(value).__name__} is not JSON"]


def guard(status_patch: MutableMapping[str, Any]) -> list[str]:
    """Drops from `status_patch` every top-level field the API server would refuse, and returns why.

    Args:
      status_patch: kopf's `patch.status` (camelCase keys), changed in place.

    Returns:
      One "status.<field>...: why" per value found; empty when the patch is writable as it is.
      A patch over MAX_STATUS_BYTES loses its largest fields outside OPERATOR_FIELDS until it fits.
    """
    problems = []
    for key in list(status_patch):
        found = unwritable(status_patch[key], f"status.{key}")
        if found:
            problems += found
            del status_patch[key]
    sizes = {k: len(json.dumps(v)) for k, v in status_patch.items()}
    for key in sorted((k for k in sizes if k not in OPERATOR_FIELDS), key=lambda k: -sizes[k]):
        if sum(sizes.values()) <= MAX_STATUS_BYTES:
            break
        problems.append(f"status.{key}: {sizes.pop(key)} bytes, the status would exceed {MAX_STATUS_BYTES} bytes")
        del status_patch[key]
    return problems


def restrict(status_patch: MutableMapping[str, Any]) -> list[str]:
    """Keeps only OPERATOR_FIELDS in `status_patch` (in place); returns the fields dropped."""
    dropped = sorted(k for k in status_patch if k not in OPERATOR_FIELDS)
    for key in dropped:
        del status_patch[key]
    return dropped


@dataclass(frozen=True)
class Written:
    """What became of one status write.

    Attributes:
      refused: the API server's refusal (a 4xx other than 404 and 429: status code and message), "" when
        written.
      gone: the job no longer exists (404): nothing was written.
      dropped: top-level status fields the patch set that the stored object lacks (a CRD older than the
        operator prunes fields it does not know; kopf warned of such "inconsistencies").
    """

    refused: str = ""
    gone: bool = False
    dropped: tuple[str, ...] = ()


def write(kube: Any, namespace: str, name: str, patch: Mapping[str, Any]) -> Written:
    """Writes a pass's status patch (`{"status": {...}}`) to the job `namespace/name` through `kube`
    (`Kube.patch_job_status`).

    Raises:
      ApiException: no answer, a 5xx or 429 (not the patch's fault: the next pass writes again).
    """
    try:
        stored = kube.patch_job_status(namespace, name, dict(patch))
    except ApiException as e:
        if e.status == 404:
            return Written(gone=True)
        if e.status is None or not 400 <= e.status < 500 or e.status == 429:
            raise
        message = f"the API server refused the status write ({e.status}): {api_message(e)[:900]}"
        _logger.error("%s", message, extra={"job": name, "namespace": namespace})
        return Written(refused=message)
    if stored is None:
        return Written(gone=True)
    kept = stored.get("status") or {}
    dropped = tuple(sorted(k for k, v in (patch.get("status") or {}).items() if v is not None and k not in kept))
    if dropped:
        _logger.warning("the API server dropped status fields %s (a CRD older than the operator?)",
                        ", ".join(dropped), extra={"job": name, "namespace": namespace})
    return Written(dropped=dropped)

