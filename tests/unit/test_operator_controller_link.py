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
