"""The API server's rules for spec fields the operator copies into pods, once for Python and once for CEL.

A spec field that reaches a Pod (container resources, tolerations) is
validated by the API server only when the operator creates the child; a value
it refuses there would leave the job stuck. So `elastic-jax validate` (the
pydantic models) and `kubectl apply` (the CRD's CEL rules, which
`elastic_jax.api.crd` takes from the models) refuse it first, each rule written
here once as a Python check and as a CEL expression over the same constants.

The rules are those of k8s.io/kubernetes `pkg/apis/core/validation`
(`validateContainerResourceName`, `validateResourceRequirements`,
`ValidateResourceQuantityValue`, `ValidateTolerations`) at the pinned 1.35.
"""

from __future__ import annotations

import re
from fractions import Fraction

# -- quantities ----------------------------------------------------------------------------

_NUMBER = re.compile(r"^([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))(.*)$")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": 1, "k": 10**3,
            "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18}
_EXPONENT = re.compile(r"^[eE]([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))$")


def quantity_value(text: str) -> Fraction:
    """The exact value of a Kubernetes quantity (`500m` → 1/2, `1Ki` → 1024, `1e3` → 1000).

    Raises:
      ValueError: `text` is not a quantity.
    """
    m = _NUMBER.fullmatch(text)
    if not m:
        raise ValueError(f"{text!r} is not a quantity")
    number, suffix = Fraction(m.group(1)), m.group(2)
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    e = _EXPONENT.fullmatch(suffix)
    if e and Fraction(e.group(1)).denominator == 1 and abs(int(Fraction(e.group(1)))) <= 1000:
        return number * Fraction(10) ** int(Fraction(e.group(1)))
    raise ValueError(f"{text!r} is not a quantity")


# -- resource names ------------------------------------------------------------------------

STANDARD_CONTAINER_RESOURCES = ("cpu", "memory", "ephemeral-storage")
HUGEPAGES_PREFIX = "hugepages-"
# A qualified name (k8s.io/apimachinery IsQualifiedName): an optional DNS-1123 subdomain prefix
# and "/", then 1-63 alphanumerics, '-', '_', '.', starting and ending alphanumeric.
QUALIFIED_NAME_PATTERN = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                          r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_QUALIFIED_NAME = re.compile(QUALIFIED_NAME_PATTERN)


def _extended(name: str) -> bool:
    """A resource outside kubernetes.io (e.g. google.com/tpu): integral, and request == limit."""
    return "/" in name and "kubernetes.io/" not in name


def _non_overcommittable(name: str) -> bool:
    return _extended(name) or name.startswith(HUGEPAGES_PREFIX)


def resource_name_problem(name: str) -> str | None:
    """Why `name` cannot be a container resource name, or None when it can."""
    if not _QUALIFIED_NAME.fullmatch(name) or len(name.rpartition("/")[0]) > 253:
        return f"{name!r} is not a valid resource name (a qualified name such as cpu or example.com/gpu)"
    if "/" not in name:
        if name in STANDARD_CONTAINER_RESOURCES:
            return None
        if name.startswith(HUGEPAGES_PREFIX):
            try:
                if quantity_value(name[len(HUGEPAGES_PREFIX):]) > 0:
                    return None
            except ValueError:
                pass
            return f"{name!r}: a hugepages resource is hugepages-<page size>, e.g. hugepages-2Mi"
        return (f"{name!r} is not a container resource: cpu, memory, ephemeral-storage, hugepages-<size>, "
                "or an extended resource with a domain (e.g. google.com/tpu)")
    if _extended(name) and (name.startswith("requests.") or not _QUALIFIED_NAME.fullmatch("requests." + name)):
        return f"{name!r} does not follow the extended resource name standard (domain/name)"
    return None


def resources_problems(requests: dict[str, str], limits: dict[str, str], field: str) -> list[str]:
    """The API server's refusals of a container's `resources`, each naming the field; [] when none.

    Args:
      requests, limits: resource name → quantity string (already shaped as quantities).
      field: e.g. "spec.worker.resources".
    """
    found = []
    for part, values in (("requests", requests), ("limits", limits)):
        for name, text in values.items():
            problem = resource_name_problem(name)
            if problem:
                found.append(f"{field}.{part}: {problem}")
            elif _extended(name) and quantity_value(text).denominator != 1:
                found.append(f"{field}.{part}[{name!r}]: {text!r} must be a whole number (an extended resource)")
    for name, text in requests.items():
        if resource_name_problem(name):
            continue
        if name not in limits:
            if _non_overcommittable(name):
                found.append(f"{field}.limits[{name!r}]: must be set, equal to the request "
                             f"({name} cannot be overcommitted)")
            continue
        request, limit = quantity_value(text), quantity_value(limits[name])
        if _non_overcommittable(name) and request != limit:
            found.append(f"{field}.requests[{name!r}] ({text}) must equal the limit ({limits[name]}): "
                         f"{name} cannot be overcommitted")
        elif request > limit:
            found.append(f"{field}.requests[{name!r}] ({text}) must be less than or equal to the limit "
                         f"({limits[name]})")
    return found


def _cel_q(expr: str) -> str:
    """CEL: the quantity of an int-or-string map value."""
    return f"quantity(string({expr}))"


_CEL_EXTENDED = "(k.contains('/') && !k.contains('kubernetes.io/'))"
_CEL_NON_OVERCOMMIT = f"({_CEL_EXTENDED} || k.startsWith('{HUGEPAGES_PREFIX}'))"


def cel_string(s: str) -> str:
    """`s` as a CEL string literal (single quotes, backslashes and quotes escaped)."""
    return "'" + s.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _cel_name_rule(part: str) -> dict[str, str]:
    standard = ", ".join(cel_string(n) for n in STANDARD_CONTAINER_RESOURCES)
    ok = (f"k.matches({cel_string(QUALIFIED_NAME_PATTERN)}) && "
          f"(k in [{standard}] || "
          f"(k.startsWith('{HUGEPAGES_PREFIX}') && isQuantity(k.substring({len(HUGEPAGES_PREFIX)})) && "
          f"quantity(k.substring({len(HUGEPAGES_PREFIX)})).compareTo(quantity('0')) > 0) || "
          f"(k.contains('/') && (k.contains('kubernetes.io/') || (!k.startsWith('requests.') && "
          f"('requests.' + k).matches({cel_string(QUALIFIED_NAME_PATTERN)})))))")
    return {"rule": f"!has(self.{part}) || self.{part}.all(k, {ok})",
            "message": ("a container resource is cpu, memory, ephemeral-storage, hugepages-<size>, or an "
                        "extended resource with a domain (e.g. google.com/tpu)"),
            "fieldPath": f".{part}"}


# CEL rules of a `Resources` object (the API server checks them at `kubectl apply`); the same
# rules as `resources_problems`. `fieldPath` makes the API server name the field.
RESOURCES_CEL_RULES: list[dict[str, str]] = [
    _cel_name_rule("requests"),
    _cel_name_rule("limits"),
    {"rule": (f"!has(self.requests) || self.requests.all(k, !{_CEL_NON_OVERCOMMIT} || "
              f"(has(self.limits) && k in self.limits))"),
     "message": "an extended resource (domain/name) or hugepages request needs a limit equal to it",
     "fieldPath": ".limits"},
    {"rule": (f"!has(self.requests) || !has(self.limits) || self.requests.all(k, !(k in self.limits) || "
              f"!isQuantity(string(self.requests[k])) || !isQuantity(string(self.limits[k])) || "
              f"({_CEL_NON_OVERCOMMIT} ? {_cel_q('self.requests[k]')}.compareTo({_cel_q('self.limits[k]')}) == 0 "
              f": {_cel_q('self.requests[k]')}.compareTo({_cel_q('self.limits[k]')}) <= 0))"),
     "message": ("a request must be less than or equal to the limit of the same resource (equal for an "
                 "extended resource or hugepages)"),
     "fieldPath": ".requests"},
    *[{"rule": (f"!has(self.{part}) || self.{part}.all(k, !isQuantity(string(self.{part}[k])) || "
                f"{_cel_q(f'self.{part}[k]')}.compareTo(quantity('0')) >= 0)"),
       "message": "a quantity must not be negative",
       "fieldPath": f".{part}"} for part in ("requests", "limits")],
    *[{"rule": (f"!has(self.{part}) || self.{part}.all(k, !{_CEL_EXTENDED} || "
                f"!isQuantity(string(self.{part}[k])) || {_cel_q(f'self.{part}[k]')}.isInteger())"),
       "message": "an extended resource (domain/name) must be a whole number",
       "fieldPath": f".{part}"} for part in ("requests", "limits")],
]

# Bounds that keep the CEL rules' estimated cost within the API server's budget.
MAX_RESOURCES = 16


# -- tolerations -----------------------------------------------------------------------------

LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$"
_LABEL_VALUE = re.compile(LABEL_VALUE_PATTERN)


# The API server's cross-field rules of one toleration (ValidateTolerations), each as a message and a CEL
# rule over the toleration object; `toleration_problems` applies the same three in Python.
TOLERATION_KEYLESS_MESSAGE = "a toleration without a key must have operator Exists (it matches every taint)"
TOLERATION_EXISTS_VALUE_MESSAGE = "a toleration with operator Exists must not have a value"
TOLERATION_SECONDS_MESSAGE = "tolerationSeconds needs effect NoExecute"
TOLERATION_CEL_RULES: list[dict[str, str]] = [
    {"rule": "(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
     "message": TOLERATION_KEYLESS_MESSAGE, "fieldPath": ".operator"},
    {"rule": "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
     "message": TOLERATION_EXISTS_VALUE_MESSAGE, "fieldPath": ".value"},
    {"rule": "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
     "message": TOLERATION_SECONDS_MESSAGE, "fieldPath": ".tolerationSeconds"},
]


def toleration_problems(key: str | None, value: str | None, operator: str = "Equal", effect: str | None = None,
                        toleration_seconds: int | None = None) -> list[str]:
    """The API server's refusals of one toleration (the phrases; the caller names the field); [] when none.

    Args:
      key, value, operator, effect, toleration_seconds: the toleration's fields (None: unset).
    """
    found = []
    if not key and operator != "Exists":
        found.append(TOLERATION_KEYLESS_MESSAGE)
    if operator == "Exists" and value:
        found.append(f"{TOLERATION_EXISTS_VALUE_MESSAGE} (got {value!r})")
    if toleration_seconds is not None and effect != "NoExecute":
        found.append(TOLERATION_SECONDS_MESSAGE)
    if key and (not _QUALIFIED_NAME.fullmatch(key) or len(key.rpartition("/")[0]) > 253):
        found.append(f"key {key!r} is not a valid label key (an optional DNS prefix and '/', then at most 63 "
                     "letters, digits, '-', '_', '.')")
    if value and not _LABEL_VALUE.fullmatch(value):
        found.append(f"value {value!r} is not a valid label value (at most 63 letters, digits, '-', '_', '.', "
                     "starting and ending with a letter or digit)")
    return found

