"""`ControllerSettings`: the controller's settings, one typed object built once from its flags and environment,
read by both entry points (`elastic-jax-controller` and `elastic_jax.connect`). Issue 11 item 5."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from elastic_jax import contract
from elastic_jax.controller.settings import DEFAULT_HOST, ControllerSettings, SettingsError, pin_host_devices
from tests.support.runs import job_manifest

CONTROLLER = str(Path(sys.executable).parent / "elastic-jax-controller")


def test_flags_win_over_the_environment_and_the_defaults_are_the_contracts():
    env = {contract.ENV_MANIFEST: "/env/job.yaml", contract.ENV_HOST: "10.0.0.1", contract.ENV_PORT: "9000",
           contract.ENV_TOKEN_FILE: "/env/token", contract.ENV_SUMMARY_FILE: "/env/summary.json",
           contract.ENV_MANIFEST_SHA256: "abc"}
    s = ControllerSettings.build(env, flags=True, manifest="/flag/job.yaml", token_file="/flag/token", port=0)
    assert (s.manifest, s.token_file, s.host, s.port, s.summary_file, s.manifest_sha256) == (
        "/flag/job.yaml", "/flag/token", "10.0.0.1", 0, "/env/summary.json", "abc")
    bare = ControllerSettings.build({contract.ENV_MANIFEST: "/j.yaml"})
    assert (bare.host, bare.port, bare.token_file, bare.summary_file, bare.manifest_sha256) == (
        DEFAULT_HOST, contract.CONTROLLER_PORT, None, None, None)


@pytest.mark.parametrize("env, flags, port, message", [
    ({}, True, None, f"--manifest (or {contract.ENV_MANIFEST}) is required"),
    ({}, False, None, f"{contract.ENV_MANIFEST} is not set"),
    ({contract.ENV_PORT: "http"}, True, None, f"{contract.ENV_PORT} 'http': must be 0..65535"),
    ({contract.ENV_PORT: "-1"}, False, None, f"{contract.ENV_PORT} '-1': must be 0..65535"),
    ({contract.ENV_PORT: "70000"}, False, None, f"{contract.ENV_PORT} 70000: must be 0..65535"),
    ({}, True, -3, "--port -3: must be 0..65535"),
])
def test_a_missing_manifest_or_a_bad_port_is_one_line_naming_it(env, flags, port, message):
    env = dict(env)
    if "is required" not in message and "is not set" not in message:
        env[contract.ENV_MANIFEST] = "/j.yaml"
    with pytest.raises(SettingsError) as e:
        ControllerSettings.build(env, flags=flags, port=port)
    assert message in str(e.value)


def test_the_token_is_the_files_else_the_variables_and_its_absence_names_where_to_set_it(tmp_path):
    (tmp_path / "token").write_text(" secret\n")
    env = {contract.ENV_MANIFEST: "/j.yaml"}
    assert ControllerSettings.build({**env, contract.ENV_TOKEN_FILE: str(tmp_path / "token")}).token() == "secret"
    assert ControllerSettings.build({**env, contract.ENV_TOKEN: "t"}).token() == "t"
    with pytest.raises(SettingsError, match=f"no control-API token: set --token-file, {contract.ENV_TOKEN_FILE} or"):
        ControllerSettings.build(env, flags=True).token()
    with pytest.raises(SettingsError, match=f"no control-API token: set {contract.ENV_TOKEN_FILE} or"):
        ControllerSettings.build(env).token()
    with pytest.raises(SettingsError, match="--token-file /nope: No such file"):
        ControllerSettings.build(env, flags=True, token_file="/nope").token()
    with pytest.raises(SettingsError, match=f"{contract.ENV_TOKEN_FILE} /nope: No such file"):
        ControllerSettings.build({**env, contract.ENV_TOKEN_FILE: "/nope"}, flags=True).token()


def test_only_a_cpu_job_pins_the_host_devices():
    env = {"XLA_FLAGS": "--xla_dump_to=/tmp/x"}
    pin_host_devices("pathways", 4, env)
    assert env == {"XLA_FLAGS": "--xla_dump_to=/tmp/x"}
    pin_host_devices("cpu", 4, env)
    assert env == {"JAX_PLATFORMS": "cpu",
                   "XLA_FLAGS": "--xla_dump_to=/tmp/x --xla_force_host_platform_device_count=4"}


def test_a_bad_port_variable_is_a_one_line_error_of_the_controller_not_a_traceback(tmp_path):
    """`elastic-jax-controller` read ELASTIC_JAX_PORT with `int()` while building its argument parser: a value
    that is not a number was a ValueError traceback (exit 1), where `connect()` said one line."""
    manifest = tmp_path / "job.yaml"
    manifest.write_text(yaml.safe_dump(job_manifest("settings", tmp_path)))
    proc = subprocess.run([CONTROLLER, "--manifest", str(manifest)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env={**os.environ, contract.ENV_PORT: "http"})
    assert proc.returncode == 2, proc.stderr
    assert f"error: {contract.ENV_PORT} 'http': must be 0..65535" in proc.stderr and "Traceback" not in proc.stderr
