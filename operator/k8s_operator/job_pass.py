"""One reconcile pass of one job, top to bottom: observe, decide, status, apply.

`reconcile_pass` is what the job's daemon (`handlers.reconcile_job`) runs on a
pass thread: it parses the job (a bad spec: `Failed`, the field named), claims
it (`claims`), sets up its fixed children (`_setup`), observes its pods,
JobSets, nodes and controller (`_pass`), decides what to do
(`reconcile.decide`, pure) and the new status (`status_decision.decide_status`,
pure; the phase from `phases.phase`), and applies both through one
`effects.Applier`. The status goes into the pass's patch, which the daemon
writes (`write_status`). `worker_pod_changed` is the small pass of the pod
event handler (the latency path: a worker pod changed, the controller told at
once).
"""

from __future__ import annotations

import copy
import logging
from typing import Any, Callable

import kopf
import yaml

from elastic_jax import contract
from elastic_jax.api import job as job_api
from elastic_jax.api import labels as lbl
from elastic_jax.api.manifest import ManifestError, parse_manifest, safe_load_bounded
from elastic_jax.api.manifest_digest import ManifestDigestMismatch, manifest_digest
from elastic_jax.api.status import (COND_STATUS_WRITE_REFUSED, REASON_STATUS_VALUES_DROPPED,
                                    REASON_STATUS_WRITE_REFUSED, REASON_STATUS_WRITTEN, ElasticTrainingJobStatus,
                                    SliceStatusEntry)
from elastic_jax.k8s_operator import (admin_policies, backends, children, claims, counters, effects, incarnation,
                                      invalid_spec_events, metrics, names, status_write, steps_lost, tokens)
from elastic_jax.k8s_operator import goodput as goodput_ledger
from elastic_jax.k8s_operator.backends import UnsupportedBackend, renderer_for
from elastic_jax.k8s_operator.clock import Clock
from elastic_jax.k8s_operator.conditions import get_condition, now_rfc3339, set_condition
from elastic_jax.k8s_operator.effects import EventLog
from elastic_jax.k8s_operator.finished import finished_phase
from elastic_jax.k8s_operator.job_state import JobState
from elastic_jax.k8s_operator.missed_losses import missed_loss_events
from elastic_jax.k8s_operator.nodes import NodeLoss, lost_nodes
from elastic_jax.k8s_operator.operator_state import OperatorState, state_of
from elastic_jax.k8s_operator.pod_faults import RefusalEvent, creation_fault, slices_missing_pods
from elastic_jax.k8s_operator.reconcile import Observed, decide
from elastic_jax.k8s_operator.slice_warming import with_warming
from elastic_jax.k8s_operator.status_builder import (REASON_INVALID_SPEC, Inputs, changed_fields,
                                                     earlier_token_secret, token_conflict, token_refused)
from elastic_jax.k8s_operator.status_decision import (StatusObserved, decide_status, expiry, failed_spec_fields,
                                                     invalid_failure)
from elastic_jax.k8s_operator.tracker import JobTracker
from elastic_jax.supervision.slice_state import down_cause

_logger = logging.getLogger(__name__)


def ref_of(body: Any) -> dict[str, Any]:
    """A minimal object reference for Events."""
    meta = body["metadata"]
    return {"apiVersion": job_api.API_VERSION, "kind": job_api.KIND,
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]}}


def event_sink(ref: dict[str, Any]):
    """Posts Events on `ref`; an `InvalidSpec` refusal once per job and cause (`invalid_spec_events`)."""
    uid = (ref.get("metadata") or {}).get("uid") or ""

    def post(type_: str, reason: str, message: str) -> None:
        if reason == REASON_INVALID_SPEC and not invalid_spec_events.POSTED.first(uid, message[:1000]):
            return
        kopf.event(ref, type=type_, reason=reason, message=message[:1000])
    return post


def parse_job(body: Any, policies: admin_policies.AdminPolicies) -> job_api.ElasticTrainingJob:
    """Validates the live object with the pydantic models, then against the admin's `policies`.

    Args:
      body: the job object as the API server returned it.
      policies: the admin's lists (`OperatorState.policies`).

    Raises:
      ManifestError: the spec is invalid (message names the field).
      UnsupportedBackend: no renderer for spec.backend, or one it cannot render (e.g. an unknown TPU), or
        a denied namespace, a spec.controller.serviceAccountName (or its token), priority class, toleration,
        image pull Secret, cache claim or gs:// location the admin did not allow (`admin_policies.REFUSALS`).
    """
    meta = body["metadata"]
    data = {"apiVersion": body.get("apiVersion", job_api.API_VERSION), "kind": job_api.KIND,
            # the UID goes on every child as a label (`incarnation`)
            "metadata": {"name": meta["name"], "namespace": meta.get("namespace"), "uid": meta.get("uid")},
            "spec": dict(body.get("spec") or {})}
    # The resolved spec (pathways: hosts per slice from the topology) is what the
    # ConfigMap, the tracker and the renderers all see.
    # (no source prefix: every message already names its field, spec.… or metadata.…)
    job = backends.resolve(parse_manifest(data, ""))
    try:
        policies.check(job, body["metadata"].get("namespace") or "default")
    except admin_policies.REFUSALS as e:
        raise UnsupportedBackend(str(e)) from None
    return job


def patch_status(patch: Any, **fields: Any) -> None:
    """Puts status fields (snake_case `ElasticTrainingJobStatus` names, validated by it) into kopf's patch.

    Raises:
      pydantic.ValidationError: a value the status model refuses (a bug here, not user input).
    """
    for key, value in status_fields(**fields).items():
        patch.status[key] = value


def status_fields(**fields: Any) -> dict[str, Any]:
    """Status fields by their snake_case `ElasticTrainingJobStatus` names → as written (camelCase), validated.

    Raises:
      pydantic.ValidationError: a value the status model refuses (a bug here, not user input).
    """
    return ElasticTrainingJobStatus.model_validate(fields).to_kube()


def fail_spec(patch: Any, status: Any, generation: int, message: str, body: Any = None, *, clock: Clock) -> None:
    """The job Failed with condition reason InvalidSpec (its times from `clock`); with `body`, also one Warning
    Event `InvalidSpec` naming the field (kopf's own "failed permanently" event is not reliable enough to promise)."""
    if body is not None:
        event_sink(ref_of(body))("Warning", REASON_INVALID_SPEC, message)
    for k, v in failed_spec_fields(status, generation, message, now_rfc3339(clock)).items():
        patch.status[k] = v


def _lost_nodes(state: OperatorState, unready_nodes) -> dict[str, NodeLoss]:
    """The nodes not Ready for longer than the operator's bound, by name ({} when off or none)."""
    views = [v for store in (unready_nodes or {}).values() for v in store]
    return lost_nodes(views, now_rfc3339(state.clock), state.node_lost_s)


def _alive(jobsets) -> set[int]:
    """Slice indices whose JobSet exists and is not being deleted."""
    return {v.slice_index for v in jobsets if not v.deleting}


def worker_pod_changed(namespace, labels: dict, job_pods, memo, unready_nodes, job_jobsets, seen_at: float) -> None:
    """`worker_pod_event`'s work: the job's pods read from the indexes, observed by its tracker, and the
    controller told (an `effects.ReportSlices`, through the job's `Applier` like the timer's)."""
    state = state_of(memo)
    job = state.jobs.get((namespace, labels[lbl.JOB_NAME]))
    if job is None or job.ref is None:
        return  # job not reconciled yet (operator starting): its daemon will sync
    if not incarnation.belongs(labels, job.uid):
        return  # a pod of an earlier job of the same name (terminating): not this job's news
    tracker = job.tracker
    lost = {n: loss.why for n, loss in _lost_nodes(state, unready_nodes).items()}
    mark = tracker.observation()  # before the read: a slower sync of an older read never wins
    pods = incarnation.own(job_pods, namespace, job.name, job.uid, job.created)
    alive = None
    if job_jobsets is not None:
        jobsets = incarnation.own(job_jobsets, namespace, job.name, job.uid, job.created)
        alive = _alive(jobsets)
        pods = incarnation.of_live_jobsets(pods, jobsets)
    events = EventLog(event_sink(job.ref))
    try:
        if tracker.observe(pods, events, lost_nodes=lost, observed_at=mark, jobsets_alive=alive, seen_at=seen_at):
            effects.Applier(state.kube, job, events).apply([effects.ReportSlices(retries=3)])
    finally:
        events.flush()


def wake_owner(state: OperatorState, namespace: str, labels: dict) -> None:
    job = state.jobs.get((namespace, labels[lbl.JOB_NAME]))
    if job is not None and incarnation.belongs(labels, job.uid):
        job.wake()


def _applied_job(state: OperatorState, key, job: job_api.ElasticTrainingJob, uid: str,
                 recorded_digest: str = "") -> job_api.ElasticTrainingJob:
    """The spec the job started with (from its ConfigMap, if this job `uid` owns it), with today's suspend and TTL.

    Anyone who may edit ConfigMaps of the namespace could have changed that copy, so it is used only
    when its digest is `recorded_digest` (the job's `status.manifestSha256`, written by the operator
    when it created the ConfigMap) and it passes the admin's allow lists; otherwise the live spec is
    used, and the controller, finding the mounted copy changed, refuses it (`manifest_digest`).
    """
    known = state.jobs.get(key)
    known = known if known is not None and known.uid == uid else None
    applied = known.applied if known is not None else None
    if applied is None:
        text = state.kube.read_manifest(key[0], names.configmap(key[1]), uid)
        if text:
            try:
                applied = parse_manifest(safe_load_bounded(text), "configmap")
                if recorded_digest and manifest_digest(applied) != recorded_digest:
                    raise ManifestDigestMismatch(f"its digest is not status.manifestSha256 {recorded_digest[:16]}...: "
                                                 "it was changed after the job was created")
                state.policies.check(applied, key[0])
            except (*admin_policies.REFUSALS, ManifestDigestMismatch) as e:
                _logger.warning("ignoring the manifest ConfigMap of %s/%s: %s", key[0], key[1], e)
                applied = None
            except (ManifestError, yaml.YAMLError):
                applied = None
        applied = applied or job
        if known is not None:
            known.applied = applied
    return applied.model_copy(update={"metadata": job.metadata, "spec": applied.spec.model_copy(update={
        "suspend": job.spec.suspend, "ttl_seconds_after_finished": job.spec.ttl_seconds_after_finished})})


def _job_state(state: OperatorState, key, job: job_api.ElasticTrainingJob, body) -> JobState:
    """The job's `JobState` (a new one for a new UID of the name: nothing carries over), its ref current."""
    meta = body["metadata"]
    def tracker() -> JobTracker:
        made = JobTracker(key[0], key[1], job.spec.slices.total, job.spec.slices.hosts_per_slice,
                          background=state.controller_threads, clock=state.clock)
        # (from the slice states the previous operator wrote: a restart is no transition)
        made.seed(ElasticTrainingJobStatus.from_kube(body.get("status") or {}).slices)
        return made

    js = state.jobs.open(key, meta["uid"], meta.get("creationTimestamp") or "", tracker)
    js.applied = js.applied or job
    js.ref = ref_of(body)
    return js


def _earlier_job_evidence(state: OperatorState, key, uid: str, job_pods=None, job_jobsets=None) -> bool:
    """Whether an earlier job of this name was deleted so recently that its children are still going.

    The operator may not read Secrets (docs/security.md), so a token Secret that
    exists is judged by what it can see: the earlier job's deletion seen by this
    process within `job_state.EARLIER_SECRET_WAIT_S`, its pods or JobSets still in the
    indexes, or the job's ConfigMap still owned by an earlier job of this name.
    A Secret planted by someone else while none of these holds is a conflict.
    """
    ns, name = key
    if state.jobs.earlier(key, uid):
        return True
    for index in (job_pods, job_jobsets):
        if any(k[:2] == (ns, name) and k[2] not in ("", uid) and views for k, views in (index or {}).items()):
            return True
    from kubernetes.client.rest import ApiException

    try:
        owners = state.kube.owners(ns, "ConfigMap", names.configmap(name))
    except (ApiException, OSError):  # no evidence: the conflict stands (and is said)
        return False
    return owners is not None and incarnation.holder(owners, name, uid) == "earlier"


def pass_inputs(body, js: JobState, job_pods, job_jobsets, unready_nodes) -> tuple:
    """What a pass reads that can change, to compare with a quiet pass's (`JobTracker.quiet`).

    The job object's resourceVersion (spec, status, annotations, deletion), the job's pods and JobSets
    from the indexes (their views: phase, readiness, restarts...), the status watch's answers so far
    and the controller they came from, and the nodes that are not Ready (a bound of time runs on those).
    Read on the event loop: the indexes and counters only, no lock, no HTTP.
    """
    meta = body["metadata"]
    ns, name, tracker = js.namespace, js.name, js.tracker
    return (meta.get("resourceVersion") or "",
            tuple(incarnation.own(job_pods, ns, name, js.uid, js.created)),
            tuple(incarnation.own(job_jobsets, ns, name, js.uid, js.created)),
            tracker.answers, tracker.controller_uid, tracker.answer_uid, bool(unready_nodes))


def reconcile_pass(body, spec, status, meta, namespace, name, patch, memo, job_pods, job_jobsets,
                   unready_nodes=None, inputs: tuple | None = None, **_):
    """One reconcile pass: children, controller notifications, status. Idempotent.

    Only for a job this operator claimed (`claims`): an unclaimed job is claimed first; a job
    another operator claimed is left alone, said once (Event, log, metric).

    Args:
      inputs: `pass_inputs` read before the pass (None: not known); a quiet pass records them (`settle`).
    """
    # One version of the object for the whole pass: a daemon's `body` is kopf's live view, updated in place
    # as watch events arrive, so a status read at the start and again at the end could be two versions. The
    # chaos benchmark caught it: the job-created handler's status write arrived mid-pass, the decision read
    # the CRD's defaults ("" for tokenSecret) at the end but not at the start, and unset the tokenSecret this
    # very pass had recorded; a restarted operator then took the job's own Secret for someone else's.
    body, status = copy.deepcopy(dict(body)), copy.deepcopy(dict(status or {}))
    body["status"] = status
    meta, spec = body.setdefault("metadata", dict(meta or {})), body.get("spec") or dict(spec or {})
    key = (namespace, name)
    generation = meta.get("generation", 0)
    state = state_of(memo)
    if not _claimed(state, body, namespace, name):
        return
    try:
        live = parse_job(body, state.policies)
    except (ManifestError, UnsupportedBackend) as e:
        if status.get("phase") != "Failed":
            fail_spec(patch, status, generation, str(e), body, clock=state.clock)
        return
    try:
        # a function, not a value: read after the controller poll, like the pods (a node Ready again
        # meanwhile must not have its pods force-deleted)
        built = _reconcile(state, key, live, body, status, generation, patch, job_pods, job_jobsets,
                           lambda: _lost_nodes(state, unready_nodes))
        js = state.jobs.get(key)
        _guard_status(js, status, generation, patch, built=bool(built))
        if js is not None:
            js.tracker.settle(inputs, bool(built) and js.tracker.last_pass_quiet and _nothing_patched(patch),
                              js.clock.monotonic())
        metrics.RECONCILES.labels("ok").inc()
    except Exception:
        metrics.RECONCILES.labels("error").inc()
        raise


def _guard_status(js: JobState | None, status, generation: int, patch, built: bool = True) -> None:
    """Makes this pass's status patch one the API server accepts, and says so when that cost fields.

    Fields holding a value the API server refuses are dropped (`status_write.guard`); after a
    refusal (`status_write_refused`) only the operator's own fields are written for
    `status_write.REFUSED_HOLD_S`. Either sets the StatusWriteRefused condition naming what and
    why, with a Warning Event when that changes; a pass that `built` the whole status and lost
    nothing clears it (a Normal Event).
    """
    if js is None or js.ref is None:
        return
    problems = status_write.guard(patch.status)
    reason = REASON_STATUS_VALUES_DROPPED
    refused = js.status_refused
    if refused is not None and js.clock.monotonic() - refused[1] < status_write.REFUSED_HOLD_S:
        dropped = status_write.restrict(patch.status)
        reason = REASON_STATUS_WRITE_REFUSED
        problems = [f"{refused[0]}; until {status_write.REFUSED_HOLD_S:.0f} s pass, only the operator's own "
                    f"fields are written (not {', '.join(dropped) or 'any other'})"] + problems
    before = ElasticTrainingJobStatus.from_kube(
        {"conditions": patch.status["conditions"] if "conditions" in patch.status else status.get("conditions") or []})
    previous = get_condition(before.conditions, COND_STATUS_WRITE_REFUSED)
    post = event_sink(js.ref)
    if problems:
        message = "; ".join(problems)[:2000]
        if previous is None or previous.status != "True" or previous.message != message:
            post("Warning", reason, message)
            _logger.warning("status write: %s", message, extra={"job": js.name})
        conditions = set_condition(before.conditions, COND_STATUS_WRITE_REFUSED, "True", reason, message, generation,
                                   now_rfc3339(js.clock))
    elif built and previous is not None and previous.status == "True":
        post("Normal", REASON_STATUS_WRITTEN, f"status written whole again (was: {previous.message})"[:1000])
        conditions = set_condition(before.conditions, COND_STATUS_WRITE_REFUSED, "False", REASON_STATUS_WRITTEN, "",
                                   generation, now_rfc3339(js.clock))
    else:
        return
    patch.status["conditions"] = ElasticTrainingJobStatus(conditions=conditions).to_kube()["conditions"]


def write_status(state: OperatorState, namespace: str, name: str, patch: dict[str, Any]) -> None:
    """Writes a pass's status `patch` (`status_write.write`); a refusal is a Warning Event, and the job's next
    writes are restricted (`_guard_status`); a whole write after the hold lifts that. Never raises for a refusal.

    Raises:
      ApiException: no answer, a 5xx or 429 (the daemon logs it and the next pass writes again).
    """
    outcome = status_write.write(state.kube, namespace, name, patch)
    js = state.jobs.get((namespace, name))
    if js is None or outcome.gone:
        return
    if outcome.refused:
        js.status_refused = (outcome.refused, js.clock.monotonic())
        if js.ref is not None:
            event_sink(js.ref)("Warning", REASON_STATUS_WRITE_REFUSED, outcome.refused)
    elif js.status_refused is not None and js.clock.monotonic() - js.status_refused[1] >= status_write.REFUSED_HOLD_S:
        js.status_refused = None  # a whole write went through after the hold


def _claimed(state: OperatorState, body, namespace: str, name: str) -> bool:
    """Whether this operator reconciles the job now (claiming it if unclaimed)."""
    meta = body["metadata"]
    uid = meta["uid"]
    claim = claims.decide(meta.get("annotations"), state.identity)
    if claim.action == "other":
        if uid not in state.claimed_elsewhere:
            state.claimed_elsewhere.add(uid)
            metrics.JOBS_CLAIMED_ELSEWHERE.set(len(state.claimed_elsewhere))
            message = claims.elsewhere_message(state.identity, claim.owner)
            _logger.warning("%s", message, extra={"job": name, "namespace": namespace, "claimed_by": claim.owner})
            event_sink(ref_of(body))("Warning", claims.REASON_CLAIMED_ELSEWHERE, message)
        return False
    if uid in state.claimed_elsewhere:  # handed over to us
        state.claimed_elsewhere.discard(uid)
        metrics.JOBS_CLAIMED_ELSEWHERE.set(len(state.claimed_elsewhere))
    if claim.action == "claim":
        # resourceVersion as precondition: of two operators racing, one wins; the next pass reads the claim
        return state.kube.claim(namespace, name, meta.get("resourceVersion") or "", claims.CLAIM_ANNOTATION,
                                state.identity)
    return True


def _reconcile(state, key, live, body, status, generation, patch, job_pods, job_jobsets,
               lost: dict[str, NodeLoss] | Callable[[], dict[str, NodeLoss]] | None = None) -> bool | None:
    """One pass (`reconcile_job`); True when it built the whole status into `patch` (None: it returned early)."""
    given = lost
    read_lost = given if callable(given) else (lambda: given or {})
    ns, name = key
    job = _applied_job(state, key, live, body["metadata"]["uid"], status.get("manifestSha256") or "")
    js = _job_state(state, key, job, body)
    tracker = js.tracker
    resource_version = body["metadata"].get("resourceVersion") or ""
    if js.body_behind(resource_version, js.clock.monotonic()):
        return  # our last status write is not back from the watch yet: this status is older than it
    if body["metadata"].get("deletionTimestamp"):
        # Being deleted (foreground, or a finalizer of someone else's): the children go with it.
        # Not a loss to recover, not news: no replacement, no Warning, nothing told to the controller.
        tracker.deleting = True
        return
    events = EventLog(event_sink(js.ref))  # every Event of this pass, posted when it ends
    try:
        return _pass(state, key, job, live, js, body, status, generation, patch, job_pods, job_jobsets,
                     read_lost, events)
    finally:
        events.flush()


def _setup(state: OperatorState, key, job, js: JobState, body, status, applier: effects.Applier,
           job_pods=None, job_jobsets=None) -> effects.Applied:
    """The job's token Secret, then its ConfigMap (manifest) and Services (`effects.setup_effects`, applied),
    and the token the tracker reports with.

    The token is derived from the operator key and the job's UID, so it is never read back (the operator
    cannot read Secrets). A Secret of that name that already exists is used only when this job's status
    (which tenants cannot write) records that the operator created it; otherwise it may be anyone's, and
    mounting it would hand it to the job: a conflict (or, when an earlier job of this name was just
    deleted, `_earlier_job_evidence`, a wait). A static child that exists is used only when it is this
    job's (`effects.check_taken`). Static children are created once per job UID.

    Returns:
      What applying observed: `refusal` set when the job may start nothing (no Secret or static child of
      its own yet), `invalid` when a create was refused as invalid.
    """
    ns, name = key
    uid = body["metadata"]["uid"]
    token = tokens.derive_token(state.key, uid)

    def adopted(child: dict) -> dict:
        kopf.adopt(child, owner=body)  # ownerReference: this job's UID, controller=true
        return child

    secret, static = effects.setup_effects(js, status.get("tokenSecret") or "",
                                           lambda: adopted(children.token_secret(job, token)),
                                           lambda: [adopted(c) for c in children.static_children(job, state.control_api_from)])
    out = applier.apply(secret)
    if out.secret_taken:
        taken = out.secret_taken
        earlier = _earlier_job_evidence(state, key, uid, job_pods, job_jobsets)
        out.refusal = earlier_token_secret(taken) if earlier else token_conflict(taken)
        return out
    if out.refusal is not None:
        return out
    js.token_secret_ours = True
    with js.tracker.lock:
        js.tracker.token = token
    applier.apply(static, out)
    if out.refusal is None:
        js.static_complete = True  # nothing to render or check again for this UID
    return out


def _pass(state, key, job, live, js: JobState, body, status, generation, patch, job_pods, job_jobsets, read_lost,
          post: EventLog) -> bool | None:
    """`_reconcile`'s pass once the job's body is current: observe, decide, apply (`effects`), status."""
    ns, name = key
    tracker, clock = js.tracker, js.clock
    resource_version = body["metadata"].get("resourceVersion") or ""
    previous = ElasticTrainingJobStatus.from_kube(status)  # (the status as read, typed: what this pass reads)
    finished = finished_phase(previous) is not None
    applier = effects.Applier(state.kube, js, post, patch, job_pods, job_jobsets)

    refusal: tuple[str, str] | None = None  # the first child the API server refused in this pass
    invalid: str | None = None  # a child the API server refused as invalid (422): the job fails
    blocked = False  # no token Secret or static child of its own: start nothing
    if not finished and not job.spec.suspend:
        setup = _setup(state, key, job, js, body, status, applier, job_pods, job_jobsets)
        refusal, invalid, blocked = setup.refusal, setup.invalid, setup.refusal is not None
        if not blocked and not previous.manifest_sha256:
            # What the ConfigMap holds (written now, or by an operator before this field): from here
            # on, the only copy the operator reads back and the controller accepts.
            applier.apply([effects.PatchStatus(status_fields(manifest_sha256=manifest_digest(job)))])
    created = js.created

    def read_pods():
        pods = incarnation.own(job_pods, ns, name, js.uid, created)
        controller_pods = [p for p in pods if p.role == lbl.ROLE_CONTROLLER]
        running = [p for p in controller_pods if not p.terminal and not p.deleting]
        return pods, controller_pods, max(running, key=lambda p: p.attempt, default=None)

    pods, controller_pods, current = read_pods()
    # What the body says before anything is decided: a job never un-finishes (a pass whose body predates
    # the finish must not count its teardown); a suspend's stops are no losses.
    with tracker.lock:
        tracker.finished = tracker.finished or finished
        tracker.suspended = bool(job.spec.suspend)
    if job.spec.suspend:
        # the pod the suspend stops is read until it exits: the step it checkpointed is what status keeps
        stopping = max((p for p in controller_pods if not p.terminal), key=lambda p: p.attempt, default=None)
        tracker.set_controller(None if finished else stopping, stopping=True)
    else:
        # a controller pod deleted by someone else is read until it exits (its replacement waits for that:
        # `Plan.replace_after_stop`): the step its stop checkpoints is the status's, and what the next resumes
        parting = None if current is not None or finished else _deleted_controller(controller_pods, previous)
        tracker.set_controller(None if finished else (current or parting), stopping=parting is not None)
    ctrl = tracker.refresh_status()
    # The poll may be HTTP in this thread (up to its timeout): the pod-event handler may have applied newer pods
    # meanwhile. Read the index again after it, marked, so neither the slice states nor the
    # decisions below act on the pods as they were before the poll.
    mark = tracker.observation()
    pods, controller_pods, current = read_pods()
    lost = read_lost()
    jobset_list = incarnation.own(job_jobsets, ns, name, js.uid, created)
    if not js.missed_losses_checked and not finished:
        # (a restarted operator: a slice replaced while none ran may hold a new worker at the old addresses, so
        # its seeded Ready is sent, never adopted from the controller's view: `JobTracker.notify`)
        restarts, _ = counters.carry_slices(previous, job.spec.slices.total, {v.slice_index: v for v in jobset_list})
        written = {e.index: e.restarts for e in previous.slices}
        tracker.unseed(i for i, n in enumerate(restarts) if n > written.get(i, n))
    # (the controller hears "slice Down: node lost" before the pods go, not "pod deleted")
    if tracker.observe(incarnation.of_live_jobsets(pods, jobset_list), post,
                       lost_nodes={n: loss.why for n, loss in lost.items()}, observed_at=mark,
                       jobsets_alive=_alive(jobset_list)):
        applier.apply([effects.ReportSlices()])
    if refusal is None and tracker.token_refused and not finished:
        refusal = token_refused(tracker.token_refused)
    if ctrl is not None and not job.spec.suspend and tracker.answer_uid == tracker.controller_uid:
        seen_down = tracker.slices_down_by_controller(ctrl)
        causes = {i: down_cause(ctrl, i) for i in seen_down}
        for i in seen_down:
            tracker.replacing(i, causes[i])
        applier.apply(effects.worker_replacements({i: list(tracker.slices[i].pods) for i in seen_down}, causes))

    jobsets = {v.slice_index: v for v in jobset_list}
    last = ctrl or tracker.last_status
    last_reason = last.failure_reason if last else None
    worker_pods = [p for p in pods if p.role == lbl.ROLE_WORKER]
    plan = decide(job, Observed(dict(status), controller_pods, jobsets, last_reason, worker_pods, now_rfc3339(clock),
                                js.expected_pod_age_s(previous.controller_pod), lost,
                                controller_phase=last.phase if last else None))
    renderer = renderer_for(job.spec.backend)

    def adopted(child: dict) -> dict:
        kopf.adopt(child, owner=body)
        return child

    applied = applier.apply(effects.child_effects(
        plan, js.node_lost_pods, state.node_lost_s, blocked,
        lambda n: adopted(renderer.controller_pod(job, n, body["metadata"]["uid"])),
        lambda i: adopted(renderer.worker_jobset(job, i))), effects.Applied(refusal, invalid))
    refusal, invalid, created_controller = applied.refusal, applied.invalid, applied.controller_created
    node_lost_messages = effects.node_lost_messages(plan, state.node_lost_s)
    if created_controller:
        controller_pod = applied.controller_pod
    elif plan.create_controller is not None and not blocked:
        controller_pod = previous.controller_pod  # still the one that died: retried next pass
    elif job.spec.suspend:
        controller_pod = ""
    elif not current:
        controller_pod = previous.controller_pod
    else:
        controller_pod = current.name
    if invalid is not None:
        # the job Failed (InvalidSpec, with an Event) and what runs stops
        applier.apply(invalid_failure(invalid, status, generation, now_rfc3339(clock), controller_pods, jobsets))
        return
    follow_up, replaced = effects.after_creates(plan, created_controller)
    applier.apply(follow_up)  # (a finish: `MarkFinished` among them)
    # A controller's restart back-off ends at a time, not at news: the daemon wakes for it (`JobTracker.wake_at`).
    tracker.wake_at = None if plan.wake_in_s is None else clock.monotonic() + plan.wake_in_s
    restarts = previous.controller_restarts + (1 if replaced else 0)

    previous_slices = previous.slices
    if finished and previous_slices:
        # A finished job keeps its last slice states: its teardown (JobSets deleted, pods gone, or a
        # tracker new after an operator restart) is not news, and rewriting it every pass never ends.
        slice_entries, replacements = previous_slices, previous.slice_replacements
        recoveries, counter_base, job_goodput, lost_steps = previous.recoveries, None, None, None
    else:
        # (totals over every controller pod and JobSet the job had: suspend/resume or a new controller
        # pod start their own counts at 0)
        counts = counters.carry(previous, job.spec.slices.total, tracker.answer_uid if ctrl is not None else "",
                                None if finished else counters.controller_recoveries(ctrl), jobsets,
                                None if finished or ctrl is None else goodput_ledger.live_ledger(ctrl),
                                js.unwritten_goodput, _freezes(tracker))
        counts = steps_lost.carry_steps_lost(previous, counts, None if finished else ctrl,
                                             tracker.answer_uid if ctrl is not None else "")
        slice_entries = slice_status(tracker, counts.slice_restarts, previous_slices, now_rfc3339(clock))
        _post_missed_losses(js, previous_slices, counts.slice_restarts, post)
        slice_entries = with_warming(slice_entries, None if job.spec.suspend else ctrl)
        replacements, recoveries, counter_base = counts.slice_replacements, counts.recoveries, counts.base
        job_goodput, lost_steps = counts.goodput, counts.steps_lost
    now = now_rfc3339(clock)  # (one time for the whole status of this pass)
    rejected = changed_fields(job.spec.to_manifest(), live.spec.to_manifest())
    observed = StatusObserved(
        inputs=Inputs(job=job, generation=generation, previous=previous, slices=slice_entries,
                      controller=None if finished else ctrl, controller_pod=controller_pod,
                      controller_restarts=restarts, slice_replacements=replacements, recoveries=recoveries,
                      counter_base=counter_base, finish=plan.finish, rejected_fields=rejected, now=now,
                      goodput=job_goodput, suspend_waits_for=plan.suspend_waits_for, steps_lost=lost_steps,
                      controller_lost=plan.controller_restarted, replace_after_stop=plan.replace_after_stop,
                      backoff=plan.backoff, losses_in_a_row=plan.losses_in_a_row_written(replaced),
                      answered_by=_answered_by(tracker.answer_uid if ctrl is not None else "", controller_pods),
                      token_secret=names.secret(name) if js.token_secret_ours else ""),
        status=status, finished=finished, refusal=refusal, controller_pods=controller_pods, worker_pods=worker_pods, jobsets=jobsets,
        current=current, controller_created_now=plan.create_controller is not None,
        node_lost_messages=node_lost_messages)
    if observed.running:
        # (HTTP reads of Events, bounded: before the decision, never inside it)
        observed.creation_refusal = _pod_creation_refusals(state, js, ns, job, jobsets, worker_pods)
        observed.whole = all(t.state == "Ready" for t in tracker.slices) and current is not None and current.ready
        observed.answer_fault = tracker.answer_fault_message(clock.monotonic())
        observed.unresponsive = tracker.unresponsive_message(clock.monotonic())
        observed.unresponsive_ended = tracker.unresponsive_ended()
        observed.since_write_s = js.since_status_write(clock.monotonic())
    decision = decide_status(observed)
    js.unwritten_goodput = goodput_ledger.newest(decision.unwritten_goodput, js.unwritten_goodput)
    applier.apply(decision.effects)
    if decision.written is None:
        return  # the worker pods' template was refused as invalid: the job failed (`MarkFinished` applied)
    js.patched(resource_version, len(patch.status) > 0, clock.monotonic())
    applier.apply(expiry(job.spec.ttl_seconds_after_finished, decision.written, clock.now()))
    # Quiet: whole and running, its controller answering well, nothing created, written or posted. The same
    # inputs would give the same nothing: the daemon skips such passes (`reconcile_once`).
    # A controller restart's back-off is quiet too once announced: nothing moves until it ends (`wake_at`).
    waiting = plan.backoff is not None and not lost and refusal is None
    tracker.last_pass_quiet = ((waiting or (observed.running and observed.whole and observed.answer_fault is None
                                            and observed.unresponsive is None and refusal is None and not lost
                                            and ctrl is not None and tracker.answer_uid == tracker.controller_uid))
                               and not tracker.token_refused
                               and plan.create_controller is None and not created_controller
                               and not post.pending and _nothing_patched(patch))
    return True


def _post_missed_losses(js: JobState, previous: list[SliceStatusEntry], restarts: list[int], post: EventLog) -> None:
    """On the job's first counted pass in this process: SliceDown for the losses while no operator ran
    (`missed_losses`), each also a slice replacement in the operator's metric."""
    if js.missed_losses_checked:
        return
    js.missed_losses_checked = True
    with js.tracker.lock:
        down_now = {t.index for t in js.tracker.slices if t.state == "Down"}
    for event in missed_loss_events(previous, restarts, down_now):
        post(*event)
        metrics.SLICE_REPLACEMENTS.inc()


def _freezes(tracker: JobTracker) -> list:
    """The current controller's freezes (`tracker.Freeze`) when this pass's answer is its own, else none."""
    with tracker.lock:
        return list(tracker.freezes) if tracker.answer_uid == tracker.controller_uid else []


def _deleted_controller(controller_pods: list, status: ElasticTrainingJobStatus) -> Any:
    """The pod `status.controllerPod` names while it is being deleted gracefully and has not stopped yet, else
    None (a force delete, grace 0: nothing runs there to read)."""
    name = status.controller_pod
    return next((p for p in controller_pods if name and p.name == name and p.deleting and not p.terminal
                 and p.deletion_grace_s != 0), None)


def _answered_by(uid: str, controller_pods: list) -> str:
    """The name of the controller pod of UID `uid` ("" when none of `controller_pods` is that one)."""
    return next((p.name for p in controller_pods if uid and p.uid == uid), "")


def _nothing_patched(patch) -> bool:
    """Whether a pass's kopf patch is empty (status, and anything else kopf would send)."""
    return not patch.status and not (isinstance(patch, dict) and any(patch.values()))


# Seconds between two reads of the Events of a job's JobSets/Jobs while pods are missing (API load bound).
REFUSAL_CHECK_S = 5.0


def _pod_creation_refusals(state: OperatorState, js: JobState, ns: str, job, jobsets: dict,
                           worker_pods: list) -> Any:
    """Why worker pods that the JobSet and Job controllers should create are missing, from their Warning Events.

    The Job controller creates worker pods, not the operator: a refusal (ResourceQuota, LimitRange,
    PodSecurity, a webhook) is only a FailedCreate Event on the Job. Read (field selectors, at most
    every REFUSAL_CHECK_S per job, only while a slice whose JobSet exists lacks pods) and kept on the
    job's state, so the condition holds between reads.

    Returns:
      A `PodFault` (PodsNotStarting) naming the slice, the object and the API server's message, or None.
    """
    from kubernetes.client.rest import ApiException

    missing = slices_missing_pods(worker_pods, {i: v.created for i, v in jobsets.items()}, job.spec.slices.hosts_per_slice)
    if not missing:
        js.creation_fault = None
        return None
    if js.clock.monotonic() - js.refusal_checked < REFUSAL_CHECK_S:
        return js.creation_fault
    js.refusal_checked = js.clock.monotonic()
    fault = None
    for i in missing:
        jobset = jobsets[i]
        found = []
        job_name = f"{jobset.name}-{names.WORKER_REPLICATED_JOB}-0"
        for kind, name in ((contract.JOBSET_KIND, jobset.name), ("Job", job_name)):
            try:
                # By UID: only Events of the job's own JobSet and of the Job that JobSet owns, never of a
                # foreign object holding the name (its Events would tell the tenant about its pods).
                uid = jobset.uid if kind == contract.JOBSET_KIND else state.kube.job_uid_if_owned(ns, job_name, jobset.uid)
                if not uid:
                    continue
                found += [RefusalEvent(kind, name, e["reason"], e["message"], e["last"])
                          for e in state.kube.warning_events(ns, kind, name, uid)]
            except (ApiException, OSError) as e:  # no `list events` (an older chart) or the API is away: no news
                _logger.warning("cannot read the Events of %s %s: %s", kind, name, e, extra={"job": job.metadata.name})
                return js.creation_fault
        fault = creation_fault(i, found, jobset.created)
        if fault is not None:
            break
    js.creation_fault = fault
    return fault


# `status.slices[i].reason` of a slice whose workers a suspend stopped.
SUSPENDED_SLICE_REASON = "workers stopped: the job is suspended (spec.suspend)"


FINISHED_SLICE_REASON = "workers stopped: the job has finished (status.phase)"


def slice_status(tracker: JobTracker, restarts: list[int], previous: list[SliceStatusEntry],
                 now: str) -> list[SliceStatusEntry]:
    """`status.slices` from the tracker; a slice's lastTransitionTime changes only when its state does.

    `restarts` are the slices' restarts by index, over all their JobSets (`counters.carry`).

    A slice the tracker never saw change (still the initial Provisioning, or
    any state after an operator restart) has no time of its own: it keeps the
    previous status's time when the state is the same, else it takes `now`;
    the next pass finds that time in `previous` (a pass waits for its last
    status write to come back, `JobState.body_behind`). A slice Down before
    and now keeps the pods written when it went Down (the ones it lost),
    outside a teardown. A pure read: the tracker is not changed.
    """
    before = {s.index: s for s in previous}
    out = []
    with tracker.lock:
        for t in tracker.slices:
            since = t.since
            if not since:
                prev = before.get(t.index)
                same = prev is not None and prev.state == t.state and prev.last_transition_time
                since = prev.last_transition_time if same else now
            reason, pods = t.reason, list(t.pods)
            prev = before.get(t.index)
            if t.state == "Down" and prev is not None and prev.state == "Down" and not tracker.teardown:
                # the pods it lost (its reason names them), until it is Ready again: its pods changing while
                # Down (the failed pod, none, the replacement Pending) rewrote status with no printed change.
                # (a teardown's slices show their pods going: nothing replaces them)
                pods = list(prev.pods)
            if (tracker.suspended or tracker.finished) and t.state in ("Down", "Draining"):
                # the operator stopped these workers: "exit code 143" would read as a failure
                reason = SUSPENDED_SLICE_REASON if tracker.suspended else FINISHED_SLICE_REASON
            out.append(SliceStatusEntry(index=t.index, state=t.state,
                                        restarts=restarts[t.index] if t.index < len(restarts) else 0,
                                        pods=pods, addresses=list(t.addresses), reason=reason,
                                        last_transition_time=since))
    return out
