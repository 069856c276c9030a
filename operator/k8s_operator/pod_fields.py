"""Which priority classes, tolerations and image pull Secrets a job may give its pods: the admin's allow lists (pure).

A tenant who may only create ElasticTrainingJobs cannot create pods. The
operator can, so every Pod field a job passes through is a power the tenant
gains through the operator unless the admin limits it (the confused-deputy
shape of `service_accounts`):

- `spec.priorityClassName`: any existing PriorityClass, `system-node-critical`
  included, lets the job's pods preempt others;
- `spec.controller.tolerations` / `spec.worker.tolerations`: tolerating the
  control plane's or a reserved pool's taints puts the pods there;
- `spec.imagePullSecrets`: the kubelet pulls with any Secret of the namespace,
  so the job may run images the tenant could not otherwise pull;
- `spec.compilationCache.persistentVolumeClaim`: the job's pods mount the claim
  read-write, so the tenant could read, fill or poison any volume of the
  namespace (one bound to an admin's hostPath PersistentVolume included), and
  whatever is in a compilation cache is run as the job's code.

Each is accepted only when a cluster admin listed it in the operator's
settings (Helm value `podFields`, flags `--allowed-priority-classes`,
`--allowed-toleration-keys`, `--allowed-image-pull-secrets`,
`--allowed-compilation-cache-claims`), which tenants cannot edit. Defaults: no
priority class, no pull Secret, no cache claim, and only the
`google.com/tpu` toleration (what GKE itself adds to TPU pods; a `backend:
cpu` job may not carry it at all, `elastic_jax.api.tpu_placement`). `*` allows
any value of a list (pull Secrets, cache claims: `namespace/*`). Anything else fails the
job naming the field (docs/security.md).
"""

from __future__ import annotations

import dataclasses

from elastic_jax.api.job import ElasticTrainingJob
from elastic_jax.k8s_operator.allow_lists import ANY, parse_names, parse_namespaced

PRIORITY_FIELD = "spec.priorityClassName"
PULL_SECRETS_FIELD = "spec.imagePullSecrets"
CACHE_CLAIM_FIELD = "spec.compilationCache.persistentVolumeClaim.claimName"

# Tolerations any job may set: GKE adds this one to every pod requesting TPUs, so tolerating it
# gives nothing a TPU job does not already have.
ALWAYS_ALLOWED_TOLERATION_KEYS = frozenset({"google.com/tpu"})


class PodFieldRefused(ValueError):
    """The job sets a priority class, toleration, pull Secret or cache claim the admin did not allow; `str()` names
    the field."""


@dataclasses.dataclass(frozen=True)
class PodFieldsPolicy:
    """The admin's allow lists for Pod fields a job passes to its pods.

    Attributes:
      priority_classes: PriorityClass names jobs may set (cluster-scoped); `*`: any.
      toleration_keys: taint keys jobs may tolerate, besides `ALWAYS_ALLOWED_TOLERATION_KEYS`; `*`: any,
        including a toleration without a key (which tolerates every taint).
      pull_secrets: (namespace, name) of Secrets jobs in that namespace may name; name `*`: any of it.
      cache_claims: (namespace, name) of PersistentVolumeClaims jobs in that namespace may mount as their
        compilation cache; name `*`: any of it.
    """

    priority_classes: frozenset[str] = frozenset()
    toleration_keys: frozenset[str] = frozenset()
    pull_secrets: frozenset[tuple[str, str]] = frozenset()
    cache_claims: frozenset[tuple[str, str]] = frozenset()

    def check(self, job: ElasticTrainingJob, namespace: str) -> None:
        """Refuses the first priority class, toleration, pull Secret or cache claim of `job` the admin did not allow.

        Args:
          job: the spec to check.
          namespace: the job object's namespace, from the API server (never from a manifest's text).

        Raises:
          PodFieldRefused: naming the field, the value and the Helm value that would allow it.
        """
        spec = job.spec
        pc = spec.priority_class_name
        if pc is not None and pc not in self.priority_classes and ANY not in self.priority_classes:
            raise PodFieldRefused(
                f"{PRIORITY_FIELD} {pc!r} is not allowed: a cluster admin must list it in the operator's "
                "podFields.priorityClassNames (Helm value; operator flag --allowed-priority-classes)")
        for role, part in (("controller", spec.controller), ("worker", spec.worker)):
            for i, t in enumerate(part.tolerations):
                key = t.key or ""
                if key in ALWAYS_ALLOWED_TOLERATION_KEYS or ANY in self.toleration_keys:
                    continue
                if not key:
                    raise PodFieldRefused(
                        f"spec.{role}.tolerations[{i}]: a toleration without a key tolerates every taint and is "
                        "not allowed: name the taint's key (a cluster admin may allow any with "
                        "podFields.tolerationKeys: ['*'])")
                if key not in self.toleration_keys:
                    raise PodFieldRefused(
                        f"spec.{role}.tolerations[{i}].key {key!r} is not allowed: a cluster admin must list it "
                        "in the operator's podFields.tolerationKeys (Helm value; operator flag --allowed-toleration-keys)")
        for i, ref in enumerate(spec.image_pull_secrets):
            _check_namespaced(self.pull_secrets, namespace, ref.name, f"{PULL_SECRETS_FIELD}[{i}].name",
                              "imagePullSecrets")
        claim = spec.compilation_cache.persistent_volume_claim if spec.compilation_cache is not None else None
        if claim is not None:
            _check_namespaced(self.cache_claims, namespace, claim.claim_name, CACHE_CLAIM_FIELD,
                              "compilationCacheClaims")


_FLAGS = {"imagePullSecrets": "image-pull-secrets", "compilationCacheClaims": "compilation-cache-claims"}
"""The operator flag (``--allowed-<flag>``, ``main.py``) behind each namespaced ``podFields`` Helm value."""


def _check_namespaced(allowed: frozenset[tuple[str, str]], namespace: str, name: str, field: str, value: str) -> None:
    """Refuses `name` of `namespace` unless `allowed` lists it (or `namespace/*`).

    Raises:
      PodFieldRefused: naming `field`, the value and the Helm value `podFields.<value>` that would allow it.
    """
    if (namespace, name) not in allowed and (namespace, ANY) not in allowed:
        raise PodFieldRefused(
            f"{field} {name!r} is not allowed in namespace {namespace}: a cluster admin must list "
            f"{namespace}/{name} in the operator's podFields.{value} (Helm value; operator flag "
            f"--allowed-{_FLAGS[value]})")


def from_flags(priority_classes: str | None, toleration_keys: str | None, pull_secrets: str | None,
               cache_claims: str | None = None) -> PodFieldsPolicy:
    """The allow lists of the flags' text (blank: the safe defaults above), for `admin_policies.AdminPolicies`.

    Raises:
      ValueError: a pull Secret or cache claim entry that is not `namespace/name`.
    """
    return PodFieldsPolicy(parse_names(priority_classes), parse_names(toleration_keys),
                           parse_namespaced(pull_secrets, any_name=True), parse_namespaced(cache_claims, any_name=True))
