"""Kopf handlers: thin shells around `reconcile.decide`, `slices` and `tracker`.

- indexes of the jobs' pods and JobSets (label selectors, no full lists), and of
  the nodes that are not Ready (node loss, issue 9 item 5);
- a pod event handler that notifies the controller the moment a worker pod
  changes (the latency path);
- one timer per job that reconciles children, polls the controller and
  writes status (the convergence path; it also rebuilds everything after
  an operator restart);
- create validates the spec: a bad one ends `Failed` with a condition naming
  the field (`kopf.PermanentError`, never a retry loop).
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import time
from typing import Any

import kopf
import yaml

from elastic_jax.api import job as job_api
from elastic_jax.api import labels as lbl
from elastic_jax.api.manifest import ManifestError, parse_manifest, safe_load_bounded
from elastic_jax.api.status import COND_FAILED, FINISHED_PHASES
from elastic_jax.k8s_operator import backends, children, claims, incarnation, metrics, names, service_accounts, tokens
from elastic_jax.k8s_operator.backends import UnsupportedBackend, renderer_for
from elastic_jax.k8s_operator.backends import pathways as pathways_backend
from elastic_jax.k8s_operator.conditions import now_rfc3339, set_condition
from elastic_jax.k8s_operator.kube import ChildRefused, Kube
from elastic_jax.k8s_operator.nodes import DEFAULT_NODE_LOST_SECONDS, NodeLoss, lost_nodes, node_view
from elastic_jax.k8s_operator.head_status import with_resource_manager
from elastic_jax.k8s_operator.reconcile import Observed, dead, decide, jobset_view
from elastic_jax.k8s_operator.pod_faults import RefusalEvent, creation_fault, pod_faults, slices_missing_pods
from elastic_jax.k8s_operator.slices import pod_view
from elastic_jax.k8s_operator.status_builder import (
    Inputs,
    build_status,
    changed_fields,
    resume_events,
    create_failure,
    child_conflict,
    previous_job_terminating,
    token_conflict,
    token_refused,
    with_create_failure,
    with_node_loss,
    with_pod_faults,
)
from elastic_jax.k8s_operator.tracker import JobTracker

_logger = logging.getLogger(__name__)
JOBS = (job_api.GROUP, job_api.VERSION, job_api.PLURAL)
_HAS_JOB = {lbl.JOB_NAME: kopf.PRESENT}


# This operator's name in job claims (`claims`): the chart sets `<release namespace>/<release name>`.
OPERATOR_IDENTITY_ENV = "ELASTIC_JAX_OPERATOR_IDENTITY"
DEFAULT_IDENTITY = "elastic-jax-operator"

# File holding the operator key (the chart mounts its Secret there); unset: a random key per process.
OPERATOR_KEY_FILE_ENV = "ELASTIC_JAX_OPERATOR_KEY_FILE"


class OperatorState:
    """Shared by all handlers through kopf's memo: the API client, the key its job tokens derive from, one tracker per job.

    Args:
      kube: the API client (built on first use when None).
      key: the operator key (`tokens.derive_token`); None reads `$ELASTIC_JAX_OPERATOR_KEY_FILE`.
      node_lost_s: seconds a node must be not Ready before the jobs' pods on it are
        force-deleted (`--node-lost-seconds`); 0 turns that off.

    Raises:
      tokens.OperatorKeyError: the key file is unreadable or too short.
    """

    def __init__(self, kube: Kube | None = None, key: bytes | None = None,
                 node_lost_s: float = DEFAULT_NODE_LOST_SECONDS, identity: str = DEFAULT_IDENTITY):
        self._kube = kube
        self.identity = identity
        # UIDs of the jobs another operator claimed (reported once each, counted in the gauge).
        self.claimed_elsewhere: set[str] = set()
        self.node_lost_s = node_lost_s
        self.key = key if key is not None else tokens.load_key(os.environ.get(OPERATOR_KEY_FILE_ENV))
        self.trackers: dict[tuple[str, str], JobTracker] = {}
        # (namespace, name) -> (job UID, the spec it started with): a new job of the same name never reads it.
        self.applied: dict[tuple[str, str], tuple[str, job_api.ElasticTrainingJob]] = {}
        # (job UID, kind, name) of the ConfigMap and Services already created: keyed by UID, so a job
        # deleted and created again under the same name gets its children again.
        self.static_done: set[tuple[str, str, str]] = set()

    @property
    def kube(self) -> Kube:
        if self._kube is None:
            self._kube = Kube()
        return self._kube


def _state(memo: Any) -> OperatorState:
    if "elasticjax" not in memo:
        memo["elasticjax"] = OperatorState()
    return memo["elasticjax"]


def _ref(body: Any) -> dict[str, Any]:
    """A minimal object reference for Events."""
    meta = body["metadata"]
    return {"apiVersion": job_api.API_VERSION, "kind": job_api.KIND,
            "metadata": {"name": meta["name"], "namespace": meta["namespace"], "uid": meta["uid"]}}


def _event_sink(ref: dict[str, Any]):
    def post(type_: str, reason: str, message: str) -> None:
        kopf.event(ref, type=type_, reason=reason, message=message[:1000])
    return post


def parse_job(body: Any) -> job_api.ElasticTrainingJob:
    """Validates the live object with the pydantic models.

    Raises:
      ManifestError: the spec is invalid (message names the field).
      UnsupportedBackend: no renderer for spec.backend, or one it cannot render (e.g. an unknown TPU), or
        a spec.controller.serviceAccountName (or its token) the admin did not allow (`service_accounts`).
    """
    meta = body["metadata"]
    data = {"apiVersion": body.get("apiVersion", job_api.API_VERSION), "kind": job_api.KIND,
            # the UID goes on every child as a label (`incarnation`)
            "metadata": {"name": meta["name"], "namespace": meta.get("namespace"), "uid": meta.get("uid")},
            "spec": dict(body.get("spec") or {})}
    # The resolved spec (pathways: hosts per slice from the topology) is what the
    # ConfigMap, the tracker and the renderers all see.
    job = backends.resolve(parse_manifest(data, "spec"))
    try:
        service_accounts.POLICY.check(job, body["metadata"].get("namespace") or "default")
    except service_accounts.ServiceAccountRefused as e:
        raise UnsupportedBackend(str(e)) from None
    return job


def _fail_spec(patch: Any, status: Any, generation: int, message: str, body: Any = None) -> None:
    """The job Failed with condition reason InvalidSpec; with `body`, also one Warning Event `InvalidSpec`
    naming the field (kopf's own "failed permanently" event is not reliable enough to promise)."""
    if body is not None:
        _event_sink(_ref(body))("Warning", "InvalidSpec", message)
    patch.status["phase"] = "Failed"
    patch.status["failureReason"] = message
    patch.status["observedGeneration"] = generation
    patch.status["conditions"] = set_condition(list(status.get("conditions") or []), COND_FAILED, "True",
                                               "InvalidSpec", message, generation, now_rfc3339())


# -- indexes ------------------------------------------------------------------------------


@kopf.index("v1", "pods", labels=_HAS_JOB)
def job_pods(namespace, labels: dict, body, **_):
    """(namespace, job, job UID) → PodView of each of the job's pods (controller and workers); read with
    `incarnation.own`."""
    return {incarnation.index_key(namespace, labels): pod_view(body)}


@kopf.index("jobset.x-k8s.io", "v1alpha2", "jobsets", labels=_HAS_JOB)
def job_jobsets(namespace, labels: dict, body, **_):
    """(namespace, job, job UID) → JobSetView of each of the job's worker JobSets; read with `incarnation.own`."""
    try:
        index = int(labels.get(lbl.SLICE_INDEX, "-1"))
    except ValueError:
        return None
    return {incarnation.index_key(namespace, labels): jobset_view(body, index)}



def unready_nodes(name, body, **_):
    """node name → NodeView of each node whose Ready condition is not True (cluster-scoped, read only).

    Ready nodes return an empty mapping, which drops the node from the index
    (None would keep its last entry), so the index stays as small as the
    cluster's trouble. Registered by `register_node_index`.
    """
    view = node_view(body)
    return {} if view.ready == "True" else {name: view}


def register_node_index() -> None:
    """Registers the Node index, so handlers get `unready_nodes`.

    Only when node-loss handling is on (`--node-lost-seconds` > 0): watching
    Nodes needs cluster-wide read access, which an operator that never acts on
    nodes should not need (and an install without that rule keeps working).
    """
    kopf.index("v1", "nodes", id="unready_nodes")(unready_nodes)


def _lost_nodes(state: OperatorState, unready_nodes) -> dict[str, NodeLoss]:
    """The nodes not Ready for longer than the operator's bound, by name ({} when off or none)."""
    views = [v for store in (unready_nodes or {}).values() for v in store]
    return lost_nodes(views, now_rfc3339(), state.node_lost_s)


# -- the latency path: a worker pod changed ------------------------------------------------


@kopf.on.event("v1", "pods", labels={lbl.JOB_NAME: kopf.PRESENT, lbl.ROLE: lbl.ROLE_WORKER})
def worker_pod_event(namespace, labels: dict, job_pods, memo, unready_nodes=None, **_):
    """Recomputes the pod's slice and tells the controller at once (the timer catches up otherwise)."""
    state = _state(memo)
    tracker = state.trackers.get((namespace, labels[lbl.JOB_NAME]))
    if tracker is None or tracker.ref is None:
        return  # job not reconciled yet (operator starting): its timer will sync
    if not incarnation.belongs(labels, tracker.job_uid):
        return  # a pod of an earlier job of the same name (terminating): not this job's news
    lost = {n: loss.why for n, loss in _lost_nodes(state, unready_nodes).items()}
    pods = incarnation.own(job_pods, namespace, tracker.name, tracker.job_uid, tracker.job_created)
    tracker.sync(pods, _event_sink(tracker.ref), retries=3, lost_nodes=lost)


# -- the job ----------------------------------------------------------------------------------


@kopf.on.create(*JOBS)
def job_created(body, spec, status, meta, patch, **_):
    """Validates the spec; a bad one ends the job Failed with the field named (no retries)."""
    try:
        parse_job(body)
    except (ManifestError, UnsupportedBackend) as e:
        message = str(e)
        _fail_spec(patch, status, meta.get("generation", 0), message, body)
        raise kopf.PermanentError(message)
    patch.status["phase"] = status.get("phase") or "Pending"


@kopf.on.delete(*JOBS, optional=True)
def job_deleted(namespace, name, uid, memo, **_):
    """Forgets the job; its children go with it through owner references."""
    state = _state(memo)
    if uid in state.claimed_elsewhere:
        state.claimed_elsewhere.discard(uid)
        metrics.JOBS_CLAIMED_ELSEWHERE.set(len(state.claimed_elsewhere))
    state.static_done = {m for m in state.static_done if m[0] != uid}
    tracker = state.trackers.get((namespace, name))
    if tracker is not None and tracker.job_uid in ("", uid):  # never a newer job's of the same name
        state.trackers.pop((namespace, name)).close()
    if (state.applied.get((namespace, name)) or ("",))[0] == uid:
        state.applied.pop((namespace, name), None)


def _applied_job(state: OperatorState, key, job: job_api.ElasticTrainingJob, uid: str) -> job_api.ElasticTrainingJob:
    """The spec the job started with (from its ConfigMap, if this job `uid` owns it), with today's suspend and TTL."""
    remembered = state.applied.get(key)
    applied = remembered[1] if remembered is not None and remembered[0] == uid else None
    if applied is None:
        text = state.kube.read_manifest(key[0], names.configmap(key[1]), uid)
        if text:
            try:
                applied = parse_manifest(safe_load_bounded(text), "configmap")
                # Anyone who may edit ConfigMaps of the namespace could have changed this copy: it
                # must pass the admin's ServiceAccount rule as the live spec did (docs/security.md).
                service_accounts.POLICY.check(applied, key[0])
            except service_accounts.ServiceAccountRefused as e:
                _logger.warning("ignoring the manifest ConfigMap of %s/%s: %s", key[0], key[1], e)
                applied = None
            except (ManifestError, yaml.YAMLError):
                applied = None
        applied = applied or job
        state.applied[key] = (uid, applied)
    return applied.model_copy(update={"metadata": job.metadata, "spec": applied.spec.model_copy(update={
        "suspend": job.spec.suspend, "ttl_seconds_after_finished": job.spec.ttl_seconds_after_finished})})


def _tracker(state: OperatorState, key, job: job_api.ElasticTrainingJob, body) -> JobTracker:
    tracker = state.trackers.get(key)
    uid = body["metadata"]["uid"]
    if tracker is not None and tracker.job_uid != uid:  # the same name, a new job: nothing carries over
        tracker.close()
        state.applied.pop(key, None)
        tracker = None
    if tracker is None:
        tracker = JobTracker(key[0], key[1], job.spec.slices.count, job.spec.slices.hosts_per_slice)
        tracker.job_uid = uid
        tracker.job_created = body["metadata"].get("creationTimestamp") or ""
        state.trackers[key] = tracker
    tracker.ref = _ref(body)
    return tracker


class TokenSecretConflict(Exception):
    """The job's token Secret name is taken by a Secret this operator did not create for this job."""


class ChildConflict(Exception):
    """The job's ConfigMap or Service name is taken by an object this job does not own.

    Attributes:
      kind, name: the object.
    """

    def __init__(self, kind: str, name: str):
        super().__init__(f"{kind} {name}")
        self.kind, self.name = kind, name


def _ensure_token_secret(state: OperatorState, key, job, tracker: JobTracker, body, status, patch) -> None:
    """Creates the job's token Secret (create only: the operator cannot read Secrets) and sets `tracker.token`.

    The token is derived from the operator key and the job's UID, so it is never
    read back. A Secret of that name that already exists is used only when this
    job's status (which tenants cannot write) records that the operator created
    it; otherwise it may be anyone's, and mounting it would hand it to the job.

    Raises:
      TokenSecretConflict: the name is taken by a Secret not recorded as ours.
      ChildRefused: the API server refused the create.
    """
    ns, name = key
    secret_name = names.secret(name)
    token = tokens.derive_token(state.key, body["metadata"]["uid"])
    if not (tracker.token_secret_ours or status.get("tokenSecret") == secret_name):
        secret = children.token_secret(job, token)
        kopf.adopt(secret, owner=body)  # ownerReference: this job's UID, controller=true
        if not state.kube.create(ns, secret):
            raise TokenSecretConflict(secret_name)
        patch.status["tokenSecret"] = secret_name
    tracker.token_secret_ours = True
    tracker.token = token


def _ensure_static(state: OperatorState, key, job, tracker: JobTracker, body) -> None:
    """ConfigMap (manifest) and Services (`children.static_children`): created once per job UID.

    One that exists already (409) is used only when it is this job's (its
    ownerReference has the job's UID: an operator restart); a ConfigMap
    planted under that name would choose the job's code and image, a Service
    would route its traffic.

    Raises:
      ChildConflict: the name is taken by an object this job does not own.
      ChildRefused: the API server refused the create.
    """
    ns, _ = key
    uid = body["metadata"]["uid"]
    for child in children.static_children(job):
        marker = (uid, child["kind"], child["metadata"]["name"])
        if marker not in state.static_done:
            kopf.adopt(child, owner=body)
            name = child["metadata"]["name"]
            if not state.kube.create(ns, child) and not state.kube.owned_by(ns, child["kind"], name, uid):
                raise ChildConflict(child["kind"], name)
            state.static_done.add(marker)


@kopf.timer(*JOBS, interval=1.0)
def reconcile_job(body, spec, status, meta, namespace, name, patch, memo, job_pods, job_jobsets,
                  unready_nodes=None, **_):
    """One reconcile pass: children, controller notifications, status. Idempotent.

    Only for a job this operator claimed (`claims`): an unclaimed job is claimed first; a job
    another operator claimed is left alone, said once (Event, log, metric).
    """
    key = (namespace, name)
    generation = meta.get("generation", 0)
    state = _state(memo)
    if not _claimed(state, body, namespace, name):
        return
    try:
        live = parse_job(body)
    except (ManifestError, UnsupportedBackend) as e:
        if status.get("phase") != "Failed":
            _fail_spec(patch, status, generation, str(e), body)
        return
    try:
        _reconcile(state, key, live, body, status, generation, patch, job_pods, job_jobsets,
                   _lost_nodes(state, unready_nodes))
        metrics.RECONCILES.labels("ok").inc()
    except Exception:
        metrics.RECONCILES.labels("error").inc()
        raise


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
            _event_sink(_ref(body))("Warning", claims.REASON_CLAIMED_ELSEWHERE, message)
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
               lost: dict[str, NodeLoss] | None = None) -> None:
    lost = lost or {}
    ns, name = key
    job = _applied_job(state, key, live, body["metadata"]["uid"])
    tracker = _tracker(state, key, job, body)
    post = _event_sink(tracker.ref)
    finished = status.get("phase") in FINISHED_PHASES

    refusal: tuple[str, str] | None = None  # the first child the API server refused in this pass
    blocked = False  # no token Secret of ours: start nothing
    if not finished and not job.spec.suspend:
        try:
            _ensure_token_secret(state, key, job, tracker, body, status, patch)
            _ensure_static(state, key, job, tracker, body)
        except TokenSecretConflict as e:
            refusal, blocked = token_conflict(str(e)), True
        except ChildConflict as e:
            refusal, blocked = child_conflict(e.kind, e.name), True
        except ChildRefused as e:
            refusal, blocked = create_failure(e.kind, e.name, e.status, e.message), True
    created = body["metadata"].get("creationTimestamp") or ""
    pods = incarnation.own(job_pods, ns, name, tracker.job_uid, created)
    controller_pods = [p for p in pods if p.role == lbl.ROLE_CONTROLLER]
    running = [p for p in controller_pods if not p.terminal and not p.deleting]
    current = max(running, key=lambda p: p.attempt, default=None)
    tracker.finished, tracker.suspended = finished, bool(job.spec.suspend)
    tracker.set_controller(None if finished or job.spec.suspend else current)
    ctrl = tracker.poll_status()
    # (the controller hears "slice Down: node lost" before the pods go, not "pod deleted")
    tracker.sync(pods, post, lost_nodes={n: loss.why for n, loss in lost.items()})
    if refusal is None and tracker.token_refused and not finished:
        refusal = token_refused(tracker.token_refused)
    if ctrl is not None:
        for i in tracker.slices_down_by_controller(ctrl):
            for pod_name in tracker.slices[i].pods:
                post("Warning", "WorkerReplaced", f"controller saw slice {i} fail while pod {pod_name} runs; deleting it")
                state.kube.delete_pod(ns, pod_name, grace_s=0)

    jobsets = {v.slice_index: v for v in incarnation.own(job_jobsets, ns, name, tracker.job_uid, created)}
    last_reason = (ctrl or tracker.last_status).failure_reason if (ctrl or tracker.last_status) else None
    worker_pods = [p for p in pods if p.role == lbl.ROLE_WORKER]
    plan = decide(job, Observed(dict(status), controller_pods, jobsets, last_reason, worker_pods, now_rfc3339(),
                                tracker.expected_pod_age_s(status.get("controllerPod") or ""), lost))
    node_lost_messages = []
    for stranded in plan.force_delete:
        # grace 0, as the out-of-service taint's pod GC: only a dead kubelet could end a graceful delete
        message = stranded.message(state.node_lost_s)
        node_lost_messages.append(message)
        if stranded.uid not in tracker.node_lost_pods:  # one Event per pod, not one per pass
            tracker.node_lost_pods.add(stranded.uid)
            post("Warning", "NodeLost", message)
            metrics.NODE_LOST_PODS.labels("controller" if stranded.slice_index < 0 else "worker").inc()
            _logger.warning("%s", message, extra={"job": name, "node": stranded.loss.node, "pod": stranded.pod})
        state.kube.delete_pod(ns, stranded.pod, grace_s=0)
    for js in plan.delete_jobsets:
        state.kube.delete_jobset(ns, js)
    for pod_name in plan.delete_pods:
        # graceful: SIGTERM lets a live controller checkpoint first (suspend)
        state.kube.delete_pod(ns, pod_name)
    renderer = renderer_for(job.spec.backend)
    controller_pod = current.name if current else ""
    created_controller = False
    if plan.create_controller is not None and not blocked:
        pod = renderer.controller_pod(job, plan.create_controller, body["metadata"]["uid"])
        kopf.adopt(pod, owner=body)
        try:
            pod_name = pod["metadata"]["name"]
            if state.kube.create(ns, pod) or state.kube.owned_by(ns, "Pod", pod_name, body["metadata"]["uid"]):
                controller_pod = pod_name
                created_controller = True
                tracker.created_controller = (controller_pod, time.monotonic())
            else:
                # An earlier incarnation's pod still in its grace period: wait for it, count nothing. Any
                # other pod of that name is not ours to wait for or delete: say so (a trial found a
                # foreign pod reported as "an earlier job ... terminating").
                earlier = any(k[:2] == (ns, name) and k[2] != tracker.job_uid and any(p.name == pod_name for p in v)
                              for k, v in (job_pods or {}).items())
                refusal = refusal or (previous_job_terminating("Pod", pod_name) if earlier
                                      else child_conflict("Pod", pod_name))
                controller_pod = status.get("controllerPod") or ""
        except ChildRefused as e:
            refusal = refusal or create_failure(e.kind, e.name, e.status, e.message)
            controller_pod = status.get("controllerPod") or ""  # still the one that died: retried next pass
    elif job.spec.suspend:
        controller_pod = ""
    elif not current:
        controller_pod = status.get("controllerPod") or ""
    for i in [] if blocked else plan.create_jobsets:
        js = renderer.worker_jobset(job, i)
        if plan.pathways_head:
            js["metadata"].setdefault("annotations", {})[lbl.PATHWAYS_HEAD] = plan.pathways_head
        kopf.adopt(js, owner=body)
        try:
            state.kube.create(ns, js)
        except ChildRefused as e:
            refusal = refusal or create_failure(e.kind, e.name, e.status, e.message)
    # A replacement is counted (and announced) once it exists: a refused or blocked create is
    # the CreateFailed condition's news, retried each pass without spending maxRestarts.
    replaced = plan.controller_restarted and created_controller
    for event in plan.events:
        if replaced or event[1] != "ControllerRestarted":
            post(*event)
    restarts = int(status.get("controllerRestarts") or 0) + (1 if replaced else 0)
    if replaced:
        metrics.CONTROLLER_RESTARTS.inc()
    if plan.finish:
        post("Normal" if plan.finish[0] == "Succeeded" else "Warning", f"Job{plan.finish[0]}", plan.finish[1])
        tracker.finished = True

    previous_slices = list(status.get("slices") or [])
    if finished and previous_slices:
        # A finished job keeps its last slice states: its teardown (JobSets deleted, pods gone, or a
        # tracker new after an operator restart) is not news, and rewriting it every pass never ends.
        slice_entries, replacements = previous_slices, int(status.get("sliceReplacements") or 0)
    else:
        slice_entries = slice_status(tracker, jobsets, previous_slices, now_rfc3339())
        replacements = (sum(v.restarts for v in jobsets.values()) if jobsets
                        else int(status.get("sliceReplacements") or 0))
    rejected = changed_fields(job.spec.to_manifest(), live.spec.to_manifest())
    new = build_status(Inputs(
        job=job, generation=generation, previous=dict(status), slices=slice_entries,
        controller=None if finished else ctrl, controller_pod=controller_pod, controller_restarts=restarts,
        slice_replacements=replacements,
        finish=plan.finish, rejected_fields=rejected, now=now_rfc3339()))
    new["conditions"], refusal_changed = with_create_failure(new["conditions"], refusal, generation, now_rfc3339())
    if refusal_changed:
        post("Warning", refusal[0], refusal[1])
    if not (finished or plan.finish or job.spec.suspend):
        # (a finished or suspended job keeps its last word: the pods are going away, not "pulled")
        faults = pod_faults(controller_pods + worker_pods)
        refused = _pod_creation_refusals(state, tracker, ns, job, jobsets, worker_pods)
        if refused is not None and refused.condition not in faults:
            faults[refused.condition] = refused
        new["conditions"], fault_events = with_pod_faults(new["conditions"], faults, generation, now_rfc3339())
        for event in fault_events:
            post(*event)
        whole = all(t.state == "Ready" for t in tracker.slices) and current is not None and current.ready
        new["conditions"], node_events = with_node_loss(new["conditions"], node_lost_messages, whole,
                                                        generation, now_rfc3339())
        for event in node_events:
            post(*event)
        if job.spec.backend == "pathways":
            head = current if current is not None and not dead(current) and plan.create_controller is None else None
            new["conditions"], head_events = with_resource_manager(
                new["conditions"], head, pathways_backend.RM_PORT,
                pathways_backend.RM_STARTUP_PERIOD_S * pathways_backend.RM_STARTUP_FAILURES, generation, now_rfc3339())
            for event in head_events:
                post(*event)
    for event in resume_events(status.get("resumedFrom"), new.get("resumedFrom")):
        post(*event)
    if new.get("phase") != status.get("phase"):
        post("Normal", "PhaseChanged", f"{status.get('phase') or 'New'} -> {new['phase']}")
    if rejected and not any(c.get("type") == "SpecChangeRejected" and c.get("status") == "True"
                            for c in status.get("conditions") or []):
        post("Warning", "SpecChangeRejected", f"{', '.join(rejected)} cannot change on an existing job")
    for k, v in new.items():
        if status.get(k) != v:
            patch.status[k] = v
    _maybe_expire(state, key, job, new)


# Seconds between two reads of the Events of a job's JobSets/Jobs while pods are missing (API load bound).
REFUSAL_CHECK_S = 5.0


def _pod_creation_refusals(state: OperatorState, tracker: JobTracker, ns: str, job, jobsets: dict,
                           worker_pods: list) -> Any:
    """Why worker pods that the JobSet and Job controllers should create are missing, from their Warning Events.

    The Job controller creates worker pods, not the operator: a refusal (ResourceQuota, LimitRange,
    PodSecurity, a webhook) is only a FailedCreate Event on the Job. Read (field selectors, at most
    every REFUSAL_CHECK_S per job, only while a slice whose JobSet exists lacks pods) and kept on the
    tracker, so the condition holds between reads.

    Returns:
      A `PodFault` (PodsNotStarting) naming the slice, the object and the API server's message, or None.
    """
    from kubernetes.client.rest import ApiException

    missing = slices_missing_pods(worker_pods, {i: v.created for i, v in jobsets.items()}, job.spec.slices.hosts_per_slice)
    if not missing:
        tracker.creation_fault = None
        return None
    if time.monotonic() - tracker.refusal_checked < REFUSAL_CHECK_S:
        return tracker.creation_fault
    tracker.refusal_checked = time.monotonic()
    fault = None
    for i in missing:
        jobset = jobsets[i]
        found = []
        for kind, name in (("JobSet", jobset.name), ("Job", f"{jobset.name}-{names.WORKER_REPLICATED_JOB}-0")):
            try:
                found += [RefusalEvent(kind, name, e["reason"], e["message"], e["last"])
                          for e in state.kube.warning_events(ns, kind, name)]
            except (ApiException, OSError) as e:  # no `list events` (an older chart) or the API is away: no news
                _logger.warning("cannot read the Events of %s %s: %s", kind, name, e, extra={"job": job.metadata.name})
                return tracker.creation_fault
        fault = creation_fault(i, found, jobset.created)
        if fault is not None:
            break
    tracker.creation_fault = fault
    return fault


def slice_status(tracker: JobTracker, jobsets: dict, previous: list[dict], now: str) -> list[dict]:
    """`status.slices` from the tracker; a slice's lastTransitionTime changes only when its state does.

    A slice the tracker never saw change (still the initial Provisioning, or
    any state after an operator restart) has no time of its own: it keeps the
    previous status's time when the state is the same, else it takes `now`,
    remembered so the next pass writes the same.
    """
    before = {s.get("index"): s for s in previous}
    out = []
    with tracker.lock:
        for t in tracker.slices:
            if not t.since:
                prev = before.get(t.index) or {}
                same = prev.get("state") == t.state and prev.get("lastTransitionTime")
                t.since = prev["lastTransitionTime"] if same else now
            out.append({"index": t.index, "state": t.state,
                        "restarts": jobsets[t.index].restarts if t.index in jobsets else 0,
                        "pods": list(t.pods), "addresses": list(t.addresses), "reason": t.reason,
                        "lastTransitionTime": t.since})
    return out


def _maybe_expire(state: OperatorState, key, job: job_api.ElasticTrainingJob, status: dict) -> None:
    """Deletes a finished job once `ttlSecondsAfterFinished` passed."""
    ttl = job.spec.ttl_seconds_after_finished
    done = status.get("completionTime")
    if ttl is None or status.get("phase") not in FINISHED_PHASES or not done:
        return
    finished_at = dt.datetime.strptime(done, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
    if (dt.datetime.now(dt.timezone.utc) - finished_at).total_seconds() >= ttl:
        _logger.info("deleting finished job %s/%s (ttlSecondsAfterFinished=%d)", key[0], key[1], ttl)
        state.kube.delete_job(*key)
