"""Control-API messages between the operator (or local launcher) and the controller.

The controller serves them over HTTP (`elastic_jax.controller.control_api`);
the operator and the launcher send them with `elastic_jax.api.client`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, StrictInt
from pydantic.alias_generators import to_camel

from elastic_jax.api.identity import JobIdentity

SliceState = Literal["Ready", "Down", "Draining"]
# How far ahead of the controller's own clock a report's generation may be.
# Generations are nanosecond timestamps of the sender (the operator or the
# launcher), so they keep increasing across restarts of either without a
# stored counter; the controller refuses one further ahead than this, so a
# wrong or hostile generation can hold a slice's later reports off for at most
# this long (the Kerberos default clock-skew tolerance; cluster nodes run NTP).
MAX_GENERATION_AHEAD_S = 300
ControllerPhase = Literal[
    "Starting",  # building the trainer, restoring a checkpoint
    "WaitingForSlices",  # fewer than the minimum active (pause), or startup
    "Running",
    "Recovering",  # a slice was lost; the step is being retried on the survivors
    "Succeeded",
    "Failed",
    "Stopped",  # ended by a stop request (Ctrl-C of elastic-jax run, a suspend); the last completed step is saved
    "Interrupted",  # ended by a signal that was not a stop request: a controller loss; a new one resumes
]


class _Msg(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class SliceReport(_Msg):
    """`PUT /v1/slices/{index}` body: what the operator observed about one slice.

    A report whose `generation` is not greater than the last one applied for
    that slice is ignored (stale), so retries and reordering are harmless.
    """

    state: SliceState = Field(description="Ready: all hosts up, addresses valid. Down: lost. Draining: about to go.")
    # A strict JSON integer (true, "3" and 3.0 are refused), int64 as in Kubernetes: a
    # nanosecond timestamp fits until 2262. Values above 2**53 are exact in JSON as
    # Python and Go parse it (not as float64). The upper bound that matters is the
    # controller's: at most MAX_GENERATION_AHEAD_S ahead of its clock.
    generation: StrictInt = Field(
        ge=0, le=2**63 - 1,
        description="Monotonically increasing per slice: the sender's time.time_ns(); at most "
                    "MAX_GENERATION_AHEAD_S ahead of the controller's clock.",
    )
    addresses: list[Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.\-\[\]:]+:[0-9]{1,5}$", max_length=300)]] = Field(
        default_factory=list, max_length=256,
        description="host:port of each worker host of the slice; required for Ready on the cpu backend.",
    )
    reason: str | None = Field(default=None, max_length=1024, description="Why (e.g. pod exit code, OOMKilled).")


class StopRequest(_Msg):
    """`POST /v1/stop` body: the user (through the launcher or the operator) asks the run to stop.

    The controller abandons the in-flight step, checkpoints the last completed
    one and exits `ControllerExit.STOPPED`. A bare SIGTERM instead means the
    controller is being lost (node shutdown, preemption): it checkpoints the
    same way but exits `ControllerExit.RESTART`.
    """

    reason: str = Field(default="stop requested", max_length=256, description="Why, for the log and summary (e.g. Ctrl-C, suspend).")


class SliceReportResult(_Msg):
    """Answer to `PUT /v1/slices/{index}`."""

    applied: bool = Field(description="False when the report was stale (generation not newer).")
    slice_index: int
    generation: int = Field(description="The generation now in force for this slice.")


class SliceStatus(_Msg):
    """The controller's view of one slice."""

    index: int
    state: Literal["Active", "Ready", "Spare", "Down", "Draining", "Unknown"] = Field(
        description="Active: in the training mesh. Ready: up, joins at the next step boundary. Spare: up, kept "
                    "out of a full mesh (spec.slices.spares), swapped in when an active slice is lost."
    )
    generation: int
    addresses: list[str] = Field(default_factory=list)
    failures: int = Field(default=0, description="Times this slice was lost.")


class RecoveryRecord(_Msg):
    """One recovery: a slice lost or a scale-up, and how long until the next completed step."""

    cause: str = Field(description="slice_down, step_deadline, scale_up, draining.")
    slices: list[int]
    at_step: int
    seconds: float | None = Field(default=None, description="From the failure to the next completed step; None while "
                                  "recovering, and for good when the run ended (stopped, failed) before that step.")


class ResumeInfo(_Msg):
    """Which checkpoint a run resumed from, and why not a newer one."""

    step: int = Field(description="The committed step restored.")
    fallback_reason: str | None = Field(
        default=None, description="Set when newer committed steps could not be restored (corrupt, truncated, "
                                  "non-finite): which, and why. The operator turns it into a Warning Event.")
    writer: JobIdentity | None = Field(
        default=None, description="The job that wrote the step; None for a step saved without a writer identity.")


class ControllerStatus(_Msg):
    """`GET /v1/status`."""

    phase: ControllerPhase
    step: int = Field(description="Optimizer steps completed.")
    total_steps: int
    desired_slices: int
    min_slices: int
    active_slices: list[int]
    inactive_slices: list[int]
    slices: list[SliceStatus]
    loss: float | None = None
    initial_loss: float | None = None
    tokens_per_second: float | None = None
    last_committed_checkpoint_step: int | None = None
    recoveries: dict[str, int] = Field(default_factory=dict, description="Count by cause.")
    recovery_history: list[RecoveryRecord] = Field(default_factory=list)
    steps_lost: int = 0
    goodput: float | None = Field(default=None, description="(productive + reduced x active/desired) seconds / wall "
                                  "seconds of this controller (the goodput ledger); None before its first step "
                                  "(not applicable).")
    goodput_seconds: dict[str, float] = Field(
        default_factory=dict, description="Wall seconds of this controller by goodput category: starting, restoring, "
                                          "productive, reduced, recovering, waiting, checkpointing.")
    failure_reason: str | None = None
    pid: int
    resumed_from: ResumeInfo | None = Field(default=None, description="The checkpoint this run resumed from; None when it started from step 0.")
