"""examples/03-maxtext-pathways.yaml (MaxText as the controller command) and `python -m elastic_jax.run_module`.

The example's rendered children are a golden file of tests/unit/test_operator_pathways.py
(case `example-03-maxtext`); here: it passes `validate --cluster`, its MaxText flags agree
with the job's own fields, its Pathways server image matches the jax that the MaxText image
pins, and run_module (a real subprocess, real HTTP on loopback) serves the control API while
the module runs and exits with the module's code.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from elastic_jax import contract
from elastic_jax.api.manifest import parse_manifest
from elastic_jax.cli import app
from elastic_jax.exit_codes import ControllerExit
from elastic_jax.k8s_operator import backends
from elastic_jax.k8s_operator.backends.pathways import proxy_image, server_image
from elastic_jax.local.processes import free_port

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "03-maxtext-pathways.yaml"
MAXTEXT_CONSTRAINTS = ROOT / "controller_image" / "constraints-maxtext.txt"
TOKEN = "run-module-token"


def _manifest() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def _maxtext_flags(manifest: dict) -> dict[str, str]:
    """MaxText's key=value overrides from spec.controller.args."""
    return dict(a.split("=", 1) for a in manifest["spec"]["controller"]["args"] if "=" in a)


def test_example_passes_validate_cluster():
    result = CliRunner().invoke(app, ["validate", "--cluster", str(EXAMPLE)])
    assert result.exit_code == 0, result.output


def test_example_runs_maxtexts_trainer_under_run_module_with_elastic_settings():
    manifest = _manifest()
    controller = manifest["spec"]["controller"]
    assert controller["command"] == ["python", "-m", "elastic_jax.run_module"]
    assert controller["args"][0] == "maxtext.trainers.pre_train.train"
    flags = _maxtext_flags(manifest)
    spec = manifest["spec"]
    # MaxText refuses elastic_enabled without the single controller (Pathways).
    assert flags["enable_single_controller"] == flags["elastic_enabled"] == "true"
    assert flags["enable_checkpointing"] == "true"
    # The job's own fields say the same as MaxText's flags: the operator reads steps on exit 0.
    assert int(flags["steps"]) == spec["training"]["steps"]
    assert int(flags["elastic_min_slice_count"]) == spec["slices"]["minSlices"]
    assert int(flags["elastic_max_retries"]) == spec["elasticity"]["maxRestarts"]
    assert float(flags["elastic_timeout_seconds"]) == spec["elasticity"]["sliceWaitTimeoutSeconds"]
    assert flags["base_output_directory"].startswith("gs://")


def test_example_pathways_images_are_the_release_of_the_maxtext_images_jax():
    pins = dict(line.split("==", 1) for line in MAXTEXT_CONSTRAINTS.read_text().splitlines()
                if line and not line.startswith("#"))
    job = backends.resolve(parse_manifest(_manifest()))
    tag = f"jax-{pins['jax']}"
    assert server_image(job) == f"us-docker.pkg.dev/cloud-tpu-v2-images/pathways/server:{tag}"
    assert proxy_image(job) == f"us-docker.pkg.dev/cloud-tpu-v2-images/pathways/proxy_server:{tag}"
    assert pins["maxtext"] == "0.2.5"


# -- run_module ---------------------------------------------------------------------------------------------


def _run(tmp_path, *argv: str, port: int | None = None, manifest_text: str | None = None) -> subprocess.CompletedProcess:
    """`python -m elastic_jax.run_module argv...` with the example (or `manifest_text`) as the job and tmp_path
    on PYTHONPATH."""
    manifest = tmp_path / "job.yaml"
    manifest.write_text(EXAMPLE.read_text() if manifest_text is None else manifest_text)
    token = tmp_path / "token"
    token.write_text(TOKEN)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
           contract.ENV_MANIFEST: str(manifest), contract.ENV_TOKEN_FILE: str(token),
           contract.ENV_HOST: "127.0.0.1", contract.ENV_PORT: str(port if port is not None else free_port())}
    proc = subprocess.Popen([sys.executable, "-m", "elastic_jax.run_module", *argv], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.slow  # (a real run_module process serving HTTP: ~15 s at load 10)
def test_module_runs_as_main_with_its_args_while_the_control_api_serves(tmp_path):
    port = free_port()
    (tmp_path / "fake_trainer.py").write_text(textwrap.dedent(f"""
        import sys, urllib.request
        if __name__ == "__main__":
            req = urllib.request.Request("http://127.0.0.1:{port}/v1/status",
                                         headers={{"Authorization": "Bearer {TOKEN}"}})
            with urllib.request.urlopen(req, timeout=30) as r:
                print("status", r.status, r.read().decode())
            with urllib.request.urlopen("http://127.0.0.1:{port}/readyz", timeout=30) as r:
                print("readyz", r.status)
            print("argv0", sys.argv[0].endswith("fake_trainer.py"), "args", sys.argv[1:])
            sys.exit(3)
    """))
    result = _run(tmp_path, "fake_trainer", "src/maxtext/configs/base.yml", "steps=5", port=port)
    assert result.returncode == 3, result.stderr
    assert "readyz 200" in result.stdout, result.stdout
    assert re.search(r'status 200 .*"desiredSlices": ?2', result.stdout), result.stdout
    # As `python -m fake_trainer ...` would: argv[0] the module's file, then its arguments.
    assert "argv0 True args ['src/maxtext/configs/base.yml', 'steps=5']" in result.stdout, result.stdout


def test_module_that_returns_exits_0(tmp_path):
    (tmp_path / "quiet_trainer.py").write_text("print('trained')\n")
    result = _run(tmp_path, "quiet_trainer")
    assert (result.returncode, result.stdout.strip()) == (0, "trained"), result.stderr


@pytest.mark.parametrize("argv, message", [
    ((), "no module given"),
    (("--help",), "no module given"),
    (("maxtext_not_installed.trainers.train", "steps=5"),
     "module 'maxtext_not_installed.trainers.train' (spec.controller.args[0]) is not installed"),
])
def test_missing_or_unknown_module_is_bad_input_naming_the_field(tmp_path, argv, message):
    result = _run(tmp_path, *argv)
    assert result.returncode == ControllerExit.BAD_INPUT
    assert message in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_runtime_that_cannot_start_is_bad_input_without_a_traceback(tmp_path):
    (tmp_path / "quiet_trainer.py").write_text("print('trained')\n")
    result = _run(tmp_path, "quiet_trainer", port=70000)
    assert result.returncode == ControllerExit.BAD_INPUT
    assert contract.ENV_PORT in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert "trained" not in result.stdout


# -- MaxText's elastic manager takes the operator's reports (elastic_jax.maxtext_plug) ----------------------

# The part of MaxText 0.2.5's maxtext/utils/elastic_utils.py the plug relies on (its wheel; MaxText itself
# needs Python >= 3.12 and Pathways): the module global and the one place it builds its own Manager.
_STANDIN_ELASTIC_UTILS = """
from pathwaysutils.elastic import manager
elastic_manager = None
def ensure_elastic_manager_initialized(config=None):
    global elastic_manager
    if elastic_manager is None:
        elastic_manager = manager.Manager()
"""
_STANDIN_TRAIN = """
from maxtext.utils import elastic_utils
if __name__ == "__main__":
    before = elastic_utils.elastic_manager
    print("before", type(before).__name__, getattr(before, "built", None))
    try:
        elastic_utils.ensure_elastic_manager_initialized()
        print("after", type(elastic_utils.elastic_manager).__name__, elastic_utils.elastic_manager is before)
    except Exception as e:  # pathways-utils' own Manager cannot start on CPU devices (no slice_index)
        print("own manager failed", type(e).__name__)
"""


def _standin_maxtext(tmp_path) -> None:
    for sub in ("maxtext", "maxtext/utils", "maxtext/trainers", "maxtext/trainers/pre_train"):
        (tmp_path / sub).mkdir(parents=True, exist_ok=True)
        (tmp_path / sub / "__init__.py").write_text("")
    (tmp_path / "maxtext/utils/elastic_utils.py").write_text(_STANDIN_ELASTIC_UTILS)
    (tmp_path / "maxtext/trainers/pre_train/train.py").write_text(_STANDIN_TRAIN)


@pytest.mark.slow  # (a real run_module process importing jax and pathwaysutils: ~11 s at load 10)
def test_maxtexts_elastic_manager_is_ours_and_built_only_when_maxtext_uses_it(tmp_path):
    """Under run_module on pathways, MaxText's `elastic_manager` global is a `LazyManager` before its trainer
    runs (nothing built: building lists jax.devices(), which must wait for pathwaysutils.initialize()), and
    MaxText's own `ensure_elastic_manager_initialized` keeps it instead of building pathways-utils' Manager."""
    _standin_maxtext(tmp_path)
    result = _run(tmp_path, "maxtext.trainers.pre_train.train", "src/maxtext/configs/base.yml")
    assert result.returncode == 0, result.stderr
    assert "before LazyManager False" in result.stdout, result.stdout
    assert "after LazyManager True" in result.stdout, result.stdout
    assert "takes the operator's slice reports" in result.stderr, result.stderr


@pytest.mark.slow  # (a real run_module process importing jax: ~10 s at load 10)
def test_maxtext_keeps_its_own_manager_off_pathways(tmp_path):
    _standin_maxtext(tmp_path)
    manifest = yaml.safe_load(EXAMPLE.read_text())
    manifest["spec"]["backend"] = "cpu"
    for key in ("accelerator", "topology"):
        manifest["spec"]["slices"].pop(key, None)
    manifest["spec"].pop("worker", None)
    manifest["spec"]["checkpoint"]["uri"] = str(tmp_path / "ckpt")
    result = _run(tmp_path, "maxtext.trainers.pre_train.train", manifest_text=yaml.safe_dump(manifest))
    assert "before NoneType None" in result.stdout, (result.stdout, result.stderr)
    assert "takes the operator's slice reports" not in result.stderr, result.stderr
