"""The status half of a reconcile pass as a pure decision: what was observed -> the effects (`effects`).

`decide_status` builds the job's new `.status` (`status_builder.build_status`), sets the conditions of
what the pass saw (a refused create, pod faults, lost nodes, refused controller answers, the Pathways
resource manager) and returns the Events they are due with and the status patch, in order. A worker
pod template the API server refuses as invalid fails the job instead (`effects.invalid_child_effects`).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any, Mapping

from elastic_jax.api.status import (COND_CONTROLLER_UNRESPONSIVE, COND_FAILED, COND_SPEC_REJECTED, FINISHED_PHASES,
                                    ElasticTrainingJobStatus, Goodput)
from elastic_jax.k8s_operator import goodput as goodput_ledger
from elastic_jax.k8s_operator.backends import pathways as pathways_backend
from elastic_jax.k8s_operator.conditions import ANSWERED_AGAIN, JOB_STOPPED, get_condition, set_condition
from elastic_jax.k8s_operator import steps_lost
from elastic_jax.k8s_operator.effects import (REASON_PHASE_CHANGED, CountGoodput, CountRebooked, CountStepsLost, DeleteJob,
                                              Effect, PatchStatus, PostEvent, invalid_child_effects, refusal_event)
from elastic_jax.k8s_operator.head_status import with_resource_manager
from elastic_jax.k8s_operator.pod_faults import PodFault, invalid_refusal, pod_faults
from elastic_jax.k8s_operator.reconcile import dead
from elastic_jax.k8s_operator.slices import JobSetView
from elastic_jax.k8s_operator.slices import PodView
from elastic_jax.k8s_operator.status_builder import (REASON_INVALID_SPEC, Inputs, build_status, resume_events,
                                                     setting_warning_events,
                                                     with_controller_answers, with_controller_unresponsive,
                                                     with_create_failure, with_node_loss,
                                                     with_pod_faults)

# The status fields this operator writes (camelCase), as `ElasticTrainingJobStatus.to_kube` names them.
_STATUS_FIELDS = tuple(f.alias or n for n, f in ElasticTrainingJobStatus.model_fields.items())

# Event reason of an edit to a spec field that cannot change on an existing job (its condition's type).
REASON_SPEC_CHANGE_REJECTED = COND_SPEC_REJECTED

# Seconds at least between two status writes of a running job that change only `COUNTER_FIELDS` (`counters_only`):
# `kubectl get ejob -w` prints a line per write, identical to the last when no printed column moved. A change
# of a printed column (phase, step, active slices, restarts, the GOODPUT percent, steps lost, spares), of a
# slice, of a condition's status or reason, of the counter base, or a stop, is written at once.
COUNTER_WRITE_S = 15.0
# Status fields (camelCase) whose change alone waits for `COUNTER_WRITE_S`: none is a printer column (the
# goodput's `percent` is: `counters_only` checks it), and none is what a later pass carries a count from (the
# recoveries and the slices' restarts are: a held-back one would be lost to a new controller's or JobSet's base).
COUNTER_FIELDS = frozenset({"goodput", "loss", "initialLoss", "lastRecoverySeconds", "lastCheckpointStep",
                            "conditions"})
# Conditions whose message alone may wait (it counts the seconds of the spell it tells).
_COUNTING_MESSAGES = frozenset({COND_CONTROLLER_UNRESPONSIVE})


def failed_spec_fields(status: Mapping[str, Any] | None, generation: int, message: str, now: str) -> dict[str, Any]:
    """The status fields (as written) of a job Failed with condition reason InvalidSpec: phase, failureReason,
    observedGeneration and the whole list of conditions (`now`: RFC 3339, the condition's time)."""
    failed = ElasticTrainingJobStatus.from_kube(status)  # (the whole list of conditions is written back)
    failed.phase, failed.failure_reason, failed.observed_generation = "Failed", message, generation
    failed.conditions = set_condition(failed.conditions, COND_FAILED, "True", REASON_INVALID_SPEC, message, generation,
                                      now)
    written = failed.to_kube()
    return {k: written[k] for k in ("phase", "failureReason", "observedGeneration", "conditions")}


def invalid_failure(message: str, status: Mapping[str, Any], generation: int, now: str,
                    controller_pods: list[PodView], jobsets: Mapping[int, JobSetView]) -> list[Effect]:
    """A child the API server refused as invalid: the job Failed (InvalidSpec, completionTime `now`), what runs
    stopped (`effects.invalid_child_effects`)."""
    fields = failed_spec_fields(status, generation, message, now)
    fields.update(ElasticTrainingJobStatus.model_validate({"completion_time": now}).to_kube())
    return invalid_child_effects(message, fields, status.get("phase") or "", controller_pods, jobsets.values())


@dataclasses.dataclass
class StatusObserved:
    """What the status decision reads, besides `build_status`'s `Inputs`.

    Attributes:
      inputs: `build_status`'s inputs (its `finish` is the plan's, its `now` this pass's time, its
        `rejected_fields` the spec fields edited that cannot change: `status_builder.changed_fields`).
      status: the job's `.status` as read (camelCase).
      finished: the job's phase was already Succeeded or Failed.
      refusal: (reason, message) of the first create refused in this pass, or None.
      controller_pods, worker_pods: the job's pods; jobsets: its JobSets by slice index.
      current: the newest controller pod that runs (None: none).
      controller_created_now: the plan asked for a new controller pod (`Plan.create_controller` not None).
      creation_refusal: why worker pods are missing, from their Job's Events (`job_pass._pod_creation_refusals`).
      node_lost_messages: the messages of the pods force-deleted off lost nodes in this pass.
      whole: every slice Ready and the controller Ready (the NodeLost condition clears).
      answer_fault: why the controller's answers are not used (`JobTracker.answer_fault_message`), or None.
      unresponsive: why the running controller counts as unresponsive (`JobTracker.unresponsive_message`), or None.
      unresponsive_ended: (reason, message) of how the last unresponsive spell ended (`JobTracker.unresponsive_ended`).
      since_write_s: seconds since this operator last wrote the job's status (None: it did not, since it started):
        a change of `COUNTER_FIELDS` alone waits until `COUNTER_WRITE_S` (`counters_only`).
    """

    inputs: Inputs
    status: Mapping[str, Any]
    finished: bool
    refusal: tuple[str, str] | None
    controller_pods: list[PodView]
    worker_pods: list[PodView]
    jobsets: Mapping[int, JobSetView]
    current: PodView | None
    controller_created_now: bool
    creation_refusal: PodFault | None = None
    node_lost_messages: list[str] = dataclasses.field(default_factory=list)
    whole: bool = False
    answer_fault: str | None = None
    unresponsive: str | None = None
    unresponsive_ended: tuple[str, str] = ANSWERED_AGAIN
    since_write_s: float | None = None

    @property
    def running(self) -> bool:
        """Neither finished, nor finishing now, nor suspended: its pods' faults are news."""
        i = self.inputs
        return not (self.finished or i.finish or i.job.spec.suspend)


@dataclasses.dataclass
class StatusDecision:
    """The status half's effects, in order, and the status written (None: the job failed instead).

    `unwritten_goodput` is this pass's `status.goodput` total when only its time counters moved and it was
    held back (`goodput.held_back`): the handler keeps it for `counters.carry` (None: nothing held back).
    """

    effects: list[Effect]
    written: dict[str, Any] | None
    unwritten_goodput: Goodput | None = None


def decide_status(o: StatusObserved) -> StatusDecision:
    """The job's new status and the Events due with it (pure).

    Returns:
      A `StatusDecision`: Events, goodput counts, then one `PatchStatus` of the fields that changed (none when
      only the goodput ledger's time counters moved, held back: `goodput.held_back`); or,
      when the API server refuses the worker pod template as invalid, the job's failure
      (`invalid_failure`) with `written` None.
    """
    i = o.inputs
    if o.running and o.unresponsive is not None:
        i = dataclasses.replace(i, controller_unresponsive=True)  # (the phase and ACTIVE say it too)
    job, generation, now = i.job, i.generation, i.now
    new = build_status(i)
    out: list[Effect] = []
    new.conditions, refusal_changed = with_create_failure(new.conditions, o.refusal, generation, now)
    if refusal_changed:
        out.append(refusal_event(o.refusal))
    if o.running:
        # (a finished or suspended job keeps its last word: the pods are going away, not "pulled")
        faults = pod_faults(o.controller_pods + o.worker_pods)
        refused = o.creation_refusal
        if invalid_refusal(refused):
            return StatusDecision(out + invalid_failure(f"worker pods cannot be created: {refused.message}", o.status,
                                                        generation, now, o.controller_pods, o.jobsets), None)
        if refused is not None and refused.condition not in faults:
            faults[refused.condition] = refused
        new.conditions, fault_events = with_pod_faults(new.conditions, faults, generation, now)
        new.conditions, node_events = with_node_loss(new.conditions, o.node_lost_messages, o.whole, generation, now)
        new.conditions, answer_events = with_controller_answers(new.conditions, o.answer_fault, generation, now)
        new.conditions, unresponsive_events = with_controller_unresponsive(new.conditions, o.unresponsive,
                                                                           generation, now, o.unresponsive_ended)
        answer_events += unresponsive_events
        head_events: list[tuple[str, str, str]] = []
        if job.spec.backend == "pathways":
            head = o.current if o.current is not None and not dead(o.current) and not o.controller_created_now \
                else None
            new.conditions, head_events = with_resource_manager(
                new.conditions, head, pathways_backend.RM_PORT,
                pathways_backend.RM_STARTUP_PERIOD_S * pathways_backend.RM_STARTUP_FAILURES, generation, now)
        out += [PostEvent(*e) for e in fault_events + node_events + answer_events + head_events]
    else:
        # (a controller that did not answer, or answered wrongly, is no news once the job stops: neither
        # condition stays True on a Suspended or finished job)
        new.conditions, answer_events = with_controller_answers(new.conditions, None, generation, now, JOB_STOPPED)
        new.conditions, unresponsive_events = with_controller_unresponsive(new.conditions, None, generation, now,
                                                                           JOB_STOPPED)
        out += [PostEvent(*e) for e in answer_events + unresponsive_events]
    out += [PostEvent(*e) for e in resume_events(i.previous.resumed_from, new.resumed_from)]
    out += [PostEvent(*e) for e in setting_warning_events(i.previous.setting_warnings, new.setting_warnings)]
    if new.phase != o.status.get("phase"):
        out.append(PostEvent("Normal", REASON_PHASE_CHANGED, f"{o.status.get('phase') or 'New'} -> {new.phase}"))
    rejected_before = get_condition(i.previous.conditions, COND_SPEC_REJECTED)
    if i.rejected_fields and not (rejected_before is not None and rejected_before.status == "True"):
        out.append(PostEvent("Warning", REASON_SPEC_CHANGE_REJECTED,
                             f"{', '.join(i.rejected_fields)} cannot change on an existing job"))
    written = new.to_kube()
    changed = {k: merge_patch_value(v, o.status.get(k)) for k, v in written.items() if o.status.get(k) != v}
    # A field the new status unsets (None: `lastCheckpointStep` once the checkpoint it named went with a lost
    # pod) is left out of `written`; only a null in the merge patch removes it from the object.
    changed.update({k: None for k in _STATUS_FIELDS if o.status.get(k) is not None and k not in written})
    held = None
    if set(changed) == {"goodput"} and goodput_ledger.held_back(i.previous.goodput, new.goodput, o.running):
        # only the ledger's clock moved: no write (a quiet job's `kubectl get -w` printed the same line every
        # long poll); the operator keeps the total for a new controller's base (`goodput.QUIET_WRITE_S`)
        held, written["goodput"] = new.goodput, o.status["goodput"]
        changed = {}
    elif (changed and o.running and o.since_write_s is not None and o.since_write_s < COUNTER_WRITE_S
          and counters_only(changed, o.status)):
        # nothing `kubectl get ejob` prints moved: written with the next change that it shows, or COUNTER_WRITE_S
        # after the last write (the next pass computes them again from the controller's answer)
        held = new.goodput if "goodput" in changed else None
        for k in changed:
            if k in o.status:
                written[k] = o.status[k]
            else:
                written.pop(k, None)
        changed = {}
    else:
        out += [CountGoodput(category, seconds)
                for category, seconds in goodput_ledger.increments(i.previous.goodput, new.goodput).items()]
        out += [CountRebooked(category, seconds)
                for category, seconds in goodput_ledger.rebooked(i.previous.goodput, new.goodput).items()]
    lost = steps_lost.newly_lost(i.previous, new.steps_lost)
    if lost:
        out.append(CountStepsLost(lost))
    out.append(PatchStatus(changed))
    return StatusDecision(out, written, held)


def merge_patch_value(new: Any, old: Any) -> Any:
    """`new` as a JSON merge patch (RFC 7386) of `old`: in an object, a key `old` has and `new` lacks is null.

    The status is written by merge patch, which keeps what it does not name: a nested key the new status
    dropped (`counterBase.stepAtResume` once a resumed pod took over) stayed in the object, and the next
    controller loss counted its steps lost from that stale step (session 16's trial and CI: +836 for a pod
    that had reached 1271). Lists are replaced whole, as merge patch does.
    """
    if not isinstance(new, Mapping) or not isinstance(old, Mapping):
        return new
    out = {k: merge_patch_value(v, old.get(k)) for k, v in new.items()}
    out.update({k: None for k in old if k not in new})
    return out


def counters_only(changed: Mapping[str, Any], before: Mapping[str, Any]) -> bool:
    """Whether a status patch changes nothing a user sees on `kubectl get ejob` (-w, -o wide) nor anything a
    later pass carries a count from: only `COUNTER_FIELDS`, the goodput's seconds but not its `percent`, and of
    the conditions only the message of a `_COUNTING_MESSAGES` one.

    Args:
      changed: the patch (camelCase fields, new values; None unsets).
      before: the status as written.
    """
    if not set(changed) <= COUNTER_FIELDS:
        return False
    if "goodput" in changed and (changed["goodput"] or {}).get("percent") != (before.get("goodput") or {}).get("percent"):
        return False
    if "conditions" in changed:
        def shape(conditions: Any) -> list:
            return [{k: v for k, v in c.items() if not (k == "message" and c.get("type") in _COUNTING_MESSAGES)}
                    for c in conditions or []]
        if shape(changed["conditions"]) != shape(before.get("conditions")):
            return False
    return True


def expiry(ttl_s: int | None, written: Mapping[str, Any], now: dt.datetime) -> list[Effect]:
    """[DeleteJob] once a finished job's `ttlSecondsAfterFinished` (`ttl_s`, None: never) passed since its
    `completionTime` (`written`: the status as written; `now`: aware UTC), else []."""
    done = written.get("completionTime")
    if ttl_s is None or written.get("phase") not in FINISHED_PHASES or not done:
        return []
    finished_at = dt.datetime.strptime(done, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.timezone.utc)
    return [DeleteJob(ttl_s)] if (now - finished_at).total_seconds() >= ttl_s else []
