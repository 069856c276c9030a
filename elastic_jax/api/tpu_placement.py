"""A `backend: cpu` job stays off TPU nodes: the pod fields through which it could land on or request them.

A cpu job runs the tenant's images with no TPU work to do, so a TPU toleration,
a `cloud.google.com/gke-tpu-*` node selector or a TPU resource request in it can
only put the tenant's code on TPU machines it was never granted (issue 31, RISK
8). On GKE every TPU node carries the taint `google.com/tpu=present:NoSchedule`,
and a pod requesting `google.com/tpu` is given the matching toleration by the
API server (ExtendedResourceToleration), so the fields that open the way are:

- `spec.<role>.tolerations`: the `google.com/tpu` key, or a key-less `Exists`
  toleration whose effect is unset or NoSchedule (it tolerates every taint of
  that effect, the TPU one included);
- `spec.<role>.nodeSelector`: a key under `cloud.google.com/gke-tpu` (the GKE
  TPU node labels: accelerator, topology, ...);
- `spec.<role>.resources`: a request or limit of `google.com/tpu` or of the
  legacy `cloud-tpus.google.com/*` resources;
- `spec.slices.accelerator` / `spec.slices.topology`: the TPU slice shape, which
  only backend pathways reads (a cpu job that names one was written for TPUs and
  would otherwise run on CPU workers without a word: `slice_shape_problems`).

Those are every scheduling field of the spec (it has no affinity, extra
containers or raw pod template: unknown fields are refused). Each rule is
written once in Python (`problems`, run by the model, hence by `elastic-jax
validate` and the operator's parse) and once as CEL (`CEL_RULES`, put on the
CRD, so `kubectl apply` refuses it first).
"""

from __future__ import annotations

from typing import Any

ROLES = ("controller", "worker")
TPU_TAINT_KEY = "google.com/tpu"
TPU_LABEL_PREFIX = "cloud.google.com/gke-tpu"
TPU_RESOURCE = "google.com/tpu"
LEGACY_TPU_RESOURCE_PREFIX = "cloud-tpus.google.com/"
# A toleration without a key tolerates every taint of its effect (all effects when unset).
_TPU_TAINT_EFFECTS = (None, "", "NoSchedule")

_WHY = "backend cpu runs on CPU nodes; TPU nodes are for backend pathways"


def is_tpu_resource(name: str) -> bool:
    """Whether a container resource name is a TPU (`google.com/tpu`, `cloud-tpus.google.com/v3`, ...)."""
    return name == TPU_RESOURCE or name.startswith(LEGACY_TPU_RESOURCE_PREFIX)


def tolerates_tpu_taint(key: str | None, operator: str, effect: str | None) -> bool:
    """Whether a toleration (its key, operator, effect) tolerates GKE's `google.com/tpu` taint, or names it."""
    if key == TPU_TAINT_KEY:
        return True
    return not key and operator == "Exists" and effect in _TPU_TAINT_EFFECTS


def problems(spec: Any) -> list[str]:
    """Every TPU scheduling field of a cpu job, each one line naming the field; [] for other backends.

    Args:
      spec: an `ElasticTrainingJobSpec` (or a stand-in of its valid fields: a section that failed its own
        validation raises AttributeError, and `job.run_rules` skips the rule).
    """
    if spec.backend != "cpu":
        return []
    found = []
    for role in ROLES:
        part = getattr(spec, role)
        for i, t in enumerate(part.tolerations):
            if tolerates_tpu_taint(t.key, t.operator, t.effect):
                what = (f"tolerates the TPU taint {TPU_TAINT_KEY}" if t.key else
                        f"a key-less Exists toleration{'' if not t.effect else ' of effect ' + t.effect} "
                        f"tolerates every taint, the TPU one ({TPU_TAINT_KEY}) included; name the taint's key")
                found.append(f"spec.{role}.tolerations[{i}]: {what}: {_WHY}")
        for key in part.node_selector:
            if key.startswith(TPU_LABEL_PREFIX):
                found.append(f"spec.{role}.nodeSelector[{key!r}]: selects TPU nodes: {_WHY}")
        for kind, values in (("requests", part.resources.requests), ("limits", part.resources.limits)):
            for name in values:
                if is_tpu_resource(name):
                    found.append(f"spec.{role}.resources.{kind}[{name!r}]: asks for TPU chips: {_WHY}")
    return found


SLICE_SHAPE_FIELDS = ("accelerator", "topology")


def slice_shape_problems(spec: Any) -> list[str]:
    """`spec.slices.accelerator` / `spec.slices.topology` set on a cpu job, each one line naming the field.

    Args:
      spec: an `ElasticTrainingJobSpec` or a stand-in of its valid fields (AttributeError when
        `spec.slices` failed its own validation: `job.run_rules` skips the rule).
    """
    if spec.backend != "cpu":
        return []
    return [f"spec.slices.{name}: {value!r} is a TPU slice shape, read by backend pathways only; "
            f"backend cpu runs CPU worker processes (remove it, or set spec.backend: pathways)"
            for name in SLICE_SHAPE_FIELDS if (value := getattr(spec.slices, name)) is not None]


def _cel(role: str) -> list[dict[str, str]]:
    cpu_and = f"self.backend != 'cpu' || !has(self.{role})"
    tol = f"self.{role}.tolerations"
    sel = f"self.{role}.nodeSelector"
    res = f"self.{role}.resources"
    not_tpu = f"!(k == '{TPU_RESOURCE}' || k.startsWith('{LEGACY_TPU_RESOURCE_PREFIX}'))"
    return [
        {"rule": (f"{cpu_and} || !has({tol}) || {tol}.all(t, has(t.key) && t.key != '' ? "
                  f"t.key != '{TPU_TAINT_KEY}' : "
                  "!(has(t.operator) && t.operator == 'Exists') || (has(t.effect) && t.effect != '' && "
                  "t.effect != 'NoSchedule'))"),
         "message": (f"spec.{role}.tolerations: a backend cpu job must not tolerate the TPU taint {TPU_TAINT_KEY} "
                     f"(by its key, or by a key-less Exists toleration of effect NoSchedule or unset): {_WHY}"),
         "fieldPath": f".{role}.tolerations"},
        {"rule": f"{cpu_and} || !has({sel}) || {sel}.all(k, !k.startsWith('{TPU_LABEL_PREFIX}'))",
         "message": f"spec.{role}.nodeSelector: a backend cpu job must not select TPU nodes ({TPU_LABEL_PREFIX}*): {_WHY}",
         "fieldPath": f".{role}.nodeSelector"},
        *[{"rule": f"{cpu_and} || !has({res}) || !has({res}.{kind}) || {res}.{kind}.all(k, {not_tpu})",
           "message": (f"spec.{role}.resources.{kind}: a backend cpu job must not ask for TPU chips "
                       f"({TPU_RESOURCE}, {LEGACY_TPU_RESOURCE_PREFIX}*): {_WHY}"),
           "fieldPath": f".{role}.resources.{kind}"} for kind in ("requests", "limits")],
    ]


# The CRD's rules on the spec: what `problems` and `slice_shape_problems` refuse, at `kubectl apply`.
CEL_RULES: list[dict[str, str]] = [rule for role in ROLES for rule in _cel(role)] + [
    {"rule": f"self.backend != 'cpu' || !has(self.slices.{name})",
     "message": (f"spec.slices.{name}: a TPU slice shape, read by backend pathways only; backend cpu runs CPU "
                 "worker processes (remove it, or set spec.backend: pathways)"),
     "fieldPath": f".slices.{name}"} for name in SLICE_SHAPE_FIELDS]
