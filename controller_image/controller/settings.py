"""The controller process's settings: one typed object, built once from its command line and environment.

Two entry points start a controller: `elastic-jax-controller` (`main`, the built-in trainer host) and a
user's own program calling `elastic_jax.connect()` (library mode). Both read the variables the operator
sets in the controller pod and `elastic-jax run` sets locally (`elastic_jax.contract`); `ControllerSettings`
is the one reader of them, so the two cannot drift (before, each read them itself: a bad
`ELASTIC_JAX_PORT` was a traceback from one and a one-line error from the other). Standard library and the
contract only: `main` builds it before jax is imported.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from elastic_jax import contract

DEFAULT_HOST = "0.0.0.0"
"""Where the control API binds when neither `--host` nor `ELASTIC_JAX_HOST` says (all of the pod's addresses)."""


class SettingsError(ValueError):
    """A setting is missing or wrong; the message is one line naming it."""


def _name(flag: str | None, env: str, from_flag: bool) -> str:
    """How an error names a setting: the flag when the command line gave it, else the variable."""
    return flag if flag is not None and from_flag else env


@dataclasses.dataclass(frozen=True)
class ControllerSettings:
    """What a controller process is told to do, before it reads its manifest.

    Attributes:
      manifest: path of the job's manifest (`--manifest`, `ELASTIC_JAX_MANIFEST`).
      manifest_sha256: the digest the manifest must have (`ELASTIC_JAX_MANIFEST_SHA256`, operator-set), or None.
      token_file: file holding the control-API token (`--token-file`, `ELASTIC_JAX_TOKEN_FILE`), or None.
      token_value: the token itself when there is no file (`ELASTIC_JAX_TOKEN`, the local launcher's), or None.
      host: the control API's bind address (`--host`, `ELASTIC_JAX_HOST`; default `DEFAULT_HOST`).
      port: its TCP port, 0..65535, 0 picks a free one (`--port`, `ELASTIC_JAX_PORT`; default
        `contract.CONTROLLER_PORT`).
      summary_file: where the run's JSON summary goes (`--summary-file`, `ELASTIC_JAX_SUMMARY_FILE`), or None.
      flags: built with a command line (`main`): errors name the flags, not only the variables.
      token_from_flag: the token file came from `--token-file` (its errors name the flag).
    """

    manifest: str
    manifest_sha256: str | None = None
    token_file: str | None = None
    token_value: str | None = None
    host: str = DEFAULT_HOST
    port: int = contract.CONTROLLER_PORT
    summary_file: str | None = None
    flags: bool = False
    token_from_flag: bool = False

    @classmethod
    def build(cls, environ: Mapping[str, str], *, flags: bool = False, manifest: str | None = None,
              token_file: str | None = None, host: str | None = None, port: int | None = None,
              summary_file: str | None = None) -> "ControllerSettings":
        """The settings from `environ`, where the keyword arguments (the command line's, None: not given) win.

        Args:
          environ: the process environment (`os.environ`, or a test's mapping).
          flags: a command line exists (`elastic-jax-controller`): errors name its flags too.
          manifest, token_file, host, port, summary_file: the command line's values.

        Raises:
          SettingsError: no manifest, or a port that is not a number in 0..65535.
        """
        manifest = manifest or environ.get(contract.ENV_MANIFEST)
        if not manifest:
            raise SettingsError(f"--manifest (or {contract.ENV_MANIFEST}) is required" if flags else
                                f"{contract.ENV_MANIFEST} is not set (the operator or elastic-jax run sets it)")
        if port is None:
            raw = environ.get(contract.ENV_PORT, str(contract.CONTROLLER_PORT))
            if not raw.isdigit():
                raise SettingsError(f"{contract.ENV_PORT} {raw!r}: must be 0..65535 (0 picks a free port)")
            port, port_name = int(raw), contract.ENV_PORT
        else:
            port_name = "--port"
        if not 0 <= port <= 65535:
            raise SettingsError(f"{port_name} {port}: must be 0..65535 (0 picks a free port)")
        return cls(manifest=manifest, manifest_sha256=environ.get(contract.ENV_MANIFEST_SHA256) or None,
                   token_file=token_file or environ.get(contract.ENV_TOKEN_FILE) or None,
                   token_value=environ.get(contract.ENV_TOKEN) or None,
                   host=host or environ.get(contract.ENV_HOST) or DEFAULT_HOST, port=port,
                   summary_file=summary_file or environ.get(contract.ENV_SUMMARY_FILE) or None,
                   flags=flags, token_from_flag=token_file is not None)

    def token(self) -> str:
        """The control-API token: the token file's content (stripped), else `token_value`.

        Raises:
          SettingsError: the file cannot be read, or there is no token (an empty one included).
        """
        if self.token_file:
            try:
                value = Path(self.token_file).read_text().strip()
            except OSError as e:
                name = _name("--token-file", contract.ENV_TOKEN_FILE, self.token_from_flag)
                raise SettingsError(f"{name} {self.token_file}: {e.strerror}") from None
        else:
            value = (self.token_value or "").strip()
        if not value:
            where = f"--token-file, {contract.ENV_TOKEN_FILE}" if self.flags else contract.ENV_TOKEN_FILE
            raise SettingsError(f"no control-API token: set {where} or {contract.ENV_TOKEN}")
        return value


def pin_host_devices(backend: str, devices_per_host: int, environ: MutableMapping[str, str] = os.environ) -> None:
    """Makes this process see as many CPU devices as a worker host (cpu backend; only before jax loads).

    The exported per-slice program records its device count, so the controller that exports it must see
    as many local devices as a worker host has. Both entry points call this right after reading the manifest.

    Args:
      backend: `spec.backend`; anything but "cpu" changes nothing.
      devices_per_host: `spec.slices.devicesPerHost`.
      environ: the environment to set (default `os.environ`).
    """
    if backend != "cpu":
        return
    environ.setdefault("JAX_PLATFORMS", "cpu")
    if devices_per_host > 1:
        flag = f"--xla_force_host_platform_device_count={devices_per_host}"
        environ["XLA_FLAGS"] = (environ.get("XLA_FLAGS", "") + " " + flag).strip()
