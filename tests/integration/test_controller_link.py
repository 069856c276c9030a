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
from elastic_jax.k8s_operator import handlers, job_pass, metrics, operator_state
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
        server = self.server
        server.gets.append(self.path)
        if server.hang_gets:  # a status long poll held open; reports still answered
            server.get_entered.set()
            server.release.wait(120)
        self._answer(STATUS if server.version is None else {**STATUS, "version": server.version})

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
        # (version None: a controller from before long polls, which ignores `after` and `wait`)
        server.hang_gets, server.get_entered, server.gets, server.version = False, threading.Event(), [], None
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
    state.jobs.add(job_pass.JobState("ns", job, f"uid-{job}", "", t,
                                     ref={"metadata": {"name": job, "namespace": "ns", "uid": f"uid-{job}"}}))
    return t


def test_a_hanging_controller_does_not_delay_another_jobs_down_report(controllers, monkeypatch):
    hanging, answering = controllers
    events = []
    monkeypatch.setattr(handlers.kopf, "event", lambda ref, type, reason, message: events.append((reason, message)))
    state = operator_state.OperatorState(kube=object(), key=b"k" * 32, controller_threads=True)
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


def _wait(predicate, what: str):
    pause = threading.Event()
    for _ in range(600):
        if predicate():
            return
        pause.wait(0.05)
    raise AssertionError(what)


def test_a_jobs_own_status_long_poll_held_open_does_not_delay_its_down_report(controllers):
    """The watch's long poll may be held up to its wait: the job's Down goes out beside it, not after it."""
    _, controller = controllers
    controller.hang_gets, controller.version = True, 41
    state = operator_state.OperatorState(kube=object(), key=b"k" * 32, controller_threads=True)
    t = _tracker(state, "c", controller, timeout_s=120.0)
    try:
        assert controller.get_entered.wait(30), "the watch never asked for status"
        t.sync([_pod("c", "c-w0", lbl.ROLE_WORKER, False, "Failed", 137)], lambda *e: None)
        _wait(lambda: t.slices[0].acked is not None and t.slices[0].acked[1] == "Down", "Down not acknowledged")
        assert not controller.release.is_set() and len(controller.gets) == 1  # still the first GET, held
    finally:
        controller.release.set()
        t.close()


def test_the_watch_long_polls_a_versioned_controller_and_plainly_polls_an_old_one(controllers):
    """A controller with versions is asked `after=<its version>&wait=...`; one from before long polls (no
    version in its answers, `after` ignored) is asked plainly again, and its status still reaches the pass."""
    _, controller = controllers
    state = operator_state.OperatorState(kube=object(), key=b"k" * 32, controller_threads=True)
    t = _tracker(state, "d", controller, timeout_s=10.0)
    try:
        _wait(lambda: len(controller.gets) >= 2, "the watch did not ask twice")
        assert controller.gets[:2] == ["/v1/status", "/v1/status"]  # old controller: no version to wait on
        status = t.refresh_status()
        assert status is not None and status.step == 3 and status.version == 0
        controller.version = 41
        _wait(lambda: any("after=41" in g for g in controller.gets), "no long poll after version 41")
        long_poll = next(g for g in controller.gets if "after=41" in g)
        assert "wait=25" in long_poll
    finally:
        t.close()


def test_a_report_on_a_closed_client_is_an_unreachable_controller_not_a_crash():
    """CI: the job's controller pod changed and its client was closed while the link still sent a report;
    httpx's RuntimeError ("the client has been closed") escaped as a traceback in the operator's log."""
    from elastic_jax.api.client import ControlApiError, ControlClient
    from elastic_jax.local.processes import free_port

    port = free_port()  # nothing listens: the request is never answered
    client = ControlClient(f"http://127.0.0.1:{port}", "tok")
    client.close()
    with pytest.raises(ControlApiError) as e:
        client.report_slice(0, "Ready", 1, ["127.0.0.1:1"], None)
    assert e.value.kind == ControlApiError.UNREACHABLE and "client closed" in str(e.value)
