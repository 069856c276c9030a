"""Per-job control-API tokens, derived from the operator's key (no Secret is ever read).

A job's bearer token is HMAC-SHA256(operator key, job UID). The operator
creates the job's Secret holding it (`create` only: it has no `get`, `list`
or `watch` on Secrets anywhere) and computes it again whenever it needs it,
after a restart too. The key is a random Secret in the operator's own
namespace, mounted into the operator pod as a file (the Helm chart creates
it once and keeps it across upgrades). See docs/security.md.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import secrets
from pathlib import Path

_logger = logging.getLogger(__name__)

# Fewer bytes than a SHA-256 block of entropy would make the tokens guessable sooner than HMAC is.
MIN_KEY_BYTES = 32


class OperatorKeyError(ValueError):
    """The operator key file is missing, unreadable or too short."""


def derive_token(key: bytes, job_uid: str) -> str:
    """The control-API bearer token of the job with UID `job_uid` (43 URL-safe characters).

    Raises:
      ValueError: empty `job_uid` (a token must belong to one object).
    """
    if not job_uid:
        raise ValueError("a job token needs the job's UID")
    digest = hmac.new(key, f"elastic-jax/control-token/{job_uid}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(digest).decode().rstrip("=")


def load_key(path: str | None) -> bytes:
    """The operator key from `path`, or a random one for this process when `path` is None.

    A random key changes on every operator restart, so an operator restarted
    with one can no longer talk to running controllers: development only.

    Raises:
      OperatorKeyError: `path` is unreadable or holds fewer than `MIN_KEY_BYTES` bytes.
    """
    if path is None:
        _logger.warning("no operator key file: using a random key for this process only "
                        "(jobs' controllers become unreachable when it restarts)")
        return secrets.token_bytes(MIN_KEY_BYTES)
    try:
        key = Path(path).read_bytes().strip()
    except OSError as e:
        raise OperatorKeyError(f"operator key file {path}: {e.strerror}") from None
    if len(key) < MIN_KEY_BYTES:
        raise OperatorKeyError(f"operator key file {path}: {len(key)} bytes, at least {MIN_KEY_BYTES} needed")
    return key
