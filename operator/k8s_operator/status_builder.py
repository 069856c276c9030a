"""The job's new `.status` from the previous one and what the operator observed (pure)."""

from __future__ import annotations

import dataclasses
from typing import Any

from elastic_jax import contract
from elastic_jax.api import status as st
from elastic_jax.api.cluster import checkpoints_go_with_pod, local_checkpoint_loss
from elastic_jax.api.control import ControllerStatus
from elastic_jax.api.job import ElasticTrainingJob
from elastic_jax.api.status import (COND_CONTROLLER_ANSWERS_REFUSED, COND_CONTROLLER_UNRESPONSIVE,
                                    REASON_CONTROLLER_ANSWER_INVALID, REASON_CONTROLLER_NOT_ANSWERING)
from elastic_jax.k8s_operator.conditions import ANSWERED_AGAIN, get_condition, set_condition
from elastic_jax.k8s_operator.phases import TRAINING_PHASES, phase as job_phase
from elastic_jax.k8s_operator import controller_restart
from elastic_jax.k8s_operator.finished import finished_phase
from elastic_jax.k8s_operator.reconcile import ControllerBackOff, attempt_of, backoff_message
from elastic_jax.k8s_operator.slice_warming import spare_indices


@dataclasses.dataclass
class Inputs:
    """Everything `build_status` reads.

    Attributes:
      job: the applied job (suspend/TTL from the live object).
      generation: metadata.generation of the live object.
      previous: the current `.status` (`ElasticTrainingJobStatus.from_kube`).
      slices: per-slice status entries from the tracker.
      controller: the controller's last status, None when unreachable.
      controller_pod: name of the current controller pod ("" when none).
      controller_restarts: after this pass.
      slice_replacements: slice replacements over every JobSet of the job (`counters.Counts`).
      recoveries: recoveries over every controller pod of the job (`counters.Counts`).
      counter_base: `status.counterBase` to write; None keeps the previous one.
      finish: ("Succeeded"|"Failed", reason) when the job ends in this pass.
      rejected_fields: spec fields edited that the operator refuses to apply.
      now: RFC 3339 time.
      goodput: `status.goodput` over every controller pod (`counters.Counts.goodput`); None keeps the previous one.
      suspend_waits_for: spec.suspend: the controller pods still running (`reconcile.Plan.suspend_waits_for`);
        the phase is Suspending until there are none.
      steps_lost: `status.stepsLost` (`counters.Counts.steps_lost`); None keeps the previous one.
      controller_lost: this pass found the controller pod lost and replaces it (`controller_restart.restarting`).
      replace_after_stop: the lost controller pod whose container still stops (`Plan.replace_after_stop`).
      answered_by: the controller pod `controller` answered from; None: the current one (`controller_pod`).
      controller_unresponsive: the running controller has not answered for `tracker.UNRESPONSIVE_GRACE_S`
        (condition ControllerUnresponsive True after this pass): a training job reads Degraded, 0 active.
      backoff: the lost controller's replacement waits (`reconcile.Plan.backoff`); None: no wait.
      losses_in_a_row: `status.controllerLossesInARow` when this pass created a lost controller's replacement
        (`reconcile.Plan.losses_in_a_row`); None: kept, or 0 once the current controller trained a step.
      token_secret: the job's token Secret when this operator knows it created it (this process did, or status
        recorded it): written into `status.tokenSecret` by every pass that builds the status, so the record a
        restarted operator trusts is never lost while any operator knows it (""; keep the previous one).
    """

    job: ElasticTrainingJob
    generation: int
    previous: st.ElasticTrainingJobStatus
    slices: list[st.SliceStatusEntry]
    controller: ControllerStatus | None
    controller_pod: str
    controller_restarts: int
    slice_replacements: int
    recoveries: int
    counter_base: st.CounterBase | None
    finish: tuple[str, str] | None
    rejected_fields: list[str]
    now: str
    goodput: st.Goodput | None = None
    suspend_waits_for: list[str] = dataclasses.field(default_factory=list)
    steps_lost: int | None = None
    controller_lost: bool = False
    replace_after_stop: str = ""
    answered_by: str | None = None
    controller_unresponsive: bool = False
    backoff: ControllerBackOff | None = None
    losses_in_a_row: int | None = None
    token_secret: str = ""


def build_status(i: Inputs) -> st.ElasticTrainingJobStatus:
    """The whole new status, conditions with observedGeneration (`i.previous` is not modified)."""
    prev = i.previous
    out = prev.model_copy(deep=True)
    finished = finished_phase(prev)  # (a finish the operator did not write is recomputed: `finished`)
    if finished is None and i.finish is not None:
        finished = i.finish[0]
        out.failure_reason = i.finish[1] if finished == "Failed" else ""
        out.completion_time = i.now
    c = i.controller
    from_current = c is not None and (i.answered_by is None or i.answered_by == i.controller_pod)
    local = checkpoints_go_with_pod(i.job)
    restarting = controller_restart.restarting(prev, i.controller_lost or bool(i.replace_after_stop) or
                                               i.backoff is not None, c, from_current,
                                               stopped=bool(finished or i.job.spec.suspend))
    if i.losses_in_a_row is not None:
        out.controller_losses_in_a_row = i.losses_in_a_row
    elif from_current and c.step > (c.resumed_from.step if c.resumed_from is not None else 0):
        out.controller_losses_in_a_row = 0  # a controller trained a step: the crash loop, if any, is over
    if c is not None:
        # A new controller reports step 0 until its restore ends (phase Starting): keep the step the
        # job had, or the STEP column reads 10361 -> 0 -> 10411 around a suspend or a controller loss.
        if not (c.phase == "Starting" and c.step == 0 and "step" in prev.model_fields_set):
            out.step = c.step
        # (a suspend's controller is read until it exits, for the step its stop saves; it trains no more)
        out.active_slices = 0 if i.job.spec.suspend else len(c.active_slices)
        if c.loss is not None:
            out.loss = round(c.loss, 5)
        if c.initial_loss is not None:
            out.initial_loss = round(c.initial_loss, 5)
        if c.last_committed_checkpoint_step is not None or (local and from_current):
            # (local: the current pod's emptyDir holds its own checkpoints only; None until it commits one)
            out.last_checkpoint_step = c.last_committed_checkpoint_step
        if c.resumed_from is not None:
            out.resumed_from = resumed_from_status(c, i.controller_pod)
        out.setting_warnings = list(c.setting_warnings)
        # (by the controller's word: the operator's own slice states do not know which Ready slice trains)
        out.spare_slices = [] if i.job.spec.suspend else spare_indices(c)
        timed = [r.seconds for r in c.recovery_history if r.seconds is not None and r.cause != "scale_up"]
        if timed:
            out.last_recovery_seconds = round(timed[-1], 3)
    elif finished or i.job.spec.suspend or not i.controller_pod:
        out.active_slices = 0
        out.spare_slices = []
    if restarting and not from_current:
        out.active_slices = 0  # (the lost controller's mesh trains no more; the replacement's answer says its own)
    if local and not finished and _checkpoints_gone(prev, i, restarting, from_current):
        out.last_checkpoint_step = None  # (unset: no committed checkpoint exists for the job now)
    out.steps_lost = prev.steps_lost if i.steps_lost is None else i.steps_lost
    if i.goodput is not None:
        out.goodput = i.goodput
    if finished == "Succeeded":
        # Exit 0 means the final step's checkpoint committed (`ControllerExit.SUCCEEDED`); the last
        # poll, before that save, said an older step (550 while 600 was committed).
        out.step = out.last_checkpoint_step = i.job.spec.training.steps
    out.spare_count = len(out.spare_slices)  # (the printer column: a list prints "[]" for none)
    out.observed_generation = i.generation
    if i.token_secret:
        out.token_secret = i.token_secret
    out.desired_slices = i.job.spec.slices.count
    out.total_steps = i.job.spec.training.steps
    out.slices = i.slices
    out.controller_pod = i.controller_pod
    attempt = attempt_of(i.controller_pod)  # (kept through a suspend, when no pod runs: the resume's is the next)
    if attempt is not None and (out.controller_attempt is None or attempt > out.controller_attempt):
        out.controller_attempt = attempt
    out.controller_restarts = i.controller_restarts
    out.slice_replacements = i.slice_replacements
    out.recoveries = i.recoveries
    out.start_time = prev.start_time or i.now
    if i.counter_base is not None:
        out.counter_base = i.counter_base
    if prev.phase == "Suspended" and not finished and not i.job.spec.suspend:
        # The resume: no controller runs yet, and the new one starts from the latest committed checkpoint (none
        # with a local spec.checkpoint.uri: step 0), not from the step the job had reached, which STEP read
        # until the new controller's answer said otherwise. That step is kept for the steps it loses.
        out.counter_base = _at_resume(prev, out.counter_base or st.CounterBase())
        out.step = resume_step(prev, local)
    unresponsive = i.controller_unresponsive and not restarting
    phase = job_phase(
        finished=finished,
        suspended=i.job.spec.suspend,
        controller_phase=c.phase if c is not None else None,
        slice_states=[s.state for s in i.slices],
        active_slices=out.active_slices,
        desired_slices=i.job.spec.slices.count,
        trained=c is not None and c.step > (c.resumed_from.step if c.resumed_from is not None else 0),
        stopping=bool(i.suspend_waits_for),
        previous=prev.phase,
        restarting=restarting,
        unresponsive=unresponsive,
    )
    if unresponsive and phase in TRAINING_PHASES:
        # A frozen or wedged controller: its last answer's step and mesh are all that is known. `kubectl get
        # ejob` kept Running 2/2; now Degraded with 0 active (STEP stays the last step read: those steps were
        # made). The livenessProbe ends the freeze (then Recovering) or the controller answers again.
        out.active_slices = 0
    out.phase = phase
    conds = list(prev.conditions)
    g, now = i.generation, i.now
    training = phase in TRAINING_PHASES
    running_message = f"phase {phase}"
    if phase == "Pending" and c is not None and from_current:
        reached = out.counter_base.step_at_resume if out.counter_base is not None else None
        running_message += f": {pending_stage(c, i.controller_pod, out.step, local, reached)}"
    elif phase == "Pending" and c is None and i.controller_pod and prev.controller_pod == i.controller_pod:
        # A failed poll (a timeout on a loaded node) is no news of the pod's stage: keep its last word rather
        # than fall back to a bare "phase Pending" and forward again at the next answer.
        before = get_condition(prev.conditions, st.COND_RUNNING)
        if before is not None and before.message.startswith(f"phase Pending: controller pod {i.controller_pod} "):
            running_message = before.message
    if i.backoff is not None:
        running_message += f": no controller runs: {backoff_message(i.backoff)}"
    conds = set_condition(conds, st.COND_RUNNING, _bool(training), phase, running_message, g, now)
    degraded = phase in ("Degraded", "Recovering")
    if i.backoff is not None and degraded:
        conds = set_condition(conds, st.COND_DEGRADED, "True", st.REASON_CONTROLLER_BACK_OFF,
                              f"no controller runs: {backoff_message(i.backoff)}", g, now)
    elif restarting and degraded:
        conds = set_condition(conds, st.COND_DEGRADED, "True", st.REASON_CONTROLLER_RESTARTING,
                              f"the controller pod is being replaced: {out.active_slices}/{i.job.spec.slices.count} "
                              "slices active", g, now)
    elif unresponsive:
        conds = set_condition(conds, st.COND_DEGRADED, "True", st.REASON_CONTROLLER_UNRESPONSIVE,
                              f"the controller does not answer (condition ControllerUnresponsive): 0/"
                              f"{i.job.spec.slices.count} slices known to train; step {out.step} is the last it "
                              "reported", g, now)
    elif degraded or training:
        conds = set_condition(conds, st.COND_DEGRADED, _bool(degraded),
                              st.REASON_SLICES_DOWN if degraded else st.REASON_ALL_SLICES_ACTIVE,
                              f"{out.active_slices}/{i.job.spec.slices.count} slices active", g, now)
    else:  # finished, suspended or not started: "AllSlicesActive, 0/2 active" would contradict itself
        conds = set_condition(conds, st.COND_DEGRADED, "False", st.REASON_NOT_TRAINING, f"phase {phase}", g, now)
    restarted = controller_restart.restarted_condition(
        i.controller_restarts, i.controller_pod, restarting,
        out.resumed_from.step if out.resumed_from is not None and out.resumed_from.controller_pod == i.controller_pod
        else None, i.job.spec.suspend, finished, i.replace_after_stop,
        local_uri=i.job.spec.checkpoint.uri if local else "",
        backoff=backoff_message(i.backoff) if i.backoff is not None else "")
    if restarted is not None:
        conds = set_condition(conds, st.COND_CONTROLLER_RESTARTED, "True", *restarted, g, now)
    # A suspended job whose checkpoints go with its controller pod says so while it is suspended.
    lost = local_checkpoint_loss(i.job) if i.job.spec.suspend and not finished else None
    message = f"spec.suspend: {lost}; a resume starts again from step 0" if lost else "spec.suspend"
    if phase == "Suspending":  # (not suspended yet: the controller may still make a step)
        conds = set_condition(conds, st.COND_SUSPENDED, "False", st.REASON_SUSPENDING,
                              f"{message}; waiting for controller pod {', '.join(i.suspend_waits_for)} to stop "
                              "(it ends its step, checkpoints it and exits; its workers are kept until then)", g, now)
    else:
        conds = set_condition(conds, st.COND_SUSPENDED, _bool(i.job.spec.suspend and not finished),
                              (st.REASON_SUSPENDED_WITHOUT_CHECKPOINT if lost else st.REASON_SUSPENDED)
                              if i.job.spec.suspend else st.REASON_NOT_SUSPENDED, message, g, now)
    if i.rejected_fields:
        conds = set_condition(conds, st.COND_SPEC_REJECTED, "True", st.REASON_IMMUTABLE_WHILE_RUNNING,
                              f"{', '.join(i.rejected_fields)} cannot change on an existing job; the job keeps "
                              "running with the spec it started with (revert the edit, or delete and re-create the job)",
                              g, now)
    elif get_condition(conds, st.COND_SPEC_REJECTED) is not None:
        conds = set_condition(conds, st.COND_SPEC_REJECTED, "False", st.REASON_SPEC_APPLIED, "", g, now)
    # A job failed for its spec (the operator's parse, or a child the API server found invalid) keeps
    # its InvalidSpec condition: that reason is what the user must act on.
    failed = get_condition(conds, st.COND_FAILED)
    invalid_spec = (finished == "Failed" and failed is not None and failed.status == "True"
                    and failed.reason == st.REASON_INVALID_SPEC)
    if finished and not invalid_spec:
        reason = out.failure_reason or "" if finished == "Failed" else f"trained {i.job.spec.training.steps} steps"
        conds = set_condition(conds, finished, "True",
                              st.REASON_JOB_FAILED if finished == "Failed" else st.REASON_JOB_SUCCEEDED, reason, g, now)
    out.conditions = conds
    return out


def _at_resume(prev: st.ElasticTrainingJobStatus, base: st.CounterBase) -> st.CounterBase:
    """`counterBase` of a resume's pass: `stepAtResume` holds the step the job had reached, for the steps the
    resumed pod loses (`steps_lost.carry_steps_lost` reads it when that pod takes over).

    The highest step reached and not yet counted: STEP, or the `stepAtResume` of an earlier resume whose pod
    never took over (suspended again before it answered: STEP shows where that pod would have started, 0 with a
    local checkpoint.uri; the trial's toggles lost 1319 steps uncounted). Unset when the resumed pod already took
    over in this pass (it answered at once): the takeover took STEP as its `stepReached`, and a `stepAtResume`
    left behind would be read as the step reached at the next loss. (The trial's +3203 for a pod that reached
    2387 was mostly the merge patch keeping a dropped `stepAtResume`: `status_decision.merge_patch_value`.)
    """
    before = prev.counter_base
    if base.controller_uid and (before is None or before.controller_uid != base.controller_uid):
        return base.model_copy(update={"step_at_resume": None})
    pending = before.step_at_resume if before is not None and before.step_at_resume is not None else 0
    return base.model_copy(update={"step_at_resume": max(prev.step, pending)})


def resume_step(prev: st.ElasticTrainingJobStatus, local: bool) -> int:
    """The step a resumed job's new controller pod starts from, as far as the operator knows before it says:
    the suspend's committed checkpoint (`lastCheckpointStep`), or 0 when none is kept (a local
    spec.checkpoint.uri: it went with the stopped pod's emptyDir). A checkpoint it cannot read makes it start
    from an older one; its answer then says so (`resumedFrom`)."""
    if local or prev.last_checkpoint_step is None:
        return 0
    return prev.last_checkpoint_step


def pending_stage(c: ControllerStatus, controller_pod: str, shown_step: int, local: bool,
                  reached: int | None = None) -> str:
    """What a job that has not trained yet waits for, by its controller's own word (the Running condition's
    message while the phase is Pending).

    Measured on the local control plane under load (a resume after suspend, `e2e/measure_resume_lag.py`): the new
    controller answers ~9 s after its pod is created, then reports `Starting` ~12 s (building its trainer,
    restoring or initializing its state) and then `Running` at its resume step ~27 s more (the first step's
    compile on the workers) before a step completes. The operator writes each of those answers within a
    second; this says which one the STEP and ACTIVE columns stand on, so the seconds of real work are not
    read as a stale status.

    Args:
      c: the current controller's answer.
      controller_pod: its pod's name.
      shown_step: `status.step` this pass writes (while `Starting` it keeps the step it had: after a resume the
        step the pod starts from, `resume_step`; after a controller loss the step the job had reached).
      local: spec.checkpoint.uri is local to the controller pod (a new pod starts again from step 0).
      reached: after a resume, the step the job had reached before it (`counterBase.stepAtResume`); else None.

    Returns:
      One clause, e.g. "controller pod j-controller-1 is starting (building its trainer, restoring or
      initializing its state); step 88 is the step the job reached before it".
    """
    resumed = c.resumed_from.step if c.resumed_from is not None else c.step
    if c.phase == "Starting":
        before = ""
        if reached is not None:
            start = ("step 0: spec.checkpoint.uri is local to the earlier controller pod" if local else
                     f"its latest committed checkpoint, step {shown_step}" if shown_step else "step 0")
            before = f"; it starts from {start}; the job had reached step {reached} before it"
        elif shown_step:
            before = f"; step {shown_step} is the step the job reached before it" + (
                " (this pod starts again from step 0: spec.checkpoint.uri is local to the earlier controller pod)"
                if local else "")
        return (f"controller pod {controller_pod} is starting: building its trainer, then restoring its latest "
                f"committed checkpoint or initializing its state{before}")
    if c.phase == "WaitingForSlices":
        return f"controller pod {controller_pod} waits for its slices at step {resumed} (no step trained yet)"
    if c.phase in ("Running", "Recovering"):
        return (f"controller pod {controller_pod} compiles and runs its first step from step {resumed} on "
                f"{len(c.active_slices)} slice(s)")
    return f"controller pod {controller_pod} reports phase {c.phase}"


def _checkpoints_gone(prev: st.ElasticTrainingJobStatus, i: Inputs, restarting: bool, from_current: bool) -> bool:
    """For a job whose checkpoints go with its controller pod (`cluster.checkpoints_go_with_pod`): the
    checkpoint `lastCheckpointStep` names went with a pod that is gone or going, and no answer of the
    current pod says otherwise.

    True on the passes that find the controller pod lost (`restarting`, no answer of the replacement yet)
    and once a new controller pod is named (a replacement, or the pod of a resume after a suspend) before it
    answered: the trial's `lastCheckpointStep` kept naming the lost pod's emptyDir checkpoint until the new
    controller committed one. A suspended job keeps the step its stop saved while the stopping pod still runs
    (its emptyDir holds that checkpoint); once no pod is left to stop (Suspended), the checkpoint is gone with
    it, as the Suspended condition says (the trial's Suspended job claimed it, then `Pending` with that step
    after the resume).
    """
    if i.job.spec.suspend:
        return not i.suspend_waits_for
    if from_current:
        return False  # the current pod's own word (`build_status` took it)
    if restarting:
        return True
    return bool(i.controller_pod) and i.controller_pod != prev.controller_pod


def _bool(value: bool) -> st.ConditionStatus:
    return "True" if value else "False"


def resumed_from_status(c: ControllerStatus, controller_pod: str) -> st.ResumedFrom:
    """`status.resumedFrom` from the controller's `resumedFrom`; the controller must have resumed."""
    r = c.resumed_from
    w = r.writer
    return st.ResumedFrom(
        step=r.step, writer_namespace=w.namespace if w else "", writer_name=w.name if w else "",
        writer_uid=w.uid if w else "", fallback_reason=r.fallback_reason or "", controller_pod=controller_pod,
    )


def resume_events(previous: st.ResumedFrom | None, current: st.ResumedFrom | None) -> list[tuple[str, str, str]]:
    """(type, reason, message) Events for a resume newly reported in `status.resumedFrom`.

    One `Resumed` Event per resume (a new controller pod resuming counts again, even from the
    same step), plus a Warning `CheckpointFallback` when newer steps could not be restored.

    Args:
      previous: the job's `status.resumedFrom` before this pass (None when unset).
      current: the one built in this pass.
    """
    if current is None or current == previous:
        return []
    r = current
    writer = (f"{r.writer_namespace}/{r.writer_name} (uid {r.writer_uid})" if r.writer_uid
              else "an unknown job (no writer identity saved)")
    events = [("Normal", st.EVENT_RESUMED, f"resumed from checkpoint step {r.step} written by {writer}")]
    if r.fallback_reason:
        events.append(("Warning", st.EVENT_CHECKPOINT_FALLBACK,
                       f"resumed from older checkpoint step {r.step}: {r.fallback_reason}"))
    return events


def setting_warning_events(previous: list[str], current: list[str]) -> list[tuple[str, str, str]]:
    """A Warning `SettingWarning` Event for each line of `status.settingWarnings` that was not there before."""
    return [("Warning", st.EVENT_SETTING_WARNING, w) for w in current if w not in previous]


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


# (kept under its old name for importers)
REASON_INVALID_SPEC = st.REASON_INVALID_SPEC


def invalid_child(kind: str, name: str, api_message: str) -> str:
    """The failure reason of a job whose child the API server refused as invalid (422): the spec copied into
    it breaks a rule `elastic-jax validate` and the CRD did not catch; retrying cannot help.

    Args:
      kind, name: the child.
      api_message: the API server's message, which names the field of the child (up to 900 characters).
    """
    return (f"the API server refused {kind} {name} as invalid, a spec field copied into it breaks the API "
            f"server's rules (fix the field it names and re-create the job): {api_message[:900]}")



def create_failure(kind: str, name: str, http_status: int, api_message: str) -> tuple[str, str]:
    """(reason, message) of the CreateFailed condition for a child the API server refused.

    Args:
      kind, name: the child.
      http_status: 403 (admission such as PodSecurity, or RBAC), 422 (invalid), ...
      api_message: the API server's message, passed on whole (up to 900 characters).
    """
    reason = st.REFUSAL_REASONS.get(http_status, f"HTTP{http_status}")
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

    The token is HMAC(operator key, job UID): an operator with another key derives another token
    than the one in the job's Secret, which the controller reads. The likely cause first: an
    operator run without `--operator-key-file` makes a random key at each start, so after a restart
    it refuses every running job (the host-process recipe, now in docs/kubernetes.md, once did this); else another
    Helm release took the job over.
    """
    return st.REASON_TOKEN_REFUSED, (
        f"the controller refuses this operator's token ({detail}), so slice reports do not reach it: the "
        "job's token Secret was made with another operator key. Likely cause: the operator was restarted "
        f"without its key file (--operator-key-file / {contract.ENV_OPERATOR_KEY_FILE}; without one each "
        "start makes a random key): restart it with the key file it ran with before. Or the job was handed "
        "over from another Helm release: install this release with that release's key "
        "(operatorKey.existingSecret). Else delete and re-create the job")


def child_conflict(kind: str, name: str) -> tuple[str, str]:
    """(reason, message) of the CreateFailed condition when the name of one of the job's children is taken."""
    why = {contract.JOBSET_KIND: "its pods are not this slice's workers, so the slice cannot start",
           "Pod": "it is not this job's controller",
           "NetworkPolicy": "a NetworkPolicy of that name would decide who reaches the job's pods"}.get(
        kind, "a ConfigMap of that name would choose the job's code, a Service would route its traffic")
    what = "that slice is not started" if kind == contract.JOBSET_KIND else "nothing is started"
    return st.REASON_CHILD_CONFLICT, (
        f"{kind} {name} exists and is not owned by this job, so it is not used and {what} ({why}); "
        "delete or rename it")


def with_create_failure(conditions: list[st.Condition], failure: tuple[str, str] | None, generation: int,
                        now: str) -> tuple[list[st.Condition], bool]:
    """`conditions` with CreateFailed set from this pass, and whether an Event is due.

    Args:
      conditions: the new status's conditions.
      failure: (reason, message) of the first refusal of this pass, None when nothing was refused.
      generation, now: as for `set_condition`.

    Returns:
      (conditions, changed): changed is True when the refusal is new or its message
      differs from the last one, so the Event is posted once, not every pass.
    """
    previous = get_condition(conditions, st.COND_CREATE_FAILED)
    if failure is None:
        if previous is None or previous.status != "True":
            return conditions, False
        return set_condition(conditions, st.COND_CREATE_FAILED, "False", st.REASON_CHILDREN_CREATED, "", generation,
                             now), False
    reason, message = failure
    changed = previous is None or previous.status != "True" or previous.message != message
    return set_condition(conditions, st.COND_CREATE_FAILED, "True", reason, message, generation, now), changed


def _waiting_slices(message: str) -> str:
    """The `[slices waiting: ...]` tail of a PodsNotStarting message (`pod_faults.pod_faults`), "" if none."""
    head, sep, tail = message.rpartition(" [slices waiting: ")
    return tail if sep else ""


# Condition type -> the reason it gets once no pod shows that fault any more.
_FAULT_CLEARED = {st.COND_IMAGE_PULL_FAILED: st.REASON_IMAGES_PULLED, st.COND_PODS_NOT_STARTING: st.REASON_PODS_STARTED}


def with_pod_faults(conditions: list[st.Condition], faults: dict[str, Any], generation: int,
                    now: str) -> tuple[list[st.Condition], list[tuple[str, str, str]]]:
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
        previous = get_condition(conditions, type_)
        fault = faults.get(type_)
        if fault is None:
            if previous is not None and previous.status == "True":
                conditions = set_condition(conditions, type_, "False", cleared, "", generation, now)
                events.append(("Normal", cleared, f"{type_} cleared: {previous.message}"[:1000]))
            continue
        was_true = previous is not None and previous.status == "True"
        # ErrImagePull <-> ImagePullBackOff alternate with every kubelet retry: one Event, not one per retry
        # ... and PodsNotStarting once more when the set of waiting slices changes (a second pool missing)
        if not was_true or (type_ != st.COND_IMAGE_PULL_FAILED and (
                previous.reason != fault.reason
                or _waiting_slices(previous.message) != _waiting_slices(fault.message))):
            events.append(("Warning", fault.reason, fault.message))
        conditions = set_condition(conditions, type_, "True", fault.reason, fault.message, generation, now)
    return conditions, events


def with_node_loss(conditions: list[st.Condition], force_deleted: list[str], recovered: bool, generation: int,
                   now: str) -> tuple[list[st.Condition], list[tuple[str, str, str]]]:
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
    previous = get_condition(conditions, st.COND_NODE_LOST)
    if force_deleted:
        message = "; ".join(force_deleted)[:2000]
        return set_condition(conditions, st.COND_NODE_LOST, "True", st.REASON_NODE_LOST, message, generation, now), []
    if previous is None or previous.status != "True" or not recovered:
        return conditions, []
    message = f"recovered from: {previous.message}"[:2000]
    return (set_condition(conditions, st.COND_NODE_LOST, "False", st.REASON_NODE_LOSS_RECOVERED, message, generation,
                          now), [("Normal", st.REASON_NODE_LOSS_RECOVERED, message)])


def _with_answer_condition(conditions: list[st.Condition], type_: str, true_reason: str, fault: str | None,
                           generation: int, now: str, warn_on_change: bool,
                           ended: tuple[str, str] = ANSWERED_AGAIN,
                           ) -> tuple[list[st.Condition], list[tuple[str, str, str]]]:
    """`conditions` with the controller-answer condition `type_` True (`true_reason`, message `fault`) or, once
    `fault` is None after True, False (`ended`: reason and message), and the Events due: a Warning when it turns
    True (and, with `warn_on_change`, when its message changes), a Normal when it turns False. Never written
    for a job whose controller never erred."""
    previous = get_condition(conditions, type_)
    was_true = previous is not None and previous.status == "True"
    if fault is None:
        if not was_true:
            return conditions, []
        reason, message = ended
        return (set_condition(conditions, type_, "False", reason, "", generation, now),
                [("Normal", reason, f"{message} (was: {previous.message})"[:1000])])
    events = []
    if not was_true or (warn_on_change and previous.message != fault):
        events.append(("Warning", true_reason, fault[:1000]))
    return set_condition(conditions, type_, "True", true_reason, fault, generation, now), events


def with_controller_answers(conditions: list[st.Condition], fault: str | None, generation: int,
                            now: str, ended: tuple[str, str] = ANSWERED_AGAIN,
                            ) -> tuple[list[st.Condition], list[tuple[str, str, str]]]:
    """`conditions` with ControllerAnswersRefused set from this pass, and the Events due.

    Args:
      conditions: the new status's conditions.
      fault: `JobTracker.answer_fault_message` (None: the answers are good, or the controller is
        starting or gone).
      generation, now: as for `set_condition`.
      ended: (reason, message) of the False it turns to (`ANSWERED_AGAIN`, or `JOB_STOPPED` for a job
        that no longer runs).

    Returns:
      True (reason ControllerAnswerInvalid, the message naming why) with one Warning Event when it
      starts or the message's cause changes; False (reason ControllerAnswering, or `ended`'s) with a
      Normal Event once the answers are good again. Never written for a job whose controller never erred.
    """
    return _with_answer_condition(conditions, COND_CONTROLLER_ANSWERS_REFUSED, REASON_CONTROLLER_ANSWER_INVALID,
                                  fault, generation, now, warn_on_change=True, ended=ended)


def with_controller_unresponsive(conditions: list[st.Condition], unresponsive: str | None, generation: int,
                                 now: str, ended: tuple[str, str] = ANSWERED_AGAIN,
                                 ) -> tuple[list[st.Condition], list[tuple[str, str, str]]]:
    """`conditions` with ControllerUnresponsive set from this pass, and the Events due.

    Args:
      conditions: the new status's conditions.
      unresponsive: `JobTracker.unresponsive_message` (None: the controller answers, is starting, or is gone).
      generation, now: as for `set_condition`.
      ended: `JobTracker.unresponsive_ended`: how the spell ended, when it did.

    Returns:
      True (reason ControllerNotAnswering, the message naming how long and the last error; it is rewritten
      as that grows) with one Warning Event when it turns True; False (reason ControllerAnswering once it
      answers again, ControllerGone once another controller pod or none is the current one) with a Normal
      Event. Never written for a job whose controller always answered.
    """
    return _with_answer_condition(conditions, COND_CONTROLLER_UNRESPONSIVE, REASON_CONTROLLER_NOT_ANSWERING,
                                  unresponsive, generation, now, warn_on_change=False, ended=ended)
