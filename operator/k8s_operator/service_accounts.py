"""Which ServiceAccounts a job's controller pod may run as: the cluster admin's allow list (pure).

A tenant who may only create ElasticTrainingJobs cannot create pods, so
cannot run code as any ServiceAccount of their namespace. Naming one in
`spec.controller.serviceAccountName` would hand their controller image that
account's power: its Kubernetes RBAC (through a mounted token) and, on GKE,
the Google service account Workload Identity binds to it. So the operator
accepts only accounts the admin listed in the operator's settings (Helm value
`controllerServiceAccounts`, flags `--allowed-service-accounts` /
`--allowed-token-service-accounts`), which tenants cannot edit, and mounts a
token only for an account listed as allowed to mount one and only when the
spec asks. Anything else fails the job naming the field (docs/security.md).
"""

from __future__ import annotations

import dataclasses

from elastic_jax.api.job import ElasticTrainingJob
from elastic_jax.k8s_operator.allow_lists import parse_namespaced

FIELD = "spec.controller.serviceAccountName"
TOKEN_FIELD = "spec.controller.automountServiceAccountToken"


class ServiceAccountRefused(ValueError):
    """The job names a ServiceAccount (or asks for its token) the admin did not allow; `str()` names the field."""


@dataclasses.dataclass(frozen=True)
class ServiceAccountPolicy:
    """The admin's allow list.

    Attributes:
      allowed: (namespace, name) of ServiceAccounts jobs in that namespace may name.
      token_allowed: the subset whose Kubernetes API token a job may mount
        (`automountServiceAccountToken: true`).
    """

    allowed: frozenset[tuple[str, str]] = frozenset()
    token_allowed: frozenset[tuple[str, str]] = frozenset()

    def check(self, job: ElasticTrainingJob, namespace: str) -> None:
        """Refuses a ServiceAccount or a token mount the admin did not allow for `namespace`.

        Args:
          job: the spec to check.
          namespace: the job object's namespace, from the API server (never from a manifest's
            text: the ConfigMap copy of a spec could name another one).

        Raises:
          ServiceAccountRefused: naming the field, the account and how an admin allows it.
        """
        c = job.spec.controller
        if c.service_account_name is None:
            return
        key = (namespace, c.service_account_name)
        if key not in self.allowed and key not in self.token_allowed:
            raise ServiceAccountRefused(
                f"{FIELD} {c.service_account_name!r} is not allowed in namespace {key[0]}: a cluster admin must "
                f"list {key[0]}/{key[1]} in the operator's controllerServiceAccounts.allowed (Helm value; "
                "operator flag --allowed-service-accounts)")
        if c.automount_service_account_token and key not in self.token_allowed:
            raise ServiceAccountRefused(
                f"{TOKEN_FIELD}: the token of ServiceAccount {key[0]}/{key[1]} may not be mounted: a cluster admin "
                "must list it in the operator's controllerServiceAccounts.allowTokenMount (Helm value; "
                "operator flag --allowed-token-service-accounts); "
                "Workload Identity does not need the token")


def from_flags(allowed: str | None, token_allowed: str | None) -> ServiceAccountPolicy:
    """The allow list of the flags' text (blank: no job may name a ServiceAccount), for
    `admin_policies.AdminPolicies`.

    Raises:
      ValueError: an entry that is not `namespace/name`.
    """
    return ServiceAccountPolicy(parse_namespaced(allowed, any_name=False),
                                parse_namespaced(token_allowed, any_name=False))
