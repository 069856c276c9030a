"""The MaxText controller image (target ``controller-maxtext``), built here, runs MaxText's trainer.

Issue 13 item 3: the image CI builds like the others (on a Python 3.12 base
made here, :func:`e2e.kind.images.python312_base`) runs as the pod would run it
(uid 65532, read-only root, ``/tmp`` the only writable place, no network):
``python -m elastic_jax.run_module maxtext.trainers.pre_train.train ...`` with
MaxText 0.2.5 itself, a tiny decoder on the CPU (no TPUs here; the ``cpu``
backend), synthetic data and Orbax checkpoints in a mounted folder. The control
API answers while MaxText trains (what the controller pod's probes and the
operator's slice reports need), and the exit code is MaxText's.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

import yaml

from elastic_jax import contract
from elastic_jax.api.images import MAXTEXT_IMAGE

ROOT = Path(__file__).resolve().parents[2]
CONSTRAINTS = ROOT / "controller_image" / "constraints-maxtext.txt"
TOKEN = "maxtext-image-test-token"
RUN_S = 900.0
"""Bound on the container's run (seconds): import and compile of the tiny model take ~40 s on an idle core."""

# A decoder small enough to compile in seconds on a loaded CPU; MaxText's own base.yml for the rest.
MAXTEXT_ARGS = [
    "maxtext.trainers.pre_train.train", "src/maxtext/configs/base.yml", "run_name=image-test",
    "base_output_directory=/out/maxtext", "hardware=cpu", "skip_jax_distributed_system=true",
    "dataset_type=synthetic", "steps=4", "per_device_batch_size=1", "max_target_length=32",
    "base_emb_dim=32", "base_num_query_heads=2", "base_num_kv_heads=2", "base_mlp_dim=64",
    "base_num_decoder_layers=2", "head_dim=16", "vocab_size=128",
    "enable_checkpointing=true", "async_checkpointing=false", "checkpoint_period=2",
]


def _pins() -> dict[str, str]:
    lines = [l for l in CONSTRAINTS.read_text().splitlines() if l and not l.startswith("#")]
    return dict(l.split("==", 1) for l in lines)


def _job_dir() -> Path:
    job = {
        "apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob",
        "metadata": {"name": "maxtext-image", "namespace": "default"},
        "spec": {"backend": "cpu", "slices": {"count": 1},
                 "controller": {"command": ["python", "-m", "elastic_jax.run_module"], "args": MAXTEXT_ARGS},
                 "training": {"steps": 4, "globalBatchSize": 1},
                 "checkpoint": {"uri": "/out/maxtext"}},
    }
    d = Path(tempfile.mkdtemp(prefix="ejx-maxtext-"))
    (d / "job.yaml").write_text(yaml.safe_dump(job))
    (d / "token").write_text(TOKEN)
    (d / "out").mkdir()
    for p in (d, d / "job.yaml", d / "token"):  # read by uid 65532 through the bind mount
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    os.chown(d / "out", 65532, 65532)  # the container's only writable mount that outlives it
    return d


def test_the_maxtext_image_has_the_pinned_maxtext_and_jax(docker_engine, maxtext_image):
    out = docker_engine.docker(
        "run", "--rm", "--network", "none", "--read-only", "--entrypoint", "python", maxtext_image, "-c",
        "import importlib.metadata as m, sys; print(sys.version_info[:2], m.version('maxtext'), m.version('jax'), "
        "m.version('pathwaysutils'), m.version('elastic-jax'))", timeout=300).stdout.decode()
    pins = _pins()
    assert out.split() == ["(3,", "12)", pins["maxtext"], pins["jax"], pins["pathwaysutils"],
                           MAXTEXT_IMAGE.name.rsplit(":", 1)[1]], out


def test_maxtext_trains_under_run_module_in_the_image(docker_engine, maxtext_image):
    job_dir = _job_dir()
    name = f"ejx-maxtext-{os.getpid()}"
    env = {contract.ENV_MANIFEST: "/job/job.yaml", contract.ENV_TOKEN_FILE: "/job/token",
           contract.ENV_HOST: "127.0.0.1", contract.ENV_PORT: "8080",
           contract.ENV_SUMMARY_FILE: "/out/summary.json"}
    env_args = [a for k, v in env.items() for a in ("-e", f"{k}={v}")]
    docker_engine.docker(
        "run", "-d", "--name", name, "--network", "none", "--read-only", "--user", "65532:65532",
        "--tmpfs", "/tmp:rw,exec,size=2g,uid=65532", "-v", f"{job_dir}:/job:ro",
        "-v", f"{job_dir / 'out'}:/out:rw", *env_args,
        "--entrypoint", "python", maxtext_image, "-m", "elastic_jax.run_module", *MAXTEXT_ARGS, timeout=120)
    try:
        # While MaxText runs, the control API answers with the job's token, and refuses another
        # (in the container's own network namespace: --network none).
        probe = ("import json, sys, urllib.error, urllib.request as u\n"
                 "def get(token):\n"
                 "    r = u.Request('http://127.0.0.1:8080/v1/status', headers={'Authorization': 'Bearer ' + token})\n"
                 "    try:\n"
                 "        return json.load(u.urlopen(r, timeout=10))['totalSteps']\n"
                 "    except urllib.error.HTTPError as e:\n"
                 "        return e.code\n"
                 f"print(get({TOKEN!r}), get('not-the-token'))")
        answered, deadline = None, time.monotonic() + RUN_S
        while time.monotonic() < deadline:
            state = docker_engine.docker("inspect", "-f", "{{.State.Running}}", name).stdout.decode().strip()
            if answered is None:
                proc = docker_engine.docker("exec", name, "python", "-c", probe, check=False, timeout=60)
                if proc.returncode == 0:
                    answered = proc.stdout.decode().strip()
            if state != "true":
                break
            time.sleep(1.0)
        else:
            raise AssertionError(f"MaxText still running after {RUN_S:.0f}s")
        code = int(docker_engine.docker("inspect", "-f", "{{.State.ExitCode}}", name).stdout)
        logs = docker_engine.docker("logs", name).stderr.decode(errors="replace")
        assert code == 0, logs[-4000:]
        assert answered == "4 401", f"control API never answered as it should ({answered}) during the run; logs:\n{logs[-3000:]}"
        # MaxText's own loop ran all its steps and committed its Orbax checkpoints every 2 steps.
        assert "completed step: 3" in logs, logs[-3000:]
        checkpoints = job_dir / "out" / "maxtext" / "image-test" / "checkpoints"
        steps = sorted(int(p.name) for p in checkpoints.iterdir() if p.name.isdigit()) if checkpoints.is_dir() else []
        assert steps and steps[0] == 0 and 2 in steps, (sorted(checkpoints.parent.rglob("*"))[:40], logs[-2000:])
        summary = json.loads((job_dir / "out" / "summary.json").read_text())
        assert summary["exit_code"] == 0 and summary["succeeded"] is True, summary
    finally:
        docker_engine.docker("rm", "-f", name, check=False, timeout=120)
        shutil.rmtree(job_dir, ignore_errors=True)
