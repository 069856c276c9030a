"""The JobSet controller: its CRD, its webhooks on 127.0.0.1, its process.

The CRD and webhook manifests are read from the pinned JobSet module in Go's
module cache (``build.sh`` downloads it), never copied into this repository.
Upstream serves the webhooks behind a Service with certificates it rotates
itself; here the controller serves them on 127.0.0.1 with a certificate from
our CA, and the webhook configurations point at that URL
(``clientConfig.url``), so admission is real: JobSet defaulting and validation,
and the pod webhooks, run on every create.
"""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from pathlib import Path

import yaml

from e2e.harness.paths import E2E_DIR
from e2e.harness.ports import Ports


def pinned_version() -> str:
    """The JobSet release pinned in ``e2e/localcluster/go.mod``.

    Raises:
        RuntimeError: go.mod does not require sigs.k8s.io/jobset.
    """
    m = re.search(r"^\s*sigs\.k8s\.io/jobset (v\S+)", (E2E_DIR / "localcluster" / "go.mod").read_text(), re.M)
    if not m:
        raise RuntimeError("e2e/localcluster/go.mod does not require sigs.k8s.io/jobset")
    return m.group(1)


def module_dir() -> Path:
    """The pinned JobSet module's folder in Go's module cache (downloaded if missing).

    Raises:
        subprocess.CalledProcessError: ``go mod download`` failed.
    """
    out = subprocess.run(["go", "mod", "download", "-json", f"sigs.k8s.io/jobset@{pinned_version()}"],
                         check=True, capture_output=True, text=True, env=_go_env())
    return Path(json.loads(out.stdout)["Dir"])


def _go_env() -> dict[str, str]:
    import os
    env = dict(os.environ)
    env["GOFLAGS"] = "-mod=mod"
    return env


def webhook_configurations(manifests: str, url_base: str, ca_pem: bytes) -> list[dict]:
    """Upstream webhook configurations, rewritten to call ``url_base`` directly.

    Applies what upstream's kustomize overlay does (the ``jobset-`` name prefix
    and the pod webhooks' objectSelector, so only JobSet pods go through them)
    and replaces each ``clientConfig.service`` by ``url`` + ``caBundle``.

    Raises:
        ValueError: a webhook has no ``clientConfig.service.path``.
    """
    ca = base64.b64encode(ca_pem).decode()
    out = []
    for doc in yaml.safe_load_all(manifests):
        if not doc:
            continue
        doc["metadata"]["name"] = "jobset-" + doc["metadata"]["name"]
        for hook in doc["webhooks"]:
            try:
                path = hook["clientConfig"]["service"]["path"]
            except KeyError:
                raise ValueError(f"webhook {hook.get('name')} has no clientConfig.service.path") from None
            hook["clientConfig"] = {"url": url_base + path, "caBundle": ca}
            if hook["name"] in ("mpod.kb.io", "vpod.kb.io"):
                hook["objectSelector"] = {"matchExpressions": [
                    {"key": "jobset.sigs.k8s.io/jobset-name", "operator": "Exists"}]}
        out.append(doc)
    return out


def write_manifests(state: Path, ports: Ports) -> Path:
    """Write the CRD and webhook configurations into ``state/jobset/manifests``; return that folder."""
    src = module_dir() / "config" / "components"
    dest = state / "jobset" / "manifests"
    dest.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src / "crd" / "bases" / "jobset.x-k8s.io_jobsets.yaml", dest / "crd.yaml")
    hooks = webhook_configurations((src / "webhook" / "manifests.yaml").read_text(),
                                   f"https://127.0.0.1:{ports.jobset_webhook}",
                                   (state / "pki" / "ca.crt").read_bytes())
    (dest / "webhooks.yaml").write_text(yaml.safe_dump_all(hooks))
    return dest


def write_config(state: Path, ports: Ports) -> Path:
    """The controller's Configuration file: loopback webhook, our certificate, no cert rotation.

    The serving certificate is the API server's (it is valid for 127.0.0.1 and
    signed by the cluster CA), copied under the names controller-runtime reads.
    """
    pki = state / "pki"
    certs = state / "jobset" / "certs"
    certs.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(pki / "apiserver.crt", certs / "tls.crt")
    shutil.copyfile(pki / "apiserver.key", certs / "tls.key")
    config = {
        "apiVersion": "config.jobset.x-k8s.io/v1alpha1",
        "kind": "Configuration",
        "leaderElection": {"leaderElect": False},
        # Upstream rotates its own certificate into a Secret behind a Service;
        # there is no Service routing here, so we hand it ours.
        "internalCertManagement": {"enable": False},
        "webhook": {"host": "127.0.0.1", "port": ports.jobset_webhook, "certDir": str(certs)},
        "metrics": {"bindAddress": f"127.0.0.1:{ports.jobset_metrics}"},
        "health": {"healthProbeBindAddress": f"127.0.0.1:{ports.jobset_health}"},
    }
    path = state / "jobset" / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def controller_argv(bin_dir: Path, state: Path, ports: Ports) -> list[str]:
    """The JobSet controller manager (it reads ``KUBECONFIG`` from its environment)."""
    return [
        str(bin_dir / "jobset-controller"),
        f"--config={write_config(state, ports)}",
        "--zap-log-level=info",
    ]


def readyz_url(ports: Ports) -> str:
    """Plain-HTTP readiness endpoint (true once webhooks and controllers run)."""
    return f"http://127.0.0.1:{ports.jobset_health}/readyz"
