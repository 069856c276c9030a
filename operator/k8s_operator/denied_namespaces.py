"""Namespaces the operator never makes children in: the admin's deny list (pure).

The operator may create pods and Secrets in every namespace it watches (a
cluster-wide install: all of them). A job in `kube-system` would have it
create pods beside the cluster's own components, under that namespace's
PodSecurity level (usually `privileged`) and network policies. So a job in a
denied namespace is never reconciled into children: it fails before anything
is created, condition `Failed` (reason `InvalidSpec`) and a Warning Event,
both naming the namespace and the setting (docs/security.md).

Set by the Helm value `deniedNamespaces` (the chart adds its own release
namespace, where the operator key Secret lives, unless `denyReleaseNamespace:
false`), the operator flag `--denied-namespaces` or env
`ELASTIC_JAX_DENIED_NAMESPACES`; without any: `DEFAULT`.
"""

from __future__ import annotations

import dataclasses

from elastic_jax.k8s_operator.allow_lists import parse_names

DEFAULT = frozenset({"kube-system", "kube-public", "kube-node-lease"})


class NamespaceDenied(ValueError):
    """The job's namespace is on the admin's deny list; `str()` names it and the setting."""


@dataclasses.dataclass(frozen=True)
class DeniedNamespaces:
    """The admin's deny list.

    Attributes:
      names: namespaces in which no job is reconciled (exact names).
    """

    names: frozenset[str] = DEFAULT

    def check(self, namespace: str) -> None:
        """Refuses a job of `namespace` when it is denied.

        Args:
          namespace: the job object's namespace, from the API server.

        Raises:
          NamespaceDenied: naming the namespace, the Helm value and the operator flag.
        """
        if namespace in self.names:
            raise NamespaceDenied(
                f"metadata.namespace {namespace!r} is denied: the operator creates no pods or Secrets there "
                f"(operator setting deniedNamespaces: {', '.join(sorted(self.names))}; Helm value "
                "deniedNamespaces, operator flag --denied-namespaces); create the job in a tenant namespace")


def from_flags(text: str | None) -> DeniedNamespaces:
    """The deny list of the flag's text (None: `DEFAULT`; blank: none denied), for `admin_policies.AdminPolicies`."""
    return DeniedNamespaces(DEFAULT if text is None else parse_names(text))
