"""Start-up on the pathways backend with the real pathwaysutils (0.1.13) and a Pathways proxy that never answers.

Issue 29 faults 1 and 4. The processes run as the operator renders the
controller container: `JAX_PLATFORMS=proxy`, `JAX_BACKEND_TARGET` pointing at
the proxy. The "proxy" is a loopback socket this test holds listening that
never speaks gRPC (a proxy container still starting), and the client's
connection timeout is cut to a few seconds (`PATHWAYS_PROXY_CONNECTION_TIMEOUT_SECS`,
which pathwaysutils' proxy backend reads; 120 s by default).

Fault 1: anything that touched a JAX backend before `pathwaysutils.initialize()`
(Orbax's checkpointer asks `jax.default_backend()`) failed with "Backend 'proxy'
is not in the list of known backends", exit 1: the job Failed at its first
start. Now the failure the processes reach is the proxy connection itself, which
shows `initialize()` ran first. Fault 4: that connection failure is a controller
loss (exit 75, `ControllerExit.RESTART`: the operator starts the controller again
and counts it), not Failed. Covered for the three ways a controller starts: the
built-in controller, `elastic_jax.connect()` in a user's own program, and
`python -m elastic_jax.run_module` (MaxText).
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pytest

from elastic_jax import contract
from elastic_jax.exit_codes import ControllerExit

ROOT = Path(__file__).parents[2]
UNKNOWN_PROXY = "not in the list of known backends"  # JAX's words when no one registered the proxy backend

MANIFEST = """\
apiVersion: elasticjax.dev/v1alpha1
kind: ElasticTrainingJob
metadata:
  name: pw-start
spec:
  backend: pathways
  slices:
    count: 1
    accelerator: tpu-v5-lite-podslice
    topology: 2x2
  controller:
    trainer:
      entryPoint: elastic_jax.controller.builtin_lm:make_trainer
      config: {seqLen: 16, dModel: 16, numLayers: 1, numHeads: 2, mlpDim: 32, data: stdlib}
  training:
    steps: 4
    globalBatchSize: 4
  checkpoint:
    uri: CKPT
    intervalSteps: 2
"""


@pytest.fixture
def silent_proxy():
    """A loopback address that accepts connections and never answers (the proxy container not up yet)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield f"grpc://127.0.0.1:{s.getsockname()[1]}"


def _env(tmp_path: Path, target: str) -> dict[str, str]:
    manifest = tmp_path / "job.yaml"
    manifest.write_text(MANIFEST.replace("CKPT", str(tmp_path / "ckpt")))
    (tmp_path / "token").write_text("t0ken")
    termination = tmp_path / "termination-log"
    termination.write_text("")
    return {"PYTHONPATH": f"{ROOT}:{tmp_path}", "PATH": "/usr/bin:/bin", "JAX_PLATFORMS": "proxy",
            "JAX_BACKEND_TARGET": target, "PATHWAYS_PROXY_CONNECTION_TIMEOUT_SECS": "3",
            contract.JAX_ENV_COMPILATION_CACHE_DIR: str(tmp_path / "compilation-cache"),
            contract.ENV_MANIFEST: str(manifest), contract.ENV_TOKEN_FILE: str(tmp_path / "token"),
            contract.ENV_HOST: "127.0.0.1", contract.ENV_PORT: "0", contract.ENV_LOG_FORMAT: "text",
            contract.ENV_TERMINATION_MESSAGE_PATH: str(termination)}


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)


def test_the_controller_initializes_pathways_first_and_a_silent_proxy_is_a_controller_loss(tmp_path, silent_proxy):
    proc = _run(["-m", "elastic_jax.controller.main"], _env(tmp_path, silent_proxy))
    assert UNKNOWN_PROXY not in proc.stderr, proc.stderr[-3000:]  # fault 1: Orbax's backend init came first
    assert proc.returncode == ControllerExit.RESTART, proc.stderr[-3000:]  # fault 4: was 1 (Failed)
    assert f"the Pathways proxy at {silent_proxy} did not answer" in proc.stderr
    message = (tmp_path / "termination-log").read_text()
    assert message.startswith(f"restart: the Pathways proxy at {silent_proxy} did not answer within the client's "
                              "connection timeout (3 s)"), message
    # Persistence on and pathwaysutils' Orbax handler registered (its log line), the cache's state said once.
    assert "overriding jax.Array" in proc.stderr
    assert proc.stderr.count("JAX's persistent compilation cache is off on Pathways") == 1
    assert not (tmp_path / "ckpt").exists()  # nothing half-done before the proxy answered


def test_a_library_program_connects_pathways_first(tmp_path, silent_proxy):
    """`elastic_jax.connect()` then the user's own jitted code: the runtime initializes Pathways itself."""
    program = "import elastic_jax, jax\nruntime = elastic_jax.connect()\nprint(jax.devices())\n"
    proc = _run(["-c", program], _env(tmp_path, silent_proxy))
    assert UNKNOWN_PROXY not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == ControllerExit.RESTART, proc.stderr[-3000:]
    assert f"controller lost: the Pathways proxy at {silent_proxy} did not answer" in proc.stderr


def test_run_module_connects_pathways_before_the_module(tmp_path, silent_proxy):
    """MaxText under `run_module`: a module that uses JAX at import sees Pathways, and a silent proxy is a loss."""
    (tmp_path / "uses_jax.py").write_text("import jax\nprint(jax.devices())\n")
    proc = _run(["-m", "elastic_jax.run_module", "uses_jax"], _env(tmp_path, silent_proxy))
    assert UNKNOWN_PROXY not in proc.stderr, proc.stderr[-3000:]
    assert proc.returncode == ControllerExit.RESTART, proc.stderr[-3000:]
