"""Issue 11 (status truth): a stopped controller's last status reaches its poller
(`controller.final_status`), so a suspended job's status has the step its stop saved."""

from __future__ import annotations

import threading

from elastic_jax.controller.final_status import FinalStatusHandoff


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_no_poller_no_wait():
    h = FinalStatusHandoff(Clock())
    h.ended()
    assert h.wait(timeout_s=0) is True  # nobody read the status: exiting at once waits for no one


def test_a_poller_that_stopped_long_ago_is_not_waited_for():
    clock = Clock()
    h = FinalStatusHandoff(clock)
    h.served()
    clock.t += 60
    h.ended()
    assert h.wait(recent_s=5, timeout_s=0) is True


def test_a_recent_poller_gets_the_final_status_before_exit():
    clock = Clock()
    h = FinalStatusHandoff(clock)
    h.served()  # the operator's pass a moment before the stop
    h.ended()
    # a read before `ended` does not count: the exit waits for the next one
    assert h.wait(timeout_s=0) is False
    waited: dict = {}
    waiter = threading.Thread(target=lambda: waited.setdefault("served", h.wait(timeout_s=600)))
    waiter.start()
    h.served()  # the next poll sees the final phase, step and committed checkpoint
    waiter.join()
    assert waited == {"served": True}


def test_reads_before_the_end_do_not_release_the_exit():
    clock = Clock()
    h = FinalStatusHandoff(clock)
    for _ in range(3):
        h.served()
    assert h.wait(timeout_s=0) is False  # not ended yet: no final status was served
