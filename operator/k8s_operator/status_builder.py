"""The job's new `.status` from the previous one and what the operator observed (pure)."""

from __future__ import annotations

import dataclasses
from typing import Any

from elastic_jax.api import status as st
from elastic_jax.api.control import ControllerStatus
from elastic_jax.api.job import ElasticTrainingJob
from elastic_jax.k8s_operator.conditions import derive_phase, set_condition


@dataclasses.dataclass
class Inputs:
    """Everything `build_status` reads.

    Attributes:
      job: the applied job (suspend/TTL from the live object).
      generation: metadata.generation of the live object.
      previous: the current `.status` dict.
      slices: per-slice status entries (camelCase dicts) from the tracker.
      controller: the controller's last status, None when unreachable.
      controller_pod: name of the current controller pod ("" when none).
      controller_restarts: after this pass.
      slice_replacements: slice replacements over every JobSet of the job (`counters.Counts`).
      recoveries: recoveries over every controller pod of the job (`counters.Counts`).
      counter_base: `status.counterBase` (camelCase) to write; None keeps the previous one.
      finish: ("Succeeded"|"Failed", reason) when the job ends in this pass.
      rejected_fields: spec fields edited that the operator refuses to apply.
      now: RFC 3339 time.
    """

    job: ElasticTrainingJob
    generation: int
    previous: dict[str, Any]
    slices: list[dict[str, Any]]
    controller: ControllerStatus | None
    controller_pod: str
    controller_restarts: int
    slice_replacements: int
    recoveries: int
    counter_base: dict[str, Any] | None
    finish: tuple[str, str] | None
    rejected_fields: list[str]
    now: str


def build_status(i: Inputs) -> dict[str, Any]:
    """The whole new status (camelCase), conditions with observedGeneration."""
    prev = i.previous
    out: dict[str, Any] = {k: v for k, v in prev.items() if k != "kopf"}
    finished = prev.get("phase") if prev.get("phase") in st.FINISHED_PHASES else None
    if finished is None and i.finish is not None:
        finished = i.finish[0]
        out["failureReason"] = i.finish[1] if finished == "Failed" else ""
        out["completionTime"] = i.now
    c = i.controller
    if c is not None:
        # A new controller reports step 0 until its restore ends (phase Starting): keep the step the
        # job had, or the STEP column reads 10361 -> 0 -> 10411 around a suspend or a controller loss.
        if not (c.phase == "Starting" and c.step == 0 and "step" in prev):
            out["step"] = c.step
        out["activeSlices"] = len(c.active_slices)
        if c.loss is not None:
            out["loss"] = round(c.loss, 5)
        if c.initial_loss is not None:
            out["initialLoss"] = round(c.initial_loss, 5)
        if c.last_committed_checkpoint_step is not None:
            out["lastCheckpointStep"] = c.last_committed_checkpoint_step
        if c.resumed_from is not None:
            out["resumedFrom"] = resumed_from_status(c, i.controller_pod)
        timed = [r.seconds for r in c.recovery_history if r.seconds is not None and r.cause != "scale_up"]
        if timed:
            out["lastRecoverySeconds"] = round(timed[-1], 3)
    elif finished or i.job.spec.suspend or not i.controller_pod:
        out["activeSlices"] = 0
    if finished == "Succeeded":
        # Exit 0 means the final step's checkpoint committed (`ControllerExit.SUCCEEDED`); the last
        # poll, before that save, said an older step (550 while 600 was committed).
        out["step"] = out["lastCheckpointStep"] = i.job.spec.training.steps
    out.update({
        "observedGeneration": i.generation,
        "desiredSlices": i.job.spec.slices.count,
        "totalSteps": i.job.spec.training.steps,
        "slices": i.slices,
        "controllerPod": i.controller_pod,
        "controllerRestarts": i.controller_restarts,
        "sliceReplacements": i.slice_replacements,
        "recoveries": i.recoveries,
        "startTime": prev.get("startTime") or i.now,
    })
    if i.counter_base is not None:
        out["counterBase"] = i.counter_base
    phase = derive_phase(
        finished=finished,
        suspended=i.job.spec.suspend,
        controller_phase=c.phase if c is not None else None,
        slice_states=[s["state"] for s in i.slices],
        active_slices=out.get("activeSlices", 0),
        desired_slices=i.job.spec.slices.count,
    )
    if c is None and not finished and not i.job.spec.suspend and prev.get("phase") in ("Running", "Degraded", "Recovering"):
        # The controller is briefly unreachable (exiting, or its pod being replaced): keep the last phase.
        phase = prev["phase"]
    out["phase"] = phase
    conds = list(prev.get("conditions") or [])
    g, now = i.generation, i.now
    training = phase in ("Running", "Degraded", "Recovering")
    conds = set_condition(conds, st.COND_RUNNING, str(training), phase, f"phase {phase}", g, now)
    degraded = phase in ("Degraded", "Recovering")
    if degraded or training:
        conds = set_condition(conds, st.COND_DEGRADED, str(degraded), "SlicesDown" if degraded else "AllSlicesActive",
                              f"{out.get('activeSlices', 0)}/{i.job.spec.slices.count} slices active", g, now)
    else:  # finished, suspended or not started: "AllSlicesActive, 0/2 active" would contradict itself
        conds = set_condition(conds, st.COND_DEGRADED, "False", "NotTraining", f"phase {phase}", g, now)
    if i.controller_restarts:
        conds = set_condition(conds, st.COND_CONTROLLER_RESTARTED, "True", "ControllerPodLost",
                              f"controller pod recreated {i.controller_restarts} time(s); now {i.controller_pod}", g, now)
    conds = set_condition(conds, st.COND_SUSPENDED, str(i.job.spec.suspend and not finished),
                          "Suspended" if i.job.spec.suspend else "NotSuspended", "spec.suspend", g, now)
    if i.rejected_fields:
        conds = set_condition(conds, st.COND_SPEC_REJECTED, "True", "ImmutableWhileRunning",
                              f"{', '.join(i.rejected_fields)} cannot change on an existing job; the job keeps "
                              "running with the spec it started with (revert the edit, or delete and re-create the job)",
                              g, now)
    elif any(x.get("type") == st.COND_SPEC_REJECTED for x in conds):
        conds = set_condition(conds, st.COND_SPEC_REJECTED, "False", "SpecApplied", "", g, now)
    # A job failed for its spec (the operator's parse, or a child the API server found invalid) keeps
    # its InvalidSpec condition: that reason is what the user must act on.
    invalid_spec = finished == "Failed" and any(
        x.get("type") == st.COND_FAILED and x.get("status") == "True" and x.get("reason") == REASON_INVALID_SPEC
        for x in conds)
    if finished and not invalid_spec:
        reason = out.get("failureReason") or "" if finished == "Failed" else f"trained {i.job.spec.training.steps} steps"
        conds = set_condition(conds, finished, "True", "JobFailed" if finished == "Failed" else "JobSucceeded",
                              reason, g, now)
    out["conditions"] = conds
    return out


def resumed_from_status(c: ControllerStatus, controller_pod: str) -> dict[str, Any]:
    """`status.resumedFrom` (camelCase) from the controller's `resumedFrom`; the controller must have resumed."""
    r = c.resumed_from
    w = r.writer
    return st.ResumedFrom(
        step=r.step, writer_namespace=w.namespace if w else "", writer_name=w.name if w else "",
        writer_uid=w.uid if w else "", fallback_reason=r.fallback_reason or "", controller_pod=controller_pod,
    ).model_dump(mode="json", by_alias=True)


def resume_events(previous: dict[str, Any] | None, current: dict[str, Any] | None) -> list[tuple[str, str, str]]:
    """(type, reason, message) Events for a resume newly reported in `status.resumedFrom`.

    One `Resumed` Event per resume (a new controller pod resuming counts again, even from the
    same step), plus a Warning `CheckpointFallback` when newer steps could not be restored.

    Args:
      previous: the job's `status.resumedFrom` before this pass (None when unset).
      current: the one built in this pass.
    """
    if not current or current == previous:
        return []
    r = st.ResumedFrom.model_validate(current)
    writer = (f"{r.writer_namespace}/{r.writer_name} (uid {r.writer_uid})" if r.writer_uid
              else "an unknown job (no writer identity saved)")
    events = [("Normal", st.EVENT_RESUMED, f"resumed from checkpoint step {r.step} written by {writer}")]
    if r.fallback_reason:
        events.append(("Warning", st.EVENT_CHECKPOINT_FALLBACK,
                       f"resumed from older checkpoint step {r.step}: {r.fallback_reason}"))
    return events


def changed_fields(applied: dict[str, Any], current: dict[str, Any], prefix: str = "spec") -> list[str]:
    """Dotted paths (camelCase) where two spec dicts differ, ignoring suspend and TTL."""
    out = []
    for key in sorted(set(applied) | set(current)):
        if prefix == "spec" and key in ("suspend", "ttlSecondsAfterFinished"):
            continue
        a, b = applied.get(key), current.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out.extend(changed_fields(a, b, f"{prefix}.{key}"))
        elif a != b:
            out.append(f"{prefix}.{key}")
    return out


# The Failed condition's reason when the spec is what is wrong (an Event of the same reason goes with it).
REASON_INVALID_SPEC = "InvalidSpec"


def invalid_child(kind: str, name: str, api_message: str) -> str:
    """The failure reason of a job whose child the API server refused as invalid (422): the spec copied into
    it breaks a rule `elastic-jax validate` and the CRD did not catch; retrying cannot help.

    Args:
      kind, name: the child.
      api_message: the API server's message, which names the field of the child (up to 900 characters).
    """
    return (f"the API server refused {kind} {name} as invalid, a spec field copied into it breaks the API "
            f"server's rules (fix the field it names and re-create the job): {api_message[:900]}")


# HTTP status of a refused create -> the condition's reason.
_REFUSAL_REASONS = {400: "BadRequest", 403: "Forbidden", 404: "NotFound", 422: "Invalid", 429: "TooManyRequests",
                     500: "ServerError", 503: "ServiceUnavailable"}


def create_failure(kind: str, name: str, http_status: int, api_message: str) -> tuple[str, str]:
    """(reason, message) of the CreateFailed condition for a child the API server refused.

    Args:
      kind, name: the child.
      http_status: 403 (admission such as PodSecurity, or RBAC), 422 (invalid), ...
      api_message: the API server's message, passed on whole (up to 900 characters).
    """
    reason = _REFUSAL_REASONS.get(http_status, f"HTTP{http_status}")
    return reason, f"creating {kind} {name} was refused ({http_status}): {api_message[:900]}"


def previous_job_terminating(kind: str, name: str) -> tuple[str, str]:
    """(reason, message) of the CreateFailed condition while `name` is held by an earlier job's child."""
    return st.REASON_PREVIOUS_JOB_TERMINATING, (
        f"{kind} {name} still belongs to an earlier job of this name (deleted, still terminating); this job "
        "creates its own once it is gone, without counting a restart")


def token_conflict(secret: str) -> tuple[str, str]:
    """(reason, message) of the CreateFailed condition when the token Secret's name is taken."""
    return st.REASON_TOKEN_SECRET_CONFLICT, (
        f"Secret {secret} exists and was not created by the operator for this job, so it is not used and "
        "nothing is started; delete or rename that Secret (if it is this job's own, left from an interrupted "
        "create, deleting it is safe: it is created again with the same token)")


def earlier_token_secret(secret: str) -> tuple[str, str]:
    """(reason, message) of the CreateFailed condition while the token Secret's name is most likely held by
    the Secret of an earlier job of this name, deleted moments ago (garbage collection removes it)."""
    return st.REASON_PREVIOUS_JOB_TERMINATING, (
        f"waiting for the earlier job's Secret {secret} to go: a job of this name was just deleted and the "
        "garbage collector removes its token Secret; this job creates its own then (the operator never reads "
        "Secrets, so this is judged from the earlier job's other children; if it is still there a minute after "
        "they are gone, it is reported as a conflict)")


def token_refused(detail: str) -> tuple[str, str]:
    """(reason, message) of the CreateFailed condition when the controller refuses this operator's token (401).

    The token is HMAC(operator key, job UID): an operator with another key (another Helm release
    took the job over) derives another token than the one in the job's Secret, which the
    controller reads.
    """
    return st.REASON_TOKEN_REFUSED, (
        f"the controller refuses this operator's token ({detail}), so slice reports do not reach it: the "
        "job's token Secret was made with another operator key (a job handed over from another Helm "
        "release?). Install this release with that release's key (operatorKey.existingSecret), or "
        "delete and re-create the job")


def child_conflict(kind: str, name: str) -> tuple[str, str]:
    """(reason, message) of the CreateFailed condition when the name of one of the job's children is taken."""
    why = {"JobSet": "its pods are not this slice's workers, so the slice cannot start",
           "Pod": "it is not this job's controller"}.get(
        kind, "a ConfigMap of that name would choose the job's code, a Service would route its traffic")
    what = "that slice is not started" if kind == "JobSet" else "nothing is started"
    return st.REASON_CHILD_CONFLICT, (
        f"{kind} {name} exists and is not owned by this job, so it is not used and {what} ({why}); "
        "delete or rename it")


def with_create_failure(conditions: list[dict[str, Any]], failure: tuple[str, str] | None, generation: int,
                        now: str) -> tuple[list[dict[str, Any]], bool]:
    """`conditions` with CreateFailed set from this pass, and whether an Event is due.

    Args:
      conditions: the new status's conditions.
      failure: (reason, message) of the first refusal of this pass, None when nothing was refused.
      generation, now: as for `set_condition`.

    Returns:
      (conditions, changed): changed is True when the refusal is new or its message
      differs from the last one, so the Event is posted once, not every pass.
    """
    previous = next((c for c in conditions if c.get("type") == st.COND_CREATE_FAILED), None)
    if failure is None:
        if previous is None or previous.get("status") != "True":
            return conditions, False
        return set_condition(conditions, st.COND_CREATE_FAILED, "False", "ChildrenCreated", "", generation, now), False
    reason, message = failure
    changed = previous is None or previous.get("status") != "True" or previous.get("message") != message
    return set_condition(conditions, st.COND_CREATE_FAILED, "True", reason, message, generation, now), changed


def _waiting_slices(message: str) -> str:
    """The `[slices waiting: ...]` tail of a PodsNotStarting message (`pod_faults.pod_faults`), "" if none."""
    head, sep, tail = message.rpartition(" [slices waiting: ")
    return tail if sep else ""


# Condition type -> the reason it gets once no pod shows that fault any more.
_FAULT_CLEARED = {st.COND_IMAGE_PULL_FAILED: "ImagesPulled", st.COND_PODS_NOT_STARTING: "PodsStarted"}


def with_pod_faults(conditions: list[dict[str, Any]], faults: dict[str, Any], generation: int,
                    now: str) -> tuple[list[dict[str, Any]], list[tuple[str, str, str]]]:
    """`conditions` with ImagePullFailed / PodsNotStarting set from this pass, and the Events due.

    Args:
      conditions: the new status's conditions.
      faults: condition type -> `pod_faults.PodFault` (this pass's live pods).
      generation, now: as for `set_condition`.

    Returns:
      (conditions, events): a Warning Event when a fault appears or its reason
      changes (not every pass, not for each kubelet back-off retry); a Normal
      one when it clears.
    """
    events: list[tuple[str, str, str]] = []
    for type_, cleared in _FAULT_CLEARED.items():
        previous = next((c for c in conditions if c.get("type") == type_), None)
        fault = faults.get(type_)
        if fault is None:
            if previous is not None and previous.get("status") == "True":
                conditions = set_condition(conditions, type_, "False", cleared, "", generation, now)
                events.append(("Normal", cleared, f"{type_} cleared: {previous.get('message', '')}"[:1000]))
            continue
        was_true = previous is not None and previous.get("status") == "True"
        # ErrImagePull <-> ImagePullBackOff alternate with every kubelet retry: one Event, not one per retry
        # ... and PodsNotStarting once more when the set of waiting slices changes (a second pool missing)
        if not was_true or (type_ != st.COND_IMAGE_PULL_FAILED and (
                previous.get("reason") != fault.reason
                or _waiting_slices(previous.get("message", "")) != _waiting_slices(fault.message))):
            events.append(("Warning", fault.reason, fault.message))
        conditions = set_condition(conditions, type_, "True", fault.reason, fault.message, generation, now)
    return conditions, events


def with_node_loss(conditions: list[dict[str, Any]], force_deleted: list[str], recovered: bool, generation: int,
                   now: str) -> tuple[list[dict[str, Any]], list[tuple[str, str, str]]]:
    """`conditions` with NodeLost set from this pass, and the Events due when it clears.

    Stateless on purpose (it survives an operator restart): True from the pass
    that force-deletes pods on a lost node until the job is whole again.

    Args:
      conditions: the new status's conditions.
      force_deleted: this pass's messages (`nodes.NodeLostPod.message`), one per pod force-deleted.
      recovered: every slice is Ready and a controller pod runs (the losses are repaired).
      generation, now: as for `set_condition`.

    Returns:
      (conditions, events): True with reason NodeLost and this pass's messages
      while pods are being force-deleted; it stays True (same message) until
      `recovered`, then False with reason NodeLossRecovered, keeping the message
      (which node, which pods) and a Normal Event. The NodeLost Warning Events
      themselves are posted per pod by the handler.
    """
    previous = next((c for c in conditions if c.get("type") == st.COND_NODE_LOST), None)
    if force_deleted:
        message = "; ".join(force_deleted)[:2000]
        return set_condition(conditions, st.COND_NODE_LOST, "True", "NodeLost", message, generation, now), []
    if previous is None or previous.get("status") != "True" or not recovered:
        return conditions, []
    message = f"recovered from: {previous.get('message', '')}"[:2000]
    return (set_condition(conditions, st.COND_NODE_LOST, "False", "NodeLossRecovered", message, generation, now),
            [("Normal", "NodeLossRecovered", message)])
