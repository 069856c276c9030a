"""The `status` of an `ElasticTrainingJob`, written by the operator.

Kubernetes conventions: a `phase` for humans and printer columns, and
`conditions` (type, status, reason, message, lastTransitionTime,
observedGeneration) for machines. Like the spec models, these are the source
of the CRD's status schema (`elastic_jax.api.crd`).
"""

from __future__ import annotations

from typing import Any, Literal, Mapping

from pydantic import Field, ValidationError

from elastic_jax.api.job import _Model

# Suspending: spec.suspend is set and a controller container still runs (it ends its step, checkpoints and
# exits; its workers are kept for it); Suspended once it has terminated.
Phase = Literal["Pending", "Running", "Degraded", "Recovering", "Suspending", "Suspended", "Succeeded", "Failed"]
# Provisioning: pods not all up yet (never Ready). Ready: every host Running and Ready.
# Down: lost after being Ready (a pod failed, vanished or is being replaced). Draining:
# a Ready pod got a deletion timestamp (preemption, drain); Down follows.
SliceState = Literal["Provisioning", "Ready", "Down", "Draining"]
ConditionStatus = Literal["True", "False", "Unknown"]

FINISHED_PHASES = ("Succeeded", "Failed")

# Condition types.
COND_RUNNING = "Running"  # training steps are being made
COND_DEGRADED = "Degraded"  # fewer active slices than desired
COND_CONTROLLER_RESTARTED = "ControllerRestarted"  # the controller pod was recreated at least once
COND_SPEC_REJECTED = "SpecChangeRejected"  # an edit the operator cannot apply to a running job
COND_SUSPENDED = "Suspended"
# True while the API server refuses one of the job's children (reason Forbidden,
# Invalid, ...: its message is the API server's) or the job's token Secret name is
# taken by a Secret this operator did not create (reason TokenSecretConflict).
COND_CREATE_FAILED = "CreateFailed"
# A child pod's image cannot be pulled (reason: the kubelet's, e.g. ImagePullBackOff; message names the image).
COND_IMAGE_PULL_FAILED = "ImagePullFailed"
# A child pod cannot be scheduled, or its container cannot be created (reason: the scheduler's/kubelet's).
COND_PODS_NOT_STARTING = "PodsNotStarting"
# A node hosting one of the job's pods was not Ready for longer than the operator's bound
# (--node-lost-seconds): its pods were force-deleted (reason NodeLost, message names the node);
# False (reason NodeLossRecovered) once every slice is Ready and a controller runs again.
COND_NODE_LOST = "NodeLost"
# Backend pathways: True while the live controller pod's Pathways resource manager (the
# pathways-rm sidecar) has not passed its startupProbe, i.e. does not listen yet: no slice
# JobSet is created and the controller container does not start until it does (reason
# ResourceManagerStarting, or ResourceManagerRestarting after a restart of that sidecar);
# False (reason ResourceManagerListening) once it listens.
COND_WAITING_FOR_RESOURCE_MANAGER = "WaitingForResourceManager"
# Condition reasons: every reason the operator writes, spelled once (CamelCase, Kubernetes style).
# Running: its reason is the phase itself (`Phase`).
# Degraded
REASON_SLICES_DOWN = "SlicesDown"  # fewer slices train than desired (Degraded or Recovering)
REASON_ALL_SLICES_ACTIVE = "AllSlicesActive"
REASON_NOT_TRAINING = "NotTraining"  # finished, suspended or not started
# The running controller does not answer (condition ControllerUnresponsive True): no slice is known to train,
# so a training job reads Degraded with 0 active slices until it answers again or its pod is replaced.
REASON_CONTROLLER_UNRESPONSIVE = "ControllerUnresponsive"
# ControllerRestarted (and Degraded, while it lasts)
REASON_CONTROLLER_POD_LOST = "ControllerPodLost"
# From the pass that finds the controller pod lost (or being deleted by someone else) until its replacement
# has completed a step: no controller trains meanwhile, so the phase is Recovering (`controller_restart`).
REASON_CONTROLLER_RESTARTING = "ControllerRestarting"
# The controller pod is lost again before any controller trained a step since the last loss (a crash loop: a
# `sys.exit(3)` at start-up): its replacement waits, 10 s doubling to 300 s (`supervision.backoff`). Also
# on Degraded while it lasts, with a Warning Event of the same reason.
REASON_CONTROLLER_BACK_OFF = "ControllerBackOff"
# Suspended
REASON_SUSPENDED = "Suspended"
# Suspended, and spec.checkpoint.uri is local to the controller pod: a resume starts again from step 0.
REASON_SUSPENDED_WITHOUT_CHECKPOINT = "SuspendedWithoutCheckpoint"
REASON_NOT_SUSPENDED = "NotSuspended"
# False while spec.suspend waits for the controller container to stop (phase Suspending); the message names the pod.
REASON_SUSPENDING = "Suspending"
# SpecChangeRejected
REASON_IMMUTABLE_WHILE_RUNNING = "ImmutableWhileRunning"
REASON_SPEC_APPLIED = "SpecApplied"
# Succeeded / Failed
REASON_JOB_SUCCEEDED = "JobSucceeded"
REASON_JOB_FAILED = "JobFailed"
# The spec is what is wrong (the operator's parse, or a child the API server found invalid); an
# Event of the same reason goes with it.
REASON_INVALID_SPEC = "InvalidSpec"
# CreateFailed: True with the API server's refusal by HTTP status (`REFUSAL_REASONS`), or one of the
# conflicts below; False once every child was created.
REASON_CHILDREN_CREATED = "ChildrenCreated"
REFUSAL_REASONS = {400: "BadRequest", 403: "Forbidden", 404: "NotFound", 422: "Invalid", 429: "TooManyRequests",
                   500: "ServerError", 503: "ServiceUnavailable"}
# ImagePullFailed / PodsNotStarting: True with the kubelet's or scheduler's reason; False with these.
REASON_IMAGES_PULLED = "ImagesPulled"
REASON_PODS_STARTED = "PodsStarted"
# NodeLost
REASON_NODE_LOST = "NodeLost"
REASON_NODE_LOSS_RECOVERED = "NodeLossRecovered"
# WaitingForResourceManager (backend pathways)
REASON_RM_STARTING = "ResourceManagerStarting"
REASON_RM_RESTARTING = "ResourceManagerRestarting"
REASON_RM_LISTENING = "ResourceManagerListening"
REASON_TOKEN_SECRET_CONFLICT = "TokenSecretConflict"
REASON_CHILD_CONFLICT = "ChildNameConflict"
REASON_TOKEN_REFUSED = "ControllerRefusesToken"  # the controller answers 401 to this operator's token
# A child's name is still held by a pod of an earlier job of the same name (deleted, terminating).
REASON_PREVIOUS_JOB_TERMINATING = "PreviousJobTerminating"
# Events about a resume from a checkpoint: every resume (Normal), and a resume from an older
# step because the newer ones could not be restored (Warning).
EVENT_RESUMED = "Resumed"
EVENT_CHECKPOINT_FALLBACK = "CheckpointFallback"
EVENT_SETTING_WARNING = "SettingWarning"
# Slice Events are `Slice<state>` (SliceReady, SliceDown, SliceDraining, SliceProvisioning) for each transition;
# SliceDown also for replacements that happened while no operator ran (`missed_losses`).
EVENT_SLICE_DOWN = "SliceDown"
# The controller acknowledged a slice report (its generation in the message).
EVENT_CONTROLLER_NOTIFIED = "ControllerNotified"
# pathways: JobSets whose workers registered with a Pathways head that is gone are deleted and re-created.
EVENT_WORKERS_RESTARTED = "WorkersRestarted"
COND_FAILED = "Failed"

# The job's status write and its controller's answers (`status_write`, `controller_link`).
# True while a status write lost fields the API server would refuse (a value that is not JSON or not
# int64: `status_write.guard`) or the API server refused a status write anyway (the next writes keep
# only the operator's own fields for `status_write.REFUSED_HOLD_S`); the message says which and why.
COND_STATUS_WRITE_REFUSED = "StatusWriteRefused"
REASON_STATUS_VALUES_DROPPED = "StatusValuesDropped"  # the guard dropped fields before writing
REASON_STATUS_WRITE_REFUSED = "StatusWriteRefused"  # the API server refused a write
REASON_STATUS_WRITTEN = "StatusWritten"  # False again: a whole status was written
# True while the current controller's answers are unusable (too big, too slow, malformed, a 4xx other
# than 401) for longer than `tracker.ANSWER_FAULT_GRACE_S`; the message names why. A controller still
# starting (connection refused before its first good answer) is not this: it is Pending, no Warning.
COND_CONTROLLER_ANSWERS_REFUSED = "ControllerAnswersRefused"
REASON_CONTROLLER_ANSWER_INVALID = "ControllerAnswerInvalid"
REASON_CONTROLLER_ANSWERING = "ControllerAnswering"  # False again: a good answer came
# True while the current controller pod runs, has answered before, and no exchange with its control API (the
# status long poll, slice reports) has been answered for `tracker.UNRESPONSIVE_GRACE_S`, the last ones failing
# with no HTTP answer (a timeout, a refused or reset connection): a frozen (SIGSTOPped) or wedged process,
# seen well before its livenessProbe ends it. The message names how long and the last error. False (reason
# REASON_CONTROLLER_ANSWERING) once it answers again, or REASON_CONTROLLER_GONE once another controller pod (or
# none) is the current one, or when the job is suspended or finishes (both conditions: `JOB_STOPPED`). A
# controller still starting is not this.
COND_CONTROLLER_UNRESPONSIVE = "ControllerUnresponsive"
REASON_CONTROLLER_NOT_ANSWERING = "ControllerNotAnswering"
REASON_CONTROLLER_GONE = "ControllerGone"  # False: the controller it was about is not the current one, or none runs


class Condition(_Model):
    """One Kubernetes-style condition."""

    type: str = Field(description="Condition type, e.g. Running, Degraded, Failed.")
    status: ConditionStatus = Field(description="True, False or Unknown.")
    reason: str = Field(default="", description="CamelCase machine-readable reason.")
    message: str = Field(default="", description="Human-readable detail.")
    last_transition_time: str = Field(default="", description="RFC 3339 time the status last changed.")
    observed_generation: int = Field(default=0, description="metadata.generation the condition was computed for.")


class SliceStatusEntry(_Model):
    """What the operator sees of one slice."""

    index: int = Field(ge=0, description="Slice index.")
    state: SliceState = Field(description="Provisioning, Ready, Down or Draining.")
    restarts: int = Field(default=0, ge=0, description="Times the slice's workers were replaced (its JobSet restarted), "
                                                       "over every JobSet the slice had (suspend/resume keeps it).")
    pods: list[str] = Field(default_factory=list, description="Names of the slice's current worker pods; of a slice "
                                                               "lost while the job runs, the ones it lost, until it "
                                                               "is Ready again.")
    addresses: list[str] = Field(default_factory=list, description="host:port of each worker (when Ready).")
    reason: str = Field(default="", description="Why the slice is in this state (e.g. exit code 137); of a Ready "
                                                "slice outside the training mesh, that its worker still compiles "
                                                "the step programs (warming) before it joins or is a warm spare.")
    last_transition_time: str = Field(default="", description="RFC 3339 time of the last state change.")


class ResumedFrom(_Model):
    """The checkpoint the current controller resumed from, as the controller reported it."""

    step: int = Field(ge=0, description="The committed checkpoint step restored.")
    writer_namespace: str = Field(default="", description="Namespace of the job that wrote the step (empty: unknown).")
    writer_name: str = Field(default="", description="Name of the job that wrote the step (empty: unknown).")
    writer_uid: str = Field(
        default="", description="metadata.uid of the job that wrote the step (empty: saved without a writer identity).")
    fallback_reason: str = Field(
        default="", description="Why newer committed steps were skipped (corrupt, truncated, non-finite): each "
                                "step with a short reason (exception type and first line, no object reprs); empty "
                                "when none were.")
    controller_pod: str = Field(default="", description="The controller pod that resumed.")


class SliceCounterBase(_Model):
    """Restarts of one slice's earlier JobSets (`CounterBase`)."""

    index: int = Field(ge=0, description="Slice index.")
    jobset_uid: str = Field(default="", description="metadata.uid of the JobSet whose restarts are added to `restarts`.")
    restarts: int = Field(default=0, ge=0, description="Restarts of the slice's JobSets before that one (deleted on "
                                                        "suspend, or for a new Pathways head).")


# Goodput ledger categories (the controller's `goodput.CATEGORIES`), in the order status lists them.
GOODPUT_CATEGORIES = ("productive", "reduced", "recovering", "waiting", "checkpointing", "restoring", "starting",
                      "stalled")


class GoodputSeconds(_Model):
    """Wall seconds of the job's controllers by goodput category (exactly one category is current at a time)."""

    productive: float = Field(default=0.0, ge=0, description="Seconds training on every desired slice.")
    reduced: float = Field(default=0.0, ge=0, description="Seconds training on fewer slices than spec.slices.count "
                                                          "(replica resize).")
    recovering: float = Field(default=0.0, ge=0, description="Seconds from a failure to the next completed step "
                                                             "(paused time excluded), plus steps done and then lost.")
    waiting: float = Field(default=0.0, ge=0, description="Seconds paused for lack of slices after training began.")
    checkpointing: float = Field(default=0.0, ge=0, description="Seconds the training loop blocked on a checkpoint save.")
    restoring: float = Field(default=0.0, ge=0, description="Seconds reading a checkpoint or host snapshot back.")
    starting: float = Field(default=0.0, ge=0, description="Seconds from a controller process's start to its first "
                                                           "completed step (start-up, first slices, first compile, "
                                                           "and a first step that failed and was retried).")
    stalled: float = Field(default=0.0, ge=0, description="Seconds the training loop was stuck in the controller's own "
                                                          "code (a blocking data read, a deadlock in user code) past "
                                                          "the step deadline, outside the slices' step.")


class Goodput(_Model):
    """The job's goodput ledger, over every controller pod it had (docs/failure-handling.md, "Goodput")."""

    fraction: float | None = Field(
        default=None, ge=0, le=1,
        description="(productive + reduced x active/desired) seconds / the seconds booked; unset before any were.")
    percent: str = Field(default="", description="`fraction` as a percentage with one decimal (the GOODPUT column).")
    seconds: GoodputSeconds = Field(default_factory=GoodputSeconds, description="Seconds per category.")
    reduced_equivalent_seconds: float = Field(
        default=0.0, ge=0, description="`reduced` weighted by active/desired slices: what that work costs at full size.")
    wall_seconds: float = Field(default=0.0, ge=0, description="The categories' seconds added up.")


class GoodputBase(_Model):
    """What the job's earlier controller pods booked (`CounterBase.goodput`)."""

    seconds: GoodputSeconds = Field(default_factory=GoodputSeconds, description="Seconds per category.")
    reduced_equivalent_seconds: float = Field(default=0.0, ge=0, description="Their reduced seconds x active/desired.")


class CounterBase(_Model):
    """What earlier controller pods and JobSets of the job counted.

    The live sources restart at 0 (a new controller pod after a loss or a resume; a
    JobSet created again), so each total in status is this base plus the live count.
    """

    controller_uid: str = Field(default="", description="metadata.uid of the controller pod whose recoveries are "
                                                        "added to `recoveries`.")
    recoveries: int = Field(default=0, ge=0, description="Recoveries the job's earlier controller pods made.")
    slices: list[SliceCounterBase] = Field(default_factory=list, description="Per slice: restarts of its earlier JobSets.")
    goodput: GoodputBase | None = Field(
        default=None, description="The goodput ledger of the job's earlier controller pods, added to `goodput`.")
    steps_lost: int = Field(default=0, ge=0, description="`stepsLost` of the job's earlier controller pods, added to "
                                                         "`stepsLost`.")
    step_reached: int | None = Field(
        default=None, ge=0, description="`step` when the live controller pod took over: the steps it does not resume "
                                        "(reached minus the step it resumed from) are lost. Unset: not known.")
    trained_from_step: int | None = Field(
        default=None, ge=0, description="The lowest step the job's controllers resumed from: the goodput ledger's "
                                        "productive and reduced seconds trained the steps from here to `step_reached`. "
                                        "Unset until a controller reported where it resumed.")
    step_at_resume: int | None = Field(
        default=None, ge=0, description="`step` when the job was resumed (spec.suspend true, then false): from then "
                                        "`step` is the step the new controller pod starts from, and the steps lost "
                                        "count from this once it takes over. Unset: no resume waits for its controller.")
    resume_counted: bool = Field(
        default=False, description="The live controller pod said where it resumed, so the steps it lost from "
                                   "`stepReached` are in `stepsLost`. A pod replaced before that (suspended or lost "
                                   "while starting) passes `stepReached` on to the next one.")
    frozen_seconds: float = Field(
        default=0.0, ge=0, description="Seconds the live controller pod was frozen (it ran but did not answer for "
                                       "longer than the ControllerUnresponsive grace, then answered again) while "
                                       "training, as far as its own ledger booked them as training (not what it "
                                       "booked `stalled` itself); `goodput` books them `recovering`.")
    frozen_reduced_seconds: float = Field(
        default=0.0, ge=0, description="Of `frozenSeconds`, those frozen while it trained on fewer slices than "
                                       "desired (its ledger booked them `reduced`).")
    frozen_until: float | None = Field(
        default=None, ge=0, description="When (Unix seconds) the last freeze counted in `frozenSeconds` ended: a "
                                        "freeze is added once. Unset: none counted.")


class ElasticTrainingJobStatus(_Model):
    """Observed state of an elastic training job."""

    phase: Phase = Field(default="Pending", description="Pending, Running, Degraded (fewer slices train than "
                                                        "desired, or the controller does not answer), Recovering, "
                                                        "Suspending (the controller still stopping), Suspended, "
                                                        "Succeeded or Failed.")
    observed_generation: int = Field(default=0, description="metadata.generation last reconciled.")
    conditions: list[Condition] = Field(default_factory=list, description="Kubernetes-style conditions.")
    desired_slices: int = Field(default=0, description="spec.slices.count.")
    active_slices: int = Field(default=0, description="Slices in the controller's training mesh.")
    slices: list[SliceStatusEntry] = Field(default_factory=list, description="Per-slice state.")
    step: int = Field(default=0, description="Optimizer steps completed.")
    total_steps: int = Field(default=0, description="spec.training.steps.")
    loss: float | None = Field(default=None, description="Latest training loss.")
    initial_loss: float | None = Field(default=None, description="Loss of the first step.")
    last_checkpoint_step: int | None = Field(default=None, description="Newest committed checkpoint step.")
    controller_pod: str = Field(default="", description="Name of the current controller pod.")
    controller_attempt: int | None = Field(
        default=None, ge=0, description="N of the newest controller pod the operator created for this job "
                                        "(<job>-controller-N): the next one is N+1, also after a suspend and resume, "
                                        "so no pod name of the job is used twice. Unset: none created yet.")
    controller_restarts: int = Field(default=0, ge=0, description="Times the controller pod was recreated (never for a worker failure).")
    controller_losses_in_a_row: int = Field(
        default=0, ge=0, description="Controller losses since a controller last completed a training step (or ran "
                                     "10 min): the restart back-off's count (kubelet CrashLoopBackOff rule: the first "
                                     "replacement at once, then 10 s doubling up to 300 s from the lost pod's finish).")
    slice_replacements: int = Field(default=0, ge=0, description="Worker slices replaced in total (the slices' "
                                                                 "restarts added up), across suspend/resume.")
    recoveries: int = Field(default=0, ge=0, description="Recoveries (a slice lost, hung or drained) the job's "
                                                         "controllers made, over every controller pod of the job (a new "
                                                         "one after a loss or a resume adds to it).")
    goodput: Goodput | None = Field(
        default=None, description="Where the job's controller wall time went, over every controller pod of the job "
                                  "(a new one after a loss or a resume adds to it); unset until a controller answered.")
    spare_slices: list[int] = Field(
        default_factory=list, description="Indices of the slices the controller keeps as hot spares now (Ready, out "
                                          "of the training mesh; spec.slices.spares), as it last reported.")
    spare_count: int = Field(default=0, ge=0, description="How many slices spareSlices names (the SPARES column of "
                                                           "`kubectl get ejob -o wide`: 0 for none).")
    steps_lost: int = Field(
        default=0, ge=0, description="Training steps completed and then thrown away, over every controller pod of the "
                                     "job: a new controller pod (a controller loss, a resume) that resumes from an "
                                     "earlier step than the job had reached (`step` then) loses the difference, and a "
                                     "controller that restores lost state itself (pathways) the steps it re-does. Their "
                                     "seconds are booked `recovering` in `goodput`, not `productive`.")
    last_recovery_seconds: float | None = Field(default=None, description="Seconds from the last failure to the next completed step.")
    failure_reason: str = Field(default="", description="Why the job failed.")
    setting_warnings: list[str] = Field(
        default_factory=list, description="Settings the current controller found wrong while it ran, one line each "
                                          "naming the field (e.g. spec.elasticity.stepDeadlineSeconds shorter than "
                                          "every slice's step, with the step time); each new one is also a Warning "
                                          "Event (SettingWarning).")
    resumed_from: ResumedFrom | None = Field(
        default=None, description="The checkpoint step (and the job that wrote it) the current controller resumed from; "
                                  "unset when it started from step 0.")
    token_secret: str = Field(
        default="", description="The token Secret the operator created for this job (by UID); only it is ever mounted.")
    manifest_sha256: str = Field(
        default="", description=("Digest of the spec the operator wrote to the manifest ConfigMap; the controller "
                                 "refuses a manifest with another, and the operator reads the ConfigMap back only "
                                 "with this one."))
    counter_base: CounterBase | None = Field(
        default=None, description="Counts of the job's earlier controller pods and JobSets that `recoveries`, "
                                  "`sliceReplacements` and the slices' `restarts` include (kept by the operator).")
    start_time: str = Field(default="", description="RFC 3339 time the job was first reconciled.")
    completion_time: str = Field(default="", description="RFC 3339 time it Succeeded or Failed.")

    @classmethod
    def from_kube(cls, status: Mapping[str, Any] | None) -> ElasticTrainingJobStatus:
        """The typed status from a job's `.status` as the API server returns it (camelCase).

        kopf's own `status.kopf` and fields this version does not know (written by a
        newer operator) are left out; only the fields present count as set, so
        `to_kube` writes back no default the job never had.

        Raises:
          ValueError: a known field holds a value the model refuses (naming the field):
            `.status` was edited by hand through the status subresource.
        """
        known = {f.alias or n for n, f in cls.model_fields.items()}
        data = {k: v for k, v in (status or {}).items() if k in known}
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise ValueError(f"status.{where}: {first['msg']} (the job's status was not written by this operator)") from None

    def to_kube(self) -> dict[str, Any]:
        """The camelCase `.status` to write: the fields set (read back or assigned), unset optionals left out."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True, exclude_none=True)
