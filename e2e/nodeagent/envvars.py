"""A container's environment, as the kubelet builds it.

Order: the image's env, then service env for the ``kubernetes`` Service, then
``envFrom``, then ``env`` (later wins). ``$(VAR)`` in env values, command and
args expands to earlier-defined variables; ``$$(VAR)`` stays literal.
"""

from __future__ import annotations

import base64
import re

from e2e.nodeagent.kubeapi import ApiError, KubeApi

_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


class EnvError(Exception):
    """A referenced Secret, ConfigMap, key or field does not exist (the container cannot start)."""


def expand(value: str, env: dict[str, str]) -> str:
    """Kubernetes ``$(VAR)`` expansion: defined names are replaced, others kept, ``$$`` -> ``$``."""
    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1)
        return env.get(name, m.group(0))
    return _REF.sub(sub, value)


def field_value(pod: dict, path: str) -> str:
    """Value of a downward-API ``fieldRef.fieldPath``.

    Raises:
        EnvError: unsupported path.
    """
    meta, spec, status = pod["metadata"], pod["spec"], pod.get("status", {})
    m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if m:
        return (meta.get(m.group(1)) or {}).get(m.group(2), "")
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.podIP": status.get("podIP", ""),
        "status.hostIP": status.get("hostIP", ""),
        "status.podIPs": status.get("podIP", ""),
        "status.hostIPs": status.get("hostIP", ""),
    }
    if path in ("metadata.labels", "metadata.annotations"):
        items = meta.get(path.split(".")[1]) or {}
        return "\n".join(f'{k}="{v}"' for k, v in sorted(items.items()))
    if path not in simple:
        raise EnvError(f"unsupported fieldRef.fieldPath {path!r}")
    return simple[path]


def resource_value(container: dict, ref: dict) -> str:
    """Value of a ``resourceFieldRef`` (limits/requests of this container), as a string."""
    kind, _, name = ref["resource"].partition(".")
    value = ((container.get("resources") or {}).get(kind) or {}).get(name)
    if value is None:
        # Unset limits default to node allocatable in the kubelet; report "0".
        return "0"
    return str(value)


class _Lookup:
    """Caches Secrets and ConfigMaps read while building one environment."""

    def __init__(self, api: KubeApi, namespace: str):
        self.api, self.ns, self.cache = api, namespace, {}

    def data(self, kind: str, name: str, optional: bool) -> dict[str, str] | None:
        key = (kind, name)
        if key not in self.cache:
            path = f"/api/v1/namespaces/{self.ns}/{'secrets' if kind == 'Secret' else 'configmaps'}/{name}"
            try:
                obj = self.api.get(path)
            except ApiError as e:
                if e.status == 404:
                    if optional:
                        self.cache[key] = None
                        return None
                    raise EnvError(f'{kind.lower()} "{name}" not found') from None
                raise
            if kind == "Secret":
                self.cache[key] = {k: base64.b64decode(v).decode(errors="replace")
                                   for k, v in (obj.get("data") or {}).items()}
            else:
                self.cache[key] = dict(obj.get("data") or {})
        return self.cache[key]


def build(api: KubeApi, pod: dict, container: dict, base: dict[str, str]) -> dict[str, str]:
    """The full environment of ``container``.

    Args:
        api: client used to read referenced Secrets and ConfigMaps.
        pod: the Pod object (status.podIP must already be set).
        container: the container spec.
        base: image env and service env, applied first.

    Raises:
        EnvError: a non-optional reference is missing.
    """
    env = dict(base)
    lookup = _Lookup(api, pod["metadata"]["namespace"])
    for src in container.get("envFrom") or []:
        prefix = src.get("prefix", "")
        for kind, key in (("ConfigMap", "configMapRef"), ("Secret", "secretRef")):
            if key in src:
                ref = src[key]
                data = lookup.data(kind, ref["name"], ref.get("optional", False)) or {}
                for k, v in data.items():
                    env[prefix + k] = v
    for var in container.get("env") or []:
        name = var["name"]
        if "valueFrom" not in var:
            env[name] = expand(var.get("value", ""), env)
            continue
        src = var["valueFrom"]
        if "fieldRef" in src:
            env[name] = field_value(pod, src["fieldRef"]["fieldPath"])
        elif "resourceFieldRef" in src:
            env[name] = resource_value(container, src["resourceFieldRef"])
        elif "secretKeyRef" in src or "configMapKeyRef" in src:
            kind, ref = (("Secret", src["secretKeyRef"]) if "secretKeyRef" in src
                         else ("ConfigMap", src["configMapKeyRef"]))
            optional = ref.get("optional", False)
            data = lookup.data(kind, ref["name"], optional)
            if data is None:
                continue
            if ref["key"] not in data:
                if optional:
                    continue
                raise EnvError(f'couldn\'t find key {ref["key"]} in {kind} {pod["metadata"]["namespace"]}/{ref["name"]}')
            env[name] = data[ref["key"]]
        else:
            raise EnvError(f"env {name}: unsupported valueFrom {sorted(src)}")
    return env
