"""A real Prometheus (Debian's `prometheus` package) for tests: on loopback, its own temp dir and a free port,
stopped by PID.

`ensure_prometheus()` finds the binary, installing the package with apt-get where the suite may (root, Debian,
apt reachable: as CI runs, and as the kind tier installs its engine); elsewhere the test skips saying why.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from e2e.harness.apt import apt_get
from elastic_jax.local.processes import free_port

DEBIAN_PACKAGE = "prometheus"


def ensure_prometheus() -> str:
    """The `prometheus` binary's path; installs Debian's package when missing and possible, else `pytest.skip`."""
    found = shutil.which("prometheus")
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("needs Prometheus: no `prometheus` on PATH and no root apt-get to install Debian's "
                    f"`{DEBIAN_PACKAGE}` package (apt-get install -y prometheus)")
    # One apt-get at a time: another lane of the suite may be installing it, or the kind tier's engine.
    install = ["install", "-y", "-qq", "--no-install-recommends", DEBIAN_PACKAGE]
    if apt_get(*install, capture_output=True).returncode != 0:
        apt_get("update", "-qq", capture_output=True)
        proc = apt_get(*install, capture_output=True, text=True)
        if proc.returncode != 0:
            pytest.skip(f"needs Prometheus: apt-get install {DEBIAN_PACKAGE} failed: {proc.stderr.strip()[-300:]}")
    return shutil.which("prometheus") or pytest.skip(f"apt-get installed {DEBIAN_PACKAGE} but no prometheus on PATH")


class Prometheus:
    """A Prometheus process scraping every second; use as a context manager (stopped by PID on exit).

    Args:
      binary: `ensure_prometheus()`.
      home: its folder (config, data, log).
      scrape_configs: Prometheus `scrape_configs` entries (dicts as in its YAML).
    """

    def __init__(self, binary: str, home: Path, scrape_configs: list[dict]):
        self.home = home
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        home.mkdir(parents=True, exist_ok=True)
        config = {"global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
                  "scrape_configs": scrape_configs}
        (home / "prometheus.yml").write_text(yaml.safe_dump(config))
        self._argv = [binary, f"--config.file={home / 'prometheus.yml'}", f"--storage.tsdb.path={home / 'data'}",
                      f"--web.listen-address=127.0.0.1:{self.port}", "--web.enable-lifecycle"]
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "Prometheus":
        self._log = (self.home / "prometheus.log").open("w")
        self.proc = subprocess.Popen(self._argv, stdout=self._log, stderr=subprocess.STDOUT, cwd=self.home)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"prometheus exited: {self.log_tail()}"
            try:
                if httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.__exit__()
        raise AssertionError(f"prometheus not ready after 120 s: {self.log_tail()}")

    def __exit__(self, *exc) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self._log.close()

    def log_tail(self) -> str:
        path = self.home / "prometheus.log"
        return path.read_text()[-2000:] if path.exists() else ""

    def query(self, expr: str) -> list[dict]:
        """The instant query's result vector (`[{"metric": {...}, "value": [t, "v"]}, ...]`).

        Raises:
          AssertionError: Prometheus refused the query (a syntax error: the message says where).
        """
        answer = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=10).json()
        assert answer["status"] == "success", f"{expr}: {answer.get('error')}"
        result = answer["data"]["result"]
        return result if isinstance(result, list) else [{"metric": {}, "value": result}]

    def targets_up(self) -> dict[str, str]:
        """`{scrape job: health}` of the active targets (health: up, down, unknown)."""
        answer = httpx.get(f"{self.url}/api/v1/targets", timeout=10).json()
        return {t["labels"]["job"]: t["health"] for t in answer["data"]["activeTargets"]}
