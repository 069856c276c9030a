"""`elastic-jax-controller --serve-only`: the real process serves the control API over its slice set, no JAX.

The operator scale benchmark runs 50 of these in place of training controllers; this checks that what it
talks to is the product's API: auth, stale generations, the active set following the operator's reports,
and a clean exit on SIGTERM and on `POST /v1/stop`.
"""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import pytest
import yaml

from elastic_jax import contract
from elastic_jax.api.client import ControlApiError, ControlClient
from elastic_jax.exit_codes import ControllerExit
from elastic_jax.local.processes import Child, free_port, wait_until

TOKEN = "serve-only-test-token"


def _manifest(tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({
        "apiVersion": "elasticjax.dev/v1alpha1", "kind": "ElasticTrainingJob",
        "metadata": {"name": "serve-only"},
        # a trainer that does not exist: serve-only must never import it
        "spec": {"backend": "cpu", "slices": {"count": 3, "minSlices": 2},
                 "controller": {"trainer": {"entryPoint": "no_such_module:make_trainer"}},
                 "training": {"steps": 100, "globalBatchSize": 6},
                 "checkpoint": {"uri": str(tmp_path / "ckpt")}},
    }))
    return path


@pytest.fixture
def serve_only(tmp_path):
    port = free_port()
    proc = Child("serve-only", [sys.executable, "-m", "elastic_jax.controller.main", "--serve-only",
                                         "--manifest", str(_manifest(tmp_path)), "--host", "127.0.0.1",
                                         "--port", str(port), "--log-format", "text"],
                          tmp_path / "controller.log", env={contract.ENV_TOKEN: TOKEN})
    proc.start()
    client = ControlClient(f"http://127.0.0.1:{port}", TOKEN, timeout_s=5.0)
    try:
        assert wait_until(lambda: client.ready() or not proc.alive(), timeout_s=120), "never ready"
        assert proc.alive(), proc.log_path.read_text()
        yield proc, client, port
    finally:
        client.close()
        proc.stop()


def _states(client: ControlClient) -> dict[int, str]:
    return {s.index: s.state for s in client.status().slices}


def test_serve_only_follows_the_operators_reports_without_jax(serve_only):
    proc, client, port = serve_only
    status = client.status()
    assert (status.phase, status.step, status.pid) == ("WaitingForSlices", 0, proc.pid)
    assert _states(client) == {0: "Unknown", 1: "Unknown", 2: "Unknown"}

    g = time.time_ns()
    for i in range(3):
        assert client.report_slice(i, "Ready", g + i, addresses=[f"10.0.0.{i}:8471"]).applied
    status = client.status()
    assert (status.phase, status.active_slices) == ("Running", [0, 1, 2])

    assert client.report_slice(1, "Down", g + 10, reason="pod failed").applied
    assert not client.report_slice(1, "Ready", g + 5, addresses=["10.0.0.9:8471"]).applied  # stale: ignored
    status = client.status()
    assert (status.phase, status.active_slices) == ("Running", [0, 2])
    down = next(s for s in status.slices if s.index == 1)
    assert (down.state, down.generation, down.failures) == ("Down", g + 10, 1)

    assert client.report_slice(0, "Down", g + 11).applied
    assert client.status().phase == "WaitingForSlices"  # 1 active < minSlices 2
    assert client.report_slice(1, "Ready", g + 12, addresses=["10.0.0.1:8471"]).applied
    assert client.status().active_slices == [1, 2]

    with pytest.raises(ControlApiError) as e:
        ControlClient(f"http://127.0.0.1:{port}", "wrong-token").status()
    assert e.value.status_code == 401
    # no JAX in the process: what lets 50 of them share a machine
    maps = Path(f"/proc/{proc.pid}/maps").read_text()
    assert "jaxlib" not in maps and "xla_extension" not in maps

    proc.signal(signal.SIGTERM)
    assert proc.wait(timeout_s=60) == ControllerExit.RESTART


def test_serve_only_stops_on_request(serve_only):
    proc, client, _ = serve_only
    client.stop("benchmark done")
    assert proc.wait(timeout_s=60) == ControllerExit.STOPPED


def test_a_sigkilled_controller_wakes_its_jobs_pass_at_once(serve_only):
    """Trial finding: after the controller was SIGKILLed, `kubectl get ejob` kept its old step and slices for
    ~12 s. The operator's link to it (its status watch, a long poll of the real process) fails the moment the
    process dies, and that failure wakes the job's reconcile daemon (`JobState.waker`) at once, without a
    timer tick; before it, nothing but the next 1 s tick would look."""
    import asyncio
    import os

    from elastic_jax.api import labels as lbl
    from elastic_jax.k8s_operator.job_state import JobState
    from elastic_jax.k8s_operator.slices import pod_view
    from elastic_jax.k8s_operator.tracker import JobTracker

    proc, _, port = serve_only
    tracker = JobTracker("ns", "j", 3, 1, background=True, client_factory=lambda url, token: ControlClient(
        f"http://127.0.0.1:{port}", token, timeout_s=30.0))
    job = JobState("ns", "j", "uid-j", "", tracker)
    tracker.token = TOKEN
    try:
        tracker.set_controller(pod_view({
            "metadata": {"name": "j-controller-0", "uid": "ctrl-uid", "resourceVersion": "1",
                         "labels": {lbl.ROLE: lbl.ROLE_CONTROLLER, lbl.JOB_NAME: "j", lbl.JOB_UID: "uid-j",
                                    lbl.CONTROLLER_ATTEMPT: "0"}},
            "status": {"phase": "Running", "podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]}}))
        assert wait_until(lambda: tracker.poll_result is not None, timeout_s=60), "the watch never got an answer"
        assert asyncio.run(job.waker.wait(0))  # the first answer woke it: consumed
        answers = tracker.answers
        os.kill(proc.pid, signal.SIGKILL)
        assert asyncio.run(job.waker.wait(600))  # woken by the failed exchange (the bound only ends a broken test)
        assert tracker.answers > answers and tracker.poll_result is None
    finally:
        tracker.close()
