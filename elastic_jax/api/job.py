"""The `ElasticTrainingJob` custom resource: spec and status models.

These pydantic models are the single source of truth for the resource. The
CRD in `crds/` is generated from them (`elastic_jax.api.crd`), the local
launcher validates manifests with them, the operator reconciles them and the
controller reads its spec from them. Field descriptions become the CRD's
schema descriptions, so write them for users.

YAML field names are camelCase (Kubernetes convention); Python attribute
names are snake_case. Unknown fields are refused everywhere (`extra="forbid"`)
so a typo in a manifest is an error naming the field, never silently ignored.
"""

from __future__ import annotations

import json
import math
import re
import types
from typing import Annotated, Any, Callable, ClassVar, Literal

from pydantic import (BaseModel, ConfigDict, Field, PlainValidator, TypeAdapter, ValidationError, WithJsonSchema,
                      field_validator, model_validator)
from pydantic.alias_generators import to_camel

from elastic_jax import contract
from elastic_jax.api import checkpoints, images, nesting, pod_rules, runtime_env, tpu_placement

GROUP = contract.GROUP
VERSION = contract.VERSION
API_VERSION = contract.API_VERSION
KIND = contract.KIND
PLURAL = contract.PLURAL
SINGULAR = "elastictrainingjob"
SHORT_NAMES = ("ejob",)

# Default images; the local control plane maps them to local commands and the
# images/Dockerfile builds them (one source of truth: elastic_jax.api.images).
DEFAULT_CONTROLLER_IMAGE = images.CONTROLLER_IMAGE
DEFAULT_WORKER_IMAGE = images.WORKER_IMAGE
BUILTIN_TRAINER = "elastic_jax.controller.builtin_lm:make_trainer"

# A job name must be a DNS-1035 label (it starts with a letter): the job's Service is
# named after it, and Service names are DNS-1035 labels. No `$` (it matches before a
# trailing newline in Python): names are checked with `fullmatch`.
NAME_PATTERN = "^[a-z]([-a-z0-9]*[a-z0-9])?$"
_DNS1035 = re.compile(NAME_PATTERN[1:-1])
# Every child name is the job name plus a suffix, and each must stay a 63-character
# label. The longest is a worker pod at the largest shape: JobSet `<job>-slice-<i>`
# (i <= 63), its Job `<jobset>-worker-0`, its pods `<job>-<pod index>-<5 random>`
# (pod index <= 255), which JobSet's webhook checks against 63 characters:
# `-slice-63-worker-0-255-abcde` is 28 characters, so a job name has at most 35.
# `tests/unit/test_operator_render.py` renders that shape and checks every name.
LONGEST_CHILD_SUFFIX = "-slice-63-worker-0-255-abcde"
MAX_NAME_LENGTH = 63 - len(LONGEST_CHILD_SUFFIX)
_ENTRY_POINT = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
# The OpenAPI pattern of Kubernetes' resource.Quantity (k8s.io/apimachinery, as
# controller-gen emits it for CRDs), so the API server and `elastic-jax validate`
# refuse the same strings.
QUANTITY_PATTERN = (r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
                    r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$")
_QUANTITY = re.compile(QUANTITY_PATTERN)
# Integers in the API server are int64: a larger number in a manifest is refused there
# (the CRD's `maximum`), so `elastic-jax validate` refuses it too (issue 9: steps: 2**70).
# The bound is the largest float64 below 2**63: the API server reads a schema's `maximum` as
# a float64 (2**63 - 1 rounds up to 2**63 and overflows), and both sides must agree exactly.
INT64_MAX = 2**63 - 1024
# Bounds of the fields the controller sizes memory or waits by (issue 9: `globalBatchSize: 2**40` was
# accepted and the controller grew until the node's memory ran out). A step's global batch is built
# on the controller host, so it is bounded by what one host can hold; a duration beyond 30 days is a
# typo, and a timer that large overflows Python's waits.
MAX_GLOBAL_BATCH_SIZE = 2**20
MAX_DURATION_SECONDS = 30 * 24 * 3600
# (the CEL twin of `batch_shares_problem`)
BATCH_SHARES_MESSAGE = (
    "spec.training.globalBatchSize must be a multiple of spec.slices.count (backend cpu: of spec.slices.count x "
    "spec.slices.devicesPerHost): the built-in loop gives every slice, and every device of a slice, an equal share "
    "of each step's batch")


# One rule, one line: a model validator collects every rule it breaks and raises them together, one
# problem a line (`manifest.validation_problems` splits them), as the API server lists every failed
# rule instead of the first.
PROBLEM_SEPARATOR = "\n"


def collect(found: list[str], check: Callable[..., Any], *args: Any) -> None:
    """Runs `check(*args)`; a `ValueError` it raises is appended to `found` (one problem a line)."""
    try:
        check(*args)
    except ValueError as e:
        found.extend(str(e).split(PROBLEM_SEPARATOR))


def problems_of(check: Callable[..., Any], *args: Any) -> list[str]:
    """The problems `check(*args)` raises as a `ValueError` (`collect`), [] when it returns."""
    found: list[str] = []
    collect(found, check, *args)
    return found


def raise_all(found: list[str]) -> None:
    """Raises `found` as one `ValueError` (nothing when empty)."""
    if found:
        raise ValueError(PROBLEM_SEPARATOR.join(found))


def run_rules(section: Any, rules: tuple[Callable[[Any], list[str]], ...]) -> list[str]:
    """Every problem the `rules` of one section find in `section`, rule by rule (one problem a line).

    Args:
      section: the section's model, or a stand-in holding only the fields that validated
        (`partial_problems`): a rule reading a field that is absent there raises `AttributeError` and
        is skipped alone (its field's own error says what is wrong; a rule over it would be noise),
        while the section's other rules still run, as the API server runs each CEL rule beside the
        field errors.

    Returns:
      The messages in rule order; a `ValueError` a rule raises counts as its problems.
    """
    found: list[str] = []
    for rule in rules:
        try:
            found += rule(section)
        except AttributeError:
            pass
        except ValueError as e:
            found.extend(str(e).split(PROBLEM_SEPARATOR))
    return found


def _checked(rules: tuple[Callable[[Any], list[str]], ...]) -> Callable[[Any], Any]:
    """A pydantic after-validator body raising every problem of `rules` (`run_rules`) at once."""
    def validate(self: Any) -> Any:
        raise_all(run_rules(self, rules))
        return self
    return validate


def _quantity(value: Any) -> str:
    """A Kubernetes quantity, int or string as in a Pod spec (`cpu: 2`, `memory: 4Gi`); returned as a string.

    Raises:
      ValueError: a float (the API server refuses it for int-or-string; quote it),
        a bool, a negative value, or a string that is not a quantity.
    """
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    if isinstance(value, float) and value.is_integer():
        # (kubectl sends YAML's 2.0 as 2, which passes; a client that sends JSON sends 2.0, which the API server
        # refuses for an int-or-string: the manifest must pass however it is sent)
        raise ValueError(f"{value!r}: must be an integer or a quoted string, e.g. {int(value)} or "
                         f"'{value:g}', not a float (kubectl would send it as {int(value)}, but the API server "
                         "refuses it from a client that sends JSON)")
    if isinstance(value, float) and math.isfinite(value):
        raise ValueError(f"{value!r}: must be an integer or a quoted string; write a fraction as a string, e.g. "
                         f"'{value}' or '{int(value * 1000)}m'")
    if isinstance(value, str) and _QUANTITY.fullmatch(value) and not value.startswith("-"):
        return value
    # The pattern allows a sign; a Pod refuses negative requests and limits, so refuse them here.
    raise ValueError(f"{value!r} is not a non-negative Kubernetes quantity (e.g. 2, '500m', '4Gi')")


Quantity = Annotated[str, PlainValidator(_quantity),
                     WithJsonSchema({"x-kubernetes-int-or-string": True, "pattern": QUANTITY_PATTERN,
                                     "maxLength": 64})]


class _Model(BaseModel):
    """Base: camelCase aliases, unknown fields refused, snake_case accepted too."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
    )

    def to_manifest(self) -> dict[str, Any]:
        """Returns the camelCase, JSON-compatible dict (unset optionals dropped)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# What the API server takes as an env var name (Kubernetes >= 1.34: printable ASCII but `=`); the same
# pattern goes into the CRD, so `kubectl apply` refuses what a pod create would refuse later.
ENV_NAME_PATTERN = r"^[ -<>-~]+$"
_ENV_NAME = re.compile(ENV_NAME_PATTERN)


# A list of env vars is a map keyed by name in the CRD, so the API server refuses a name set twice
# (as `_env_not_reserved` does); the bound keeps the CEL rules over it cheap.
MAX_ENV = 128
# spec.controller.command/args: items and characters per item (the manifest must fit a ConfigMap anyway).
MAX_COMMAND_ITEMS = 64
MAX_COMMAND_ITEM_CHARS = 4096
ENV_LIST_SCHEMA = {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]}
# Tolerations per pod: bounds the cost of the CRD's CEL rules over the list (`tpu_placement.CEL_RULES`).
MAX_TOLERATIONS = 64


class EnvVar(_Model):
    """One environment variable for a container (a plain value only)."""

    name: str = Field(min_length=1, max_length=1024,
                      description="Variable name: printable ASCII characters other than '='.",
                      json_schema_extra={"pattern": ENV_NAME_PATTERN})
    value: str = Field(default="", description="Variable value.")

    @field_validator("name")
    @classmethod
    def _printable_without_equals(cls, name: str) -> str:
        if not _ENV_NAME.fullmatch(name):
            raise ValueError(f"{name!r}: an environment variable name is printable ASCII characters other than '=' "
                             "(the API server refuses the pod otherwise)")
        return name


# Kubernetes name shapes (k8s.io/apimachinery validation): a DNS-1123 subdomain names a Secret,
# ServiceAccount or PriorityClass; a label value is at most 63 characters.
DNS1123_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_DNS1123_SUBDOMAIN = re.compile(DNS1123_SUBDOMAIN_PATTERN)
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_LABEL_KEY = re.compile(r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                        r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$")


def _object_name(value: str, what: str) -> str:
    """`value` if it is a DNS-1123 subdomain of at most 253 characters (what Kubernetes names Secrets,
    ServiceAccounts and PriorityClasses with).

    Raises:
      ValueError: naming `what` and the rule.
    """
    if len(value) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(value):
        raise ValueError(f"{what} {value!r} must be a Kubernetes object name: lowercase letters, digits, '-' and '.', "
                         "starting and ending with a letter or digit, at most 253 characters")
    return value


class LocalObjectReference(_Model):
    """A Secret in the job's namespace, by name (as a Pod's `imagePullSecrets` names it)."""

    name: str = Field(min_length=1, max_length=253, description="Name of a Secret in the job's namespace.",
                      json_schema_extra={"pattern": DNS1123_SUBDOMAIN_PATTERN})

    @model_validator(mode="after")
    def _name_shape(self) -> "LocalObjectReference":
        _object_name(self.name, "secret name")
        return self


class Toleration(_Model):
    """A Pod toleration (Kubernetes `core/v1.Toleration`): lets the pods schedule onto nodes with a matching taint."""

    # CEL rules for the CRD: what `_as_the_api_server_checks` refuses (the API server's ValidateTolerations),
    # so `kubectl apply` refuses it rather than the pod create later.
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": pod_rules.TOLERATION_CEL_RULES})

    key: str | None = Field(default=None, max_length=317,
                            description="Taint key to match (a label key); empty with operator Exists matches every taint.",
                            json_schema_extra={"pattern": pod_rules.QUALIFIED_NAME_PATTERN})
    operator: Literal["Exists", "Equal"] = Field(default="Equal", description="Exists (any value) or Equal (value must match).")
    value: str | None = Field(default=None, max_length=63, description="Taint value to match (operator Equal; a label value).",
                              json_schema_extra={"pattern": pod_rules.LABEL_VALUE_PATTERN})
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = Field(
        default=None, description="Taint effect to match; empty matches all effects.")
    toleration_seconds: int | None = Field(
        default=None, ge=-INT64_MAX, le=INT64_MAX, description="NoExecute only: how long the pod stays bound after the taint appears (default forever).")

    @model_validator(mode="after")
    def _as_the_api_server_checks(self) -> "Toleration":
        found = pod_rules.toleration_problems(self.key, self.value, self.operator, self.effect,
                                              self.toleration_seconds)
        raise_all(found)
        return self

    def to_pod(self) -> dict[str, Any]:
        """The toleration as it appears in a Pod spec (unset fields left out)."""
        return self.to_manifest()


def _node_selector(value: dict[str, str], field: str) -> dict[str, str]:
    """Checks label keys and values of a nodeSelector as the API server does.

    Raises:
      ValueError: naming `field`, the key and the rule.
    """
    for k, v in value.items():
        if not _LABEL_KEY.fullmatch(k) or len(k.rpartition("/")[0]) > 253:
            raise ValueError(f"{field} key {k!r} is not a valid label key")
        if not _LABEL_VALUE.fullmatch(v):
            raise ValueError(f"{field}[{k!r}] value {v!r} is not a valid label value "
                             "(at most 63 letters, digits, '-', '_', '.', starting and ending with a letter or digit)")
    return value


# A container image as a Pod takes it: not empty, no leading or trailing whitespace.
IMAGE_PATTERN = r"^\S(.*\S)?$"


def _pod_fields(image: str, resources: "Resources", role: str) -> None:
    """Checks the fields of a `role` ("spec.controller" / "spec.worker") that the API server checks in a Pod.

    Raises:
      ValueError: every problem found, each naming its field.
    """
    found = []
    if image != image.strip():
        found.append(f"{role}.image {image!r} must not have leading or trailing whitespace")
    found += resources.problems(f"{role}.resources")
    raise_all(found)


# The CRD's rules of a nodeSelector (as `_node_selector` checks): label keys, label values.
NODE_SELECTOR_SCHEMA = {
    "additionalProperties": {"type": "string", "maxLength": 63, "pattern": pod_rules.LABEL_VALUE_PATTERN},
    "x-kubernetes-validations": [{
        "rule": f"self.all(k, size(k) <= 317 && k.matches({pod_rules.cel_string(pod_rules.QUALIFIED_NAME_PATTERN)}))",
        "message": "a nodeSelector key must be a label key (an optional DNS prefix and '/', then at most 63 "
                   "letters, digits, '-', '_', '.')"}],
}


# Requests given to a container when the spec sets neither a request nor a limit for that resource
# (`effective_resources`). Sized for the cpu backend on a small cluster (kind on a laptop): enough
# that the scheduler does not pack a JAX process onto a node with no room, small enough that a
# 3-node kind cluster on 2 cores runs several jobs. No limits: an OOM kill of the controller costs a
# restart, and the Pathways controller's host snapshots need memory no default can guess.
DEFAULT_REQUESTS = {
    "controller": {"cpu": "250m", "memory": "512Mi"},
    "worker": {"cpu": "250m", "memory": "512Mi"},
}


class Resources(_Model):
    """Kubernetes container resources (quantities as in a Pod: `cpu: 2`, `cpu: 500m`, `memory: 4Gi`)."""

    # CEL rules for the CRD: the API server's pod rules (`pod_rules.resources_problems`) at `kubectl apply`.
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": pod_rules.RESOURCES_CEL_RULES})

    requests: dict[str, Quantity] = Field(
        default_factory=dict, max_length=pod_rules.MAX_RESOURCES,
        description=("Resource requests, e.g. {cpu: 1, memory: 2Gi}; each at most its limit (equal to it for an "
                     "extended resource such as example.com/gpu, or hugepages)."))
    limits: dict[str, Quantity] = Field(default_factory=dict, max_length=pod_rules.MAX_RESOURCES,
                                        description="Resource limits, e.g. {memory: 4Gi}.")

    def problems(self, field: str) -> list[str]:
        """What the API server would refuse in these resources when creating the pod, each naming `field`
        (e.g. "spec.worker.resources"); [] when nothing."""
        return pod_rules.resources_problems(self.requests, self.limits, field)

    def effective(self, role: str) -> dict[str, Any]:
        """The container's `resources`: these, plus `DEFAULT_REQUESTS[role]` for each resource (cpu, memory)
        the spec gives neither a request nor a limit for (a limit alone makes Kubernetes request the limit).

        Raises:
          KeyError: an unknown role.
        """
        requests = dict(self.requests)
        for name, quantity in DEFAULT_REQUESTS[role].items():
            if name not in requests and name not in self.limits:
                requests[name] = quantity
        return {k: v for k, v in (("requests", requests), ("limits", dict(self.limits))) if v}


class SliceSpec(_Model):
    """How many slices the job wants and what one slice is."""

    # CEL rule for the CRD: the API server refuses what `_min_not_above_count` refuses.
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [{
        "rule": "!has(self.minSlices) || self.minSlices <= self.count",
        "message": "spec.slices.minSlices must not exceed spec.slices.count",
        "fieldPath": ".minSlices",
    }, {
        "rule": "!has(self.spares) || self.count + self.spares <= 64",
        "message": "spec.slices.count + spec.slices.spares must be at most 64",
        "fieldPath": ".spares",
    }]})

    count: int = Field(ge=1, le=64, description="Desired number of slices (data-parallel replicas across DCN).")
    min_slices: int | None = Field(
        default=None,
        ge=1, le=64,
        description=(
            "Fewest active slices training may continue on. Equal to `count` (the default): pause and "
            "resume, training waits for a lost slice to come back. Lower: replica resize, training "
            "continues on the remaining slices and scales back up when the slice rejoins."
        ),
    )
    spares: int = Field(
        default=0,
        ge=0,
        le=8,
        description=(
            "Hot spare slices: started and health-checked like the others but kept out of the training mesh. "
            "When an active slice is lost, a Ready spare takes its place at the next step boundary (no wait "
            "for a pod to be scheduled or a process to start) and the lost slice, once replaced, becomes a "
            "spare. Slice indices are 0..count+spares-1; any `count` Ready ones train. Costs `spares` more "
            "slices of hardware for the whole run (pathways: `spares` more TPU node pools of the slice's "
            "shape, their workers registered with the resource manager; a swap then copies the state from a "
            "surviving slice to the spare and runs the program compiled ahead for the new mesh, not a node "
            "pool's provisioning)."
        ),
    )
    hosts_per_slice: int = Field(default=1, ge=1, le=256, description="Worker hosts (pods) per slice. The cpu backend supports 1.")
    devices_per_host: int = Field(
        default=1,
        ge=1,
        le=64,
        description="Devices per host. cpu backend: host devices the worker JAX process fakes (--xla_force_host_platform_device_count).",
    )
    accelerator: str | None = Field(
        default=None, max_length=63, description="pathways backend: GKE TPU accelerator label, e.g. tpu-v5-lite-podslice."
    )
    topology: str | None = Field(default=None, max_length=63, description="pathways backend: TPU topology of one slice, e.g. 2x2.")

    # Each rule reads only its own fields, so one invalid field skips only the rules over it (`run_rules`).
    RULES: ClassVar[tuple[Callable[[Any], list[str]], ...]] = (
        lambda s: [f"spec.slices.minSlices ({s.min_slices}) must not exceed spec.slices.count ({s.count})"]
        if s.min_slices is not None and s.min_slices > s.count else [],
        lambda s: [f"spec.slices.spares: count + spares ({s.count} + {s.spares}) must be at most 64"]
        if s.count + s.spares > 64 else [],
    )
    _min_not_above_count = model_validator(mode="after")(_checked(RULES))

    @property
    def total(self) -> int:
        """Slices started: `count` that train plus `spares` kept ready (indices 0..total-1)."""
        return self.count + self.spares

    @property
    def minimum(self) -> int:
        """The effective minimum slice count (`count` when `minSlices` is unset)."""
        return self.count if self.min_slices is None else self.min_slices


def entry_point_problems(entry_point: str) -> list[str]:
    """[] for a `package.module:function` entry point; else the one line saying what it must look like."""
    if _ENTRY_POINT.fullmatch(entry_point):
        return []
    return [f"spec.controller.trainer.entryPoint {entry_point!r} must look like 'package.module:function'"]


class TrainerSpec(_Model):
    """Which training program the controller runs, and its configuration."""

    entry_point: str = Field(
        default=BUILTIN_TRAINER,
        description="`module:function` returning an elastic_jax.controller.trainer.Trainer; called with `config`.",
        json_schema_extra={"pattern": _ENTRY_POINT.pattern},
    )
    config: dict[str, Any] = Field(default_factory=dict, description="Free-form configuration passed to the entry point.")

    RULES: ClassVar[tuple[Callable[[Any], list[str]], ...]] = (lambda s: entry_point_problems(s.entry_point),)
    _entry_point_shape = model_validator(mode="after")(_checked(RULES))

    @field_validator("config", mode="before")
    @classmethod
    def _config_depth(cls, value: Any) -> Any:
        # Before pydantic walks it: a config nested thousands deep (the API server takes 10000 levels)
        # would end every recursive reader after it (JSON, YAML, deepcopy) in a RecursionError.
        problem = nesting.config_problem(value)
        if problem:
            raise ValueError(problem)
        return value


LIBRARY_MODE_TRAINER = ("spec.controller.trainer: not used with spec.controller.command (library mode: the command "
                        "is the training program); remove one of them")


def as_written_problem(manifest: dict[str, Any]) -> str | None:
    """The CRD rule on what a user wrote that the model cannot apply, or None.

    With `spec.controller.command`, the CRD refuses a `trainer` that has a `config`, even `{}` (CEL cannot
    see into the free-form map), or an entryPoint other than the default. The model must accept an empty
    config there (`ControllerSpec._names`): the operator's manifest ConfigMap writes every default back.

    Args:
      manifest: the manifest as written, nulls pruned (`manifest.prune_nulls`).
    """
    spec = manifest.get("spec")
    controller = spec.get("controller") if isinstance(spec, dict) else None
    if not isinstance(controller, dict):  # not a mapping: the model's own error names the field
        return None
    trainer = controller.get("trainer")
    if "command" in controller and isinstance(trainer, dict) and (
            "config" in trainer or trainer.get("entryPoint", BUILTIN_TRAINER) != BUILTIN_TRAINER):
        return LIBRARY_MODE_TRAINER + " (an empty trainer.config too)"
    return None


AUTOMOUNT_NEEDS_ACCOUNT = ("spec.controller.automountServiceAccountToken needs spec.controller.serviceAccountName: "
                           "the default ServiceAccount's token is never mounted")


class ControllerSpec(_Model):
    """The long-lived controller pod that runs the training loop."""

    # CEL rules for the CRD: the API server refuses at apply what `_names` and `as_written_problem` refuse
    # (a trial found both created and then failed InvalidSpec). A trainer equal to the default is no trainer.
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [{
        # (CEL cannot take the size of the free-form config: any config given with a command is refused
        # here, an empty one too, and by `as_written_problem`; the model accepts an empty one, as the
        # operator writes it back)
        "rule": ("!has(self.command) || !has(self.trainer) || "
                 f"((!has(self.trainer.entryPoint) || self.trainer.entryPoint == '{BUILTIN_TRAINER}') && "
                 "!has(self.trainer.config))"),
        "message": LIBRARY_MODE_TRAINER + " (an empty trainer.config too)",
        "fieldPath": ".trainer",
    }, {
        "rule": "!has(self.args) || size(self.args) == 0 || has(self.command)",
        "message": "spec.controller.args: needs spec.controller.command (the built-in trainer host takes no arguments)",
        "fieldPath": ".args",
    }, {
        # (a new-user trial: the API server accepted it, then the operator failed the job InvalidSpec)
        "rule": ("!has(self.automountServiceAccountToken) || !self.automountServiceAccountToken || "
                 "has(self.serviceAccountName)"),
        "message": AUTOMOUNT_NEEDS_ACCOUNT,
        "fieldPath": ".automountServiceAccountToken",
    }]})

    image: str = Field(default=DEFAULT_CONTROLLER_IMAGE, min_length=1, description="Controller container image.",
                       json_schema_extra={"pattern": IMAGE_PATTERN})
    trainer: TrainerSpec = Field(default_factory=TrainerSpec, description="Training program and its config.")
    command: list[Annotated[str, Field(min_length=1, max_length=MAX_COMMAND_ITEM_CHARS)]] | None = Field(
        default=None, min_length=1, max_length=MAX_COMMAND_ITEMS,
        description=("Library mode: the user's own program run in the controller container instead of the "
                     "built-in trainer host (the container's command, e.g. [python, /app/train.py]). It "
                     "imports elastic_jax (docs/bring-your-own-loop.md), which serves the control API and "
                     "takes the slice reports; spec.controller.trainer must then be left unset (or default)."))
    args: list[Annotated[str, Field(max_length=MAX_COMMAND_ITEM_CHARS)]] = Field(
        default_factory=list, max_length=MAX_COMMAND_ITEMS,
        description="Arguments of spec.controller.command (the container's args). Only with command.")
    resources: Resources = Field(
        default_factory=Resources,
        description=("Controller container resources. For cpu and memory that are given neither a request nor a "
                     "limit, the operator requests 250m CPU and 512Mi memory (no limit). backend cpu: no google.com/tpu "
                     "(nor cloud-tpus.google.com/*) request or limit."))
    env: list[EnvVar] = Field(
        default_factory=list, max_length=MAX_ENV, json_schema_extra=ENV_LIST_SCHEMA,
        description=("Extra environment variables for the controller. Variables the operator sets (ELASTIC_JAX_* "
                     "other than the user settings, POD_IP, HOME, TMPDIR, XDG_CACHE_HOME; pathways: JAX_PLATFORMS, "
                     "JAX_BACKEND_TARGET, XCLOUD_ENVIRONMENT, ENABLE_PATHWAYS_PERSISTENCE) are refused."))
    node_selector: dict[str, str] = Field(
        default_factory=dict, max_length=64, json_schema_extra=NODE_SELECTOR_SCHEMA,
        description=("Node labels the controller pod must match (Pod nodeSelector). pathways: must not name "
                     "cloud.google.com/gke-tpu-accelerator (the controller runs off the TPU pools); backend cpu: no "
                     "cloud.google.com/gke-tpu* key."))
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=MAX_TOLERATIONS,
        description=("Tolerations of the controller pod. Only taint keys the cluster admin allowed (operator's "
                     "podFields.tolerationKeys) and google.com/tpu are accepted; backend cpu: not google.com/tpu, nor a "
                     "key-less Exists toleration of effect NoSchedule or unset (the pods stay off TPU nodes)."))
    service_account_name: str | None = Field(
        default=None, max_length=253, json_schema_extra={"pattern": DNS1123_SUBDOMAIN_PATTERN},
        description=("ServiceAccount of the controller pod (e.g. one bound to a Google service account by GKE "
                     "Workload Identity, to read and write gs:// checkpoints). Only ServiceAccounts the cluster "
                     "admin allowed for this namespace in the operator's settings are accepted; any other fails "
                     "the job naming this field. Unset: the namespace's default ServiceAccount, without a token."))
    automount_service_account_token: bool = Field(
        default=False,
        description=("Mount the ServiceAccount's Kubernetes API token into the controller pod. Only for a "
                     "serviceAccountName the admin allowed to mount its token; Workload Identity does not need it."))

    @property
    def library_mode(self) -> bool:
        """True when the controller runs the user's `command` (elastic_jax as a library), not the trainer host."""
        return self.command is not None

    RULES: ClassVar[tuple[Callable[[Any], list[str]], ...]] = (
        # Compared with the default, not "was it given": the operator's manifest ConfigMap writes every
        # field back, defaults included, and the program must read the same spec.
        lambda s: [LIBRARY_MODE_TRAINER] if s.command is not None and s.trainer != TrainerSpec() else [],
        lambda s: ["spec.controller.args: needs spec.controller.command (the built-in trainer host "
                   "takes no arguments)"] if s.args and s.command is None else [],
        lambda s: problems_of(_node_selector, s.node_selector, "spec.controller.nodeSelector"),
        lambda s: problems_of(_pod_fields, s.image, s.resources, "spec.controller"),
        lambda s: [] if s.service_account_name is None else
        problems_of(_object_name, s.service_account_name, "spec.controller.serviceAccountName"),
        lambda s: [AUTOMOUNT_NEEDS_ACCOUNT] if s.automount_service_account_token and s.service_account_name is None
        else [],
    )
    _names = model_validator(mode="after")(_checked(RULES))


class WorkerSpec(_Model):
    """The per-slice worker pods."""

    image: str = Field(default=DEFAULT_WORKER_IMAGE, min_length=1,
                       description="Worker container image (cpu backend) or Pathways server image.",
                       json_schema_extra={"pattern": IMAGE_PATTERN})
    resources: Resources = Field(
        default_factory=Resources,
        description=("Worker container resources. cpu backend: for cpu and memory that are given neither a request "
                     "nor a limit, the operator requests 250m CPU and 512Mi memory (no limit). pathways: the "
                     "google.com/tpu limit is the operator's; backend cpu: no google.com/tpu (nor "
                     "cloud-tpus.google.com/*) request or limit."))
    env: list[EnvVar] = Field(
        default_factory=list, max_length=MAX_ENV, json_schema_extra=ENV_LIST_SCHEMA,
        description=("Extra environment variables for workers. Variables the operator sets (ELASTIC_JAX_* other "
                     "than the user settings, POD_IP, HOME, TMPDIR, XDG_CACHE_HOME, JAX_PLATFORMS; pathways: the "
                     "Megascale/Pathways variables) are refused."))
    node_selector: dict[str, str] = Field(
        default_factory=dict, max_length=64, json_schema_extra=NODE_SELECTOR_SCHEMA,
        description=("Node labels every worker pod must match (Pod nodeSelector). pathways: added to the TPU "
                     "selectors the operator sets; a key naming cloud.google.com/gke-tpu-accelerator or "
                     "cloud.google.com/gke-tpu-topology is refused (use spec.slices); backend cpu: no "
                     "cloud.google.com/gke-tpu* key."))
    tolerations: list[Toleration] = Field(
        default_factory=list, max_length=MAX_TOLERATIONS,
        description=("Tolerations of the worker pods (pathways: GKE adds the google.com/tpu one itself). Only taint "
                     "keys the cluster admin allowed (operator's podFields.tolerationKeys) and google.com/tpu are "
                     "accepted; backend cpu: not google.com/tpu, nor a key-less Exists toleration of effect "
                     "NoSchedule or unset (the pods stay off TPU nodes)."))
    termination_grace_period_seconds: int | None = Field(
        default=None, ge=0, le=3600,
        description=(
            "Seconds a worker pod has between SIGTERM (preemption, drain, delete) and SIGKILL. Default: 5 for "
            "backend cpu (its workers hold no state), 30 for backend pathways (the Kubernetes default that "
            "pathways-utils' JobSet builder leaves in place; the controller checkpoints while the slice drains, "
            "so raise it when a checkpoint of your model takes longer)."
        ),
    )

    RULES: ClassVar[tuple[Callable[[Any], list[str]], ...]] = (
        lambda s: problems_of(_node_selector, s.node_selector, "spec.worker.nodeSelector"),
        lambda s: problems_of(_pod_fields, s.image, s.resources, "spec.worker"),
    )
    _names = model_validator(mode="after")(_checked(RULES))


class TrainingSpec(_Model):
    """Length and batch of the run."""

    steps: int = Field(ge=1, le=INT64_MAX, description="Total optimizer steps to run.")
    global_batch_size: int = Field(
        ge=1, le=MAX_GLOBAL_BATCH_SIZE,
        description=(
            "Examples per step across all active slices, at most 1048576 (2**20; the controller host builds "
            "each global batch). Kept constant when slices leave or join: "
            "the per-slice batch is rescaled (global batch / active slices, remainder to the lowest indices)."
        ),
    )
    seed: int = Field(default=0, ge=0, le=INT64_MAX, description="Seed for parameter init and data order.")
    log_every_steps: int = Field(default=10, ge=1, le=INT64_MAX, description="Steps between progress log lines.")


class CheckpointSpec(_Model):
    """Orbax checkpointing of the training state and data position."""

    # CEL rules for the CRD: the API server refuses the schemes `checkpoints.uri_problems` refuses, and the
    # forms of `checkpoints.URI_RULES` (one table for both: white space, `..`, `/`, `~`, GCS bucket names).
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [{
        "rule": "!self.uri.contains('://') || self.uri.matches('^gs://[^/]+')",
        "message": "spec.checkpoint.uri must be a local path or gs://bucket/prefix (no other scheme, not file://)",
        "fieldPath": ".uri",
    }, *checkpoints.cel_rules()]})

    uri: str = Field(min_length=1, max_length=4096,  # bounds the CEL rules' cost too
                     description=("Checkpoint directory: a local path or gs://bucket/prefix (no other scheme). A "
                                  "local path names a folder of the job's own: not /, not the home folder ~ "
                                  "itself, no ~user, no '..' segment; the bucket name follows GCS's naming rules "
                                  "(3-63 lowercase letters, digits, '-', '_', '.'; no 'goog' prefix), and no "
                                  "empty segment ('//') follows it. No white space at either end. A gs:// "
                                  "location must lie under a prefix the cluster admin allowed for the namespace, "
                                  "when the admin set any (operator's checkpointPrefixes); otherwise the job fails "
                                  "naming this field."))
    interval_steps: int = Field(default=50, ge=1, le=INT64_MAX, description="Save every this many steps (async).")
    max_to_keep: int = Field(default=3, ge=1, le=INT64_MAX, description="Committed checkpoints kept; older ones are deleted.")
    resume_from: Literal["SameJob", "Any"] = Field(
        default="SameJob",
        description=(
            "Which committed checkpoints at uri this job may resume from. SameJob: only steps this job wrote "
            "(same namespace, name and metadata.uid; a deleted and re-applied job is a new job); a step written "
            "by another job, or by an elastic-jax that did not record its writer, fails the job naming the step "
            "and the writer. Any: resume from whichever job wrote the newest step (e.g. to continue a deleted "
            "job's run, or to warm-start from another job)."
        ),
    )
    allow_data_change: bool = Field(
        default=False,
        description=(
            "Resume even when the step to resume from was trained with another spec.training.globalBatchSize or "
            "spec.training.seed (the data order, and what one step means to the optimizer, change from there on). "
            "false: the job is refused (bad input) naming each changed field with the checkpoint's and the spec's "
            "values; true: it resumes and logs the change as a warning."
        ),
    )

    RULES: ClassVar[tuple[Callable[[Any], list[str]], ...]] = (
        lambda s: checkpoints.uri_problems(s.uri),
    )
    _supported_uri = model_validator(mode="after")(_checked(RULES))


# spec.compilationCache: the field names its errors use, once.
COMPILATION_CACHE_FIELD = "spec.compilationCache"
COMPILATION_CACHE_URI_FIELD = f"{COMPILATION_CACHE_FIELD}.uri"
# A gs:// cache location: a bucket name, then an optional prefix (JAX writes it through etils/gcsfs); what the
# bucket name and the prefix may hold is `checkpoints.URI_RULES`' (its gs:// rules).
COMPILATION_CACHE_URI_PATTERN = r"^gs://[^/]"


class PersistentVolumeClaimReference(_Model):
    """A PersistentVolumeClaim in the job's namespace, by name (as a Pod volume's `persistentVolumeClaim`)."""

    claim_name: str = Field(min_length=1, max_length=253, json_schema_extra={"pattern": DNS1123_SUBDOMAIN_PATTERN},
                            description="Name of a PersistentVolumeClaim in the job's namespace.")

    @model_validator(mode="after")
    def _name_shape(self) -> "PersistentVolumeClaimReference":
        _object_name(self.claim_name, f"{COMPILATION_CACHE_FIELD}.persistentVolumeClaim.claimName")
        return self


class CompilationCacheSpec(_Model):
    """A persistent XLA compilation cache shared by the job's pods across replacements (JAX's
    `jax_compilation_cache_dir`): a replaced worker loads its step program's executable instead of compiling it.

    Exactly one of `uri` or `persistentVolumeClaim`. Unset: backend pathways uses
    `<spec.checkpoint.uri>/compilation-cache` (already shared, always gs://); backend cpu has no cache (its
    workers share no storage unless a claim is named).
    """

    # (the CRD's rule for `_one_source` sits on the spec, so it can name this field.) The bucket-name and
    # path rules of `spec.checkpoint.uri`'s table (`checkpoints.URI_RULES`, its gs:// rules), as CEL, for a
    # uri of the gs:// form (another is the pattern's to refuse, once).
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": checkpoints.cel_rules(
        COMPILATION_CACHE_URI_FIELD, checkpoints.GCS_SCOPES, optional=True,
        unless=f"!self.uri.matches({checkpoints.cel_string(COMPILATION_CACHE_URI_PATTERN)})")})

    uri: str | None = Field(
        default=None, max_length=4096, json_schema_extra={"pattern": COMPILATION_CACHE_URI_PATTERN},
        description=("gs://bucket/prefix the pods read and write the cache at, with their own credentials "
                     "(Workload Identity). Backend pathways only: the cpu worker image has no GCS client. The "
                     "bucket name and path follow spec.checkpoint.uri's gs:// rules (GCS's bucket naming "
                     "rules, no '..' or empty segment, no white space at either end)."))
    persistent_volume_claim: PersistentVolumeClaimReference | None = Field(
        default=None,
        description=(f"A claim of the job's namespace mounted at {contract.COMPILATION_CACHE_DIR} in the pods "
                     "that compile (cpu: every worker; pathways: the controller). Worker pods of a slice run on "
                     "different nodes, so ReadWriteMany (e.g. Filestore); the volume must be writable by uid/gid "
                     "65532 (fsGroup, or a volume made so). Only claims the cluster admin allowed (operator's "
                     "podFields.compilationCacheClaims) are accepted."))

    RULES: ClassVar[tuple[Callable[[Any], list[str]], ...]] = (
        lambda s: [f"{COMPILATION_CACHE_FIELD} needs exactly one of uri or persistentVolumeClaim"]
        if (s.uri is None) == (s.persistent_volume_claim is None) else [],
        lambda s: [] if s.uri is None else checkpoints.form_problems(s.uri, COMPILATION_CACHE_URI_FIELD,
                                                                      checkpoints.GCS_SCOPES)
        if re.search(COMPILATION_CACHE_URI_PATTERN, s.uri)
        else [f"{COMPILATION_CACHE_URI_FIELD}: {s.uri!r}: must be gs://bucket[/prefix]"],
    )
    _one_source = model_validator(mode="after")(_checked(RULES))


class ElasticitySpec(_Model):
    """Recovery policy."""

    # CEL rule for the CRD: the API server refuses what `_progress_timeout_covers_a_step` refuses (a
    # progress timeout no longer than one step's deadline can never be met: the watchdog would kill a
    # controller whose slow step the step deadline is still handling).
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [{
        "rule": ("!has(self.progressTimeoutSeconds) || self.progressTimeoutSeconds == 0.0 || "
                 "(self.progressTimeoutSeconds > (has(self.stepDeadlineSeconds) ? self.stepDeadlineSeconds : 60.0) "
                 "&& self.progressTimeoutSeconds > "
                 "(has(self.firstStepDeadlineSeconds) ? self.firstStepDeadlineSeconds : 120.0))"),
        "message": ("spec.elasticity.progressTimeoutSeconds must be 0 (off) or more than the longest step deadline "
                    "(stepDeadlineSeconds, firstStepDeadlineSeconds): a slow step is the step deadline's to handle"),
        "fieldPath": ".progressTimeoutSeconds",
    }]})

    max_restarts: int = Field(
        default=20, ge=0, le=INT64_MAX, description="Job-wide budget of slice recoveries; one more fails the job."
    )
    max_restarts_per_slice: int = Field(
        default=10, ge=0, le=INT64_MAX, description="Budget of replacements of any one slice; one more fails the job."
    )
    step_deadline_seconds: float = Field(
        default=60.0, gt=0, le=MAX_DURATION_SECONDS, description="A step not finished within this time marks the slow slices down (hang detection)."
    )
    slice_wait_timeout_seconds: float = Field(
        default=600.0, gt=0, le=MAX_DURATION_SECONDS, description="How long to wait for enough slices before failing the job."
    )
    first_step_deadline_seconds: float = Field(
        default=120.0, gt=0, le=MAX_DURATION_SECONDS, description="Deadline for a slice's first step on a new program (includes its compile)."
    )
    progress_timeout_seconds: float = Field(
        default=1800.0,
        ge=0, le=MAX_DURATION_SECONDS,
        description=(
            "No-progress watchdog: while the controller trains (phase Running or Recovering; not while "
            "Starting/restoring or WaitingForSlices), no completed step for this long makes its /healthz "
            "answer 503, so the pod's livenessProbe has it killed and the operator replaces it (counted "
            "against maxRestarts). Must exceed firstStepDeadlineSeconds and stepDeadlineSeconds plus a "
            "checkpoint save. 0: off."
        ),
    )
    image_pull_timeout_seconds: int = Field(
        default=900,
        ge=0, le=INT64_MAX,
        description=(
            "How long a controller or worker image may stay unpullable (ErrImagePull, ImagePullBackOff, "
            "InvalidImageName) before the job fails naming it; until then the kubelet retries with its own "
            "back-off (up to 300 s apart) and the ImagePullFailed condition names the image. Nothing is "
            "recreated or counted against maxRestarts meanwhile. 0: never fail (wait for the image)."
        ),
    )
    host_snapshot_interval_steps: int = Field(
        default=10,
        ge=0, le=INT64_MAX,
        description=(
            "pathways backend: copy the training state to controller RAM at least every this many steps, and "
            "every step while a copy (made beside the training) fits in a step, so a lost slice restores from "
            "memory when the copy is newer than the last checkpoint (0: off)."
        ),
    )


    RULES: ClassVar[tuple[Callable[[Any], list[str]], ...]] = (lambda s: _progress_timeout_problems(s),)
    _progress_timeout_covers_a_step = model_validator(mode="after")(_checked(RULES))


def _progress_timeout_problems(s: Any) -> list[str]:
    longest = max(s.step_deadline_seconds, s.first_step_deadline_seconds)
    if s.progress_timeout_seconds and s.progress_timeout_seconds <= longest:
        return [f"spec.elasticity.progressTimeoutSeconds ({s.progress_timeout_seconds:g}) must be 0 (off) or more "
                f"than the longest step deadline ({longest:g} s): a slow step is the step deadline's to handle"]
    return []


class ElasticTrainingJobSpec(_Model):
    """Desired state of an elastic multi-slice JAX training job."""

    # CEL rules for the CRD, mirroring `_backend_fields`; the backend of a job
    # cannot change under a running controller, so the API server refuses it. Each names
    # the field it refuses (`fieldPath`), as the API server reports it (else at `spec`).
    model_config = ConfigDict(json_schema_extra={"x-kubernetes-validations": [
        {"rule": "self.backend != 'pathways' || (has(self.slices.accelerator) && has(self.slices.topology))",
         "message": "backend pathways needs spec.slices.accelerator and spec.slices.topology",
         "fieldPath": ".slices", "reason": "FieldValueRequired"},
        {"rule": "self.backend != 'cpu' || !has(self.slices.hostsPerSlice) || self.slices.hostsPerSlice == 1",
         "message": "spec.slices.hostsPerSlice must be 1 for backend cpu (one worker process per slice)",
         "fieldPath": ".slices.hostsPerSlice"},
        {"rule": "!has(self.compilationCache) || has(self.compilationCache.uri) != "
                 "has(self.compilationCache.persistentVolumeClaim)",
         "message": "spec.compilationCache needs exactly one of uri or persistentVolumeClaim",
         "fieldPath": ".compilationCache", "reason": "FieldValueInvalid"},
        {"rule": "self.backend != 'cpu' || !has(self.compilationCache) || !has(self.compilationCache.uri)",
         "message": "spec.compilationCache.uri: backend cpu reads its cache from a volume "
                    "(spec.compilationCache.persistentVolumeClaim); gs:// is for backend pathways",
         "fieldPath": ".compilationCache.uri", "reason": "FieldValueForbidden"},
        {"rule": "self.training.globalBatchSize >= self.slices.count",
         "message": "spec.training.globalBatchSize must be at least spec.slices.count: every slice needs one "
                    "example per step",
         "fieldPath": ".training.globalBatchSize"},
        # `_batch_divides`: the built-in loop's equal shares (cpu: per device of each slice)
        {"rule": ("has(self.controller) && has(self.controller.command) || "
                  "self.training.globalBatchSize < self.slices.count || "
                  "self.training.globalBatchSize % (self.slices.count * (self.backend == 'cpu' && "
                  "has(self.slices.devicesPerHost) ? self.slices.devicesPerHost : 1)) == 0"),
         "message": BATCH_SHARES_MESSAGE, "fieldPath": ".training.globalBatchSize"},
        # `_env_not_reserved`, generated from the runtime contract's lists
        *runtime_env.cel_rules(),
        # `tpu_placement.problems`: a cpu job stays off TPU nodes
        *tpu_placement.CEL_RULES,
        # (immutability: `cluster.add_immutability_rules`, put on by `elastic_jax.api.crd`)
    ]})

    backend: Literal["cpu", "pathways"] = Field(
        default="cpu", description="cpu: JAX CPU slice workers (kind, local, CI). pathways: GKE TPU slices through Pathways."
    )
    slices: SliceSpec = Field(description="Slice count, minimum, and slice shape.")
    controller: ControllerSpec = Field(default_factory=ControllerSpec, description="The controller pod.")
    worker: WorkerSpec = Field(default_factory=WorkerSpec, description="The worker pods.")
    training: TrainingSpec = Field(description="Steps and global batch.")
    checkpoint: CheckpointSpec = Field(description="Where and how often to checkpoint.")
    elasticity: ElasticitySpec = Field(default_factory=ElasticitySpec, description="Recovery policy and budgets.")
    compilation_cache: CompilationCacheSpec | None = Field(
        default=None, description=("Where the pods keep XLA's persistent compilation cache, so a replaced worker "
                                   "does not compile its step program again. Unset: pathways derives it from "
                                   "spec.checkpoint.uri; cpu has none."))
    suspend: bool = Field(default=False, description="True: checkpoint, then stop the controller and workers; false resumes.")
    ttl_seconds_after_finished: int | None = Field(
        default=None, ge=0, le=INT64_MAX, description="Delete the job this many seconds after it Succeeded or Failed."
    )
    image_pull_secrets: list[LocalObjectReference] = Field(
        default_factory=list,
        description=("Secrets (kubernetes.io/dockerconfigjson, in the job's namespace) the kubelet uses to pull "
                     "the controller and worker images, e.g. for a private Artifact Registry. Names only. Only Secrets the "
                     "cluster admin allowed (operator's podFields.imagePullSecrets) are accepted."))
    priority_class_name: str | None = Field(
        default=None, max_length=253, json_schema_extra={"pattern": DNS1123_SUBDOMAIN_PATTERN},
        description=("PriorityClass of the controller and worker pods (the scheduler's preemption order). Only "
                     "classes the cluster admin allowed (operator's podFields.priorityClassNames) are accepted."))

    # (rules across sections: they read sections that may have failed, `run_rules` skips those)
    RULES: ClassVar[tuple[Callable[[Any], list[str]], ...]] = (
        lambda s: _env_not_reserved(s), lambda s: _batch_covers_slices(s), lambda s: _batch_divides(s),
        lambda s: _backend_fields(s))
    _spec_rules = model_validator(mode="after")(_checked(RULES))


def _env_not_reserved(spec: Any) -> list[str]:
    found = []
    for role, env in (("controller", spec.controller.env), ("worker", spec.worker.env)):
        seen: set[str] = set()
        for i, var in enumerate(env):
            field = f"spec.{role}.env[{i}]"
            problem = runtime_env.reserved_problem(var.name, role, spec.backend)
            if problem:
                found.append(f"{field}.name: {problem}")
            elif var.name in seen:
                found.append(f"{field}.name: {var.name} is set twice (the later one would win silently)")
            seen.add(var.name)
    if spec.priority_class_name is not None:
        collect(found, _object_name, spec.priority_class_name, "spec.priorityClassName")
    return found


def _batch_covers_slices(spec: Any) -> list[str]:
    if spec.training.global_batch_size < spec.slices.count:
        return [f"spec.training.globalBatchSize ({spec.training.global_batch_size}) must be at least "
                f"spec.slices.count ({spec.slices.count}): every slice needs one example per step"]
    return []


def batch_shares_problem(global_batch_size: int, slice_count: int, devices_per_slice: int,
                         devices_field: str = "spec.slices.devicesPerHost") -> list[str]:
    """The built-in loop's rule for `spec.training.globalBatchSize`: equal shares per slice and per device.

    The cpu backend cuts each step's batch into `slice_count` chunks (`backend_cpu.split_sizes`: an uneven
    split compiles a second step program on every worker and leaves the larger chunks' slices setting the
    pace) and shards a chunk over its worker's devices only when it divides (else one device runs it all);
    the pathways backend shards the batch over slices x chips only when it divides (else every chip of a
    slice, or of the job, runs the whole share). Neither says so at run time: refused here, by name.

    Args:
      global_batch_size: examples per step (>= `slice_count`: `_batch_covers_slices` says the other case).
      slice_count: `spec.slices.count`.
      devices_per_slice: devices of one slice (cpu: `devicesPerHost`; pathways: the topology's chips).
      devices_field: what `devices_per_slice` is read from, for the message.

    Returns:
      [] or one line naming the field and the numbers.
    """
    if global_batch_size < slice_count:
        return []
    shares = slice_count * devices_per_slice
    if global_batch_size % shares == 0:
        return []
    per = "" if devices_per_slice == 1 else f" x {devices_field} ({devices_per_slice}) = {shares}"
    below, above = global_batch_size // shares * shares, (global_batch_size // shares + 1) * shares
    nearest = f"{below} or {above}" if below else f"{above}"
    return [f"spec.training.globalBatchSize ({global_batch_size}) must be a multiple of spec.slices.count "
            f"({slice_count}){per}, e.g. {nearest}: the built-in loop gives every slice"
            f"{'' if devices_per_slice == 1 else ' and every device'} an equal share of each step's batch "
            f"({global_batch_size} / {shares} = {global_batch_size / shares:.4g})"]


def _batch_divides(spec: Any) -> list[str]:
    if spec.controller.command is not None:  # (library mode: your program cuts its own batches)
        return []
    devices = spec.slices.devices_per_host if spec.backend == "cpu" else 1  # (pathways chips: `backends.pathways`)
    return batch_shares_problem(spec.training.global_batch_size, spec.slices.count, devices)


def _pathways_shape(spec: Any) -> list[str]:
    if spec.backend != "pathways":
        return []
    # (a field that failed its own validation is absent: its error says so, "needs" it would not be true)
    missing = [n for n in ("accelerator", "topology") if getattr(spec.slices, n, "invalid") is None]
    return ["backend pathways needs " + " and ".join(f"spec.slices.{m}" for m in missing)] if missing else []


def _backend_fields(spec: Any) -> list[str]:
    """The rules tying fields to `spec.backend`, each skipped alone when a field it reads failed (`run_rules`)."""
    return run_rules(spec, (
        _pathways_shape,
        lambda s: ["spec.slices.hostsPerSlice must be 1 for backend cpu (one worker process per slice)"]
        if s.backend == "cpu" and s.slices.hosts_per_slice != 1 else [],
        lambda s: ["spec.compilationCache.uri: backend cpu reads its cache from a volume "
                   "(spec.compilationCache.persistentVolumeClaim); gs:// is for backend pathways"]
        if s.backend == "cpu" and s.compilation_cache is not None and s.compilation_cache.uri is not None else [],
        tpu_placement.problems,
        tpu_placement.slice_shape_problems,
    ))


def located(loc: tuple[Any, ...] | list[Any], message: str) -> str:
    """`message` of a problem at `loc` as `elastic-jax validate` prints it: `spec.slices.count: message`
    (Kubernetes' path spelling, list indexes in brackets), or the message alone when it already names its
    field (a model rule's message starts with `spec.`, `metadata.` or `backend `)."""
    path = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in loc).lstrip(".")
    return f"{path}: {message}" if path and not message.startswith(("spec.", "metadata.", "backend ")) else message


def partial_problems(raw: Any) -> tuple[types.SimpleNamespace | None, list[str]]:
    """The rules of every section of a manifest that failed validation, over the fields that did validate.

    Pydantic runs a model's rules only once all its fields validated, so one bad field hid every rule of
    its section and of the sections around it (`checkpoint.intervalSteps: 0` hid a `file://` uri; a bad
    `spec.slices.count` a too-small `globalBatchSize`); the API server runs each CEL rule beside the
    field errors. A rule reading a field that failed is skipped (its own error says why), the others run.

    Args:
      raw: the whole manifest as JSON-ready data (camelCase), as `manifest.parse_manifest` validates it.

    Returns:
      (the job's valid fields as nested namespaces, absent ones at their defaults, or None when `raw` is no
      mapping; the problems the rules found, each located as `validation_problems` locates pydantic's).
    """
    if not isinstance(raw, dict):
        return None, []
    found: list[str] = []
    return _valid_parts(ElasticTrainingJob, raw, (), found), found


def _valid_parts(model: type[BaseModel], raw: dict[str, Any], loc: tuple[Any, ...],
                 found: list[str]) -> types.SimpleNamespace:
    """The fields of `raw` (camelCase, at `loc`) that validate alone as `model`'s fields, absent ones at their
    defaults; a section (a nested model) that fails whole gives its own valid fields the same way, and the
    rules of every such section (`RULES`) run over what validated, appending their problems to `found`."""
    values: dict[str, Any] = {}
    for name, field in model.model_fields.items():
        key = field.alias or name
        if key not in raw:
            if not field.is_required():
                values[name] = field.get_default(call_default_factory=True)
            continue
        adapter = TypeAdapter(Annotated[(field.annotation, *field.metadata)] if field.metadata else field.annotation)
        try:
            values[name] = adapter.validate_json(json.dumps(raw[key], default=str), strict=True)
        except ValidationError:
            section = _section_model(field.annotation)
            if section is not None and isinstance(raw[key], dict):
                values[name] = _valid_parts(section, raw[key], loc + (key,), found)
            # (else left out: the whole validation reports it)
    partial = types.SimpleNamespace(**values)
    for problem in run_rules(partial, getattr(model, "RULES", ())):
        problem = located(loc, problem)
        if problem not in found:
            found.append(problem)
    return partial


def _section_model(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds (`CompilationCacheSpec | None` holds `CompilationCacheSpec`), else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    models = [a for a in getattr(annotation, "__args__", ()) if isinstance(a, type) and issubclass(a, BaseModel)]
    return models[0] if len(models) == 1 else None


# The API server's bound on all annotations of one object (TotalAnnotationSizeLimitB).
MAX_ANNOTATIONS_BYTES = 256 * 1024


class ObjectMeta(_Model):
    """Kubernetes object metadata (`metav1.ObjectMeta`).

    A manifest sets `name` and perhaps `namespace`, `labels`, `annotations`.
    The other fields are the ones the API server adds (`kubectl get ejob -o
    yaml` prints them), accepted so a job read back from a cluster still
    validates; elastic-jax does not act on them. Any other key is an unknown
    field, refused like one in `spec` (a typo such as `lables` must not be
    dropped silently).
    """

    name: str = Field(min_length=1, description="Job name: a DNS-1035 label of at most MAX_NAME_LENGTH characters.")
    namespace: str | None = Field(default=None, description="Namespace.")
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    # Set by the API server or by controllers; typed loosely: only their presence is checked.
    generate_name: str | None = None
    uid: str | None = None
    resource_version: str | None = None
    generation: int | None = None
    creation_timestamp: str | None = None
    deletion_timestamp: str | None = None
    deletion_grace_period_seconds: int | None = None
    self_link: str | None = None
    owner_references: list[dict[str, Any]] | None = None
    finalizers: list[str] | None = None
    managed_fields: list[dict[str, Any]] | None = None

    @model_validator(mode="after")
    def _dns_name(self) -> "ObjectMeta":
        problem = name_problem(self.name)
        found = [problem] if problem else []
        # The API server refuses these before any CRD rule runs (ValidateObjectMeta).
        for k, v in self.labels.items():
            if not _LABEL_KEY.fullmatch(k) or len(k.rpartition("/")[0]) > 253:
                found.append(f"metadata.labels key {k!r} is not a valid label key (an optional DNS prefix and "
                             "'/', then at most 63 letters, digits, '-', '_', '.')")
            if not _LABEL_VALUE.fullmatch(v):
                found.append(f"metadata.labels[{k!r}] value {v!r} is not a valid label value (at most 63 "
                             "letters, digits, '-', '_', '.', starting and ending with a letter or digit)")
        for k in self.annotations:
            if not _LABEL_KEY.fullmatch(k.lower()) or len(k.rpartition("/")[0]) > 253:
                found.append(f"metadata.annotations key {k!r} is not a valid annotation key (an optional DNS "
                             "prefix and '/', then at most 63 letters, digits, '-', '_', '.')")
        if sum(len(k.encode()) + len(v.encode()) for k, v in self.annotations.items()) > MAX_ANNOTATIONS_BYTES:
            found.append(f"metadata.annotations: at most {MAX_ANNOTATIONS_BYTES} bytes of keys and values")
        if self.namespace is not None and namespace_problem(self.namespace):
            found.append(f"metadata.namespace {namespace_problem(self.namespace)}")
        raise_all(found)
        return self


def namespace_problem(namespace: str) -> str | None:
    """None for a valid namespace name, else why not ("'X' must be a DNS-1123 label: ..."), as the API server
    refuses it before any CRD rule runs (metadata.namespace, `kubectl apply -n`)."""
    if len(namespace) <= 63 and _DNS1123_LABEL.fullmatch(namespace):
        return None
    return (f"{namespace!r} must be a DNS-1123 label: at most 63 lowercase letters, digits and '-', starting and "
            "ending with a letter or digit")


def name_problem(name: str) -> str | None:
    """Why `name` cannot name a job (the CRD's rule, `crd.NAME_RULES`), or None when it can.

    Returns:
      One line naming the rule broken: not a DNS-1035 label (lowercase letters,
      digits and '-', starting with a letter, ending with a letter or digit), or
      longer than `MAX_NAME_LENGTH` (so every child's name fits in 63 characters).
    """
    if not _DNS1035.fullmatch(name):
        return (f"metadata.name {name!r} must be a DNS-1035 label: lowercase letters, digits and '-', "
                "starting with a letter and ending with a letter or digit")
    if len(name) > MAX_NAME_LENGTH:
        return (f"metadata.name {name!r} is {len(name)} characters; at most {MAX_NAME_LENGTH}, so the names of "
                f"its worker pods (<name>{LONGEST_CHILD_SUFFIX}) stay within 63")
    return None


class ElasticTrainingJob(_Model):
    """A whole `ElasticTrainingJob` manifest (status, if present, is ignored on input)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    api_version: Literal[API_VERSION] = Field(description=f"Must be {API_VERSION}.")  # type: ignore[valid-type]
    kind: Literal[KIND] = Field(description=f"Must be {KIND}.")  # type: ignore[valid-type]
    metadata: ObjectMeta
    spec: ElasticTrainingJobSpec
    status: dict[str, Any] | None = Field(default=None, description="Written by the operator; ignored on input.")
