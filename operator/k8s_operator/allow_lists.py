"""Parsing the cluster admin's allow lists of the operator's flags (pure): one spelling for every list.

`service_accounts` (ServiceAccounts a controller may run as) and `pod_fields` (priority classes,
toleration keys, image pull Secrets) both read lists an admin writes in Helm values and the operator
gets as flag text: entries separated by commas or whitespace, namespaced ones as `namespace/name`.
"""

from __future__ import annotations

ANY = "*"


def parse_names(text: str | None) -> frozenset[str]:
    """Comma- or whitespace-separated names (priority classes, toleration keys) as a set; `*` means any."""
    return frozenset((text or "").replace(",", " ").split())


def parse_namespaced(text: str | None, any_name: bool) -> frozenset[tuple[str, str]]:
    """`namespace/name` entries, comma- or whitespace-separated, as (namespace, name) pairs.

    Args:
      text: the flag's text; None or blank is the empty list.
      any_name: whether `namespace/*` (any name in that namespace) is an entry. A namespace is never `*`:
        an allow list is written per namespace, so a tenant's namespace is never allowed by accident.

    Raises:
      ValueError: an entry that is not `namespace/name` (or `namespace/*` when `any_name`), naming it.
    """
    out = set()
    for entry in (text or "").replace(",", " ").split():
        namespace, sep, name = entry.partition("/")
        if (not sep or not namespace or not name or "/" in name or namespace == ANY
                or (name == ANY and not any_name)):
            raise ValueError(f"{entry!r} is not namespace/name" + (" (or namespace/*)" if any_name else ""))
        out.add((namespace, name))
    return frozenset(out)
