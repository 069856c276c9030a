"""Writes a pod's volumes to files under the pod's folder.

Supported: ``emptyDir``, ``secret``, ``configMap``, ``downwardAPI``,
``projected`` (serviceAccountToken via the TokenRequest API, configMap,
secret, downwardAPI; this is how the ServiceAccount admission plugin gives
every pod its token, ``ca.crt`` and ``namespace``), ``hostPath`` (used as
is) and ``persistentVolumeClaim`` (a Bound claim's PersistentVolume, which
must be a ``hostPath`` or ``local`` one: its folder used as is; the claim
unbound or missing is retried, as the kubelet waits). Contents are written once when the pod starts; unlike the kubelet, later
Secret/ConfigMap updates and token refreshes are not synced (tokens are valid
for an hour, longer than any test).
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

from e2e.nodeagent.envvars import EnvError, field_value
from e2e.nodeagent.kubeapi import ApiError, KubeApi

# Upstream default file mode of Secret/ConfigMap/projected volumes (0644).
DEFAULT_MODE = 0o644


class VolumeError(Exception):
    """A volume cannot be set up yet (missing Secret/ConfigMap, unsupported type); the kubelet retries."""


def _write_items(dest: Path, data: dict[str, bytes], items: list[dict] | None, mode: int) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    if items:
        chosen = []
        for item in items:
            if item["key"] not in data:
                raise VolumeError(f"key {item['key']} not found")
            chosen.append((item["path"], data[item["key"]], item.get("mode", mode)))
    else:
        chosen = [(k, v, mode) for k, v in data.items()]
    for rel, content, file_mode in chosen:
        target = dest / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        os.chmod(target, file_mode)


def _object_data(api: KubeApi, ns: str, kind: str, name: str, optional: bool) -> dict[str, bytes] | None:
    path = f"/api/v1/namespaces/{ns}/{'secrets' if kind == 'Secret' else 'configmaps'}/{name}"
    try:
        obj = api.get(path)
    except ApiError as e:
        if e.status == 404:
            if optional:
                return None
            raise VolumeError(f'{kind.lower()} "{name}" not found') from None
        raise
    if kind == "Secret":
        return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
    data = {k: v.encode() for k, v in (obj.get("data") or {}).items()}
    data.update({k: base64.b64decode(v) for k, v in (obj.get("binaryData") or {}).items()})
    return data


def _downward_items(pod: dict, items: list[dict]) -> dict[str, bytes]:
    out = {}
    for item in items:
        if "fieldRef" not in item:
            raise VolumeError(f"downwardAPI item {item.get('path')}: only fieldRef is supported")
        try:
            out[item["path"]] = field_value(pod, item["fieldRef"]["fieldPath"]).encode()
        except EnvError as e:
            raise VolumeError(str(e)) from None
    return out


def _token(api: KubeApi, pod: dict, src: dict) -> bytes:
    meta = pod["metadata"]
    sa = pod["spec"].get("serviceAccountName") or "default"
    spec = {"expirationSeconds": src.get("expirationSeconds", 3607),
            "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}}
    if src.get("audience"):
        spec["audiences"] = [src["audience"]]
    try:
        resp = api.create(f"/api/v1/namespaces/{meta['namespace']}/serviceaccounts/{sa}/token",
                          {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})
    except ApiError as e:
        raise VolumeError(f"token for serviceaccount {sa}: {e}") from None
    return resp["status"]["token"].encode()


def _projected(api: KubeApi, pod: dict, vol: dict) -> dict[str, bytes]:
    ns = pod["metadata"]["namespace"]
    files: dict[str, bytes] = {}
    for src in vol.get("sources") or []:
        if "serviceAccountToken" in src:
            files[src["serviceAccountToken"]["path"]] = _token(api, pod, src["serviceAccountToken"])
        elif "configMap" in src or "secret" in src:
            kind, ref = ("ConfigMap", src["configMap"]) if "configMap" in src else ("Secret", src["secret"])
            data = _object_data(api, ns, kind, ref["name"], ref.get("optional", False)) or {}
            items = ref.get("items")
            if items:
                for item in items:
                    if item["key"] in data:
                        files[item["path"]] = data[item["key"]]
                    elif not ref.get("optional", False):
                        raise VolumeError(f"key {item['key']} not found in {kind} {ref['name']}")
            else:
                files.update(data)
        elif "downwardAPI" in src:
            files.update(_downward_items(pod, src["downwardAPI"].get("items") or []))
        else:
            raise VolumeError(f"projected volume {vol}: unsupported source {sorted(src)}")
    return files


def _claim_path(api: KubeApi, ns: str, claim: str) -> Path:
    """The host folder of PersistentVolumeClaim `claim`'s bound PersistentVolume (hostPath or local).

    Raises:
        VolumeError: the claim is missing or not Bound yet, or its volume is of another kind.
    """
    try:
        pvc = api.get(f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{claim}")
    except ApiError as e:
        if e.status == 404:
            raise VolumeError(f'persistentvolumeclaim "{claim}" not found') from None
        raise
    volume = (pvc.get("spec") or {}).get("volumeName")
    if (pvc.get("status") or {}).get("phase") != "Bound" or not volume:
        raise VolumeError(f'persistentvolumeclaim "{claim}" is not bound')
    pv = api.get(f"/api/v1/persistentvolumes/{volume}")["spec"]
    source = pv.get("hostPath") or pv.get("local")
    if not source:
        raise VolumeError(f"persistentvolume {volume}: only hostPath and local volumes are supported")
    return Path(source["path"])


def materialize(api: KubeApi, pod: dict, pod_dir: Path) -> dict[str, Path]:
    """Write every volume of ``pod`` under ``pod_dir/volumes``.

    Returns:
        volume name -> host folder (or host path for hostPath).

    Raises:
        VolumeError: a volume cannot be built now (the caller retries later).
    """
    ns = pod["metadata"]["namespace"]
    out: dict[str, Path] = {}
    for vol in pod["spec"].get("volumes") or []:
        name = vol["name"]
        dest = pod_dir / "volumes" / name
        if "emptyDir" in vol:
            dest.mkdir(parents=True, exist_ok=True)
        elif "hostPath" in vol:
            dest = Path(vol["hostPath"]["path"])
        elif "persistentVolumeClaim" in vol:
            dest = _claim_path(api, ns, vol["persistentVolumeClaim"]["claimName"])
        elif "secret" in vol or "configMap" in vol:
            kind, ref = ("Secret", vol["secret"]) if "secret" in vol else ("ConfigMap", vol["configMap"])
            obj_name = ref.get("secretName") if kind == "Secret" else ref.get("name")
            data = _object_data(api, ns, kind, obj_name, ref.get("optional", False)) or {}
            _write_items(dest, data, ref.get("items"), ref.get("defaultMode", DEFAULT_MODE))
        elif "projected" in vol:
            _write_items(dest, _projected(api, pod, vol["projected"]), None,
                         vol["projected"].get("defaultMode", DEFAULT_MODE))
        elif "downwardAPI" in vol:
            _write_items(dest, _downward_items(pod, vol["downwardAPI"].get("items") or []), None,
                         vol["downwardAPI"].get("defaultMode", DEFAULT_MODE))
        else:
            raise VolumeError(f"volume {name}: unsupported type {sorted(k for k in vol if k != 'name')}")
        out[name] = dest
    return out
