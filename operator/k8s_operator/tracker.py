"""Per-job slice tracking and controller notification (the operator's in-memory view of slices).

One `JobTracker` per job, held by the job's `job_state.JobState`. Pod events
and the periodic reconcile both call `observe()` (pods → slice states
`slices`, transitions → Events) and then apply an `effects.ReportSlices`,
which calls `report()`: every state the current controller has not
acknowledged yet → `PUT /v1/slices/{i}`. Generations are nanosecond
timestamps, so they keep increasing across operator restarts without any
stored counter. A new controller process (new pod UID) knows nothing, so
every slice is re-sent to it.

Two paths read the pod index and observe: the pod-event handler and the 1 s
timer, whose status poll may land between its read and its observation. With
`background` (the operator's setting), every exchange with the controller runs
on the job's own `ControllerLink` threads, never on a kopf handler thread: the
handlers only ask, and read the last answer of the link's status watch (a long
poll, `refresh_status`). A
snapshot is applied only if it is not older than the last one applied
(`observation()` marks, and each pod's resourceVersion), so a slow timer pass
never turns a slice that just became Ready back into "0/1 hosts ready".
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Callable, Iterable, Mapping

from elastic_jax.api.client import ControlApiError, ControlClient
from elastic_jax.api.control import ControllerStatus
from elastic_jax.api.status import EVENT_CONTROLLER_NOTIFIED, SliceState, SliceStatusEntry
from elastic_jax.k8s_operator import metrics, names
from elastic_jax.k8s_operator.clock import SYSTEM, Clock
from elastic_jax.api.status import REASON_CONTROLLER_GONE
from elastic_jax.k8s_operator.conditions import ANSWERED_AGAIN, now_rfc3339
from elastic_jax.k8s_operator.controller_link import ControllerLink
from elastic_jax.k8s_operator.slices import PodView, group_by_slice, next_slice_state, observe_slice
from elastic_jax.supervision.slice_state import controller_saw_down, is_loss, next_generation
from elastic_jax.supervision import controller_watch

_logger = logging.getLogger(__name__)

EventSink = Callable[[str, str, str], None]


@dataclasses.dataclass
class SliceTrack:
    """The operator's state of one slice."""

    index: int
    state: SliceState = "Provisioning"
    addresses: tuple[str, ...] = ()
    pods: tuple[str, ...] = ()
    reason: str = ""
    since: str = ""
    # (controller uid, state, addresses, pods) the controller acknowledged, and with which generation. The pods
    # count: a replacement pod at the same address is a new worker the controller must be told of.
    acked: tuple[str, str, tuple[str, ...], tuple[str, ...]] | None = None
    acked_generation: int = 0
    # the generation last sent for this slice, accepted or not (`next_generation` stays above it).
    sent_generation: int = 0
    # monotonic time the current Down was first seen (for the notify-latency metric).
    down_seen_at: float | None = None
    # why the controller failed the slice whose pods the operator deletes for it (`replacing`): its Down says so
    controller_cause: str = ""
    # Ready from the status the previous operator wrote (`seed`), not seen to change since: its Ready may be one
    # the controller holds already, at these addresses (`notify` adopts it rather than re-sending it).
    seeded: bool = False


# Seconds a controller's answers must stay unusable (too big, too slow, malformed, refused) before the job
# says so (condition ControllerAnswersRefused, a Warning Event): a few exchanges 1 s apart, so one slow answer is no news.
ANSWER_FAULT_GRACE_S = 5.0

# Seconds the current controller, once it has answered, may go without answering any exchange (its exchanges
# failing with no HTTP answer: timeouts, refused or reset connections) before the job says so (condition
# ControllerUnresponsive, a Warning Event); the rule `elastic-jax run` applies too (`supervision.controller_watch`).
UNRESPONSIVE_GRACE_S = controller_watch.UNRESPONSIVE_GRACE_S

# The controller's views of a slice it holds up (in its mesh, joining, warming, a spare): a seeded Ready at the
# same addresses is one it already has (`JobTracker.notify`).
_HELD_UP = ("Active", "Ready", "Warming", "Spare")


@dataclasses.dataclass(frozen=True)
class Freeze:
    """One spell of the current controller without an answer, ended by its answer, while it trained.

    Attributes:
      ended_at: when it answered again (Unix seconds: its identity across passes and operator restarts,
        `counterBase.frozenUntil`).
      seconds: from its last answer before the spell to the answer that ended it, at most what its ledger
        booked as training meanwhile (`controller_watch.freeze_training_s`).
      booked_as: the category its ledger booked them in (`controller_watch.freeze_booked_as`): productive or reduced.
    """

    ended_at: float
    seconds: float
    booked_as: str


# Seconds between two full passes of a quiet job (`quiet`), at first: a net for what a pass's inputs miss.
QUIET_RESYNC_S = 30.0
# ... doubled by each such resync pass that finds the job quiet with its inputs unchanged, up to this. At 30 s a
# healthy job cost ~0.03 s of operator CPU a minute in resync passes alone (50 serve-only jobs, issue 12
# item 4): the one per-job cost left that did not flatten with the watches. Anything that moves a pass input
# (a pod, a JobSet, the job object, the controller's news, the not-Ready nodes) starts again at QUIET_RESYNC_S.
QUIET_RESYNC_MAX_S = 240.0


def resync_window_s(resyncs: int) -> float:
    """Seconds a quiet job's passes are skipped after its last full pass (`JobTracker.quiet`).

    Args:
      resyncs: full passes in a row that found the job quiet with the same inputs as the quiet pass before
        them (`next_resyncs`); 0 after a pass whose inputs moved.

    Returns:
      QUIET_RESYNC_S doubled `resyncs` times, at most QUIET_RESYNC_MAX_S (read at each call, so a test
      that sets QUIET_RESYNC_S to 0 gets a full pass at once).
    """
    return min(QUIET_RESYNC_MAX_S, QUIET_RESYNC_S * 2.0 ** min(max(resyncs, 0), 32))


def next_resyncs(previous: int | None, same_inputs: bool) -> int:
    """The `resyncs` count a quiet pass records (the back-off of the quiet resync, `resync_window_s`).

    Args:
      previous: the count the quiet pass before it recorded; None when the pass before was not quiet.
      same_inputs: this pass read the same inputs as that quiet pass, so it ran only because the window
        ended (a resync that found nothing): the next window doubles.

    Returns:
      previous + 1 for a resync that found nothing; 0 otherwise (something moved, or the job was not quiet).
    """
    if previous is None or not same_inputs:
        return 0
    return previous + 1

def _version(resource_version: str) -> int | None:
    """A resourceVersion as a number to order two reads of one object (None when it is not one)."""
    return int(resource_version) if resource_version.isdigit() else None


class JobTracker:
    """Tracks one job's slices and talks to its controller.

    Args:
      namespace, name: the job.
      slice_count, hosts_per_slice: from the spec (slice_count: spec.slices.total, spares included).
      client_factory: builds a `ControlClient` for (base_url, token); tests pass their own.
      background: run the controller exchanges on this job's own thread (`ControllerLink`): `report` and
        `refresh_status` then never wait on HTTP. False (unit tests of the decisions): in the caller.
      clock: what its times read (`clock.Clock`; the operator's, `OperatorState.clock`): every "monotonic
        time" below is `clock.monotonic()`, in seconds.
    """

    def __init__(self, namespace: str, name: str, slice_count: int, hosts_per_slice: int,
                 client_factory: Callable[[str, str], ControlClient] = ControlClient, background: bool = False,
                 clock: Clock = SYSTEM):
        self.clock = clock
        self.namespace = namespace
        self.name = name
        self.hosts_per_slice = hosts_per_slice
        self.slices = [SliceTrack(i) for i in range(slice_count)]
        self.lock = threading.RLock()
        self.token: str | None = None
        self.controller_uid = ""
        self.controller_url = ""
        self.client: ControlClient | None = None
        self.client_factory = client_factory
        self.last_status: ControllerStatus | None = None  # the current controller's last good answer
        self.poll_result: ControllerStatus | None = None  # the last poll's answer (None: that poll failed)
        self.answer_uid = ""  # the controller pod `poll_result` came from (it may be gone since)
        self._answer_fresh = False  # `poll_result` arrived after the last `refresh_status`
        # (why, monotonic time since) the current controller's answers are unusable (`ControlApiError.INVALID`,
        # or a 4xx other than 401); None while it answers well, is starting, or is unreachable.
        self.answer_fault: tuple[str, float] | None = None
        # (last error, monotonic time of the last answer) while the current controller, which has answered
        # before, fails its exchanges with no HTTP answer (`ControlApiError.UNREACHABLE`, no status code);
        # None while it answers.
        self.unanswered: tuple[str, float] | None = None
        self._answered_at = 0.0  # monotonic time of the current controller's last answer (status or report)
        self._unresponsive_logged = False  # the unresponsive warning was logged for the current `unanswered`
        # (reason, message) of how the last `unanswered` ended: it answered, or it is not the current controller
        # any more (`unresponsive_ended`).
        self._unanswered_end = ANSWERED_AGAIN
        # The current controller's last answer before its `unanswered` began (what its ledger books a freeze as).
        self._before_unanswered: ControllerStatus | None = None
        # The current controller's freezes it answered again after, while training (`Freeze`; `counters.carry`
        # re-books them `recovering` once each). Emptied for a new controller.
        self.freezes: list[Freeze] = []
        self._events: EventSink | None = None  # the sink the link's reports post to (the latest `sync`'s)
        self.link = ControllerLink(name, self._link_report, self.poll_status) if background else None
        self.finished = False
        # spec.suspend: the slices go Down because the operator removes them, not because they failed.
        self.suspended = False
        # The controller's 401 to this operator's token (another operator key made the job's Secret),
        # None once a report is accepted.
        self.token_refused: str | None = None
        # Observation order of the pod snapshots given to `sync` (see `observation`).
        self._marks_issued = 0
        self._mark_applied = 0
        # pod UID -> the newest resourceVersion of it that `sync` applied (only the last snapshot's pods).
        self._pod_versions: dict[str, int] = {}
        # The job is being deleted (deletionTimestamp, or its delete event): its children's end is no news.
        self.deleting = False
        # Exchanges of the status watch that brought news (failed, or an answer other than the last): a pass
        # input (`quiet`). An answer the same as the last one (a long poll's end) is no news.
        self.answers = 0
        # Called (from any thread, with or without the lock; must not block) when the controller link brings
        # news: a status answer that differs from the last one, or a failed exchange (`wake.Waker.wake`).
        self.on_news: Callable[[], None] | None = None
        # (inputs, monotonic time, resyncs) of the last pass that found the job whole and changed nothing (`settle`).
        self._quiet: tuple[tuple, float, int] | None = None
        self.last_pass_quiet = False  # the last pass found the job whole and changed nothing (`job_pass._pass`)
        # When (monotonic) a pass is due whatever its inputs: the end of a controller restart's back-off
        # (`reconcile.Plan.wake_in_s`); None: none. A quiet window ends there (`quiet`, `quiet_until`).
        self.wake_at: float | None = None

    def quiet(self, inputs: tuple, now: float) -> bool:
        """Whether a pass would do nothing: its `inputs` are those of the last pass that found the job whole and
        changed nothing (`settle`), less than its window ago (`resync_window_s`: QUIET_RESYNC_S, doubled by each
        resync pass that found nothing moved; `now`: monotonic).

        The woken daemon then skips the pass: a healthy job with no news costs no pass
        (issue 12 item 4). What a pass reads that can change is in `inputs` (the job object's
        resourceVersion, its pods and JobSets, the watch's answers, `job_pass.pass_inputs`).
        """
        quiet, wake_at = self._quiet, self.wake_at
        if wake_at is not None and now >= wake_at:
            return False
        return quiet is not None and quiet[0] == inputs and now - quiet[1] < resync_window_s(quiet[2])

    def quiet_until(self) -> float | None:
        """When (monotonic) the last quiet pass's window ends (`resync_window_s` after it, then a full pass is
        due), or `wake_at` when that is sooner; None when the last pass was not quiet."""
        quiet, wake_at = self._quiet, self.wake_at
        if quiet is None:
            return None
        end = quiet[1] + resync_window_s(quiet[2])
        return end if wake_at is None else min(end, wake_at)

    def _news(self) -> None:
        """The link brought news: counted as a pass input (`answers`), and the job's pass woken."""
        self.answers += 1
        if self.on_news is not None:
            self.on_news()

    def settle(self, inputs: tuple | None, quiet: bool, now: float) -> None:
        """Records a pass's end: `quiet` (whole, nothing written, posted or created) keeps its `inputs` (read
        before the pass) for `quiet`, and backs the next resync off when they are the last quiet pass's
        (`next_resyncs`); otherwise the next pass runs whatever its inputs."""
        if not quiet or inputs is None:
            self._quiet = None
            return
        last = self._quiet
        resyncs = next_resyncs(None if last is None else last[2], last is not None and last[0] == inputs)
        self._quiet = (inputs, now, resyncs)

    @property
    def teardown(self) -> bool:
        """The job's children go away on purpose (finished, suspended, deleted): no loss, no Warning, nothing counted."""
        return self.finished or self.suspended or self.deleting

    def observation(self) -> int:
        """A mark of observation order: take it *before* reading the pod index, pass it to `sync`.

        Returns:
          An increasing number; `sync` ignores the slice states of a snapshot whose
          mark is older than one it already applied (that snapshot was read first,
          so it cannot be newer).
        """
        with self.lock:
            self._marks_issued += 1
            return self._marks_issued

    def _stale(self, pods: list[PodView], mark: int | None) -> str:
        """Why this pod snapshot is older than what was applied ("" when it is not)."""
        if mark is not None and mark < self._mark_applied:
            return f"read before snapshot {self._mark_applied} already applied (this one is {mark})"
        for p in pods:
            seen = self._pod_versions.get(p.uid)
            version = _version(p.resource_version)
            if seen is not None and version is not None and version < seen:
                return f"pod {p.name} at resourceVersion {version}, {seen} already applied"
        return ""

    def _applied(self, pods: list[PodView], mark: int | None) -> None:
        if mark is not None:
            self._mark_applied = max(self._mark_applied, mark)
        versions = {}
        for p in pods:
            version = _version(p.resource_version)
            if version is not None:
                versions[p.uid] = max(version, self._pod_versions.get(p.uid, version))
        self._pod_versions = versions

    # -- controller --------------------------------------------------------

    def set_controller(self, pod: PodView | None, stopping: bool = False) -> None:
        """Points the tracker at the current controller pod (None: no reachable controller).

        Args:
          pod: the controller pod to poll and notify.
          stopping: the pod is being stopped on purpose (a suspend): it is still polled while it
            runs, deletion timestamp or not, so status gets the step and checkpoint its stop saved.
        """
        with self.lock:
            uid = (pod.uid if pod is not None and pod.pod_ip and pod.phase == "Running" and (stopping or not pod.deleting)
                   else "")
            if uid == self.controller_uid:
                return
            if self.client is not None:
                self.client.close()
            self.client = None
            self.controller_uid = uid
            if self.unanswered is not None:
                now = f"controller pod {pod.name} is" if uid else "no controller pod is running"
                self._unanswered_end = (REASON_CONTROLLER_GONE, f"the controller that did not answer is gone ({now} "
                                                                "the current one)")
            self.last_status = self.answer_fault = self.unanswered = self._before_unanswered = None
            self._unresponsive_logged = False
            self.freezes = []
            if not self._answer_fresh:
                # (a fresh one is the parting controller's last word, e.g. the checkpoint its stop saved:
                # `refresh_status` hands it over once)
                self.poll_result, self.answer_uid = None, ""
            if uid and self.token:
                self.controller_url = f"http://{pod.pod_ip}:{names.CONTROLLER_PORT}"
                self.client = self.client_factory(self.controller_url, self.token)
                # short timeout: a dead controller must not delay the others' notifications
                _logger.info("controller %s at %s", pod.name, self.controller_url,
                             extra={"job": self.name, "controller_uid": uid})
                if self.link is not None:
                    self.link.request(poll=True)  # the watch asks the new controller now

    def poll_status(self, after: int | None = None, wait_s: float = 0.0) -> ControllerStatus | None:
        """`GET /v1/status` of the current controller, in the caller (None when unreachable or unusable).

        Args:
          after, wait_s: a long poll (`ControlClient.status`): the answer comes once the status's version
            is not `after`, or after `wait_s` seconds (the link's watch passes them; 0: at once).
        """
        with self.lock:
            client, uid = self.client, self.controller_uid
        if client is None:
            return None
        try:
            status = client.status(after=after, wait_s=wait_s)
        except ControlApiError as e:
            with self.lock:
                if client is self.client:
                    self.poll_result, self.answer_uid, self._answer_fresh = None, "", False
                    self._answer_failed(e)
                self._news()  # (a failure is always news: the controller may be gone, a new one due)
            return None
        with self.lock:
            if client is not self.client or self.poll_result is None or self.answer_uid != uid \
                    or status != self.poll_result or self.answer_fault is not None or self.unanswered is not None:
                self._news()  # (also a good answer after refused or unanswered ones: a condition to clear)
            if client is self.client:
                self.last_status = self.poll_result = status
                self.answer_uid, self._answer_fresh = uid, True
                if self.answer_fault is not None:
                    _logger.info("controller answers again", extra={"job": self.name})
                self.answer_fault = None
                self._answered()
        return status

    def refresh_status(self) -> ControllerStatus | None:
        """The timer's read of the controller: with `background`, the link's watch's last answer, at once,
        no HTTP (None when its last exchange failed); without, polls now (`poll_status`).

        `answer_uid` names the controller pod the answer came from: with `background`, the answer of a
        controller that has just gone (a suspend's stop, a loss) is returned once, after it went, so
        the step and checkpoint it reported last still reach status.
        """
        if self.link is None:
            status = self.poll_status()
            with self.lock:
                self._answer_fresh = False
            return status
        with self.lock:
            status, fresh = self.poll_result, self._answer_fresh
            self._answer_fresh = False
            if self.answer_uid != self.controller_uid:
                self.poll_result = None  # the parting word: once (`answer_uid` still names it for this pass)
                return status if fresh else None
            return status

    def _answered(self) -> None:
        """Records an answer of the current controller: it is responsive again. Call with the lock."""
        self._answered_at = self.clock.monotonic()
        if self.unanswered is not None:
            self._unanswered_end = ANSWERED_AGAIN
            self._note_freeze(self._answered_at - self.unanswered[1])
        if self.unanswered is not None and self._unresponsive_logged:
            _logger.info("controller answers again after %.0f s without an answer",
                         self._answered_at - self.unanswered[1], extra={"job": self.name})
        self.unanswered, self._unresponsive_logged = None, False

    def _note_freeze(self, seconds: float) -> None:
        """The current controller answers again after `seconds` without an answer: a freeze (`Freeze`) when that
        reached UNRESPONSIVE_GRACE_S (the spell the condition ControllerUnresponsive tells) and its last answer
        before was training; its ledger booked those seconds as training. Call with the lock."""
        last = self._before_unanswered
        if last is None or seconds < UNRESPONSIVE_GRACE_S:
            return
        booked = controller_watch.freeze_booked_as(last.phase, last.goodput is not None, len(last.active_slices),
                                                   last.desired_slices)
        if booked is not None and self.last_status is not None:  # (`last_status`: the answer that ended it)
            seconds = controller_watch.freeze_training_s(last.goodput_seconds, self.last_status.goodput_seconds,
                                                         seconds)
        if booked is not None and seconds > 0:
            self.freezes.append(Freeze(round(self.clock.now().timestamp(), 3), round(seconds, 3), booked))
            _logger.info("controller was frozen %.0f s while training: booked recovering, not %s", seconds, booked,
                         extra={"job": self.name, "controller_uid": self.controller_uid})

    def _answer_failed(self, error: ControlApiError) -> None:
        """Records a failed exchange: an unusable answer starts (or continues) `answer_fault`; no answer at all
        from a controller that answered before starts (or continues) `unanswered`. Call with the lock."""
        if error.kind == ControlApiError.UNREACHABLE:
            if self.last_status is not None and error.status_code is None:
                # no HTTP answer at all (a 5xx is one: the process lives); never answered yet: starting
                if self.unanswered is None:
                    self._before_unanswered = self.last_status
                self.unanswered = (str(error)[:900], self._answered_at)
            return  # starting or gone: the pod tells
        if error.status_code == 401:
            return  # a 401 is `token_refused`
        since = self.answer_fault[1] if self.answer_fault is not None else self.clock.monotonic()
        if self.answer_fault is None:
            _logger.warning("controller answer refused: %s", error, extra={"job": self.name})
        self.answer_fault = (str(error)[:900], since)

    def answer_fault_message(self, now: float) -> str | None:
        """Why the controller's answers are refused, once that lasted ANSWER_FAULT_GRACE_S (`now`: monotonic)."""
        with self.lock:
            fault = self.answer_fault
        if fault is None or now - fault[1] < ANSWER_FAULT_GRACE_S:
            return None
        return (f"the controller's answers have been refused for over {ANSWER_FAULT_GRACE_S:.0f} s, so its status "
                f"and slice reports are not used: {fault[0]}")

    def unresponsive_ended(self) -> tuple[str, str]:
        """(reason, message) of how the controller's last unresponsive spell ended: REASON_CONTROLLER_ANSWERING
        when it answered again, REASON_CONTROLLER_GONE when another controller pod (or none) became the current
        one. What clears condition ControllerUnresponsive says (`status_builder.with_controller_unresponsive`)."""
        with self.lock:
            return self._unanswered_end

    def unresponsive_message(self, now: float) -> str | None:
        """Why the current controller counts as unresponsive, once it went UNRESPONSIVE_GRACE_S without
        answering (`now`: monotonic), else None. Logs a warning the first time it says so."""
        with self.lock:
            unanswered = self.unanswered
            seconds = controller_watch.unresponsive_seconds(unanswered[1] if unanswered else None, now,
                                                            UNRESPONSIVE_GRACE_S)
            if seconds is None:
                return None
            if not self._unresponsive_logged:
                self._unresponsive_logged = True
                _logger.warning("controller has not answered for %.0f s: %s", seconds, unanswered[0],
                                extra={"job": self.name, "controller_uid": self.controller_uid})
        return (f"the controller pod runs but its control API has not answered for {seconds:.0f} s (frozen or "
                f"wedged? its livenessProbe restarts it if this lasts); last error: {unanswered[0]}")

    # -- slices ------------------------------------------------------------

    def seed(self, entries: Iterable[SliceStatusEntry]) -> None:
        """Starts from the slice states the previous operator wrote (`status.slices`), not from Provisioning.

        A new operator process (restarted, rescheduled) otherwise announced `Provisioning -> Ready` for
        slices Ready all along. State, addresses, reason and time are taken; the pods are not: a pod missing
        now from pods this process never saw proves no loss (the JobSet's restarts say so,
        `missed_losses`). The controller is told every state it does not hold: a seeded Ready waits for the
        controller's first answer, and is adopted as acknowledged when that answer holds the slice up at the
        same addresses (`notify`); otherwise it is sent. Entries of indices this job does not have are ignored.
        """
        with self.lock:
            for e in entries:
                if 0 <= e.index < len(self.slices) and e.state != "Provisioning":
                    track = self.slices[e.index]
                    track.state, track.reason, track.since = e.state, e.reason, e.last_transition_time or ""
                    track.addresses = tuple(e.addresses) if e.state == "Ready" else ()
                    track.seeded = e.state == "Ready"

    def unseed(self, indices: Iterable[int]) -> None:
        """Slices replaced while no operator ran (`missed_losses`): their seeded Ready is never adopted (the
        controller may hold the lost worker at those addresses); they are sent as any other state."""
        with self.lock:
            for i in indices:
                if 0 <= i < len(self.slices):
                    self.slices[i].seeded = False

    def sync(self, pods: list[PodView], events: EventSink, retries: int = 1,
             lost_nodes: Mapping[str, str] | None = None, observed_at: int | None = None,
             jobsets_alive: set[int] | None = None, seen_at: float | None = None) -> None:
        """`observe`, then `report` (the handlers do the two apart: the report is an effect,
        `effects.ReportSlices`, applied after the pass's other effects)."""
        if self.observe(pods, events, lost_nodes, observed_at, jobsets_alive, seen_at):
            self.report(events, retries)

    def observe(self, pods: list[PodView], events: EventSink, lost_nodes: Mapping[str, str] | None = None,
                observed_at: int | None = None, jobsets_alive: set[int] | None = None,
                seen_at: float | None = None) -> bool:
        """Recomputes slice states from the job's worker pods; True when the controller is to be told (`report`).

        A snapshot older than one already applied (by `observed_at`, or a pod's
        resourceVersion below the one applied) changes no slice state: the
        controller is only sent what it has not acknowledged yet.

        Args:
          pods: the job's pods (from the index).
          events: posts a Kubernetes Event (type, reason, message).
          lost_nodes: node name -> why, for nodes not Ready longer than the operator's bound
            (`observe_slice`); a slice already Down for another reason ("0/1 hosts ready":
            the node controller marked its pod not ready first) takes the node's reason.
          observed_at: `observation()` taken before `pods` was read (None: order unknown,
            only resourceVersions are compared).
          jobsets_alive: slice indices whose JobSet exists and is not being deleted (None: not
            known). A slice whose JobSet is gone or going loses its pods on purpose (the job's
            deletion, the garbage collector, a Pathways head restart): the controller is told,
            but it is no replacement and no Warning.
          seen_at: the monotonic time (`clock`) the pod event was seen (the start of the notify-latency
            metric); None: now.
        """
        with self.lock:
            stale = self._stale(pods, observed_at)
            if stale:
                _logger.debug("pod snapshot not applied: %s", stale, extra={"job": self.name})
            else:
                self._apply(pods, events, lost_nodes, jobsets_alive, seen_at)
                self._applied(pods, observed_at)
            return not (self.finished or self.deleting)

    def report(self, events: EventSink, retries: int = 1) -> None:
        """Sends the controller every slice state it has not acknowledged (`notify`): with `background`, asks
        the job's link (returns at once); without, now, in the caller.

        Args:
          events: posts a Kubernetes Event (type, reason, message): ControllerNotified.
          retries: per report, on connection errors/5xx (each then waits in the next report).
        """
        if self.link is None:
            self.notify(events, retries)  # outside the lock: HTTP to the controller
            return
        with self.lock:
            self._events = events
        self.link.request(report_retries=retries)

    def _link_report(self, retries: int) -> None:
        """The link's reports: `notify` with the sink of the latest `sync`."""
        events = self._events
        if events is not None:
            self.notify(events, retries)

    def _apply(self, pods: list[PodView], events: EventSink, lost_nodes: Mapping[str, str] | None,
               jobsets_alive: set[int] | None = None, seen_at: float | None = None) -> None:
        """Slice transitions from one pod snapshot: states, Events, the replacement count."""
        with self.lock:
            now = self.clock.monotonic()
            for i, slice_pods in group_by_slice(pods, len(self.slices)).items():
                track = self.slices[i]
                # a Ready slice's pod that vanishes unseen was killed/force-deleted, not drained
                known = track.pods if track.state == "Ready" else ()
                obs = observe_slice(slice_pods, self.hosts_per_slice, known=known, lost_nodes=lost_nodes)
                new = next_slice_state(track.state, obs)
                changed = new != track.state or (new == "Ready" and obs.addresses != track.addresses)
                track.pods = obs.pods
                if not changed:
                    if new == "Down" and obs.node and track.reason != obs.reason:
                        # Same state, better reason: status names the node (the controller already has Down).
                        track.reason = obs.reason
                    continue
                old = track.state
                track.seeded = False  # (a state this process saw: told as any other)
                reason = obs.reason
                if new == "Down" and track.controller_cause:
                    reason = f"the controller saw the slice fail ({track.controller_cause}), so the operator " \
                             f"replaced its worker; {reason}"
                if new in ("Down", "Ready"):
                    track.controller_cause = ""  # (said once, on the Down it caused)
                track.state, track.reason, track.since = new, reason, now_rfc3339(self.clock)
                track.addresses = obs.addresses if new == "Ready" else ()
                if new in ("Down", "Draining") and track.down_seen_at is None:
                    track.down_seen_at = now if seen_at is None else min(seen_at, now)
                # A finished or suspended job's teardown is neither a failure nor news: no Warning
                # SliceDown/SliceDraining, and no replacement counted (the metric said 8 after 2 losses).
                teardown = self.teardown or (jobsets_alive is not None and i not in jobsets_alive)
                if is_loss(old, new, teardown):
                    metrics.SLICE_REPLACEMENTS.inc()
                kind = "Normal" if new in ("Ready", "Provisioning") else "Warning"
                detail = f": {reason}" if reason else ""
                where = f" at {', '.join(track.addresses)}" if new == "Ready" else ""
                if not teardown:
                    events(kind, f"Slice{new}", f"slice {i} {old} -> {new}{where}{detail}")
                _logger.info("slice %d %s -> %s", i, old, new,
                             extra={"job": self.name, "slice": i, "from": old, "to": new, "reason": obs.reason})

    def notify(self, events: EventSink, retries: int = 1) -> None:
        """Sends every slice state the current controller has not acknowledged.

        The lock is held only to choose the reports and to record their
        answers, never across the HTTP calls (with retries, seconds to a
        controller that does not answer), so the pod-event handler and the
        timer never wait on each other's HTTP. Two passes may then send the
        same slice; the generations order them (the controller drops the older),
        and an answer is recorded only if it is newer than the one recorded.
        """
        with self.lock:
            client, uid = self.client, self.controller_uid
            if client is None:
                return
            pending = []
            for track in self.slices:
                if track.state == "Provisioning":
                    continue  # the controller treats an unreported slice as not there yet
                want = self._report_of(track, uid)
                if track.acked == want:
                    continue
                if track.seeded and track.state == "Ready" and track.acked is None:
                    if self.last_status is None:
                        continue  # (a restarted operator: the controller's first answer says whether it holds it)
                    track.seeded = False
                    view = next((v for v in self.last_status.slices if v.index == track.index), None)
                    if view is not None and view.state in _HELD_UP and tuple(view.addresses) == track.addresses:
                        # The controller holds this Ready from the previous operator: a new generation would make
                        # it take the same worker for a new one (trial: re-sent on every operator restart).
                        track.acked, track.acked_generation = want, view.generation
                        track.sent_generation = max(track.sent_generation, view.generation)
                        _logger.info("controller holds slice %d Ready already (generation %d): adopted",
                                     track.index, view.generation, extra={"job": self.name, "slice": track.index})
                        continue
                track.sent_generation = next_generation(track.sent_generation)
                pending.append((track, want, track.sent_generation, track.reason or None))
        for track, want, generation, reason in pending:
            _, state, addresses, _ = want
            try:
                client.report_slice(track.index, state, generation, list(addresses), reason,
                                    retries=retries, backoff_s=0.05)
            except ControlApiError as e:
                with self.lock:
                    if e.status_code == 401:
                        self.token_refused = str(e)
                    if client is self.client:
                        self._news()  # (a failed report: the controller refused the token, or may be gone)
                    # A new controller's pod runs before its control API listens: a refused connection
                    # then is its start-up, not a failed report (it counted one error per job start).
                    starting = e.kind == ControlApiError.UNREACHABLE and self.last_status is None
                    if client is self.client:
                        self._answer_failed(e)
                metrics.NOTIFICATIONS.labels(state, "starting" if starting else "error").inc()
                # A starting controller refuses each report until it listens: at debug, not a line per try.
                (_logger.debug if starting else _logger.warning)(
                    "could not report slice %d %s%s: %s", track.index, state,
                    " (controller starting)" if starting else "", e,
                    extra={"job": self.name, "slice": track.index})
                if e.status_code is None:
                    return  # unreachable: the others would wait too; the next sync retries
                continue
            metrics.NOTIFICATIONS.labels(state, "ok").inc()
            with self.lock:
                self.token_refused = None
                if client is self.client:
                    self._answered()
                if client is not self.client or generation <= track.acked_generation:
                    continue  # another controller since, or a newer answer recorded meanwhile
                # (two reports of one state, e.g. from the pod-event handler and the pass: one Event)
                news = track.acked != want
                track.acked, track.acked_generation = want, generation
                seconds = None
                if state == "Down" and track.down_seen_at is not None and news:
                    seconds = self.clock.monotonic() - track.down_seen_at
                    metrics.NOTIFY_SECONDS.observe(seconds)
                if state == "Ready" and track.state == "Ready":
                    track.down_seen_at = None
            if not news:
                continue
            _logger.info("controller told slice %d %s", track.index, state,
                         extra={"job": self.name, "slice": track.index, "state": state,
                                "generation": generation, "notify_seconds": seconds})
            events("Normal", EVENT_CONTROLLER_NOTIFIED,
                   f"controller told slice {track.index} {state} (generation {generation})")

    @staticmethod
    def _report_of(track: SliceTrack, uid: str) -> tuple[str, str, tuple[str, ...], tuple[str, ...]]:
        """What the controller `uid` must have acknowledged of `track`: (uid, state, addresses, pods).

        The pods count only for Ready (a replacement at the same address is a new worker to join); a Down's
        or Draining's pods changing (the failed pod, then none, then its replacement Pending) is no news to
        the controller: re-sent, one loss was three `controller told slice N Down` Events.
        """
        return uid, track.state, track.addresses, track.pods if track.state == "Ready" else ()

    def replacing(self, index: int, cause: str) -> None:
        """The operator deletes slice `index`'s pods because the controller saw it fail (`cause`, e.g.
        `step_deadline`): the slice's Down (its Event, its status reason) names that cause, not only the
        delete the operator made. Forgotten once the slice is Ready again."""
        with self.lock:
            if 0 <= index < len(self.slices):
                self.slices[index].controller_cause = cause or "cause not given"

    def slices_down_by_controller(self, status: ControllerStatus) -> list[int]:
        """Slices the controller saw fail itself (e.g. a hung step) while their pods look Ready.

        The supervision core's replace rule (`slice_state.controller_saw_down`):
        the controller's view counts when its generation is at least the one of
        the Ready this controller accepted from us (older: it was read before
        that Ready was applied).
        """
        with self.lock:
            out = []
            for view in status.slices:
                if 0 <= view.index < len(self.slices):
                    track = self.slices[view.index]
                    # Only a Down of the pods the controller was last told of: while a newer state of the
                    # slice (its replacement) has not reached it, its Down is about the pods before, and
                    # acting on it deletes the fresh worker (trial: a worker lost while the controller was
                    # frozen cost two replacements).
                    accepted = track.acked == (self.controller_uid, "Ready", track.addresses, track.pods)
                    if controller_saw_down(view.state, view.generation, track.state,
                                           track.acked_generation if accepted else None):
                        out.append(view.index)
            return out

    def close(self) -> None:
        """Closes the controller client and stops the link's thread."""
        if self.link is not None:
            self.link.close()
        with self.lock:
            if self.client is not None:
                self.client.close()
                self.client = None
