"""The `InvalidSpec` Warning Event: posted once per job and cause, whichever path refuses the spec.

A spec is refused on three paths: the create handler (`handlers.job_created`), every reconcile pass that
parses the job again (`job_pass.reconcile_pass`), and a child the API server refused as invalid
(`effects.invalid_child_effects`). The first two run concurrently on a new job (kopf starts its daemon
beside the create handler), so each saw the job not yet Failed and each posted the same Event: one
refusal of `spec.compilationCache` read as two (session 10's trial). All of them post through the job's
Event sink, which asks `PostedOnce.first` here: the first post of a (job UID, message) pair goes out,
every later one is dropped. After an operator restart a Failed job is not refused again (its status says
Failed), so memory per process is enough.
"""

from __future__ import annotations

import collections
import threading

# (job UID, message) pairs remembered; the oldest are forgotten beyond this (a failed job is never
# refused again once its status says Failed, so only the first seconds of a refusal need the memory).
MAX_REMEMBERED = 4096


class PostedOnce:
    """Which (job UID, cause) pairs had their Event posted, in this operator process (thread-safe).

    Args:
      limit: pairs remembered at most (the oldest go first).
    """

    def __init__(self, limit: int = MAX_REMEMBERED):
        self._limit = limit
        self._seen: collections.OrderedDict[tuple[str, str], None] = collections.OrderedDict()
        self._lock = threading.Lock()

    def first(self, uid: str, message: str) -> bool:
        """True the first time `(uid, message)` is asked (post the Event), False every later time (drop it).

        Args:
          uid: the job's metadata.uid ("" when unknown: such posts are never deduplicated).
          message: the refusal as the Event says it (its cause: the field and why).
        """
        if not uid:
            return True
        key = (uid, message)
        with self._lock:
            if key in self._seen:
                return False
            self._seen[key] = None
            while len(self._seen) > self._limit:
                self._seen.popitem(last=False)
            return True


# The operator's one registry (the create handler has no per-job state to keep it in).
POSTED = PostedOnce()
