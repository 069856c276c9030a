"""`ControllerLink`: a job's controller exchanges on its own thread; asking never blocks, asks coalesce."""

from __future__ import annotations

import threading

from elastic_jax.k8s_operator.controller_link import ControllerLink


def test_asking_never_waits_for_the_exchange_and_asks_made_meanwhile_coalesce():
    inside, release, done = threading.Event(), threading.Event(), threading.Event()
    calls = []

    def report(retries):
        calls.append(("report", retries))
        if len(calls) == 1:
            inside.set()
            release.wait(60)

    def poll():
        calls.append(("poll",))
        done.set()

    link = ControllerLink("j", report, poll)
    try:
        link.request(report_retries=1)
        assert inside.wait(60)
        for retries in (1, 3, 2):  # while the first report hangs: returns at once, kept as one ask
            link.request(report_retries=retries, poll=True)
        release.set()
        assert done.wait(60)
        assert calls == [("report", 1), ("report", 3), ("poll",)]  # reports before the poll, highest retries
    finally:
        link.close()


def test_a_failing_exchange_does_not_end_the_link():
    polled = threading.Event()
    calls = []

    def report(retries):
        calls.append(retries)
        raise RuntimeError("a bug")

    link = ControllerLink("j", report, polled.set)
    try:
        link.request(report_retries=1)
        link.request(poll=True)
        assert polled.wait(60) and calls
    finally:
        link.close()


def test_the_link_runs_in_its_creators_context_so_kopf_event_finds_its_queue():
    """kopf.event looks its queue up in context variables, which a plain thread lacks (LookupError)."""
    import contextvars

    var = contextvars.ContextVar("kopf_queue_stand_in")
    seen, polled = [], threading.Event()
    var.set("queue")

    def poll():
        seen.append(var.get(None))
        polled.set()

    link = ControllerLink("j", lambda r: None, poll)
    try:
        link.request(poll=True)
        assert polled.wait(60) and seen == ["queue"]
    finally:
        link.close()


def test_a_parting_controllers_last_answer_reaches_the_next_pass_once():
    """A suspend's controller answers with the checkpoint its stop saved, then exits: with the poll on the
    link, that answer lands after the pass that asked; the next pass, with the pod gone, still gets it
    (e2e/test_operator_counters.py caught status keeping the step before)."""
    from elastic_jax.api.control import ControllerStatus
    from elastic_jax.k8s_operator.slices import pod_view
    from elastic_jax.k8s_operator.tracker import JobTracker

    answered = threading.Event()

    class Client:
        def status(self):
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
        assert t.refresh_status() is None  # the pass that asks: nothing answered yet
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
