"""Pods → slice states."""

from __future__ import annotations

import pytest

from elastic_jax.api import labels
from elastic_jax.k8s_operator.slices import PodView, SliceObservation, group_by_slice, next_slice_state, observe_slice, pod_view


def _pod(name="w", attempt=0, phase="Running", ready=True, ip="127.0.10.5", deleting=False, exit_code=None, host=0, slice_index=0):
    return PodView(name=name, uid=name, role="worker", slice_index=slice_index, attempt=attempt, host_index=host,
                   phase=phase, ready=ready, pod_ip=ip, deleting=deleting, exit_code=exit_code,
                   reason="" if exit_code is None else f"exit code {exit_code}")


def test_pod_view_reads_labels_and_termination():
    body = {"metadata": {"name": "p", "uid": "u", "creationTimestamp": "2025-01-01T00:00:00Z",
                         "labels": {labels.ROLE: "worker", labels.SLICE_INDEX: "2", labels.JOBSET_RESTART_ATTEMPT: "3",
                                    labels.JOB_COMPLETION_INDEX: "1"}},
            "status": {"phase": "Failed", "podIP": "127.0.10.9",
                       "containerStatuses": [{"state": {"terminated": {"exitCode": 137, "reason": "Error"}}}]}}
    v = pod_view(body)
    assert (v.slice_index, v.attempt, v.host_index, v.exit_code, v.reason) == (2, 3, 1, 137, "exit code 137")
    assert v.terminal and not v.ready


def test_ready_when_every_host_runs_and_is_ready():
    obs = observe_slice([_pod("a", host=1, ip="127.0.10.6"), _pod("b", host=0)], hosts_per_slice=2, port=9)
    assert obs.kind == "Ready"
    assert obs.addresses == ("127.0.10.5:9", "127.0.10.6:9")  # by host index


@pytest.mark.parametrize("pods, kind", [
    ([], "NotReady"),
    ([_pod(ready=False)], "NotReady"),
    ([_pod(phase="Pending", ip="")], "NotReady"),
    ([_pod(phase="Failed", exit_code=137)], "Failed"),
    ([_pod(phase="Running", exit_code=1)], "Failed"),  # container ended, phase not updated yet
    ([_pod(deleting=True)], "Draining"),
    # an older attempt's failed pod is a leftover; the new attempt is what counts
    ([_pod("old", attempt=0, phase="Failed", exit_code=137), _pod("new", attempt=1)], "Ready"),
    ([_pod("old", attempt=0, phase="Failed", exit_code=137), _pod("new", attempt=1, phase="Pending", ip="")], "NotReady"),
])
def test_observation(pods, kind):
    assert observe_slice(pods, 1).kind == kind


def test_failure_reason_names_the_pod():
    obs = observe_slice([_pod("w-0", phase="Failed", exit_code=137)], 1)
    assert obs.reason == "pod w-0: exit code 137"


@pytest.mark.parametrize("prev, kind, new", [
    (None, "NotReady", "Provisioning"),
    ("Provisioning", "NotReady", "Provisioning"),
    ("Provisioning", "Ready", "Ready"),
    ("Ready", "Failed", "Down"),
    ("Ready", "NotReady", "Down"),  # a pod vanished (kubectl delete --force)
    ("Ready", "Draining", "Draining"),
    ("Draining", "NotReady", "Down"),
    ("Down", "NotReady", "Down"),  # replacement still starting
    ("Down", "Draining", "Down"),  # an old pod being cleaned up is no drain
    ("Down", "Ready", "Ready"),
    ("Provisioning", "Failed", "Down"),
])
def test_transitions(prev, kind, new):
    assert next_slice_state(prev, SliceObservation(kind)) == new


def test_group_by_slice_ignores_other_indices_and_the_controller():
    ctrl = PodView("c", "c", "controller", -1, 0, 0, "Running", True, "x", False)
    grouped = group_by_slice([_pod("a", slice_index=0), _pod("b", slice_index=1), _pod("z", slice_index=7), ctrl], 2)
    assert {i: [p.name for p in ps] for i, ps in grouped.items()} == {0: ["a"], 1: ["b"]}
