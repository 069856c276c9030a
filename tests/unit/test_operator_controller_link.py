"""`ControllerLink`: a job's controller exchanges on its own threads; asking never blocks, asks coalesce, the
status watch long-polls with the last version."""

from __future__ import annotations

import threading

from elastic_jax.k8s_operator.controller_link import ControllerLink


def _status(version: int):
    from elastic_jax.api.control import ControllerStatus

    return ControllerStatus(phase="Running", step=0, total_steps=1, desired_slices=1, min_slices=1,
                            active_slices=[0], inactive_slices=[], slices=[], pid=1, version=version)


def test_asking_never_waits_for_the_exchange_and_asks_made_meanwhile_coalesce():
    inside, release, done = threading.Event(), threading.Event(), threading.Event()
    calls = []

    def report(retries):
        calls.append(retries)
        if len(calls) == 1:
            inside.set()
            release.wait(60)
        elif len(calls) == 2:
            done.set()

    link = ControllerLink("j", report, lambda after, wait_s: None)
    try:
        link.request(report_retries=1)
        assert inside.wait(60)
        for retries in (1, 3, 2):  # while the first report hangs: returns at once, kept as one ask
            link.request(report_retries=retries)
        release.set()
        assert done.wait(60)
        link.close()
        assert calls == [1, 3]  # the asks made meanwhile: one more pass, with the highest retries
    finally:
        link.close()


def test_a_report_never_waits_for_the_status_watch_in_flight():
    """The watch holds a long poll (up to WATCH_WAIT_S): a Down report must not queue behind it."""
    polling, release, reported = threading.Event(), threading.Event(), threading.Event()

    def poll(after, wait_s):
        polling.set()
        release.wait(60)
        return None

    link = ControllerLink("j", lambda retries: reported.set(), poll)
    try:
        assert polling.wait(60)
        link.request(report_retries=1)
        assert reported.wait(60) and not release.is_set()  # sent while the long poll is still held
    finally:
        release.set()
        link.close()


def test_the_watch_long_polls_with_the_last_version_and_forgets_it_for_a_new_controller():
    asks, answers, enough = [], iter([5, 5, 0, 9, 9]), threading.Event()
    link = None

    def poll(after, wait_s):
        asks.append((after, wait_s))
        if len(asks) == 4:
            link.request(poll=True)  # a new controller: its first ask carries no version of the old one
        if len(asks) == 6:
            enough.set()
            return None
        return _status(next(answers, 0))

    link = ControllerLink("j", lambda retries: None, poll, wait_s=7.0, min_interval_s=0.0)
    try:
        assert enough.wait(60)
    finally:
        link.close()
    # 0: a controller without versions (answers at once): asked again without one
    assert asks[:6] == [(None, 7.0), (5, 7.0), (5, 7.0), (None, 7.0), (None, 7.0), (9, 7.0)]


def test_a_failing_exchange_does_not_end_the_link():
    polled, reported = threading.Event(), threading.Event()
    calls = []

    def report(retries):
        calls.append(retries)
        reported.set()
        raise RuntimeError("a bug")

    def poll(after, wait_s):
        calls.append("poll")
        if calls.count("poll") == 2:
            polled.set()
        raise RuntimeError("a bug")

    link = ControllerLink("j", report, poll, min_interval_s=0.0)
    try:
        link.request(report_retries=1)
        assert reported.wait(60) and polled.wait(60)  # (the watch asked again after its failure)
        reported.clear()
        link.request(report_retries=2)
        assert reported.wait(60)
    finally:
        link.close()


def test_the_link_runs_in_its_creators_context_so_kopf_event_finds_its_queue():
    """kopf.event looks its queue up in context variables, which a plain thread lacks (LookupError)."""
    import contextvars

    var = contextvars.ContextVar("kopf_queue_stand_in")
    seen, polled = [], threading.Event()
    var.set("queue")

    def poll(after, wait_s):
        seen.append(var.get(None))
        polled.set()

    link = ControllerLink("j", lambda r: None, poll)
    try:
        assert polled.wait(60) and seen[0] == "queue"
    finally:
        link.close()


def test_a_parting_controllers_last_answer_reaches_the_next_pass_once():
    """A suspend's controller answers with the checkpoint its stop saved, then exits: with the poll on the
    link, that answer lands after the pass that asked; the next pass, with the pod gone, still gets it
    (e2e/test_operator_counters.py, now part of e2e/test_status_truth.py, caught status keeping the step before)."""
    from elastic_jax.api.control import ControllerStatus
    from elastic_jax.k8s_operator.slices import pod_view
    from elastic_jax.k8s_operator.tracker import JobTracker

    answered = threading.Event()

    class Client:
        def status(self, after=None, wait_s=0.0):
            answered.set()
            return ControllerStatus(phase="Stopped", step=988, total_steps=1000, desired_slices=1, min_slices=1,
                                    active_slices=[], inactive_slices=[0], slices=[], pid=1,
                                    last_committed_checkpoint_step=988)

        def close(self):
            pass

    t = JobTracker("ns", "j", 1, 1, client_factory=lambda url, token: Client(), background=True)
    try:
        t.token = "tok"
        t.set_controller(pod_view({"metadata": {"name": "c", "uid": "c0", "labels": {}},
                                   "status": {"phase": "Running", "podIP": "127.0.0.9"}}))
        assert answered.wait(60)
        for _ in range(600):  # (the link records the answer right after the client returns it)
            if t.poll_result is not None:
                break
            threading.Event().wait(0.05)
        t.set_controller(None)  # the pod exited before the next pass
        last = t.refresh_status()
        assert last is not None and last.last_committed_checkpoint_step == 988 and t.answer_uid == "c0"
        assert t.refresh_status() is None  # once
    finally:
        t.close()
