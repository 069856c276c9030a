"""The `status` of an `ElasticTrainingJob`, written by the operator.

Kubernetes conventions: a `phase` for humans and printer columns, and
`conditions` (type, status, reason, message, lastTransitionTime,
observedGeneration) for machines. Like the spec models, these are the source
of the CRD's status schema (`elastic_jax.api.crd`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from elastic_jax.api.job import _Model

Phase = Literal["Pending", "Running", "Degraded", "Recovering", "Suspended", "Succeeded", "Failed"]
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
REASON_TOKEN_SECRET_CONFLICT = "TokenSecretConflict"
REASON_CHILD_CONFLICT = "ChildNameConflict"
REASON_TOKEN_REFUSED = "ControllerRefusesToken"  # the controller answers 401 to this operator's token
# A child's name is still held by a pod of an earlier job of the same name (deleted, terminating).
REASON_PREVIOUS_JOB_TERMINATING = "PreviousJobTerminating"
# Events about a resume from a checkpoint: every resume (Normal), and a resume from an older
# step because the newer ones could not be restored (Warning).
EVENT_RESUMED = "Resumed"
EVENT_CHECKPOINT_FALLBACK = "CheckpointFallback"
COND_SUCCEEDED = "Succeeded"
COND_FAILED = "Failed"


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
    pods: list[str] = Field(default_factory=list, description="Names of the slice's current worker pods.")
    addresses: list[str] = Field(default_factory=list, description="host:port of each worker (when Ready).")
    reason: str = Field(default="", description="Why the slice is in this state (e.g. exit code 137).")
    last_transition_time: str = Field(default="", description="RFC 3339 time of the last state change.")


class ResumedFrom(_Model):
    """The checkpoint the current controller resumed from, as the controller reported it."""

    step: int = Field(ge=0, description="The committed checkpoint step restored.")
    writer_namespace: str = Field(default="", description="Namespace of the job that wrote the step (empty: unknown).")
    writer_name: str = Field(default="", description="Name of the job that wrote the step (empty: unknown).")
    writer_uid: str = Field(
        default="", description="metadata.uid of the job that wrote the step (empty: saved without a writer identity).")
    fallback_reason: str = Field(
        default="", description="Why newer committed steps were skipped (corrupt, truncated, non-finite); empty when none were.")
    controller_pod: str = Field(default="", description="The controller pod that resumed.")


class SliceCounterBase(_Model):
    """Restarts of one slice's earlier JobSets (`CounterBase`)."""

    index: int = Field(ge=0, description="Slice index.")
    jobset_uid: str = Field(default="", description="metadata.uid of the JobSet whose restarts are added to `restarts`.")
    restarts: int = Field(default=0, ge=0, description="Restarts of the slice's JobSets before that one (deleted on "
                                                        "suspend, or for a new Pathways head).")


class CounterBase(_Model):
    """What earlier controller pods and JobSets of the job counted.

    The live sources restart at 0 (a new controller pod after a loss or a resume; a
    JobSet created again), so each total in status is this base plus the live count.
    """

    controller_uid: str = Field(default="", description="metadata.uid of the controller pod whose recoveries are "
                                                        "added to `recoveries`.")
    recoveries: int = Field(default=0, ge=0, description="Recoveries the job's earlier controller pods made.")
    slices: list[SliceCounterBase] = Field(default_factory=list, description="Per slice: restarts of its earlier JobSets.")


class ElasticTrainingJobStatus(_Model):
    """Observed state of an elastic training job."""

    phase: Phase = Field(default="Pending", description="Pending, Running, Degraded, Recovering, Suspended, Succeeded or Failed.")
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
    controller_restarts: int = Field(default=0, ge=0, description="Times the controller pod was recreated (never for a worker failure).")
    slice_replacements: int = Field(default=0, ge=0, description="Worker slices replaced in total (the slices' "
                                                                 "restarts added up), across suspend/resume.")
    recoveries: int = Field(default=0, ge=0, description="Recoveries (a slice lost, hung or drained) the job's "
                                                         "controllers made, over every controller pod of the job (a new "
                                                         "one after a loss or a resume adds to it).")
    last_recovery_seconds: float | None = Field(default=None, description="Seconds from the last failure to the next completed step.")
    failure_reason: str = Field(default="", description="Why the job failed.")
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
