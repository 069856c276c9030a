"""Fixtures for the operator on the local control plane (TPU pools, the local demo), and job helpers.

The kind tier's operator tests use the chart's operator instead
(``e2e/kind/target.py``); the helpers below (the example manifest, the job,
its Events, waiting for a phase) serve both. Here the operator runs as a
local process with a kubeconfig that holds a token of the
`elastic-jax-operator` ServiceAccount, bound to a ClusterRole built from
`helm/elastic-jax/files/operator-rbac-rules.yaml` — the same rules the chart
ships — so every API call it makes is checked by the real RBAC authorizer.
Each test that starts the operator stops it by PID.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from e2e.harness import processes
from e2e.harness.paths import REPO_ROOT
from e2e.helpers import wait_for
from elastic_jax import contract
from elastic_jax.local.processes import free_port, write_private_file

RULES = REPO_ROOT / "helm" / "elastic-jax" / "files" / "operator-rbac-rules.yaml"
CRD = REPO_ROOT / "crds" / "elastictrainingjobs.yaml"
EXAMPLE = REPO_ROOT / "examples" / "01-cpu-job.yaml"
SYSTEM_NS = "elastic-jax-system"
SA = "elastic-jax-operator"


def operator_rbac_objects() -> str:
    """ServiceAccount, ClusterRole (rules from the chart's file) and ClusterRoleBinding, as YAML."""
    rules = yaml.safe_load(RULES.read_text())
    docs = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM_NS}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SA, "namespace": SYSTEM_NS}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": SA}, "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": SA},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": SA},
         "subjects": [{"kind": "ServiceAccount", "name": SA, "namespace": SYSTEM_NS}]},
    ]
    return yaml.safe_dump_all(docs)


def install_crd(cluster) -> Path:
    """Applies the generated CRD and waits until it is Established; returns its file.

    Raises:
      CommandError: kubectl refused it.
      TimeoutError: it was not Established within 60 s.
    """
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    # Polled, not `kubectl wait --for=condition=Established`: that exits 1 ("accessor error: <nil>") when it
    # reads the CRD before the API server wrote any condition (seen on a fresh cluster).
    def established() -> bool:
        crd = json.loads(cluster.kubectl("get", "crd/elastictrainingjobs.elasticjax.dev", "-o", "json").stdout)
        return any(c["type"] == "Established" and c["status"] == "True"
                   for c in (crd.get("status") or {}).get("conditions") or [])
    wait_for(established, timeout_s=60, what="the ElasticTrainingJob CRD Established", interval_s=0.2)
    return CRD


@pytest.fixture(scope="package")  # as `cluster` (e2e/conftest.py), which it uses
def ejob_crd(cluster):
    """The generated CRD, installed and Established."""
    return install_crd(cluster)


def write_operator_kubeconfig(cluster, folder: Path, duration: str = "6h") -> Path:
    """Applies the operator's RBAC and writes `folder/kubeconfig` with a token of its ServiceAccount.

    Args:
      cluster: the local cluster.
      folder: where to write the kubeconfig (it holds a bearer token).
      duration: token lifetime, as `kubectl create token --duration`.
    """
    cluster.kubectl("apply", "-f", "-", input=operator_rbac_objects())
    token = cluster.kubectl("create", "token", SA, "-n", SYSTEM_NS, f"--duration={duration}").stdout.strip()
    path = folder / "kubeconfig"
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "operator",
        "clusters": [{"name": "local", "cluster": {"server": cluster.server,
                                                     "certificate-authority": str(cluster.state / "pki" / "ca.crt")}}],
        "users": [{"name": SA, "user": {"token": token}}],
        "contexts": [{"name": "operator", "context": {"cluster": "local", "user": SA}}],
    }))
    return path


@pytest.fixture(scope="package")  # as `cluster` (e2e/conftest.py), which it uses
def operator_kubeconfig(cluster, ejob_crd, tmp_path_factory) -> Path:
    """A kubeconfig authenticating as the operator's ServiceAccount (no admin rights)."""
    return write_operator_kubeconfig(cluster, tmp_path_factory.mktemp("operator"))


def job_children(api, namespace: str, prefix: str) -> list[str]:
    """`kind/name` of every pod, Secret, ConfigMap, Service, JobSet and Job in `namespace` named `prefix*`."""
    found = []
    for path in (f"/api/v1/namespaces/{namespace}/pods", f"/api/v1/namespaces/{namespace}/secrets",
                 f"/api/v1/namespaces/{namespace}/configmaps", f"/api/v1/namespaces/{namespace}/services",
                 contract.jobsets_path(namespace),
                 f"/apis/batch/v1/namespaces/{namespace}/jobs"):
        found += [f"{path.rsplit('/', 1)[-1]}/{o['metadata']['name']}" for o in api.get(path)["items"]
                  if o["metadata"]["name"].startswith(prefix)]
    return found


class OperatorProcess(processes.LoggedProcess):
    """`elastic-jax-operator` as a child process; `stop()` ends it by PID.

    Args:
      kubeconfig: its identity.
      log_path: stdout+stderr (JSON lines) go here, appended across restarts.
      metrics_port: its Prometheus port on 127.0.0.1.
      extra_args: more command-line arguments (e.g. `--identity`, `--namespace`).
    """

    def __init__(self, kubeconfig: Path, log_path: Path, metrics_port: int, extra_args: tuple[str, ...] = ()):
        super().__init__(log_path)
        self.extra_args = list(extra_args)
        self.kubeconfig = kubeconfig
        self.metrics_port = metrics_port
        self.procs: list[subprocess.Popen] = []

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("KUBERNETES_")}
        env.update({"KUBECONFIG": str(self.kubeconfig), "PYTHONUNBUFFERED": "1", "NO_PROXY": "*"})
        # One operator key across restarts, as the chart's Secret gives the pod: job tokens derive from it.
        key_file = self.log_path.with_name("operator-key")
        if not key_file.exists():
            write_private_file(key_file, secrets.token_urlsafe(48))
        env[contract.ENV_OPERATOR_KEY_FILE] = str(key_file)
        # Pods here share the host's network: each controller binds its own loopback pod IP.
        env[contract.ENV_POD_LISTEN_ADDRESS] = "pod-ip"
        exe = shutil.which("elastic-jax-operator", path=str(Path(sys.executable).parent))
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [exe, "--metrics-port", str(self.metrics_port), "--metrics-host", "127.0.0.1", "--log-format", "json",
                 *self.extra_args],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.procs.append(self.proc)

    def kill(self) -> None:
        """SIGKILL (an operator crash: no cleanup of any kind)."""
        if self.alive():
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def wait_up(self, timeout_s: float = 60) -> None:
        """Waits until its metrics endpoint answers (kopf started).

        Raises:
          TimeoutError: not within `timeout_s` (the message ends with its log).
          AssertionError: the process exited (its log is the message).
        """
        def up():
            if not self.alive():
                return True
            try:
                return "elasticjax_operator" in self.metrics()
            except OSError:
                return False
        wait_for(up, timeout_s=timeout_s, what="operator metrics up", explain=self.log)
        assert self.alive(), self.log()

    def log_records(self) -> list[dict]:
        out = []
        for line in self.log().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def metrics(self) -> str:
        import urllib.request

        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as r:
            return r.read().decode()


def run_operator(kubeconfig: Path, log_path: Path, extra_args: tuple[str, ...] = ()):
    """A running `OperatorProcess` for a fixture to yield (a generator); stopped by PID afterwards.

    Raises:
      AssertionError: at teardown, one of its processes survived `stop()` (then it is SIGKILLed).
    """
    op = OperatorProcess(kubeconfig, log_path, free_port(), extra_args)
    op.start()
    op.wait_up()
    try:
        yield op
    finally:
        op.stop()
        survivors = []
        for proc in op.procs:  # each process this test started, nothing else
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
                survivors.append(proc.pid)
        assert not survivors, f"operator pid(s) {survivors} survived stop() and were killed"


@pytest.fixture
def operator(operator_kubeconfig, tmp_path):
    """A running operator (least-privilege identity); stopped by PID afterwards."""
    yield from run_operator(operator_kubeconfig, tmp_path / "operator.log")


def example_manifest(path: Path = EXAMPLE) -> dict:
    """The example as a dict."""
    return yaml.safe_load(path.read_text())


def clear_checkpoints(manifest: dict) -> None:
    """Removes the example's local checkpoint directory, so a run starts from step 0."""
    shutil.rmtree(manifest["spec"]["checkpoint"]["uri"], ignore_errors=True)


def get_job(cluster, namespace: str, name: str) -> dict:
    """The ElasticTrainingJob object."""
    return cluster.api().get(f"/apis/elasticjax.dev/v1alpha1/namespaces/{namespace}/elastictrainingjobs/{name}")


def apply_job(cluster, namespace: str, manifest: dict, operator: OperatorProcess):
    """`kubectl apply` of `manifest` (asserted accepted).

    Returns:
      (status, explain): the job's `.status` now (a dict, {} before any), and what a failed wait shows (that
      status and the tail of the operator's log).
    """
    result = cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(manifest), check=False)
    assert result.returncode == 0, result.stderr
    name = manifest["metadata"]["name"]

    def status() -> dict:
        return get_job(cluster, namespace, name).get("status") or {}

    def explain() -> str:
        return json.dumps(status(), indent=1)[:3000] + "\n" + operator.log()[-3000:]

    return status, explain


def start_training_job(cluster, namespace: str, operator: OperatorProcess, folder: str, slices: int | None = None):
    """Applies the CPU example as a job that never finishes during a test, and waits until it trained 5 steps.

    Args:
      folder: the checkpoint folder's last part (under /tmp/elastic-jax/<folder>/<namespace>/).
      slices: also wait until this many slices are active (None: any).

    Returns:
      (manifest, status, explain, running): `apply_job`'s two callables and the status that was training.
    """
    manifest = example_manifest()
    manifest["spec"]["training"]["steps"] = 200000  # never finishes during the test
    manifest["spec"]["checkpoint"]["uri"] = f"/tmp/elastic-jax/{folder}/{namespace}/checkpoints"
    status, explain = apply_job(cluster, namespace, manifest, operator)
    running = wait_for(lambda: (lambda s: s if s.get("phase") == "Running" and s.get("step", 0) >= 5 and (
        slices is None or s.get("activeSlices") == slices) else None)(status()),
        timeout_s=300, what="the job training", interval_s=0.5, explain=explain)
    return manifest, status, explain, running


def job_events(cluster, namespace: str, name: str) -> list[dict]:
    """Events about the job, oldest first."""
    items = cluster.api().get(f"/api/v1/namespaces/{namespace}/events",
                              fieldSelector=f"involvedObject.name={name}")["items"]
    return sorted(items, key=lambda e: e.get("firstTimestamp") or e.get("eventTime") or "")


def wait_phase(cluster, namespace: str, name: str, phases: tuple[str, ...], timeout_s: float, explain=None) -> dict:
    """Waits until the job's status.phase is one of `phases`; returns the job."""
    def check():
        job = get_job(cluster, namespace, name)
        return job if (job.get("status") or {}).get("phase") in phases else None
    return wait_for(check, timeout_s=timeout_s, what=f"job {name} phase in {phases}", interval_s=0.5,
                    explain=explain or (lambda: json.dumps(get_job(cluster, namespace, name).get("status"), indent=1)[:3000]))


def wait_finished_while_training(cluster, namespace: str, name: str, stall_s: float, explain=None) -> dict:
    """Waits until the job is Succeeded or Failed for as long as its `status.step` keeps advancing.

    A loaded machine trains slower, not wrong: only `stall_s` seconds without a new step fail the wait
    (TimeoutError, naming the step), not a total time.
    """
    last = -1
    while True:
        try:
            return wait_phase(cluster, namespace, name, ("Succeeded", "Failed"), timeout_s=stall_s, explain=explain)
        except TimeoutError:
            step = int((get_job(cluster, namespace, name).get("status") or {}).get("step") or 0)
            if step <= last:
                raise
            last = step


def time_now() -> float:
    return time.monotonic()
