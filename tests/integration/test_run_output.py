"""What a real `elastic-jax run` tells its user on its own output (not only in the run folder's logs)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

from elastic_jax.api.client import ControlClient
from tests.support.runs import ROOT, job_manifest, leftover_processes

CLI = str(Path(sys.executable).parent / "elastic-jax")
CONTROL_API = re.compile(r"^control API: (http://127\.0\.0\.1:\d+) \(token: (\S+)\)$")


def test_the_run_prints_its_control_api_url_and_token_file_never_the_token(tmp_path):
    """Trial finding C2: the control API's port was only in controller.log. The run says, on stderr, one line
    with the URL and the token's file; the URL answers with that file's token; the token is never printed."""
    m = job_manifest("api", tmp_path, slices={"count": 1}, training={"steps": 3000, "globalBatchSize": 8})
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(m))
    proc = subprocess.Popen([CLI, "run", str(path), "--workdir", str(tmp_path / "run"), "--no-failure"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)  # (all of stderr, in order)
    reader.start()
    try:
        said = None
        deadline = time.monotonic() + 300
        while said is None and proc.poll() is None and time.monotonic() < deadline:
            said = next((m for m in map(CONTROL_API.match, map(str.strip, list(lines))) if m), None)
            time.sleep(0.1)
        assert said, "".join(lines)[-3000:]
        url, token_file = said.groups()
        assert Path(token_file) == (tmp_path / "run" / "token").resolve()
        token = Path(token_file).read_text().strip()
        client = ControlClient(url, token)
        try:
            assert client.status(retries=3).total_steps == 3000  # the printed URL is the live controller's
        finally:
            client.close()
        proc.terminate()  # (stops like Ctrl-C: a SUMMARY follows)
        out = proc.stdout.read()
        proc.wait(timeout=120)
        reader.join(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    err = "".join(lines)
    assert proc.returncode == 130, err[-3000:]
    assert sum(bool(CONTROL_API.match(ln)) for ln in err.splitlines()) == 1, err[-3000:]
    assert token not in out and token not in err
    assert not leftover_processes(str(tmp_path))
