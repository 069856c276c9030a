"""A reconcile pass's effects as values, the one accumulator of its Events, and the applier that executes them.

The decisions (`reconcile.decide`, `setup_effects`, `child_effects`, `after_creates`,
`invalid_child_effects`, `status_decision.decide_status`) are pure:
from what was observed to a list of effects. `Applier.apply` executes a list in order; an API refusal
never raises out of it: it becomes an observation (`Applied`) that the next decision of the pass reads.

Every Event of a pass goes through one `EventLog`, posted when the pass ends (`EventLog.flush`).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any, Callable, Iterable, Mapping, Union


from elastic_jax import contract
from elastic_jax.api import labels as lbl
from elastic_jax.api.status import COND_CONTROLLER_RESTARTED, REASON_NODE_LOST, REASON_PREVIOUS_JOB_TERMINATING
from elastic_jax.k8s_operator import incarnation, metrics
from elastic_jax.k8s_operator.kube import ChildRefused
from elastic_jax.k8s_operator.reconcile import RESUMED_FROM_STEP_ZERO, Plan
from elastic_jax.k8s_operator.status_builder import (REASON_INVALID_SPEC, child_conflict, create_failure,
                                                     invalid_child, previous_job_terminating)

_logger = logging.getLogger(__name__)

# Event reasons `after_creates` holds back until the new controller pod exists.
REASON_CONTROLLER_RESTARTED = COND_CONTROLLER_RESTARTED  # (the Event has its condition's name)
REASON_PHASE_CHANGED = "PhaseChanged"
REASON_WORKER_REPLACED = "WorkerReplaced"


# -- the effects ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CreateChild:
    """Create `body` (a Pod or a JobSet, owner references already set); `controller`: the job's controller pod."""

    body: Mapping[str, Any]
    controller: bool = False


@dataclasses.dataclass(frozen=True)
class CreateTokenSecret:
    """Create the job's token Secret `body` (owner reference set). The operator may not read Secrets: a
    409 is not checked here, it is an observation (`Applied.secret_taken`) the handler judges."""

    body: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class CreateStatic:
    """Create the job's ConfigMap or one of its Services `body` (owner reference set), once per job."""

    body: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class ReportSlices:
    """Tell the job's controller every slice state it has not acknowledged (`JobTracker.report`)."""

    retries: int = 1


@dataclasses.dataclass(frozen=True)
class MarkFinished:
    """The job ended (or failed): its children's end from now on is no loss and no news."""


@dataclasses.dataclass(frozen=True)
class DeletePod:
    """Delete pod `name`; `grace_s` None: the pod's own grace period (SIGTERM first), 0: at once."""

    name: str
    grace_s: int | None = None


@dataclasses.dataclass(frozen=True)
class DeleteJobSet:
    """Delete the worker JobSet `name`."""

    name: str


@dataclasses.dataclass(frozen=True)
class PostEvent:
    """One Kubernetes Event on the job (`type` Normal | Warning)."""

    type: str
    reason: str
    message: str


@dataclasses.dataclass(frozen=True)
class PatchStatus:
    """Status fields (camelCase, as written) put into the pass's patch."""

    fields: Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class NodeLostPodSeen:
    """Pod `uid` on a lost node was said (its one Event): remembered, counted, logged."""

    uid: str
    pod: str
    node: str
    role: str  # "controller" | "worker"
    message: str


@dataclasses.dataclass(frozen=True)
class CountControllerRestart:
    """One controller replacement, in the operator's metric."""


@dataclasses.dataclass(frozen=True)
class DeleteJob:
    """Delete the finished job itself: its `ttlSecondsAfterFinished` (`ttl_s`) passed."""

    ttl_s: int


@dataclasses.dataclass(frozen=True)
class CountGoodput:
    """`seconds` more of goodput `category` (`goodput.increments`), in the operator's metric."""

    category: str
    seconds: float


@dataclasses.dataclass(frozen=True)
class CountRebooked:
    """`seconds` of goodput `category` re-booked as recovering (`goodput.rebooked`), in the operator's metric."""

    category: str
    seconds: float


@dataclasses.dataclass(frozen=True)
class CountStepsLost:
    """`steps` more steps lost (`steps_lost.newly_lost`), in the operator's metric."""

    steps: int


Effect = Union[CreateChild, CreateTokenSecret, CreateStatic, DeletePod, DeleteJobSet, DeleteJob, PostEvent,
               PatchStatus, NodeLostPodSeen, CountControllerRestart, CountGoodput, CountRebooked, CountStepsLost,
               ReportSlices,
               MarkFinished]


# -- the one accumulator of a pass's Events -------------------------------------------------


class EventLog:
    """A pass's Events, posted in order when the pass ends; after `flush`, a post goes to the sink at once.

    The tracker keeps the sink of its latest report for its controller link's reports (another thread, any
    time): those arrive after the pass, and are posted as they come.

    Args:
      sink: posts one Event (type, reason, message).
    """

    def __init__(self, sink: Callable[[str, str, str], None]):
        self._sink = sink
        self._pending: list[tuple[str, str, str]] = []
        self._open = True
        self._lock = threading.Lock()

    def __call__(self, type_: str, reason: str, message: str) -> None:
        with self._lock:
            if self._open:
                self._pending.append((type_, reason, message))
                return
        self._sink(type_, reason, message)

    @property
    def pending(self) -> list[tuple[str, str, str]]:
        """The Events not posted yet, in order."""
        with self._lock:
            return list(self._pending)

    def flush(self) -> None:
        """Posts the pending Events in order; later ones are posted as they come."""
        with self._lock:
            pending, self._pending, self._open = self._pending, [], False
        for event in pending:
            self._sink(*event)


# -- the applier ----------------------------------------------------------------------------


class ChildConflict(Exception):
    """The name of one of the job's children is taken by an object this job does not own.

    Attributes:
      kind, name: the object.
      earlier: it belongs to an earlier job of this name, being garbage-collected: a wait, not a conflict.
    """

    def __init__(self, kind: str, name: str, earlier: bool = False):
        super().__init__(f"{kind} {name}")
        self.kind, self.name, self.earlier = kind, name, earlier

    def refusal(self) -> tuple[str, str]:
        """(reason, message) of the CreateFailed condition."""
        return previous_job_terminating(self.kind, self.name) if self.earlier else child_conflict(self.kind, self.name)


def check_taken(kube: Any, ns: str, kind: str, child: str, job: str, uid: str, index=None) -> None:
    """After a create answered 409: returns when the object `child` is this job's own.

    Raises:
      ChildConflict: it is an earlier job's of this name (`earlier`: in our index, or owned by a
        deleted ElasticTrainingJob of this name) or anyone else's.
    """
    if incarnation.held_by_earlier(index, ns, job, uid, child):
        raise ChildConflict(kind, child, earlier=True)
    if kube.owned_by(ns, kind, child, uid):
        return
    who = incarnation.holder(kube.owners(ns, kind, child), job, uid)
    if who != "ours":
        raise ChildConflict(kind, child, earlier=who == "earlier")


def invalid_reason(e: ChildRefused) -> str | None:
    """The failure reason when the API server refused a child as invalid (422), else None (a refusal that
    may pass later: quota, admission, a webhook that is down)."""
    return invalid_child(e.kind, e.name, e.message) if e.status == 422 else None


@dataclasses.dataclass
class Applied:
    """What applying effects observed.

    Attributes:
      refusal: (reason, message) of the first create refused (CreateFailed condition), or None.
      invalid: the failure reason of a create refused as invalid (422): the job fails, or None.
      created: names of the children created (or found to be the job's own after a 409).
      controller_pod: the name of the controller pod a `CreateChild(controller=True)` created (or found
        to be the job's own), "" when none.
      secret_taken: the name of the token Secret a `CreateTokenSecret` found taken (409), "" when none.
    """

    refusal: tuple[str, str] | None = None
    invalid: str | None = None
    created: list[str] = dataclasses.field(default_factory=list)
    controller_pod: str = ""
    secret_taken: str = ""

    @property
    def controller_created(self) -> bool:
        """This pass's controller pod exists now."""
        return bool(self.controller_pod)


class Applier:
    """Executes one pass's effects in order, for one job.

    Args:
      kube: the API client (`kube.Kube`).
      job: the job's `job_state.JobState` (records the controller pod created, the lost-node pods said,
        the static children created, the job's own deletion or end; its tracker reports to the controller).
      events: the pass's `EventLog`.
      patch: kopf's patch (its `.status` takes `PatchStatus`); None on the pod-event path (no status).
      indexes: the pods and JobSets indexes (a 409 on a name an earlier job of this name holds is a wait).
    """

    def __init__(self, kube: Any, job: Any, events: EventLog, patch: Any = None, pods_index=None,
                 jobsets_index=None):
        self.kube, self.job, self.events, self.patch = kube, job, events, patch
        self.ns, self.name, self.uid = job.namespace, job.name, job.uid
        self._index = {"Pod": pods_index, contract.JOBSET_KIND: jobsets_index}

    def apply(self, effects: Iterable[Effect], applied: Applied | None = None) -> Applied:
        """Executes `effects` in order; refused creates go into the returned `Applied` (`applied` when given).

        Raises:
          kubernetes.client.rest.ApiException, OSError: a delete, or the ownership read after a 409, failed
            (the pass ends; the next one retries).
        """
        out = applied if applied is not None else Applied()
        for effect in effects:
            if isinstance(effect, (CreateChild, CreateStatic)):
                self._create(effect, out)
            elif isinstance(effect, CreateTokenSecret):
                self._create_secret(effect, out)
            elif isinstance(effect, ReportSlices):
                self.job.tracker.report(self.events, effect.retries)
            elif isinstance(effect, MarkFinished):
                with self.job.tracker.lock:
                    self.job.tracker.finished = True
            elif isinstance(effect, DeletePod):
                self.kube.delete_pod(self.ns, effect.name, **({} if effect.grace_s is None else
                                                              {"grace_s": effect.grace_s}))
            elif isinstance(effect, DeleteJobSet):
                self.kube.delete_jobset(self.ns, effect.name)
            elif isinstance(effect, DeleteJob):
                _logger.info("deleting finished job %s/%s (ttlSecondsAfterFinished=%d)", self.ns, self.name,
                             effect.ttl_s)
                self.kube.delete_job(self.ns, self.name)
                self.job.tracker.deleting = True  # its children's end, until the delete event, is no news
            elif isinstance(effect, PostEvent):
                self.events(effect.type, effect.reason, effect.message)
            elif isinstance(effect, PatchStatus):
                for k, v in effect.fields.items():
                    self.patch.status[k] = v
            elif isinstance(effect, NodeLostPodSeen):
                self.job.node_lost_pods.add(effect.uid)
                metrics.NODE_LOST_PODS.labels(effect.role).inc()
                _logger.warning("%s", effect.message, extra={"job": self.name, "node": effect.node, "pod": effect.pod})
            elif isinstance(effect, CountControllerRestart):
                metrics.CONTROLLER_RESTARTS.inc()
            elif isinstance(effect, CountGoodput):
                metrics.GOODPUT_SECONDS.labels(effect.category).inc(effect.seconds)
            elif isinstance(effect, CountRebooked):
                metrics.GOODPUT_REBOOKED_SECONDS.labels(effect.category).inc(effect.seconds)
            elif isinstance(effect, CountStepsLost):
                metrics.STEPS_LOST.inc(effect.steps)
            else:
                raise TypeError(f"not an effect: {effect!r}")
        return out

    def _create(self, effect: CreateChild | CreateStatic, out: Applied) -> None:
        body = effect.body
        kind, name = body["kind"], body["metadata"]["name"]
        try:
            if not self.kube.create(self.ns, dict(body)):
                # Ours (the index is behind, or an operator restart) is fine. An earlier job's is waited
                # for; anyone else's is not ours to wait for or delete: said (a trial found a foreign pod
                # reported as "an earlier job ... terminating", a foreign JobSet left the slice
                # Provisioning with no word; a planted ConfigMap would choose the job's code and image, a
                # Service would route its traffic).
                check_taken(self.kube, self.ns, kind, name, self.name, self.uid, self._index.get(kind))
        except ChildConflict as e:
            out.refusal = out.refusal or e.refusal()
            return
        except ChildRefused as e:
            self._refused(e, out)
            return
        out.created.append(name)
        if isinstance(effect, CreateStatic):
            self.job.static_created.add((kind, name))
        elif effect.controller:
            out.controller_pod = name
            self.job.created_controller = (name, self.job.clock.monotonic())

    def _create_secret(self, effect: CreateTokenSecret, out: Applied) -> None:
        name = effect.body["metadata"]["name"]
        try:
            if not self.kube.create(self.ns, dict(effect.body)):
                out.secret_taken = name
                return
        except ChildRefused as e:
            self._refused(e, out)
            return
        out.created.append(name)
        self.job.token_secret_ours = True
        if self.patch is not None:
            self.patch.status["tokenSecret"] = name  # (the operator's record: tenants cannot write status)

    @staticmethod
    def _refused(e: ChildRefused, out: Applied) -> None:
        out.refusal = out.refusal or create_failure(e.kind, e.name, e.status, e.message)
        out.invalid = out.invalid or invalid_reason(e)


# -- the pure decisions around `reconcile.decide` -------------------------------------------


def setup_effects(job: Any, recorded_secret: str, token_secret: Callable[[], dict],
                  static_children: Callable[[], list[dict]]) -> tuple[list[Effect], list[Effect]]:
    """The job's token Secret and its static children (ConfigMap, Services) still to create, in two
    lists applied one after the other (no static child while the Secret is not the job's own).

    Args:
      job: the job's `JobState` (what this process created already).
      recorded_secret: the job's `status.tokenSecret` (the operator's record that it created it).
      token_secret, static_children: render them (owner references set); called only when needed (the
        1 s pass renders nothing for a job whose children are all created).

    Returns:
      (the Secret's effects, the static children's effects).
    """
    secret = [] if job.token_secret_ours or recorded_secret else [CreateTokenSecret(token_secret())]
    if job.static_complete:
        return secret, []
    return secret, [CreateStatic(c) for c in static_children()
                    if (c["kind"], c["metadata"]["name"]) not in job.static_created]


def worker_replacements(slices_down: Mapping[int, Iterable[str]], causes: Mapping[int, str] | None = None
                        ) -> list[Effect]:
    """The controller saw these slices fail while their pods run (slice index -> pod names): each pod goes
    at once (grace 0), said first, naming the cause the controller gave (`causes`: slice index -> e.g.
    `step_deadline` for a hung worker; a slice without one is said without)."""
    out: list[Effect] = []
    for i, pods in slices_down.items():
        cause = (causes or {}).get(i)
        why = f" ({cause})" if cause else ""
        for pod in pods:
            out += [PostEvent("Warning", REASON_WORKER_REPLACED,
                              f"controller saw slice {i} fail{why} while pod {pod} runs; deleting it"),
                    DeletePod(pod, grace_s=0)]
    return out


def child_effects(plan: Plan, node_lost_said: set[str], node_lost_s: float, blocked: bool,
                  controller_pod: Callable[[int], dict], worker_jobset: Callable[[int], dict]) -> list[Effect]:
    """`plan`'s deletes and creates, in the order they are applied: pods on lost nodes (grace 0), JobSets,
    controller pods (graceful: SIGTERM lets a live controller checkpoint first), then creates.

    Args:
      plan: `reconcile.decide`'s plan.
      node_lost_said: UIDs of the pods on lost nodes already said (one Event per pod, not one per pass).
      node_lost_s: the operator's bound (`--node-lost-seconds`), for the message.
      blocked: no token Secret of the job's own: nothing is created.
      controller_pod, worker_jobset: render the controller pod of an incarnation, the JobSet of a slice
        (owner references set; the plan's Pathways head is recorded here on each JobSet).

    Returns:
      The effects, in order.
    """
    out: list[Effect] = []
    for stranded in plan.force_delete:
        # grace 0, as the out-of-service taint's pod GC: only a dead kubelet could end a graceful delete
        message = stranded.message(node_lost_s)
        if stranded.uid not in node_lost_said:
            out += [PostEvent("Warning", REASON_NODE_LOST, message),
                    NodeLostPodSeen(stranded.uid, stranded.pod, stranded.loss.node,
                                    "controller" if stranded.slice_index < 0 else "worker", message)]
        out.append(DeletePod(stranded.pod, grace_s=0))
    out += [DeleteJobSet(js) for js in plan.delete_jobsets]
    out += [DeletePod(p) for p in plan.delete_pods]
    if blocked:
        return out
    if plan.create_controller is not None:
        out.append(CreateChild(controller_pod(plan.create_controller), controller=True))
    for i in plan.create_jobsets:
        js = worker_jobset(i)
        if plan.pathways_head:
            js["metadata"].setdefault("annotations", {})[lbl.PATHWAYS_HEAD] = plan.pathways_head
        out.append(CreateChild(js))
    return out


def node_lost_messages(plan: Plan, node_lost_s: float) -> list[str]:
    """The messages of the plan's pods on lost nodes (the NodeLost condition's)."""
    return [stranded.message(node_lost_s) for stranded in plan.force_delete]


def after_creates(plan: Plan, controller_created: bool) -> tuple[list[Effect], bool]:
    """The plan's Events and counts once its creates were applied.

    A replacement is counted (and announced) once it exists: a refused or blocked create is the
    CreateFailed condition's news, retried each pass without spending maxRestarts. A resume's
    warning, like a replacement's, waits for its pod too.

    Returns:
      (effects, replaced): `replaced` when this pass's controller pod replaces one that died.
    """
    replaced = plan.controller_restarted and controller_created
    out: list[Effect] = []
    for event in plan.events:
        if controller_created or event[1] not in (REASON_CONTROLLER_RESTARTED, RESUMED_FROM_STEP_ZERO):
            if replaced or event[1] != REASON_CONTROLLER_RESTARTED:
                out.append(PostEvent(*event))
    if replaced:
        out.append(CountControllerRestart())
    if plan.finish:
        out += [PostEvent("Normal" if plan.finish[0] == "Succeeded" else "Warning", f"Job{plan.finish[0]}",
                          plan.finish[1]), MarkFinished()]
    return out, replaced


def refusal_event(refusal: tuple[str, str]) -> PostEvent:
    """The Event of a CreateFailed condition that changed: an earlier job's child still being
    garbage-collected is a wait, not a fault: no Warning."""
    return PostEvent("Normal" if refusal[0] == REASON_PREVIOUS_JOB_TERMINATING else "Warning", *refusal)


def invalid_child_effects(message: str, failed_fields: Mapping[str, Any], phase_before: str,
                          controller_pods: Iterable[Any], jobsets: Iterable[Any]) -> list[Effect]:
    """The job fails (InvalidSpec) and what runs stops: every pass would be refused the same way, so
    retrying would only leave the workers running under a job that cannot start.

    Args:
      message: the failure reason (names the child and the API server's word).
      failed_fields: the status fields of the failure (`status_decision.failed_spec_fields`, with completionTime).
      phase_before: the job's phase before ("" when none).
      controller_pods, jobsets: the job's PodViews and JobSetViews.
    """
    out: list[Effect] = [PostEvent("Warning", REASON_INVALID_SPEC, message), PatchStatus(dict(failed_fields))]
    out += [DeleteJobSet(js.name) for js in jobsets if not js.deleting]
    out += [DeletePod(p.name) for p in controller_pods if not p.terminal and not p.deleting]
    out += [PostEvent("Normal", REASON_PHASE_CHANGED, f"{phase_before or 'New'} -> Failed"), MarkFinished()]
    return out
