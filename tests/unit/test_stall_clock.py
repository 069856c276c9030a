"""`StallClock`: the intervals in which this process did not run, from its ticking thread's late ticks."""

from elastic_jax.controller.stall_clock import StallClock


def test_gaps_longer_than_the_threshold_are_stalls_and_count_only_inside_the_window():
    now = [100.0]
    clock = StallClock(tick_s=0.2, gap_s=1.0, clock=lambda: now[0])
    for t in (100.2, 100.4, 105.4, 105.6, 105.8):  # one 5 s gap: a SIGSTOP
        now[0] = t
        clock.tick()
    assert clock.stalled_seconds(since=100.0) == 5.0
    assert clock.stalled_seconds(since=103.4) == 2.0  # only the part of the gap after `since`
    assert clock.stalled_seconds(since=105.5) == 0.0
    now[0] = 106.5  # a tick 0.7 s late is scheduling noise, not a stall
    clock.tick()
    assert clock.stalled_seconds(since=105.5) == 0.0


def test_a_stall_not_yet_ended_by_a_tick_counts_up_to_now():
    # After SIGCONT the step's deadline may be handled before the ticking thread runs again.
    now = [10.0]
    clock = StallClock(clock=lambda: now[0])
    now[0] = 30.0
    assert clock.stalled_seconds(since=10.0) == 20.0
    now[0] = 10.5
    assert clock.stalled_seconds(since=10.0, now=10.5) == 0.0


def test_the_ticking_thread_sees_no_stall_while_the_process_runs():
    import time

    clock = StallClock(tick_s=0.01, gap_s=0.5).start()
    try:
        time.sleep(0.1)
        assert clock.stalled_seconds(since=time.monotonic() - 0.1) == 0.0
    finally:
        clock.stop()
