"""The cluster admin's policies over what a job may ask for, as one typed value (pure).

`main` builds one `AdminPolicies` from the operator's flags (`from_flags`) and hands it to the
`OperatorState`; whatever checks a job (`job_pass.parse_job`, the ConfigMap copy of a spec in
`job_pass._applied_job`) is given it. Nothing reads a module global: two states (two tests, or a
test beside the defaults) never see each other's settings.
"""

from __future__ import annotations

import dataclasses

from elastic_jax.api.job import ElasticTrainingJob
from elastic_jax.k8s_operator.checkpoint_prefixes import CheckpointPrefixes, CheckpointPrefixRefused
from elastic_jax.k8s_operator.denied_namespaces import DeniedNamespaces, NamespaceDenied
from elastic_jax.k8s_operator.pod_fields import PodFieldRefused, PodFieldsPolicy
from elastic_jax.k8s_operator.service_accounts import ServiceAccountPolicy, ServiceAccountRefused

# What `AdminPolicies.check` raises: a refusal by one of the admin's lists, naming the field and the setting.
REFUSALS = (NamespaceDenied, ServiceAccountRefused, PodFieldRefused, CheckpointPrefixRefused)


@dataclasses.dataclass(frozen=True)
class AdminPolicies:
    """The admin's lists, each from its own flags (docs/security.md). The defaults are the operator's with no
    flag given: the `kube-*` namespaces denied, no ServiceAccount, the `google.com/tpu` toleration only, no
    priority class, pull Secret or cache claim, any `gs://` location.

    Attributes:
      denied_namespaces: namespaces whose jobs get no children (`--denied-namespaces`).
      service_accounts: the controller's ServiceAccounts and token mounts (`--allowed-service-accounts`,
        `--allowed-token-service-accounts`).
      pod_fields: priority classes, tolerations, pull Secrets, cache claims (`--allowed-priority-classes`, ...).
      checkpoint_prefixes: where `gs://` checkpoints and caches may lie (`--checkpoint-prefixes`).
    """

    denied_namespaces: DeniedNamespaces = DeniedNamespaces()
    service_accounts: ServiceAccountPolicy = ServiceAccountPolicy()
    pod_fields: PodFieldsPolicy = PodFieldsPolicy()
    checkpoint_prefixes: CheckpointPrefixes = CheckpointPrefixes()

    def check(self, job: ElasticTrainingJob, namespace: str) -> None:
        """Denied namespaces, then ServiceAccount, priority class, tolerations, image pull Secrets, cache claims,
        then the allowed `gs://` prefixes.

        Args:
          job: the spec to check.
          namespace: the job object's namespace, from the API server (never from a manifest's text).

        Raises:
          one of `REFUSALS`: naming the field (or the namespace) and the setting.
        """
        self.denied_namespaces.check(namespace)
        self.service_accounts.check(job, namespace)
        self.pod_fields.check(job, namespace)
        self.checkpoint_prefixes.check(job, namespace)
