"""`peering_check.same_priority_peers`: which entries of a kopf peering object collide with a fixed priority."""

from __future__ import annotations

import datetime

import pytest

from elastic_jax.k8s_operator.peering_check import same_priority_peers, steps_aside

NOW = datetime.datetime(2026, 12, 6, 12, 0, 0, tzinfo=datetime.UTC)


def _entry(priority, seen_s_ago, lifetime=60):
    return {"priority": priority, "lifetime": lifetime, "lastseen": (NOW - datetime.timedelta(seconds=seen_s_ago)).isoformat()}


@pytest.mark.parametrize("status, own, expected", [
    ({"a": _entry(5, 10)}, None, ["a"]),                                   # live, same priority
    ({"a": _entry(6, 10)}, None, []),                                      # another priority
    ({"a": _entry(5, 61)}, None, []),                                      # dead: lastseen + lifetime passed
    ({"a": _entry(5, 100, lifetime=300)}, None, ["a"]),                    # its own lifetime counts
    ({"pod-1": _entry(5, 10)}, "pod-1", []),                               # a restarted container's own entry
    ({"b": _entry(5, 1), "a": _entry(5, 2), "c": _entry(4, 1)}, None, ["a", "b"]),
    ({"a": {"priority": 5}, "b": "junk", "c": {"lastseen": "not a date", "priority": 5}}, None, []),  # unreadable
    ({"a": {"lastseen": "2026-12-06T11:59:50"}}, None, []),                # no priority: kopf's 0, naive time = UTC
    (None, None, []),
])
def test_only_live_peers_of_the_same_priority_other_than_itself_collide(status, own, expected):
    assert same_priority_peers(status, 5, own, NOW) == expected


def test_a_naive_lastseen_is_read_as_utc_and_a_missing_priority_as_zero():
    assert same_priority_peers({"a": {"lastseen": "2026-12-06T11:59:50"}}, 0, None, NOW) == ["a"]


@pytest.mark.parametrize("own, peers, leaves", [
    ("pod-b", ["pod-a"], True),
    ("pod-a", ["pod-b"], False),
    ("pod-b", ["pod-a", "pod-c"], True),
    ("pod-a", [], False),
])
def test_of_colliding_operators_every_one_but_the_first_by_identity_steps_aside(own, peers, leaves):
    assert steps_aside(own, peers) is leaves
    # both sides apply the rule: exactly one of the set stays
    everyone = sorted([own, *peers])
    assert [steps_aside(me, [p for p in everyone if p != me]) for me in everyone].count(False) == 1
