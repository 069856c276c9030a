"""Everything the operator keeps in memory about one job: one `JobState` per job, in one registry (`Jobs`).

Owner and lifecycle: `Jobs.open` makes a job's state on its first reconcile pass (its daemon's), and
replaces it when a new job (a new UID) takes the name, closing the old one; `Jobs.forget` closes and
drops it when the job's delete event comes. Nothing about a job lives anywhere else in the operator:
the handlers read it from here, the `effects.Applier` writes what applying a pass's effects observed,
and the pod-event handler finds the job's tracker here. What outlives a job is only the registry's
record of the name's last UID (`Jobs.earlier`): its token Secret may still be going when a job of the
same name is created again (`job_pass._earlier_job_evidence`).

Everything here is rebuilt after an operator restart (from the job's status, its children and its
controller): nothing is lost but the throttles' clocks.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable, Iterator

from elastic_jax.api import job as job_api
from elastic_jax.api.status import Goodput
from elastic_jax.k8s_operator.clock import SYSTEM, Clock
from elastic_jax.k8s_operator.tracker import JobTracker
from elastic_jax.k8s_operator.wake import Waker

Key = tuple[str, str]  # (namespace, name)

# Seconds after an earlier job of the same name was seen deleted during which a taken token Secret
# name is read as that job's Secret being garbage-collected (normally gone within a second or two).
EARLIER_SECRET_WAIT_S = 60.0

# Seconds a pass waits for the watch to bring back the job this operator just patched (as kopf's
# settings.persistence.consistency_timeout does for its change handlers); then it acts on what it has.
CONSISTENCY_TIMEOUT_S = 5.0


@dataclasses.dataclass(eq=False)
class JobState:
    """The operator's memory of one job (one UID).

    Attributes:
      namespace, name, uid: the ElasticTrainingJob (a recreated job of this name gets a new JobState).
      created: its metadata.creationTimestamp (`incarnation.own`).
      tracker: its slices and its controller exchange (`tracker.JobTracker`); its clock is the job's (`clock`).
      ref: its object reference, for Events (set by each pass).
      applied: the spec it started with (`job_pass._applied_job`), None until read.
      static_created: (kind, name) of its ConfigMap and Services created (or found its own).
      static_complete: all of them are: the 1 s pass no longer renders them (a YAML dump of the manifest
        per job per second was ~15% of the steady-state operator's CPU).
      token_secret_ours: the operator created its token Secret (in this process, or recorded in status).
      creation_fault, refusal_checked: why its worker pods are missing, from their Job's Events
        (`job_pass._pod_creation_refusals`), and when (monotonic) that was read.
      status_refused: (the API server's message, monotonic time) of its last refused status write.
      created_controller: (pod name, monotonic time) of the controller pod this process created last:
        how long `reconcile.decide` waits for the pod index to show it.
      node_lost_pods: UIDs of its pods force-deleted for a lost node (their NodeLost Event is posted once).
      unwritten_goodput: the newest `status.goodput` total a pass held back (only its time counters moved:
        `goodput.held_back`), carried into a new controller's base (`counters.carry`); None: none held.
      waker: wakes its reconcile daemon (`wake`); its tracker's controller link news wakes it too.
      missed_losses_checked: its first pass compared the slices' restarts with the ones written before this
        process (`missed_losses`): worker losses while no operator ran get their SliceDown Event once.
    """

    namespace: str
    name: str
    uid: str
    created: str
    tracker: JobTracker
    ref: dict | None = None
    applied: job_api.ElasticTrainingJob | None = None
    static_created: set[tuple[str, str]] = dataclasses.field(default_factory=set)
    static_complete: bool = False
    token_secret_ours: bool = False
    creation_fault: Any = None
    refusal_checked: float = float("-inf")
    status_refused: tuple[str, float] | None = None
    created_controller: tuple[str, float] | None = None
    node_lost_pods: set[str] = dataclasses.field(default_factory=set)
    unwritten_goodput: Goodput | None = None
    missed_losses_checked: bool = False
    waker: Waker = dataclasses.field(default_factory=Waker)
    # (resourceVersion, monotonic time) of the job object the last pass patched from (`body_behind`).
    _patched_from: tuple[str, float] | None = None
    # monotonic time of the last pass that wrote its status (`since_status_write`).
    _status_written_at: float | None = None

    def __post_init__(self) -> None:
        self.tracker.on_news = self.waker.wake  # the link's news (a new answer, a failure) wakes the pass

    @property
    def key(self) -> Key:
        return self.namespace, self.name

    @property
    def clock(self) -> Clock:
        """The job's clock: its tracker's (one per job, so the job's times and its tracker's never disagree)."""
        return self.tracker.clock

    def body_behind(self, resource_version: str, now: float) -> bool:
        """Whether the job object of this pass is the one the last pass read *and patched*.

        kopf hands a timer the object from its watch, not from its own PATCH: until
        the watch brings the patched version back, status (controllerPod,
        controllerRestarts, phase) is older than what this operator wrote, and a
        pass acting on it would undo or repeat the last one (a second replacement
        controller, a counter reset). Such a pass waits, up to CONSISTENCY_TIMEOUT_S.

        Args:
          resource_version: metadata.resourceVersion of this pass's object ("" never waits).
          now: `clock.monotonic()`, in seconds.
        """
        last = self._patched_from
        return bool(resource_version) and last is not None and last[0] == resource_version \
            and now - last[1] < CONSISTENCY_TIMEOUT_S

    def patched(self, resource_version: str, wrote: bool, now: float) -> None:
        """Records that the pass that read `resource_version` wrote status (`wrote`) or not."""
        self._patched_from = (resource_version, now) if wrote and resource_version else None
        if wrote:
            self._status_written_at = now

    def since_status_write(self, now: float) -> float | None:
        """Seconds (`now`: monotonic) since a pass of this process last wrote the job's status; None: none did
        (`status_decision.COUNTER_WRITE_S`)."""
        return None if self._status_written_at is None else now - self._status_written_at

    def expected_pod_age_s(self, name: str) -> float | None:
        """Seconds since this process created controller pod `name`; None if it did not (or not last)."""
        if self.created_controller is None or self.created_controller[0] != name:
            return None
        return self.clock.monotonic() - self.created_controller[1]

    def close(self) -> None:
        """The job is gone (or replaced by a new job of its name): its children's end is no news, and its
        controller link stops."""
        self.tracker.deleting = True
        self.tracker.close()


    def wake(self) -> None:
        """Asks for a pass of this job soon (`wake.Waker.wake`): something it reads may have changed."""
        self.waker.wake()


class Jobs:
    """The operator's `JobState`s by (namespace, name): the one owner of per-job memory. Thread-safe (the
    pod-event handler reads it from kopf's executor while a timer pass opens or a delete forgets).

    Args:
      clock: what `earlier`'s wait reads (`OperatorState.clock`).
    """

    def __init__(self, clock: Clock = SYSTEM) -> None:
        self._clock = clock
        self._by_key: dict[Key, JobState] = {}
        self._earlier: dict[Key, tuple[str, float]] = {}
        self._lock = threading.Lock()

    def get(self, key: Key) -> JobState | None:
        """The job of that name this operator follows now (None: not reconciled yet, or deleted)."""
        with self._lock:
            return self._by_key.get(key)

    def tracker(self, key: Key) -> JobTracker | None:
        """`get(key).tracker`, or None."""
        job = self.get(key)
        return job.tracker if job is not None else None

    def add(self, job: JobState) -> JobState:
        """Makes `job` the state of its name (the previous one, of another UID, is closed and remembered)."""
        with self._lock:
            previous = self._by_key.get(job.key)
            if previous is not None and previous is not job:
                self._remember(job.key, previous.uid)
                previous.close()
            self._by_key[job.key] = job
        return job

    def open(self, key: Key, uid: str, created: str, make_tracker: Callable[[], JobTracker]) -> JobState:
        """The state of job `uid` of that name: the existing one, or a new one (with `make_tracker()`) when
        there is none or it is an earlier job's (nothing carries over from it)."""
        with self._lock:
            current = self._by_key.get(key)
            if current is not None and current.uid == uid:
                return current
        return self.add(JobState(key[0], key[1], uid, created, make_tracker()))

    def forget(self, key: Key, uid: str) -> None:
        """Job `uid` of that name was deleted: its state is closed and dropped (a newer job's, of the same
        name, never), and the name remembered as just deleted (`earlier`)."""
        with self._lock:
            self._remember(key, uid)
            current = self._by_key.get(key)
            if current is None or current.uid not in ("", uid):
                return
            del self._by_key[key]
        current.close()

    def earlier(self, key: Key, uid: str) -> bool:
        """Whether another job of that name than `uid` was deleted or replaced within EARLIER_SECRET_WAIT_S."""
        with self._lock:
            seen = self._earlier.get(key)
        return seen is not None and seen[0] != uid and self._clock.monotonic() - seen[1] < EARLIER_SECRET_WAIT_S

    def wake(self, key: Key, uid: str | None = None) -> None:
        """Wakes the pass of the job of that name (only if it is job `uid`, when given); a no-op for a job
        not reconciled yet (its daemon passes every `wake.PASS_INTERVAL_S` until its first pass)."""
        job = self.get(key)
        if job is not None and (uid is None or job.uid == uid):
            job.wake()

    def __iter__(self) -> Iterator[JobState]:
        with self._lock:
            return iter(list(self._by_key.values()))

    def __contains__(self, key: Key) -> bool:
        return self.get(key) is not None

    def _remember(self, key: Key, uid: str) -> None:
        """Call with the lock. Also drops records older than EARLIER_SECRET_WAIT_S (the map stays small)."""
        now = self._clock.monotonic()
        self._earlier = {k: v for k, v in self._earlier.items() if now - v[1] < EARLIER_SECRET_WAIT_S}
        self._earlier[key] = (uid, now)
