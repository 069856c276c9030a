"""Control-API messages between the operator (or local launcher) and the controller.

The controller serves them over HTTP (`elastic_jax.controller.control_api`);
the operator and the launcher send them with `elastic_jax.api.client`.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import (AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, StrictInt,
                      field_validator)
from pydantic.alias_generators import to_camel

from elastic_jax.api.identity import JobIdentity
from elastic_jax.api.job import INT64_MAX

# What a supervisor reports of a slice (`PUT /v1/slices/{i}`): its own `status.SliceState` less Provisioning, which
# is never reported (`supervision.slice_state.reported`).
ReportedState = Literal["Ready", "Down", "Draining"]
# A slice as the controller sees it (`SliceStatus.state`).
SliceView = Literal["Active", "Ready", "Warming", "Spare", "Down", "Draining", "Unknown"]
# How far ahead of the controller's own clock a report's generation may be.
# Generations are nanosecond timestamps of the sender (the operator or the
# launcher), so they keep increasing across restarts of either without a
# stored counter; the controller refuses one further ahead than this, so a
# wrong or hostile generation can hold a slice's later reports off for at most
# this long (the Kerberos default clock-skew tolerance; cluster nodes run NTP).
MAX_GENERATION_AHEAD_S = 300
# The longest `GET /v1/status?wait=` a controller holds an unchanged status (seconds).
MAX_STATUS_WAIT_S = 30.0
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
ENDED_PHASES: tuple[ControllerPhase, ...] = ("Succeeded", "Failed", "Stopped", "Interrupted")
"""Phases after which a controller trains no more: it has released its mesh (no active slice), closes its API
and exits."""


# The controller's answers are untrusted (a tenant's image or program serves them) and the operator copies
# parts of `ControllerStatus` into the job's status, which the API server refuses whole when one value is
# not JSON (NaN, Infinity) or not an int64. So every field of an answer is bounded here, per field:
# - counts, steps, indices, generations (-1: none yet), pid: integers in [0, INT64_MAX] (job.py's bound, the one the API
#   server compares exactly); outside, the answer is refused (`ControlApiError` "malformed answer",
#   naming the field): no controller of ours sends one.
# - loss, initial loss, tokens/s, goodput, a recovery's seconds: a non-finite value (a diverged run's NaN
#   loss is a real answer) is dropped to None ("not reported"), as pydantic's JSON encoder writes it.
# - goodput seconds per category: finite and in [0, MAX_REPORTED_SECONDS], else refused.
# - free text (failure and fallback reasons, causes): cut to MAX_TEXT characters (the start says why).
# - lists: at most MAX_LIST_ITEMS entries, else refused.
MAX_TEXT = 2048
MAX_LIST_ITEMS = 4096
# A million years of seconds: far beyond any ledger, and its sum over the categories stays finite.
MAX_REPORTED_SECONDS = 3.2e13

Count = Annotated[int, Field(ge=0, le=INT64_MAX)]
# A slice's generation as the controller holds it: -1 before any report was applied.
Generation = Annotated[int, Field(ge=-1, le=INT64_MAX)]


def _finite_or_none(value: float | None) -> float | None:
    """None for NaN and +-Infinity (JSON cannot carry them, nor can the job's status)."""
    return value if value is None or math.isfinite(value) else None


def _cut(value: Any) -> Any:
    """Free text cut to MAX_TEXT characters."""
    return value[:MAX_TEXT] if isinstance(value, str) else value


OptionalFinite = Annotated[float | None, AfterValidator(_finite_or_none)]
Text = Annotated[str, BeforeValidator(_cut)]
Seconds = Annotated[float, Field(ge=0, le=MAX_REPORTED_SECONDS, allow_inf_nan=False)]


class _Msg(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


class SliceReport(_Msg):
    """`PUT /v1/slices/{index}` body: what the operator observed about one slice.

    A report whose `generation` is not greater than the last one applied for
    that slice is ignored (stale), so retries and reordering are harmless.
    """

    state: ReportedState = Field(description="Ready: all hosts up, addresses valid. Down: lost. Draining: about to go.")
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
    slice_index: Count
    generation: Generation = Field(description="The generation now in force for this slice.")


class SliceStatus(_Msg):
    """The controller's view of one slice."""

    index: Count
    state: SliceView = Field(
        description="Active: in the training mesh. Ready: up, joins at the next step boundary. Spare: up, kept "
                    "out of a full mesh (spec.slices.spares), swapped in when an active slice is lost. Warming: "
                    "up and outside the mesh, its worker still compiling the step programs: it joins (or is a "
                    "warm spare) once that ends."
    )
    generation: Generation
    addresses: list[Annotated[str, StringConstraints(max_length=300)]] = Field(default_factory=list, max_length=256)
    failures: Count = Field(default=0, description="Times this slice was lost.")


class RecoveryRecord(_Msg):
    """One recovery: a slice lost or a scale-up, and how long until the next completed step.

    A slice lost while a slice loss is recovered (found down during the wait for slices that follows it) joins
    that loss's `slices`: one recovery handled both."""

    cause: Text = Field(description="slice_down, step_deadline, scale_up, draining.")
    slices: list[Count] = Field(max_length=MAX_LIST_ITEMS)
    at_step: Count
    seconds: OptionalFinite = Field(default=None, description="From the failure to the next completed step; None while "
                                  "recovering, and for good when the run ended (stopped, failed) before that step.")
    fewest_slices: Count | None = Field(
        default=None, description="Fewest slices up (Ready and healthy) while this recovery waited for slices: below "
                                  "min_slices the run paused (WaitingForSlices); None: it never had to wait.")
    paused_seconds: OptionalFinite = Field(
        default=None, description="Seconds of this recovery spent waiting for slices (paused below min_slices); "
                                  "None: it never had to wait.")


class ResumeInfo(_Msg):
    """Which checkpoint a run resumed from, and why not a newer one."""

    step: Count = Field(description="The committed step restored.")
    fallback_reason: Text | None = Field(
        default=None, description="Set when newer committed steps could not be restored (corrupt, truncated, "
                                  "non-finite): which, and why. The operator turns it into a Warning Event.")
    writer: JobIdentity | None = Field(
        default=None, description="The job that wrote the step; None for a step saved without a writer identity.")

    @field_validator("writer")
    @classmethod
    def _bounded_writer(cls, writer: JobIdentity | None) -> JobIdentity | None:
        """A writer's namespace, name and uid are Kubernetes names: at most 253 characters each."""
        for name in ("namespace", "name", "uid"):
            if writer is not None and len(getattr(writer, name)) > 253:
                raise ValueError(f"writer.{name} is longer than 253 characters")
        return writer


class ControllerStatus(_Msg):
    """`GET /v1/status`. Bounded field by field (see MAX_TEXT above): what the operator copies is always
    writable to the job's status."""

    phase: ControllerPhase
    step: Count = Field(description="Optimizer steps completed.")
    total_steps: Count
    desired_slices: Count
    min_slices: Count
    active_slices: list[Count] = Field(max_length=MAX_LIST_ITEMS)
    inactive_slices: list[Count] = Field(max_length=MAX_LIST_ITEMS)
    slices: list[SliceStatus] = Field(max_length=MAX_LIST_ITEMS)
    loss: OptionalFinite = Field(default=None, description="None also when the loss is not finite (NaN, Inf).")
    initial_loss: OptionalFinite = None
    tokens_per_second: OptionalFinite = None
    last_committed_checkpoint_step: Count | None = None
    recoveries: dict[Annotated[str, StringConstraints(max_length=64)], Count] = Field(
        default_factory=dict, max_length=64, description="Count by cause.")
    recovery_history: list[RecoveryRecord] = Field(default_factory=list, max_length=MAX_LIST_ITEMS)
    steps_lost: Count = 0
    goodput: OptionalFinite = Field(default=None, description="(productive + reduced x active/desired) seconds / wall "
                                    "seconds of this controller (the goodput ledger); None before its first step "
                                    "(not applicable).")
    goodput_seconds: dict[Annotated[str, StringConstraints(max_length=64)], Seconds] = Field(
        default_factory=dict, max_length=64,
        description="Wall seconds of this controller by goodput category: starting, restoring, "
                    "productive, reduced, recovering, waiting, checkpointing.")
    failure_reason: Text | None = None
    stalled: Text | None = Field(
        default=None, description="Set while the training loop is stuck in the controller's own code (outside the "
                                  "slices' step) for longer than a step may take: what, for how long, and the "
                                  "setting. `elastic-jax run` prints it; its seconds are booked `stalled`.")
    setting_warnings: list[Text] = Field(
        default_factory=list, max_length=8,
        description="Settings the run found wrong while it ran, one line each naming the field (e.g. "
                    "spec.elasticity.stepDeadlineSeconds shorter than every slice's step, with the step time; a resume "
                    "that spec.checkpoint.allowDataChange let change the global batch size or seed, naming each). The "
                    "operator copies them to status.settingWarnings and posts each new one as a Warning Event.")
    pid: Count
    resumed_from: ResumeInfo | None = Field(default=None, description="The checkpoint this run resumed from; None when it started from step 0.")
    version: Count = Field(default=0, description=(
        "Moves up whenever this status changes (the goodput seconds that tick with the clock excepted); "
        "`GET /v1/status?after=<version>&wait=<s>` waits for it to move. 0: a controller without long polls."))
