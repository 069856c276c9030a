"""The job's status write: nothing in it may make the API server refuse it, and a refusal is never silent.

The operator copies parts of a controller's answer into the job's status; a
controller runs a tenant's program. The API server refuses a whole status
patch for one bad value (NaN or Infinity is not JSON; an integer outside
int64 is not an integer of the schema), and a refused patch raised out of
kopf's timer ends that job's timer task for good: its status froze and a
later controller loss was never handled (the hostile-tenant trial).

Two layers:
- `guard`: before kopf writes the patch, any top-level status field holding
  a value the API server would refuse is dropped from it (the models already
  bound what a controller can send: `elastic_jax.api.control`); the handler
  turns what was dropped into the `StatusWriteRefused` condition and a
  Warning Event.
- `install_refusal_net`: a status patch the API server refuses anyway (a
  rule this guard does not know) is caught around kopf's patch step, so the
  timer keeps running; the callback posts a Warning Event, and the job's next
  passes write only the operator's own fields plus the condition for
  `REFUSED_HOLD_S`, then try the whole status again.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any, Callable, MutableMapping

from elastic_jax.api.job import INT64_MAX

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


RefusedCallback = Callable[[str, str, str], None]  # (namespace, name, the API server's message)
WrittenCallback = Callable[[str, str], None]  # (namespace, name)


def install_refusal_net(group: str, on_refused: RefusedCallback, on_written: WrittenCallback) -> None:
    """Wraps kopf's patch step so that a refused status patch of a `group` object never escapes into kopf.

    kopf (1.45) applies a handler's patch in `kopf._core.actions.application.patch_and_check`,
    after the handler returned: an `APIClientError` there ends a timer's task for good. The
    wrapper catches a 4xx (except 404, which kopf handles) of a patch that has a status, calls
    `on_refused`, and returns as kopf does for an unapplied patch; `on_written` follows each
    status patch of the group that went through. Idempotent.

    Raises:
      RuntimeError: kopf no longer has that step (another kopf version: pin it, or adapt this).
    """
    from kopf._cogs.clients import errors
    from kopf._core.actions import application

    inner = getattr(application, "patch_and_check", None)
    if inner is None:
        raise RuntimeError("kopf._core.actions.application.patch_and_check is gone: adapt status_write")
    if getattr(inner, "_elasticjax_net", False):
        return

    async def patch_and_check(*, settings, resource, body, patch, logger):
        ours = getattr(resource, "group", None) == group and bool(patch) and "status" in patch
        if not ours:
            return await inner(settings=settings, resource=resource, body=body, patch=patch, logger=logger)
        namespace, name = body.metadata.namespace, body.metadata.name
        try:
            result = await inner(settings=settings, resource=resource, body=body, patch=patch, logger=logger)
        except errors.APIClientError as e:
            if isinstance(e, errors.APINotFoundError):
                raise
            message = f"the API server refused the status write ({e.status}): {str(e)[:900]}"
            _logger.error("%s", message, extra={"job": name, "namespace": namespace})
            on_refused(namespace, name, message)
            return None, None
        on_written(namespace, name)
        return result

    patch_and_check._elasticjax_net = True  # type: ignore[attr-defined]
    application.patch_and_check = patch_and_check
