"""`StatusFeed`: the status version moves with the content only; a long poll answers at once or on change."""

from __future__ import annotations

import asyncio

from elastic_jax.api.control import ControllerStatus
from elastic_jax.controller import status_feed
from elastic_jax.controller.status_feed import StatusFeed


def _status(step: int = 0, goodput_s: float = 0.0) -> ControllerStatus:
    return ControllerStatus(phase="Running", step=step, total_steps=10, desired_slices=1, min_slices=1,
                            active_slices=[0], inactive_slices=[], slices=[], pid=1, goodput=0.5,
                            goodput_seconds={"productive": goodput_s})


class _Source:
    def __init__(self):
        self.step, self.goodput_s, self.builds = 0, 0.0, 0

    def __call__(self) -> ControllerStatus:
        self.builds += 1
        return _status(self.step, self.goodput_s)


def _feed(source: _Source, start: int = 1000) -> StatusFeed:
    return StatusFeed(source, clock_ns=lambda: start)


async def _build(feed: StatusFeed):
    return feed.current()


async def _connected() -> bool:
    return False


def test_the_version_moves_when_the_content_changes_and_not_with_the_clock_driven_goodput():
    source = _Source()
    feed = _feed(source)
    first = feed.current()
    assert first.version == 1001
    source.goodput_s = 12.5  # ticks with the clock: not a change
    again = feed.current()
    assert again.version == first.version and again.goodput_seconds == {"productive": 12.5}
    source.step = 1
    assert feed.current().version == first.version + 1


def test_a_poll_without_after_or_wait_or_with_another_version_answers_at_once():
    source = _Source()
    feed = _feed(source)
    version = feed.current().version
    for after, wait_s in ((None, 30.0), (version, 0.0), (version - 1, 30.0), (version + 7, 30.0)):
        answer = asyncio.run(feed.answer(after, wait_s, lambda: _build(feed), _connected))
        assert answer.version == version  # (a restarted caller's or controller's version: never waits)
    assert source.builds == 5  # one build per answer: nothing waited


def test_a_long_poll_waits_until_the_version_moves_and_a_poke_wakes_it():
    source = _Source()
    feed = _feed(source)
    version = feed.current().version

    async def scenario():
        waiting = asyncio.ensure_future(feed.answer(version, 30.0, lambda: _build(feed), _connected))
        while source.builds < 2:  # the poll's own first build: it is waiting now
            await asyncio.sleep(0)
        assert not waiting.done()
        source.step = 5
        feed.poke()
        return await waiting

    answer = asyncio.run(scenario())
    assert answer.step == 5 and answer.version == version + 1


def test_a_long_poll_with_no_change_answers_the_same_version_when_its_wait_ends():
    source = _Source()
    feed = _feed(source)
    version = feed.current().version
    source.goodput_s = 3.0
    answer = asyncio.run(feed.answer(version, 0.01, lambda: _build(feed), _connected))
    assert answer.version == version and answer.goodput_seconds == {"productive": 3.0}  # fresh clock fields


def test_a_caller_that_went_away_ends_its_wait():
    source = _Source()
    feed = _feed(source)
    version = feed.current().version

    async def gone() -> bool:
        return True

    answer = asyncio.run(feed.answer(version, 30.0, lambda: _build(feed), gone))
    assert answer.version == version  # (returned after one tick, not after 30 s; nothing is sent to it)


def test_more_long_polls_than_max_waiters_are_answered_at_once():
    source = _Source()
    feed = _feed(source)
    version = feed.current().version

    async def scenario():
        held = [asyncio.ensure_future(feed.answer(version, 30.0, lambda: _build(feed), _connected))
                for _ in range(status_feed.MAX_WAITERS)]
        while source.builds < 1 + status_feed.MAX_WAITERS:
            await asyncio.sleep(0)
        extra = await feed.answer(version, 30.0, lambda: _build(feed), _connected)
        assert not any(h.done() for h in held)
        source.step = 1
        feed.poke()
        return extra, await asyncio.gather(*held)

    extra, held = asyncio.run(scenario())
    assert extra.version == version and all(h.version == version + 1 for h in held)


def test_a_restarted_controller_starts_above_the_previous_processes_versions():
    old = _feed(_Source(), start=1_000).current().version
    new = StatusFeed(_Source()).current().version  # (time.time_ns(): far above any count of changes)
    assert new > old
