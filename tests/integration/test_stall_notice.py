"""Issue 31 item 12 (jax#38503): a controller stuck in its own code under `elastic-jax run`.

A blocked data read left the run `Running` and silent (150 s at the default
settings, until `progressTimeoutSeconds`), and the stall was booked as
productive goodput. Now, once the training loop has been in the controller's
own code (not waiting on any slice) for longer than a step may take
(`spec.elasticity.stepDeadlineSeconds`), `/v1/status` says so (`stalled`),
`elastic-jax run` prints it as a `warning:` line, and the seconds are booked
`stalled`, never productive. A real run whose trainer's data read blocks.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

from elastic_jax.local.processes import wait_until
from elastic_jax.logs import read_events
from tests.support.runs import ROOT, TINY_TRAINER, job_manifest, leftover_processes

CLI = str(Path(sys.executable).parent / "elastic-jax")
DEADLINE_S = 10


def _wait_for(predicate, what: str, timeout_s: float = 300):
    """`predicate()`'s first true answer (polled every 0.25 s, for at most `timeout_s`)."""
    found = []
    assert wait_until(lambda: found.append(predicate()) or found[-1], timeout_s, 0.25), f"timed out waiting for {what}"
    return found[-1]


def test_a_blocked_data_read_is_said_in_the_runs_output_and_never_booked_productive(tmp_path):
    m = job_manifest("stall", tmp_path, training={"steps": 1000, "globalBatchSize": 8, "logEverySteps": 1},
                     checkpoint={"uri": str(tmp_path / "ckpt"), "intervalSteps": 1000},
                     controller={"trainer": {"entryPoint": "tests.support.trainers:blocking_data_trainer",
                                             "config": dict(TINY_TRAINER)}},
                     # (progressTimeoutSeconds stays at its default, 1800 s: the notice comes long before)
                     elasticity={"stepDeadlineSeconds": DEADLINE_S, "firstStepDeadlineSeconds": 60})
    (tmp_path / "job.yaml").write_text(yaml.safe_dump(m))
    err_path = tmp_path / "stderr.txt"
    with open(err_path, "w") as err:
        proc = subprocess.Popen([CLI, "run", str(tmp_path / "job.yaml"), "--workdir", str(tmp_path / "run")],
                                stdout=subprocess.DEVNULL, stderr=err, text=True, cwd=tmp_path,
                                env={**os.environ, "PYTHONPATH": str(ROOT)}, start_new_session=True)
    log = tmp_path / "run" / "controller.log"
    try:
        events = lambda: read_events(log.read_text()) if log.exists() else []  # noqa: E731
        port = _wait_for(lambda: next((e["port"] for e in events() if e["event"] == "ready"), None), "ready")
        token = (tmp_path / "run" / "token").read_text().strip()

        def status() -> dict:
            return httpx.get(f"http://127.0.0.1:{port}/v1/status", headers={"Authorization": f"Bearer {token}"},
                             timeout=10).json()

        line = _wait_for(lambda: next((ln for ln in err_path.read_text().splitlines()
                                       if ln.startswith("warning: stalled:")), None), "the run to say it is stalled")
        assert f"spec.elasticity.stepDeadlineSeconds={DEADLINE_S} s" in line and "data read" in line, line
        assert proc.poll() is None  # alive: only the notice tells
        first = status()
        assert first["stalled"] and first["phase"] == "Running", first
        time.sleep(3)
        later = status()
        assert later["step"] == first["step"]  # stuck: no step since
        # The stall's seconds go to `stalled`, none to productive.
        assert later["goodputSeconds"]["productive"] == first["goodputSeconds"]["productive"], (first, later)
        assert later["goodputSeconds"]["stalled"] >= first["goodputSeconds"]["stalled"] + 2 >= DEADLINE_S, later
        assert err_path.read_text().count("warning: stalled:") == 1  # said once, not per poll
        assert [e for e in events() if e["event"] == "stall_noticed"]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        for p in leftover_processes(str(tmp_path)):
            p.kill()
