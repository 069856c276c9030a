"""A controller stuck in its own code under `elastic-jax run`: a real run whose trainer's data read blocks.

Issue 31 item 12 (jax#38503): a blocked data read left the run `Running` and
silent (150 s at the default settings, until `progressTimeoutSeconds`), and the
stall was booked as productive goodput. Now, once the training loop has been in
the controller's own code (not waiting on any slice) for longer than a step may
take (`spec.elasticity.stepDeadlineSeconds`), `/v1/status` says so (`stalled`),
`elastic-jax run` prints it as a `warning:` line, and the seconds are booked
`stalled`, never productive.

Issue 9 item 3: the no-progress watchdog. `/healthz` (real HTTP, what the pod's
livenessProbe calls) answers 200 while steps complete and through the notice,
and 503 once none did for `progressTimeoutSeconds`; the log says why.

One run shows both, in the order they happen (the notice at the step deadline,
the 503 at the progress timeout): two runs of the same blocked job did before.
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
from tests.support.trainers import BLOCK_AFTER_EXAMPLES

CLI = str(Path(sys.executable).parent / "elastic-jax")
DEADLINE_S = 10
PROGRESS_TIMEOUT_S = 30
"""Above the first-step deadline (the rule), and far enough above DEADLINE_S that `/healthz` is read while
the notice is out and the watchdog not yet due."""


def _wait_for(predicate, what: str, timeout_s: float = 300):
    """`predicate()`'s first true answer (polled every 0.25 s, for at most `timeout_s`)."""
    found = []
    assert wait_until(lambda: found.append(predicate()) or found[-1], timeout_s, 0.25), f"timed out waiting for {what}"
    return found[-1]


def test_a_blocked_data_read_is_said_never_booked_productive_and_fails_the_liveness_check_at_the_bound(tmp_path):
    m = job_manifest("stall", tmp_path, training={"steps": 1000, "globalBatchSize": 8, "logEverySteps": 1},
                     checkpoint={"uri": str(tmp_path / "ckpt"), "intervalSteps": 1000},
                     controller={"trainer": {"entryPoint": "tests.support.trainers:blocking_data_trainer",
                                             "config": dict(TINY_TRAINER)}},
                     # (a step deadline missed re-reads a batch, so the block comes earlier: far above a
                     # loaded machine's step, and below the progress timeout, which must exceed both)
                     elasticity={"stepDeadlineSeconds": DEADLINE_S, "firstStepDeadlineSeconds": 25,
                                 "progressTimeoutSeconds": PROGRESS_TIMEOUT_S})
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
        healthz = f"http://127.0.0.1:{port}/healthz"

        def status() -> dict:
            return httpx.get(f"http://127.0.0.1:{port}/v1/status", headers={"Authorization": f"Bearer {token}"},
                             timeout=10).json()

        def logged_step() -> int:
            return max((e["step"] for e in events() if e["event"] == "step"), default=0)

        _wait_for(lambda: logged_step() >= 3, "step 3")
        assert httpx.get(healthz, timeout=10).status_code == 200  # training: healthy
        line = _wait_for(lambda: next((ln for ln in err_path.read_text().splitlines()
                                       if ln.startswith("warning: stalled:")), None), "the run to say it is stalled")
        assert f"spec.elasticity.stepDeadlineSeconds={DEADLINE_S} s" in line and "data read" in line, line
        assert proc.poll() is None  # alive: only the notice tells
        first = status()
        assert first["stalled"] and first["phase"] == "Running", first
        blocked_at = first["step"]
        assert 3 <= blocked_at <= BLOCK_AFTER_EXAMPLES // 8 and logged_step() == blocked_at, (blocked_at, first)
        time.sleep(3)
        later = status()
        assert later["step"] == blocked_at  # stuck: no step since
        # The stall's seconds go to `stalled`, none to productive.
        assert later["goodputSeconds"]["productive"] == first["goodputSeconds"]["productive"], (first, later)
        assert later["goodputSeconds"]["stalled"] >= first["goodputSeconds"]["stalled"] + 2 >= DEADLINE_S, later
        assert err_path.read_text().count("warning: stalled:") == 1  # said once, not per poll
        assert [e for e in events() if e["event"] == "stall_noticed"]
        # The notice is no liveness failure: within the progress timeout the controller is still healthy.
        assert not [e for e in events() if e["event"] == "stalled"]
        assert httpx.get(healthz, timeout=10).status_code == 200
        answer = _wait_for(lambda: (r := httpx.get(healthz, timeout=10)).status_code == 503 and r, "healthz 503")
        assert answer.text == "stalled"  # public endpoint: the reason is in the log, not the body
        stalled = [e for e in events() if e["event"] == "stalled"]
        assert len(stalled) == 1, stalled  # logged once, not per probe
        assert f"progressTimeoutSeconds={PROGRESS_TIMEOUT_S}" in stalled[0]["msg"]
        assert f"after step {blocked_at}" in stalled[0]["msg"]
        # Not before the bound: from the blocked step's completion (its log record) to the watchdog's.
        done = [e["ts"] for e in events() if e["event"] == "step" and e["step"] == blocked_at]
        assert stalled[0]["ts"] - done[-1] >= PROGRESS_TIMEOUT_S - 1, (stalled[0], done)
        assert proc.poll() is None  # the process itself is alive: only the watchdog can tell
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        for p in leftover_processes(str(tmp_path)):
            p.kill()
