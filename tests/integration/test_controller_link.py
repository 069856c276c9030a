"""A job whose controller never answers delays no other job's Down report (hostile-tenant trial, issue 12 item 4).

Each poll and report used to run on one of kopf's handler threads for up to its timeout, so 16 such
controllers slowed every job's failure handling to ~9 s. Here two real HTTP controllers on loopback:
job A's holds every request open until the test lets it go; job B's answers. The handlers run on a
one-thread pool standing in for kopf's handler threads, A's poll and A's pod event first. B's
controller must have acknowledged its Down while A's requests are still held: causality, no clock.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import http.server
import json
import threading

import pytest

from elastic_jax.api import labels as lbl
from elastic_jax.api.client import ControlClient
from elastic_jax.k8s_operator import handlers, metrics
from elastic_jax.k8s_operator.slices import pod_view
from elastic_jax.k8s_operator.tracker import JobTracker

STATUS = {"phase": "Running", "step": 3, "totalSteps": 10, "desiredSlices": 1, "minSlices": 1, "activeSlices": [0],
          "inactiveSlices": [], "slices": [], "pid": 7}


class _Controller(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _answer(self, body: dict) -> None:
        server = self.server
        if server.hang:
            server.entered.set()
            server.release.wait(120)  # (the test releases it; the bound only ends a broken test)
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):  # noqa: N802
        self._answer(STATUS)

    def do_PUT(self):  # noqa: N802
        report = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.reports.append((self.path, report["state"]))
        index = int(self.path.rsplit("/", 1)[1])
        self._answer({"applied": True, "sliceIndex": index, "generation": report["generation"]})


class _Server(http.server.ThreadingHTTPServer):
    # server_close() joins the handler threads: none outlives the test (a released handler wrote to a
    # socket the client had abandoned after the test, and the server printed that into the next test's output).
    daemon_threads = False
    block_on_close = True

    def handle_error(self, request, client_address):
        pass  # the client gave up on a held request (its deadline): expected here, not a failure


@pytest.fixture
def controllers():
    servers = []
    for hang in (True, False):
        server = _Server(("127.0.0.1", 0), _Controller)
        server.hang, server.entered, server.release, server.reports = hang, threading.Event(), threading.Event(), []
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    yield servers
    for server in servers:
        server.release.set()
        server.shutdown()
        server.server_close()


def _pod(job: str, name: str, role: str, ready: bool, phase="Running", exit_code=None, rv=1):
    labels = {lbl.ROLE: role, lbl.JOB_NAME: job, lbl.JOB_UID: f"uid-{job}"}
    if role == lbl.ROLE_WORKER:
        labels.update({lbl.SLICE_INDEX: "0", lbl.JOB_COMPLETION_INDEX: "0", lbl.JOBSET_RESTART_ATTEMPT: "0"})
    else:
        labels[lbl.CONTROLLER_ATTEMPT] = "0"
    status = {"phase": phase, "podIP": "127.0.0.1", "conditions": [{"type": "Ready", "status": str(ready)}]}
    if exit_code is not None:
        status["containerStatuses"] = [{"name": "worker", "state": {"terminated": {"exitCode": exit_code}}}]
    return pod_view({"metadata": {"name": name, "uid": f"{name}-uid", "resourceVersion": str(rv), "labels": labels},
                     "status": status})


def _tracker(state, job: str, server, timeout_s: float) -> JobTracker:
    url = f"http://127.0.0.1:{server.server_address[1]}"
    t = JobTracker("ns", job, 1, 1, client_factory=lambda u, token: ControlClient(url, token, timeout_s=timeout_s),
                   background=state.controller_threads)
    t.token = "tok"
    t.set_controller(_pod(job, f"{job}-controller-0", lbl.ROLE_CONTROLLER, True))
    state.jobs.add(handlers.JobState("ns", job, f"uid-{job}", "", t,
                                     ref={"metadata": {"name": job, "namespace": "ns", "uid": f"uid-{job}"}}))
    return t


def test_a_hanging_controller_does_not_delay_another_jobs_down_report(controllers, monkeypatch):
    hanging, answering = controllers
    events = []
    monkeypatch.setattr(handlers.kopf, "event", lambda ref, type, reason, message: events.append((reason, message)))
    state = handlers.OperatorState(kube=object(), key=b"k" * 32, controller_threads=True)
    a = _tracker(state, "a", hanging, timeout_s=120.0)  # A's exchanges end only when the test lets them
    b = _tracker(state, "b", answering, timeout_s=10.0)
    index = {}
    for job, t in (("a", a), ("b", b)):
        up = _pod(job, f"{job}-w0", lbl.ROLE_WORKER, True)
        t.sync([up], lambda *e: None)  # Ready (A's report hangs on A's link; B's is acknowledged)
    acked_before = metrics.NOTIFY_SECONDS._sum.get()
    for job in ("a", "b"):
        index[("ns", job, f"uid-{job}")] = [_pod(job, f"{job}-w0", lbl.ROLE_WORKER, False, "Failed", 137, rv=2)]

    kopf_threads = concurrent.futures.ThreadPoolExecutor(max_workers=1)  # kopf's handler threads, all of them
    try:
        def pod_event(job):
            return asyncio.run(handlers.worker_pod_event(namespace="ns", labels={lbl.JOB_NAME: job,
                                                                               lbl.JOB_UID: f"uid-{job}"},
                                                         job_pods=index, memo={"elasticjax": state}))

        first = [kopf_threads.submit(a.refresh_status), kopf_threads.submit(pod_event, "a")]
        assert hanging.entered.wait(30), "job A's controller never got a request"
        kopf_threads.submit(pod_event, "b").result(30)
        for f in first:
            f.result(30)  # the handlers returned: no HTTP on them
        deadline = threading.Event()
        for _ in range(300):  # B's controller acknowledges its Down on B's own link
            if b.slices[0].acked is not None and b.slices[0].acked[1] == "Down":
                break
            deadline.wait(0.1)
        assert b.slices[0].acked is not None and b.slices[0].acked[1] == "Down"
        assert ("/v1/slices/0", "Down") in answering.reports
        # ... while job A's controller still holds its requests: A acknowledged nothing
        assert not hanging.release.is_set() and a.slices[0].acked is None
        assert metrics.NOTIFY_SECONDS._sum.get() > acked_before  # B's Down, seen -> acknowledged, observed
    finally:
        hanging.release.set()
        kopf_threads.shutdown(wait=True)
        a.close()
        b.close()
